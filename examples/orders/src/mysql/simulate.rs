//! The simulator's run book on MySQL: the statements that record a run (`simulation_runs`,
//! `simulation_messages`); planning and publishing are `crate::simulate`'s.

use async_trait::async_trait;
use sqlx::{MySql, MySqlPool, QueryBuilder};

use super::Shop;
use crate::simulate::{RecordedMessage, RunBook, SimulateParams};

/// The run book in `shop`'s tables.
pub(super) struct MySqlRunBook<'a> {
    pub(super) pool: &'a MySqlPool,
    pub(super) shop: &'a Shop,
}

#[async_trait]
impl RunBook for MySqlRunBook<'_> {
    async fn start(&self, params: &SimulateParams) -> Result<i64, sqlx::Error> {
        // As text: MariaDB's JSON is LONGTEXT, and both check it is JSON.
        let parameters = serde_json::to_string(params).map_err(|e| sqlx::Error::Encode(e.into()))?;
        let inserted = sqlx::query(&self.shop.sql("INSERT INTO {shop}.simulation_runs (parameters) VALUES (?)"))
            .bind(parameters)
            .execute(self.pool)
            .await?;
        i64::try_from(inserted.last_insert_id()).map_err(|e| sqlx::Error::Decode(e.into()))
    }

    async fn name_orders(&self, run_id: i64, order_prefix: &str) -> Result<(), sqlx::Error> {
        sqlx::query(&self.shop.sql(
            "UPDATE {shop}.simulation_runs SET parameters = JSON_SET(parameters, '$.order_prefix', ?) WHERE id = ?",
        ))
        .bind(order_prefix)
        .bind(run_id)
        .execute(self.pool)
        .await?;
        Ok(())
    }

    async fn record_messages(&self, run_id: i64, messages: &[RecordedMessage<'_>]) -> Result<(), sqlx::Error> {
        if messages.is_empty() {
            return Ok(());
        }
        let mut insert = QueryBuilder::<MySql>::new(
            self.shop
                .sql("INSERT INTO {shop}.simulation_messages (run_id, consumer_group, message_id, poison, copies) "),
        );
        // 5 000 rows of 5 parameters: under MySQL's 65 535 placeholders.
        insert.push_values(messages, |mut row, m| {
            row.push_bind(run_id).push_bind(m.group).push_bind(m.message_id).push_bind(m.poison).push_bind(m.copies);
        });
        // VALUES(): MySQL 8 deprecates it for a row alias, which MariaDB lacks; both accept it.
        insert.push(" ON DUPLICATE KEY UPDATE copies = copies + VALUES(copies)");
        insert.build().execute(self.pool).await?;
        Ok(())
    }

    async fn finish(&self, run_id: i64, published: i64, duplicates: i64, poison: i64) -> Result<(), sqlx::Error> {
        sqlx::query(&self.shop.sql(
            "UPDATE {shop}.simulation_runs
             SET finished_at = UTC_TIMESTAMP(6), published = ?, duplicates = ?, poison = ? WHERE id = ?",
        ))
        .bind(published)
        .bind(duplicates)
        .bind(poison)
        .bind(run_id)
        .execute(self.pool)
        .await?;
        Ok(())
    }
}
