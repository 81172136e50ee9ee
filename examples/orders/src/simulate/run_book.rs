//! The statements that record a simulation run (`simulation_runs`, `simulation_messages`): the
//! seam between the simulator and a database, and its PostgreSQL side.

use async_trait::async_trait;
use sqlx::PgPool;

use super::SimulateParams;

/// The statements that record a run, on one database.
#[async_trait]
pub(crate) trait RunBook: Sync {
    /// Records a new run with `params` (its `parameters`); its id.
    async fn start(&self, params: &SimulateParams) -> Result<i64, sqlx::Error>;
    /// Adds `order_prefix` to the run's `parameters`.
    async fn name_orders(&self, run_id: i64, order_prefix: &str) -> Result<(), sqlx::Error>;
    /// Records (adds to the copies of) up to 5 000 published messages.
    async fn record_messages(&self, run_id: i64, messages: &[RecordedMessage<'_>]) -> Result<(), sqlx::Error>;
    /// Marks the run finished, with its totals.
    async fn finish(&self, run_id: i64, published: i64, duplicates: i64, poison: i64) -> Result<(), sqlx::Error>;
}

/// A row of `simulation_messages`: a message as one consumer group receives it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RecordedMessage<'a> {
    pub(crate) group: &'a str,
    pub(crate) message_id: &'a str,
    pub(crate) poison: bool,
    pub(crate) copies: i32,
}

/// The run book on PostgreSQL.
pub(super) struct PgRunBook<'a>(pub(super) &'a PgPool);

#[async_trait]
impl RunBook for PgRunBook<'_> {
    async fn start(&self, params: &SimulateParams) -> Result<i64, sqlx::Error> {
        sqlx::query_scalar("INSERT INTO shop.simulation_runs (parameters) VALUES ($1) RETURNING id")
            .bind(sqlx::types::Json(params))
            .fetch_one(self.0)
            .await
    }

    async fn name_orders(&self, run_id: i64, order_prefix: &str) -> Result<(), sqlx::Error> {
        sqlx::query("UPDATE shop.simulation_runs SET parameters = parameters || jsonb_build_object('order_prefix', $2::text) WHERE id = $1")
            .bind(run_id)
            .bind(order_prefix)
            .execute(self.0)
            .await?;
        Ok(())
    }

    async fn record_messages(&self, run_id: i64, messages: &[RecordedMessage<'_>]) -> Result<(), sqlx::Error> {
        sqlx::query(
            "INSERT INTO shop.simulation_messages (run_id, consumer_group, message_id, poison, copies)
             SELECT $1, * FROM unnest($2::text[], $3::text[], $4::bool[], $5::int[])
             ON CONFLICT (run_id, consumer_group, message_id) DO UPDATE
                 SET copies = simulation_messages.copies + EXCLUDED.copies",
        )
        .bind(run_id)
        .bind(messages.iter().map(|m| m.group).collect::<Vec<_>>())
        .bind(messages.iter().map(|m| m.message_id).collect::<Vec<_>>())
        .bind(messages.iter().map(|m| m.poison).collect::<Vec<_>>())
        .bind(messages.iter().map(|m| m.copies).collect::<Vec<_>>())
        .execute(self.0)
        .await?;
        Ok(())
    }

    async fn finish(&self, run_id: i64, published: i64, duplicates: i64, poison: i64) -> Result<(), sqlx::Error> {
        sqlx::query(
            "UPDATE shop.simulation_runs SET finished_at = now(), published = $2, duplicates = $3, poison = $4 WHERE id = $1",
        )
        .bind(run_id)
        .bind(published)
        .bind(duplicates)
        .bind(poison)
        .execute(self.0)
        .await?;
        Ok(())
    }
}
