//! PostgreSQL's transaction of one operator action ([`OperatorTx`]); the changes it makes are
//! in `handler_books.rs`, `record_books.rs` and `conflict_books.rs`.

use async_trait::async_trait;
use sqlx::{Postgres, Transaction};

use crate::actions::OperatorTx;
use crate::audit::NewAuditEntry;

/// An operator action's transaction on PostgreSQL.
pub(super) struct PgOperatorTx(pub(super) Transaction<'static, Postgres>);

#[async_trait]
impl OperatorTx for PgOperatorTx {
    async fn audit(&mut self, entry: &NewAuditEntry<'_>) -> Result<i64, sqlx::Error> {
        super::audit::insert(&mut *self.0, entry).await
    }

    async fn commit(self: Box<Self>) -> Result<(), sqlx::Error> {
        self.0.commit().await
    }

    async fn rollback(self: Box<Self>) -> Result<(), sqlx::Error> {
        self.0.rollback().await
    }
}
