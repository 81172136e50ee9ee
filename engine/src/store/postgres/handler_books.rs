//! PostgreSQL's handler pause rows for operators ([`HandlerBooks`]): the list, and a change in
//! a transaction (`SELECT … FOR UPDATE`, `UPDATE … RETURNING`, the audit entry beside it).

use async_trait::async_trait;
use sqlx::PgPool;

use super::operator_tx::PgOperatorTx;
use crate::actions::handlers::{HandlerBooks, HandlerChange, HandlerPause, MAX_HANDLERS};
use crate::pause::PauseState;

const COLUMNS: &str = "consumer_group, message_type, state, since, changed_by, reason, error_class, http_status, \
                       failed_at, probe_at, version, kind, seen_at";

#[async_trait]
impl HandlerBooks for PgPool {
    async fn handler_pauses(&self) -> Result<Vec<HandlerPause>, sqlx::Error> {
        // handler_pauses_pkey's order.
        let sql = format!("SELECT {COLUMNS} FROM handler_pauses ORDER BY consumer_group, message_type LIMIT $1");
        sqlx::query_as(&sql).bind(MAX_HANDLERS).fetch_all(self).await
    }

    async fn begin_change(&self) -> Result<Box<dyn HandlerChange>, sqlx::Error> {
        Ok(Box::new(PgOperatorTx(self.begin().await?)))
    }
}

#[async_trait]
impl HandlerChange for PgOperatorTx {
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
}
