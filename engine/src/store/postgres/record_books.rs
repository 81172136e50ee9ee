//! PostgreSQL's records for the single-record operator actions ([`RecordBooks`]): the row
//! locked by `SELECT … FOR UPDATE`, each transition one conditional `UPDATE` (the status counts
//! follow by trigger), the open attempt closed beside it, the audit entry in the transaction.

use async_trait::async_trait;
use sqlx::{PgConnection, PgPool};

use super::operator_tx::PgOperatorTx;
use crate::actions::record::{HAND_DEAD_LETTER_CLASS, LockedRecord, RecordBooks, RecordChange, RecordTransition};
use crate::actions::republish::StoredMessage;
use crate::record::RecordStatus;

#[async_trait]
impl RecordBooks for PgPool {
    async fn begin_record_change(&self) -> Result<Box<dyn RecordChange>, sqlx::Error> {
        Ok(Box::new(PgOperatorTx(self.begin().await?)))
    }
}

#[async_trait]
impl RecordChange for PgOperatorTx {
    async fn lock(&mut self, id: i64) -> Result<Option<LockedRecord>, sqlx::Error> {
        let sql = format!(
            "SELECT consumer_group, status, lease_owner, lease_token, lease_expires_at,
                    COALESCE(lease_expires_at < now(), false) AS lease_expired, parked_at IS NOT NULL AS parked,
                    version, {}
             FROM dedup_records WHERE id = $1 FOR UPDATE",
            StoredMessage::COLUMNS
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
        let (outcome, note) = match change {
            RecordTransition::Release { requeue, note } => {
                sqlx::query(
                    "UPDATE dedup_records SET status = 'failed', version = version + 1, lease_owner = NULL,
                            lease_token = NULL, lease_expires_at = NULL,
                            max_attempts = GREATEST(max_attempts, attempts + 1),
                            next_attempt_at = CASE WHEN $2 THEN now() END,
                            parked_at = CASE WHEN $2 THEN NULL ELSE parked_at END, updated_at = now()
                     WHERE id = $1 AND status = 'processing'",
                )
                .bind(id)
                .bind(requeue)
                .execute(&mut *conn)
                .await?;
                ("released", note)
            }
            RecordTransition::MarkSucceeded { note } => {
                sqlx::query(
                    "UPDATE dedup_records SET status = 'succeeded', version = version + 1, lease_owner = NULL,
                            lease_token = NULL, lease_expires_at = NULL, completed_at = now(),
                            next_attempt_at = NULL, parked_at = NULL, payload = NULL, headers = NULL,
                            error_class = NULL, updated_at = now()
                     WHERE id = $1 AND status = $2",
                )
                .bind(id)
                .bind(from.as_str())
                .execute(&mut *conn)
                .await?;
                ("succeeded", note)
            }
            RecordTransition::DeadLetter { note } => {
                sqlx::query(
                    "UPDATE dedup_records SET status = 'dead', version = version + 1, lease_owner = NULL,
                            lease_token = NULL, lease_expires_at = NULL, next_attempt_at = NULL,
                            last_error = $3, error_class = $4, updated_at = now()
                     WHERE id = $1 AND status = $2",
                )
                .bind(id)
                .bind(from.as_str())
                .bind(note)
                .bind(HAND_DEAD_LETTER_CLASS)
                .execute(&mut *conn)
                .await?;
                ("dead", note)
            }
            RecordTransition::Requeue => return make_claimable(conn, &[id]).await,
        };
        sqlx::query(
            "UPDATE record_attempts SET ended_at = now(), outcome = $2, error = $3
             WHERE record_id = $1 AND ended_at IS NULL",
        )
        .bind(id)
        .bind(outcome)
        .bind(note)
        .execute(conn)
        .await?;
        Ok(())
    }
}

/// `failed`/`dead` → `failed`, claimable now (one more attempt when none is left), for rows the
/// caller has locked and checked. Shared by the single and the bulk requeue.
pub(super) async fn make_claimable(conn: &mut PgConnection, ids: &[i64]) -> Result<(), sqlx::Error> {
    sqlx::query(
        "UPDATE dedup_records SET status = 'failed', version = version + 1,
                max_attempts = GREATEST(max_attempts, attempts + 1),
                next_attempt_at = now(), parked_at = NULL, updated_at = now()
         WHERE id = ANY($1) AND status IN ('failed', 'dead')",
    )
    .bind(ids)
    .execute(conn)
    .await?;
    Ok(())
}
