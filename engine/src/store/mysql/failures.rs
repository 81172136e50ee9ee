//! MySQL's failure reads ([`FailureReads`]): the records not succeeded read through
//! `dedup_records_unsettled_idx` (`unsettled_status`, id), the stand-in for PostgreSQL's
//! partial indexes; the retries' and dead letters' cells from `dedup_records_status_cells_idx`
//! alone, by `status` (MariaDB 10.11 was seen to read an index on the generated
//! `unsettled_status` alone only on a prepared statement's first execution and to look up every
//! row on the next ones: 0.5 s at 10 000 failed records where the index alone takes 3 ms).
//! Dead letters are read per (class, type) and grouped here: MySQL's `GROUP_CONCAT` is cut at `group_concat_max_len` (1 024 bytes by default on MySQL 8) and
//! `JSON_ARRAYAGG` takes no `ORDER BY` there.

use std::collections::BTreeMap;

use async_trait::async_trait;
use chrono::{DateTime, NaiveDateTime, Utc};
use sqlx::FromRow;
use sqlx::mysql::MySqlPool;

use crate::console::QueryError;
use crate::console::endpoints::DeadLetterClass;
use crate::console::failures::{CRASH_LOOP_REENTRIES, DeadLetterGroup, FailureReads, RetryCell, StuckList};
use crate::console::overview::OverviewReads;

/// Dead records of one (class, type).
#[derive(FromRow)]
struct DeadCell {
    error_class: Option<String>,
    message_type: String,
    records: i64,
    first_seen_at: DateTime<Utc>,
    last_seen_at: DateTime<Utc>,
}

#[async_trait]
impl FailureReads for MySqlPool {
    async fn stuck_records(&self, limit: i64) -> Result<StuckList, QueryError> {
        let rows = async {
            sqlx::query_as(
                "SELECT id, CAST(consumer_group AS CHAR) AS consumer_group, CAST(message_id AS CHAR) AS message_id,
                        CAST(message_type AS CHAR) AS message_type, CAST(handler_mode AS CHAR) AS handler_mode,
                        CAST(lease_owner AS CHAR) AS lease_owner, lease_token, lease_expires_at,
                        TIMESTAMPDIFF(SECOND, lease_expires_at, UTC_TIMESTAMP(6)) AS stuck_secs, updated_at, attempts,
                        max_attempts, reentries, reentries >= ? AS crash_loop, parked_at
                 FROM dedup_records WHERE unsettled_status = 'processing' AND lease_expires_at < UTC_TIMESTAMP(6)
                 ORDER BY lease_expires_at, id LIMIT ?",
            )
            .bind(CRASH_LOOP_REENTRIES)
            .bind(limit)
            .fetch_all(self)
            .await
            .map_err(QueryError::from)
        };
        let (rows, total) = tokio::try_join!(rows, self.stuck_count())?;
        Ok(StuckList { total, rows })
    }

    async fn retry_cells(&self) -> Result<(Vec<RetryCell>, Option<DateTime<Utc>>), QueryError> {
        let cells = async {
            sqlx::query_as(
                "SELECT attempts, CAST(message_type AS CHAR) AS message_type, COUNT(*) AS records
                 FROM dedup_records FORCE INDEX (dedup_records_status_cells_idx)
                 WHERE status = 'failed' GROUP BY attempts, message_type",
            )
            .fetch_all(self)
            .await
            .map_err(QueryError::from)
        };
        let next = async {
            sqlx::query_scalar::<_, Option<NaiveDateTime>>(
                "SELECT MIN(next_attempt_at) FROM dedup_records FORCE INDEX (dedup_records_status_cells_idx)
                 WHERE status = 'failed'",
            )
            .fetch_one(self)
            .await
            .map(|t| t.map(|t| t.and_utc()))
            .map_err(QueryError::from)
        };
        Ok(tokio::try_join!(cells, next)?)
    }

    async fn dead_letter_groups(&self, limit: i64) -> Result<Vec<DeadLetterGroup>, QueryError> {
        let cells: Vec<DeadCell> = sqlx::query_as(
            // Grouped by the class's bytes: its column's collation pads spaces, which would make
            // `BOOM` and `BOOM ` one class (PostgreSQL keeps them apart).
            "SELECT CAST(class AS CHAR) AS error_class, CAST(message_type AS CHAR) AS message_type, records,
                    first_seen_at, last_seen_at
             FROM (SELECT CAST(error_class AS BINARY) AS class, message_type, COUNT(*) AS records,
                          MIN(first_seen_at) AS first_seen_at, MAX(updated_at) AS last_seen_at
                   FROM dedup_records FORCE INDEX (dedup_records_status_cells_idx)
                   WHERE status = 'dead' GROUP BY class, message_type) cells",
        )
        .fetch_all(self)
        .await?;
        Ok(group_dead_cells(cells, usize::try_from(limit).unwrap_or(0)))
    }
}

/// PostgreSQL's grouping of the dead letters, over (class, type) cells: one group per class,
/// its types sorted; HTTP handlers' classes first, then the most records, then by class.
fn group_dead_cells(cells: Vec<DeadCell>, limit: usize) -> Vec<DeadLetterGroup> {
    let mut groups: BTreeMap<Option<String>, DeadLetterGroup> = BTreeMap::new();
    for cell in cells {
        let group = groups.entry(cell.error_class.clone()).or_insert_with(|| DeadLetterGroup {
            error_class: cell.error_class,
            records: 0,
            first_seen_at: cell.first_seen_at,
            last_seen_at: cell.last_seen_at,
            message_types: Vec::new(),
        });
        group.records += cell.records;
        group.first_seen_at = group.first_seen_at.min(cell.first_seen_at);
        group.last_seen_at = group.last_seen_at.max(cell.last_seen_at);
        group.message_types.push(cell.message_type);
    }
    let http = DeadLetterClass::http_error_classes();
    let is_http = |g: &DeadLetterGroup| g.error_class.as_deref().is_some_and(|c| http.contains(&c));
    let mut groups: Vec<DeadLetterGroup> = groups.into_values().collect();
    groups.iter_mut().for_each(|g| g.message_types.sort());
    // PostgreSQL sorts a NULL class last among equals (ORDER BY … error_class).
    groups.sort_by(|a, b| {
        is_http(b)
            .cmp(&is_http(a))
            .then(b.records.cmp(&a.records))
            .then_with(|| a.error_class.is_none().cmp(&b.error_class.is_none()))
            .then_with(|| a.error_class.cmp(&b.error_class))
    });
    groups.truncate(limit);
    groups
}
