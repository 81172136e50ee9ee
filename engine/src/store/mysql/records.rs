//! MySQL's records list ([`RecordReads`]): the same filters, orders and keyset pages as
//! PostgreSQL's, in MySQL's terms. A status other than `succeeded` reads
//! `dedup_records_unsettled_idx`; a message id or prefix goes to the dedup key. Keys are bytes,
//! so orders by message id compare bytes (PostgreSQL's `COLLATE "C"`). What MySQL lacks: no
//! `LATERAL` on MariaDB (the message-id order reads each group in its own part of a `UNION ALL`,
//! the groups listed first), no id range for a time filter yet (`first_seen_at` is compared
//! directly: correct, but not yet measured at 1 M records; docs/research/store-seam.md).

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::mysql::MySqlPool;
use sqlx::{MySql, QueryBuilder};

use crate::console::QueryError;
use crate::console::filter::{CursorKey, RecordFilter, RecordFlag, SortKey, SortOrder, prefix_upper_bound};
use crate::console::records::{ANSWER_CHARS, AttemptRow, RecordDetail, RecordReads, RecordRow, RowsQuery};
use crate::record::RecordStatus;

/// The list's columns of `d` (`_bin` text and bytes read `AS CHAR`). An order names `d.`'s
/// columns: an unqualified name would be the cast alias, compared by the connection's collation.
const ROW_COLUMNS: &str = "d.id, CAST(d.consumer_group AS CHAR) AS consumer_group, CAST(d.message_id AS CHAR) AS message_id,
     CAST(d.message_type AS CHAR) AS message_type, CAST(d.status AS CHAR) AS status,
     CAST(d.handler_mode AS CHAR) AS handler_mode, d.attempts, d.max_attempts, d.first_seen_at, d.updated_at,
     d.next_attempt_at, CAST(d.error_class AS CHAR) AS error_class, d.duplicate_count";

/// The consumer groups that have records.
const KNOWN_GROUPS_SQL: &str = "SELECT consumer_group FROM record_counts GROUP BY consumer_group";

/// Appends the `WHERE` conditions of `filter` on `d` (always at least `TRUE`), every value bound.
pub(super) fn push_filter(q: &mut QueryBuilder<'_, MySql>, filter: &RecordFilter) {
    q.push(" WHERE TRUE");
    if let Some(group) = &filter.group {
        q.push(" AND d.consumer_group = ").push_bind(group.as_bytes().to_vec());
    } else if filter.message_id.is_some() || filter.id_prefix.is_some() {
        q.push(format!(" AND d.consumer_group IN ({KNOWN_GROUPS_SQL})"));
    }
    match filter.status {
        Some(RecordStatus::Succeeded) => {
            q.push(" AND d.status = 'succeeded'");
        }
        Some(status) => {
            // Both columns, so that either index serves: `dedup_records_unsettled_idx` the id
            // order, `dedup_records_status_cells_idx` the attempts order.
            q.push(" AND d.status = ").push_bind(status.as_str());
            q.push(" AND d.unsettled_status = ").push_bind(status.as_str());
        }
        None => {}
    }
    if let Some(t) = &filter.message_type {
        q.push(" AND d.message_type = ").push_bind(t.as_bytes().to_vec());
    }
    if let Some(class) = &filter.error_class {
        q.push(" AND d.error_class = ").push_bind(class.clone());
    }
    if let Some(from) = filter.from {
        q.push(" AND d.first_seen_at >= ").push_bind(from.naive_utc());
    }
    if let Some(to) = filter.to {
        q.push(" AND d.first_seen_at < ").push_bind(to.naive_utc());
    }
    if let Some(n) = filter.min_attempts {
        q.push(" AND d.attempts >= ").push_bind(n);
    }
    if let Some(id) = &filter.message_id {
        q.push(" AND d.message_id = ").push_bind(id.as_bytes().to_vec());
    }
    if let Some(prefix) = &filter.id_prefix {
        q.push(" AND d.message_id >= ").push_bind(prefix.as_bytes().to_vec());
        if let Some(upper) = prefix_upper_bound(prefix) {
            q.push(" AND d.message_id < ").push_bind(upper.into_bytes());
        }
    }
    match filter.flag {
        Some(RecordFlag::DoubleEffect) => {
            q.push(" AND d.id IN (SELECT record_id FROM record_attempts WHERE late_effect = TRUE)");
        }
        Some(RecordFlag::LateDuplicate) => {
            q.push(" AND d.id IN (SELECT record_id FROM late_duplicates)");
        }
        Some(RecordFlag::Conflict) => {
            q.push(" AND d.id IN (SELECT record_id FROM record_conflicts WHERE settled_at IS NULL)");
        }
        None => {}
    }
}

#[async_trait]
impl RecordReads for MySqlPool {
    async fn record_rows(&self, query: &RowsQuery<'_>) -> Result<Vec<RecordRow>, QueryError> {
        let (cmp, dir) = match query.direction {
            SortOrder::Desc => ("<", "DESC"),
            SortOrder::Asc => (">", "ASC"),
        };
        let mut q: QueryBuilder<'_, MySql> = QueryBuilder::new("");
        match query.sort {
            SortKey::Time => {
                q.push(format!("SELECT {ROW_COLUMNS} FROM dedup_records d"));
                push_filter(&mut q, query.filter);
                if let Some(c) = query.cursor {
                    q.push(format!(" AND d.id {cmp} ")).push_bind(c.id);
                }
                match (query.window_end, query.direction) {
                    (Some(end), SortOrder::Desc) => q.push(" AND d.id >= ").push_bind(end),
                    (Some(end), SortOrder::Asc) => q.push(" AND d.id <= ").push_bind(end),
                    (None, _) => &mut q,
                };
                q.push(format!(" ORDER BY d.id {dir} LIMIT ")).push_bind(query.rows);
            }
            SortKey::Attempts => {
                // Three ordered parts merged, as PostgreSQL's: the first tries apart from the rest.
                q.push("SELECT * FROM (");
                for (n, part) in ["d.attempts > 1", "d.attempts = 1", "d.attempts < 1"].into_iter().enumerate() {
                    if n > 0 {
                        q.push(" UNION ALL ");
                    }
                    q.push(format!("(SELECT {ROW_COLUMNS} FROM dedup_records d"));
                    push_filter(&mut q, query.filter);
                    q.push(format!(" AND {part}"));
                    if let Some(c) = query.cursor {
                        let CursorKey::Attempts(a) = c.key else { unreachable!("the cursor's sort is checked") };
                        // The bound on attempts alone as well: MariaDB takes no range from the row
                        // comparison, and a part would scan its whole attempts range (break review:
                        // a previous page took 4.7-6.1 s at 1 M records).
                        q.push(format!(" AND d.attempts {cmp}= ")).push_bind(a);
                        q.push(format!(" AND (d.attempts, d.id) {cmp} (")).push_bind(a).push(", ").push_bind(c.id).push(")");
                    }
                    q.push(format!(" ORDER BY d.attempts {dir}, d.id {dir} LIMIT ")).push_bind(query.rows).push(")");
                }
                q.push(format!(") parts ORDER BY attempts {dir}, id {dir} LIMIT ")).push_bind(query.rows);
            }
            SortKey::MessageId => {
                // The dedup key leads with the group: each group is one part, merged by the key's bytes.
                let groups: Vec<Vec<u8>> = match &query.filter.group {
                    Some(group) => vec![group.as_bytes().to_vec()],
                    None => sqlx::query_scalar(KNOWN_GROUPS_SQL).fetch_all(self).await?,
                };
                if groups.is_empty() {
                    return Ok(Vec::new());
                }
                q.push("SELECT * FROM (");
                for (n, group) in groups.into_iter().enumerate() {
                    if n > 0 {
                        q.push(" UNION ALL ");
                    }
                    q.push(format!("(SELECT {ROW_COLUMNS}, d.message_id AS sort_key FROM dedup_records d"));
                    push_filter(&mut q, query.filter);
                    q.push(" AND d.consumer_group = ").push_bind(group);
                    if let Some(c) = query.cursor {
                        // (message_id, id) past the cursor, spelled as one range of the dedup key
                        // from the cursor's id on, less the rows not past it (a row comparison or an
                        // OR of two ranges read 2-4× slower on MariaDB).
                        let CursorKey::MessageId(m) = &c.key else { unreachable!("the cursor's sort is checked") };
                        let not_past = if cmp == ">" { "<=" } else { ">=" };
                        q.push(format!(" AND d.message_id {cmp}= ")).push_bind(m.as_bytes().to_vec());
                        q.push(" AND NOT (d.message_id = ").push_bind(m.as_bytes().to_vec());
                        q.push(format!(" AND d.id {not_past} ")).push_bind(c.id).push(")");
                    }
                    // A message id is unique in its group: ordered by it alone, the part reads the
                    // dedup key in order (with the id as well, MariaDB sorted the whole group).
                    q.push(format!(" ORDER BY d.message_id {dir} LIMIT ")).push_bind(query.rows).push(")");
                }
                q.push(format!(") r ORDER BY sort_key {dir}, id {dir} LIMIT ")).push_bind(query.rows);
            }
        }
        Ok(q.build_query_as().fetch_all(self).await?)
    }

    async fn id_bounds(&self) -> Result<Option<(i64, i64)>, QueryError> {
        let (min, max): (Option<i64>, Option<i64>) =
            sqlx::query_as("SELECT MIN(id), MAX(id) FROM dedup_records").fetch_one(self).await?;
        Ok(min.zip(max))
    }

    async fn record_fields(&self, id: i64) -> Result<Option<RecordDetail>, QueryError> {
        // The headers as JSON text (MariaDB's JSON is text); id_source as its byte's code, as
        // PostgreSQL's "char" reads.
        let sql = format!(
            "SELECT {ROW_COLUMNS}, d.reentries, CAST(d.lease_owner AS CHAR) AS lease_owner, d.lease_token,
                    d.lease_expires_at, COALESCE(d.lease_expires_at < UTC_TIMESTAMP(6), FALSE) AS lease_expired,
                    d.version, d.completed_at, d.last_error, LOWER(HEX(d.payload_hash)) AS payload_hash, d.payload,
                    d.payload_truncated, CAST(d.headers AS CHAR) AS headers, CAST(d.content_type AS CHAR) AS content_type,
                    CAST(d.source_broker AS CHAR) AS source_broker, CAST(d.source_exchange AS CHAR) AS source_exchange,
                    CAST(d.source_routing_key AS CHAR) AS source_routing_key,
                    CAST(d.source_queue AS CHAR) AS source_queue, d.last_duplicate_at,
                    CAST(TIMESTAMPDIFF(MICROSECOND, d.first_seen_at, d.last_duplicate_at) / 1000 AS SIGNED)
                        AS last_duplicate_delay_ms,
                    d.payload_conflicts, d.parked_at, ASCII(d.id_source) AS id_source
             FROM dedup_records d WHERE d.id = ?"
        );
        Ok(sqlx::query_as(&sql).bind(id).fetch_optional(self).await?)
    }

    async fn attempt_rows(&self, id: i64) -> Result<Vec<AttemptRow>, QueryError> {
        Ok(sqlx::query_as(
            "SELECT attempt, CAST(worker AS CHAR) AS worker, started_at, ended_at, CAST(outcome AS CHAR) AS outcome, error,
                    CAST(taken_over_by AS CHAR) AS taken_over_by, late_effect, answer_status, latency_ms,
                    LEFT(answer, ?) AS answer
             FROM record_attempts WHERE record_id = ? ORDER BY attempt, id",
        )
        .bind(ANSWER_CHARS)
        .bind(id)
        .fetch_all(self)
        .await?)
    }

    async fn late_duplicate_note(&self, id: i64) -> Result<Option<(DateTime<Utc>, i64, bool)>, QueryError> {
        Ok(sqlx::query_as("SELECT first_seen_at, delay_ms, held FROM late_duplicates WHERE record_id = ?")
            .bind(id)
            .fetch_optional(self)
            .await?)
    }
}
