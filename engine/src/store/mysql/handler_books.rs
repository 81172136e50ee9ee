//! MySQL's handler pause rows for operators ([`HandlerBooks`]): the list, and a change in a
//! transaction (`SELECT … FOR UPDATE`, then the `UPDATE` and the row read back by its primary
//! key, the audit entry beside it).

use async_trait::async_trait;
use sqlx::mysql::MySqlPool;

use super::operator_tx::MySqlOperatorTx;
use crate::actions::handlers::{HandlerBooks, HandlerChange, HandlerPause, MAX_HANDLERS};
use crate::pause::PauseState;

/// The row as [`HandlerPause`] reads it (`_bin` text and bytes `AS CHAR`).
const SELECT: &str = "SELECT CAST(consumer_group AS CHAR) AS consumer_group, CAST(message_type AS CHAR) AS message_type,
                             CAST(state AS CHAR) AS state, since, CAST(changed_by AS CHAR) AS changed_by, reason,
                             CAST(error_class AS CHAR) AS error_class, http_status, failed_at, probe_at, version,
                             CAST(kind AS CHAR) AS kind, seen_at
                      FROM handler_pauses";

#[async_trait]
impl HandlerBooks for MySqlPool {
    async fn handler_pauses(&self) -> Result<Vec<HandlerPause>, sqlx::Error> {
        // The primary key's order (the columns, not the `AS CHAR` aliases of the same names).
        sqlx::query_as(&format!("{SELECT} ORDER BY handler_pauses.consumer_group, handler_pauses.message_type LIMIT ?"))
            .bind(MAX_HANDLERS)
            .fetch_all(self)
            .await
    }

    async fn begin_change(&self) -> Result<Box<dyn HandlerChange>, sqlx::Error> {
        Ok(Box::new(MySqlOperatorTx(self.begin().await?)))
    }
}

#[async_trait]
impl HandlerChange for MySqlOperatorTx {
    async fn lock(&mut self, group: &str, message_type: &str) -> Result<Option<(String, i64)>, sqlx::Error> {
        sqlx::query_as(
            "SELECT CAST(state AS CHAR), version FROM handler_pauses WHERE consumer_group = ? AND message_type = ?
             FOR UPDATE",
        )
        .bind(group.as_bytes())
        .bind(message_type.as_bytes())
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
        sqlx::query(
            "UPDATE handler_pauses SET state = ?, since = UTC_TIMESTAMP(6), changed_by = ?, reason = ?, probe_at = NULL,
                    version = version + 1
             WHERE consumer_group = ? AND message_type = ?",
        )
        .bind(to.as_str())
        .bind(actor)
        .bind(reason)
        .bind(group.as_bytes())
        .bind(message_type.as_bytes())
        .execute(&mut *self.0)
        .await?;
        sqlx::query_as(&format!("{SELECT} WHERE consumer_group = ? AND message_type = ?"))
            .bind(group.as_bytes())
            .bind(message_type.as_bytes())
            .fetch_one(&mut *self.0)
            .await
    }
}
