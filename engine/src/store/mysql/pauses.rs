//! The handlers' pause rows (`handler_pauses`) on MySQL: [`PauseBook`] for [`crate::pause`]
//! (`postgres/pauses.rs` states what each does). A write that PostgreSQL answers with
//! `RETURNING` runs in a transaction of its own here, and reads the row it locked back.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::mysql::MySqlRow;
use sqlx::Row;

use super::{MySqlStore, sql, text};
#[cfg(feature = "http")]
use crate::store::roles::EnginePause;
use crate::store::roles::{PauseBook, PauseBooks, PauseRow};

/// The pause book on the store's pool.
struct MySqlPauseBook(MySqlStore);

impl PauseBooks for MySqlStore {
    fn pause_book(&self) -> std::sync::Arc<dyn PauseBook> {
        std::sync::Arc::new(MySqlPauseBook(self.clone()))
    }
}

/// A row's `(state, probe_at)`.
fn state(row: &MySqlRow) -> Result<(String, Option<DateTime<Utc>>), sqlx::Error> {
    Ok((text(row, "state")?, row.try_get("probe_at")?))
}

#[async_trait]
impl PauseBook for MySqlPauseBook {
    /// In message-type order, so that processes registering one group's handlers at once take
    /// the rows in one order.
    async fn register(&self, group: &str, handlers: &[(String, &'static str)]) -> Result<(), sqlx::Error> {
        if handlers.is_empty() {
            return Ok(());
        }
        let mut sorted: Vec<&(String, &str)> = handlers.iter().collect();
        sorted.sort();
        let sql = self.0.render(&sql::register(sorted.len()));
        let mut query = sqlx::query(&sql);
        for (message_type, kind) in sorted {
            query = query.bind(group).bind(message_type.as_str()).bind(*kind);
        }
        query.execute(&self.0.pool).await.map(drop)
    }

    async fn paused(&self, group: &str) -> Result<Vec<PauseRow>, sqlx::Error> {
        let rows = sqlx::query(&self.0.render(sql::PAUSED)).bind(group).fetch_all(&self.0.pool).await?;
        rows.iter()
            .map(|row| {
                let (state, probe_at) = state(row)?;
                Ok((text(row, "message_type")?, state, probe_at))
            })
            .collect()
    }

    async fn take_probe(
        &self,
        group: &str,
        message_type: &str,
        interval_ms: i64,
    ) -> Result<Option<DateTime<Utc>>, sqlx::Error> {
        let mut tx = self.0.pool.begin().await?;
        let taken = sqlx::query(&self.0.render(sql::TAKE_PROBE))
            .bind(interval_ms)
            .bind(group)
            .bind(message_type)
            .execute(&mut *tx)
            .await?
            .rows_affected();
        if taken == 0 {
            tx.rollback().await?;
            return Ok(None);
        }
        let row = sqlx::query(&self.0.render(sql::PAUSE_STATE)).bind(group).bind(message_type).fetch_one(&mut *tx).await?;
        tx.commit().await?;
        Ok(state(&row)?.1)
    }

    #[cfg(feature = "http")]
    async fn pause(&self, p: &EnginePause<'_>) -> Result<Option<(String, Option<DateTime<Utc>>)>, sqlx::Error> {
        let mut tx = self.0.pool.begin().await?;
        sqlx::query(&self.0.render(&sql::pause()))
            .bind(p.group)
            .bind(p.message_type)
            .bind(p.state)
            .bind(crate::db::storable::text(p.reason))
            .bind(crate::db::storable::text(p.error_class))
            .bind(p.http_status)
            .bind((p.state == "breaker").then_some(p.probe_interval_ms))
            .execute(&mut *tx)
            .await?;
        let row = sqlx::query(&self.0.render(sql::PAUSE_STATE)).bind(p.group).bind(p.message_type).fetch_one(&mut *tx).await?;
        tx.commit().await?;
        let (stored, probe_at) = state(&row)?;
        Ok((stored == p.state).then_some((stored, probe_at)))
    }

    #[cfg(feature = "http")]
    async fn resume_after_probe(&self, group: &str, message_type: &str) -> Result<bool, sqlx::Error> {
        let sql = self.0.render(sql::RESUME_AFTER_PROBE);
        let done = sqlx::query(&sql).bind(group).bind(message_type).execute(&self.0.pool).await?.rows_affected();
        Ok(done == 1)
    }
}
