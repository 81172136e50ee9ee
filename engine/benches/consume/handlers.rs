//! The consume bench's handlers: without effect, one business row per message, one statement
//! for a run of messages (a batch handler), and a leased one without effect. With the feature
//! `mysql`, the first two also write in MariaDB's transaction (the same row in its own
//! `bench_effects`).

use async_trait::async_trait;
use dedup_engine::handler::{HandlerError, HandlerInput, LeaseGuard, LeasedHandler, TransactionalHandler};
use sqlx::PgConnection;

/// The business change of the idempotent phase: one row per message.
pub struct InsertRow;

#[async_trait]
impl TransactionalHandler for InsertRow {
    async fn handle(&self, input: &HandlerInput<'_>, tx: &mut PgConnection) -> Result<(), HandlerError> {
        sqlx::query("INSERT INTO bench_effects (message_id) VALUES ($1)")
            .bind(input.message_id.as_str())
            .execute(tx)
            .await?;
        Ok(())
    }
}

#[cfg(feature = "mysql")]
#[async_trait]
impl TransactionalHandler<sqlx::MySql> for InsertRow {
    async fn handle(&self, input: &HandlerInput<'_>, tx: &mut sqlx::MySqlConnection) -> Result<(), HandlerError> {
        sqlx::query("INSERT INTO bench_effects (message_id) VALUES (?)")
            .bind(input.message_id.as_str())
            .execute(tx)
            .await?;
        Ok(())
    }
}

/// The pipeline alone: a transactional handler with no business change of its own.
pub struct NoEffect;

#[async_trait]
impl TransactionalHandler for NoEffect {
    async fn handle(&self, _: &HandlerInput<'_>, _: &mut PgConnection) -> Result<(), HandlerError> {
        Ok(())
    }
}

#[cfg(feature = "mysql")]
#[async_trait]
impl TransactionalHandler<sqlx::MySql> for NoEffect {
    async fn handle(&self, _: &HandlerInput<'_>, _: &mut sqlx::MySqlConnection) -> Result<(), HandlerError> {
        Ok(())
    }
}

/// The leased phase: a leased handler with no effect of its own.
pub struct LeasedNoEffect;

#[async_trait]
impl LeasedHandler for LeasedNoEffect {
    async fn handle(&self, _: &HandlerInput<'_>, lease: &LeaseGuard) -> Result<(), HandlerError> {
        lease.check()
    }
}

/// The business change of the batch-handler phase: one row per message, a run of up to 500
/// messages written by one statement.
pub struct InsertRows;

#[async_trait]
impl TransactionalHandler for InsertRows {
    async fn handle(&self, input: &HandlerInput<'_>, tx: &mut PgConnection) -> Result<(), HandlerError> {
        TransactionalHandler::<sqlx::Postgres>::handle(&InsertRow, input, tx).await
    }

    fn max_batch(&self) -> usize {
        500
    }

    async fn handle_batch(&self, inputs: &[HandlerInput<'_>], tx: &mut PgConnection) -> Result<(), HandlerError> {
        let ids: Vec<&str> = inputs.iter().map(|input| input.message_id.as_str()).collect();
        sqlx::query("INSERT INTO bench_effects (message_id) SELECT * FROM unnest($1::text[])")
            .bind(&ids)
            .execute(tx)
            .await?;
        Ok(())
    }
}
