//! MySQL's records for the single-record operator actions ([`RecordBooks`]): the row locked by
//! `SELECT … FOR UPDATE`, each transition one conditional `UPDATE` with its status counts'
//! delta rows beside it (no triggers: DESIGN.md, "MySQL store"), the open attempt closed, the
//! audit entry in the transaction.

use async_trait::async_trait;
use sqlx::mysql::MySqlPool;
use sqlx::MySqlConnection;

use super::operator_tx::MySqlOperatorTx;
use crate::actions::record::{HAND_DEAD_LETTER_CLASS, LockedRecord, RecordBooks, RecordChange, RecordTransition};
use crate::record::RecordStatus;

/// The columns of [`crate::actions::republish::StoredMessage`] (`_bin` text and bytes `AS CHAR`;
/// the headers as JSON text, MariaDB's JSON being text).
pub(super) const STORED_MESSAGE: &str = "id, CAST(message_id AS CHAR) AS message_id,
     CAST(consumer_group AS CHAR) AS consumer_group, CAST(source_broker AS CHAR) AS source_broker,
     CAST(source_exchange AS CHAR) AS source_exchange, CAST(source_routing_key AS CHAR) AS source_routing_key,
     payload, payload_truncated, CAST(headers AS CHAR) AS headers, CAST(content_type AS CHAR) AS content_type,
     CAST(type_property AS CHAR) AS type_property, poison";

#[async_trait]
impl RecordBooks for MySqlPool {
    async fn begin_record_change(&self) -> Result<Box<dyn RecordChange>, sqlx::Error> {
        Ok(Box::new(MySqlOperatorTx(self.begin().await?)))
    }
}

#[async_trait]
impl RecordChange for MySqlOperatorTx {
    async fn lock(&mut self, id: i64) -> Result<Option<LockedRecord>, sqlx::Error> {
        let sql = format!(
            "SELECT CAST(status AS CHAR) AS status, CAST(lease_owner AS CHAR) AS lease_owner, lease_token,
                    lease_expires_at, COALESCE(lease_expires_at < UTC_TIMESTAMP(6), FALSE) AS lease_expired,
                    parked_at IS NOT NULL AS parked, version, {STORED_MESSAGE}
             FROM dedup_records WHERE id = ? FOR UPDATE"
        );
        sqlx::query_as(&sql).bind(id).fetch_optional(&mut *self.0).await
    }

    async fn transition(
        &mut self,
        record: &LockedRecord,
        from: RecordStatus,
        change: RecordTransition<'_>,
    ) -> Result<(), sqlx::Error> {
        let id = record.id();
        let conn = &mut *self.0;
        let (to, attempt) = match change {
            RecordTransition::Release { requeue, note } => {
                sqlx::query(
                    "UPDATE dedup_records SET status = 'failed', version = version + 1, lease_owner = NULL,
                            lease_token = NULL, lease_expires_at = NULL,
                            max_attempts = GREATEST(max_attempts, attempts + 1),
                            next_attempt_at = IF(?, UTC_TIMESTAMP(6), NULL),
                            parked_at = IF(?, NULL, parked_at), updated_at = UTC_TIMESTAMP(6)
                     WHERE id = ? AND status = 'processing'",
                )
                .bind(requeue)
                .bind(requeue)
                .bind(id)
                .execute(&mut *conn)
                .await?;
                (RecordStatus::Failed, Some(("released", note)))
            }
            RecordTransition::MarkSucceeded { note } => {
                sqlx::query(
                    "UPDATE dedup_records SET status = 'succeeded', version = version + 1, lease_owner = NULL,
                            lease_token = NULL, lease_expires_at = NULL, completed_at = UTC_TIMESTAMP(6),
                            next_attempt_at = NULL, parked_at = NULL, payload = NULL, headers = NULL,
                            error_class = NULL, updated_at = UTC_TIMESTAMP(6)
                     WHERE id = ? AND status = ?",
                )
                .bind(id)
                .bind(from.as_str())
                .execute(&mut *conn)
                .await?;
                (RecordStatus::Succeeded, Some(("succeeded", note)))
            }
            RecordTransition::DeadLetter { note } => {
                sqlx::query(
                    "UPDATE dedup_records SET status = 'dead', version = version + 1, lease_owner = NULL,
                            lease_token = NULL, lease_expires_at = NULL, next_attempt_at = NULL,
                            last_error = ?, error_class = ?, updated_at = UTC_TIMESTAMP(6)
                     WHERE id = ? AND status = ?",
                )
                .bind(note)
                .bind(HAND_DEAD_LETTER_CLASS)
                .bind(id)
                .bind(from.as_str())
                .execute(&mut *conn)
                .await?;
                (RecordStatus::Dead, Some(("dead", note)))
            }
            RecordTransition::Requeue => return make_claimable(conn, &[id]).await,
        };
        if let Some((outcome, note)) = attempt {
            sqlx::query(
                "UPDATE record_attempts SET ended_at = UTC_TIMESTAMP(6), outcome = ?, error = ?
                 WHERE record_id = ? AND ended_at IS NULL",
            )
            .bind(outcome)
            .bind(note)
            .bind(id)
            .execute(&mut *conn)
            .await?;
        }
        count_move(conn, record.consumer_group(), from, to).await
    }
}

/// The status counts' delta rows of one record of `group` moved from `from` to `to` (none when
/// it stays).
async fn count_move(
    conn: &mut MySqlConnection,
    group: &str,
    from: RecordStatus,
    to: RecordStatus,
) -> Result<(), sqlx::Error> {
    if from == to {
        return Ok(());
    }
    sqlx::query("INSERT INTO record_counts (consumer_group, status, n) VALUES (?, ?, -1), (?, ?, 1)")
        .bind(group.as_bytes())
        .bind(from.as_str())
        .bind(group.as_bytes())
        .bind(to.as_str())
        .execute(conn)
        .await?;
    Ok(())
}

/// `failed`/`dead` → `failed`, claimable now (one more attempt when none is left), for rows the
/// caller has locked and checked, with the status counts' delta rows of those that were `dead`.
/// Shared by the single and the bulk requeue.
pub(super) async fn make_claimable(conn: &mut MySqlConnection, ids: &[i64]) -> Result<(), sqlx::Error> {
    if ids.is_empty() {
        return Ok(());
    }
    let list = super::sql::repeat("?", ids.len());
    for (status, sign) in [("dead", "-"), ("failed", "")] {
        let sql = format!(
            "INSERT INTO record_counts (consumer_group, status, n)
             SELECT consumer_group, '{status}', {sign}COUNT(*) FROM dedup_records
             WHERE id IN ({list}) AND status = 'dead' GROUP BY consumer_group"
        );
        let mut q = sqlx::query(&sql);
        for id in ids {
            q = q.bind(id);
        }
        q.execute(&mut *conn).await?;
    }
    let sql = format!(
        "UPDATE dedup_records SET status = 'failed', version = version + 1,
                max_attempts = GREATEST(max_attempts, attempts + 1),
                next_attempt_at = UTC_TIMESTAMP(6), parked_at = NULL, updated_at = UTC_TIMESTAMP(6)
         WHERE id IN ({list}) AND status IN ('failed', 'dead')"
    );
    let mut q = sqlx::query(&sql);
    for id in ids {
        q = q.bind(id);
    }
    q.execute(conn).await.map(drop)
}
