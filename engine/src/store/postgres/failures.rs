//! PostgreSQL's failure reads ([`FailureReads`]) over the partial indexes of the records not
//! succeeded: the stuck, the failed, and the dead by class (`dedup_records_dead_class_idx`).

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::PgPool;

use crate::console::QueryError;
use crate::console::endpoints::DeadLetterClass;
use crate::console::failures::{CRASH_LOOP_REENTRIES, DeadLetterGroup, FailureReads, RetryCell, StuckList};
use crate::console::overview::OverviewReads;

#[async_trait]
impl FailureReads for PgPool {
    async fn stuck_records(&self, limit: i64) -> Result<StuckList, QueryError> {
        let rows = async {
            sqlx::query_as(
                "SELECT id, consumer_group, message_id, message_type, handler_mode, lease_owner, lease_token,
                        lease_expires_at, extract(epoch FROM now() - lease_expires_at)::bigint AS stuck_secs,
                        updated_at, attempts, max_attempts, reentries, reentries >= $2 AS crash_loop, parked_at
                 FROM dedup_records WHERE status = 'processing' AND lease_expires_at < now()
                 ORDER BY lease_expires_at, id LIMIT $1",
            )
            .bind(limit)
            .bind(CRASH_LOOP_REENTRIES)
            .fetch_all(self)
            .await
            .map_err(QueryError::from)
        };
        let (rows, total) = tokio::try_join!(rows, self.stuck_count())?;
        Ok(StuckList { total, rows })
    }

    async fn retry_cells(&self) -> Result<(Vec<RetryCell>, Option<DateTime<Utc>>), QueryError> {
        // One index-only pass over the failed records; one probe of their retry-time index.
        let cells = async {
            sqlx::query_as(
                "SELECT attempts, message_type, count(*) AS records FROM dedup_records WHERE status = 'failed'
                 GROUP BY attempts, message_type",
            )
            .fetch_all(self)
            .await
            .map_err(QueryError::from)
        };
        let next = async {
            sqlx::query_scalar(
                "SELECT next_attempt_at FROM dedup_records WHERE status = 'failed' AND next_attempt_at IS NOT NULL
                 ORDER BY next_attempt_at LIMIT 1",
            )
            .fetch_optional(self)
            .await
            .map_err(QueryError::from)
        };
        Ok(tokio::try_join!(cells, next)?)
    }

    async fn dead_letter_groups(&self, limit: i64) -> Result<Vec<DeadLetterGroup>, QueryError> {
        // Grouped by (class, type) first, so no per-group sort of the types is needed; one
        // index-only pass over dedup_records_dead_class_idx (error_class, first_seen_at, id)
        // INCLUDE (message_type, updated_at) WHERE dead.
        Ok(sqlx::query_as(
            "SELECT error_class, sum(records)::bigint AS records, min(first_seen_at) AS first_seen_at,
                    max(last_seen_at) AS last_seen_at, array_agg(message_type ORDER BY message_type) AS message_types
             FROM (SELECT error_class, message_type, count(*) AS records, min(first_seen_at) AS first_seen_at,
                          max(updated_at) AS last_seen_at
                   FROM dedup_records WHERE status = 'dead' GROUP BY error_class, message_type) AS by_type
             GROUP BY error_class
             ORDER BY COALESCE(error_class = ANY($2), false) DESC, sum(records) DESC, error_class LIMIT $1",
        )
        .bind(limit)
        .bind(DeadLetterClass::http_error_classes())
        .fetch_all(self)
        .await?)
    }
}
