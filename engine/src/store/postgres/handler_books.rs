//! PostgreSQL's handler pause rows for operators ([`HandlerBooks`]): the list, and a change in
//! a transaction (`SELECT … FOR UPDATE`, `UPDATE … RETURNING`, the audit entry beside it).

use async_trait::async_trait;
use sqlx::{PgPool, Postgres, Transaction};

use crate::actions::handlers::{HandlerBooks, HandlerChange, HandlerPause, MAX_HANDLERS};
use crate::audit::NewAuditEntry;
use crate::pause::PauseState;

const COLUMNS: &str = "consumer_group, message_type, state, since, changed_by, reason, error_class, http_status, \
                       failed_at, probe_at, version, kind, seen_at";

/// An operator's change on PostgreSQL.
struct PgHandlerChange(Transaction<'static, Postgres>);

#[async_trait]
impl HandlerBooks for PgPool {
    async fn handler_pauses(&self) -> Result<Vec<HandlerPause>, sqlx::Error> {
        // handler_pauses_pkey's order.
        let sql = format!("SELECT {COLUMNS} FROM handler_pauses ORDER BY consumer_group, message_type LIMIT $1");
        sqlx::query_as(&sql).bind(MAX_HANDLERS).fetch_all(self).await
    }

    async fn begin_change(&self) -> Result<Box<dyn HandlerChange>, sqlx::Error> {
        Ok(Box::new(PgHandlerChange(self.begin().await?)))
    }
}

#[async_trait]
impl HandlerChange for PgHandlerChange {
    async fn lock(&mut self, group: &str, message_type: &str) -> Result<Option<(String, i64)>, sqlx::Error> {
        sqlx::query_as("SELECT state, version FROM handler_pauses WHERE consumer_group = $1 AND message_type = $2 FOR UPDATE")
            .bind(group)
            .bind(message_type)
            .fetch_optional(&mut *self.0)
            .await
    }

    async fn set_state(
        &mut self,
        group: &str,
        message_type: &str,
        to: PauseState,
        actor: &str,
        reason: &str,
    ) -> Result<HandlerPause, sqlx::Error> {
        let sql = format!(
            "UPDATE handler_pauses SET state = $3, since = now(), changed_by = $4, reason = $5, probe_at = NULL,
                    version = version + 1
             WHERE consumer_group = $1 AND message_type = $2 RETURNING {COLUMNS}"
        );
        sqlx::query_as(&sql)
            .bind(group)
            .bind(message_type)
            .bind(to.as_str())
            .bind(actor)
            .bind(reason)
            .fetch_one(&mut *self.0)
            .await
    }

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
