//! MySQL's records list ([`RecordReads`]): the same filters, orders and keyset pages as
//! PostgreSQL's, in MySQL's terms. A status other than `succeeded` reads
//! `dedup_records_unsettled_idx`; a message id or prefix goes to the dedup key. Keys are bytes,
//! so orders by message id compare bytes (PostgreSQL's `COLLATE "C"`). What MySQL lacks: no
//! `LATERAL` on MariaDB (the message-id order reads each group in its own part of a `UNION ALL`,
//! the groups listed first); a time range becomes an id range by a binary search over the
//! primary key ([`ArrivalIds`]) where PostgreSQL calls `dedup_records_id_at`.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::mysql::MySqlPool;
use sqlx::{MySql, QueryBuilder};

use super::arrival::ArrivalIds;
use crate::console::QueryError;
use crate::console::filter::{Cursor, CursorKey, RecordFilter, RecordFlag, SortKey, SortOrder, prefix_upper_bound};
use crate::console::records::{ANSWER_CHARS, AttemptRow, RecordDetail, RecordReads, RecordRow, RowsQuery};
use crate::record::RecordStatus;
use crate::store::attempts_order::{AttemptsPart, PartBound};

/// The list's columns of `d` (`_bin` text and bytes read `AS CHAR`). An order names `d.`'s
/// columns: an unqualified name would be the cast alias, compared by the connection's collation.
const ROW_COLUMNS: &str = "d.id, CAST(d.consumer_group AS CHAR) AS consumer_group, CAST(d.message_id AS CHAR) AS message_id,
     CAST(d.message_type AS CHAR) AS message_type, CAST(d.status AS CHAR) AS status,
     CAST(d.handler_mode AS CHAR) AS handler_mode, d.attempts, d.max_attempts, d.first_seen_at, d.updated_at,
     d.next_attempt_at, CAST(d.error_class AS CHAR) AS error_class, d.duplicate_count";

/// The consumer groups that have records.
const KNOWN_GROUPS_SQL: &str = "SELECT consumer_group FROM record_counts GROUP BY consumer_group";

/// Appends the `WHERE` conditions of `filter` on `d` (always at least `TRUE`), every value bound;
/// `ids` are its time range's ids ([`ArrivalIds::of`]), so that a time range reads a stretch of
/// the primary key.
pub(super) fn push_filter(q: &mut QueryBuilder<'_, MySql>, filter: &RecordFilter, ids: ArrivalIds) {
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
            // order, `dedup_records_status_cells_idx` the attempts order. Under an error class,
            // the status alone: `dedup_records_dead_class_idx` then serves, where naming both
            // made MariaDB merge two indexes and read the status's whole range (840 entries
            // against 51 for a class of 50 at 100 000 records).
            q.push(" AND d.status = ").push_bind(status.as_str());
            if filter.error_class.is_none() {
                q.push(" AND d.unsettled_status = ").push_bind(status.as_str());
            }
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
    if let Some(id) = ids.from_id {
        q.push(" AND d.id >= ").push_bind(id);
    }
    if let Some(id) = ids.to_id {
        q.push(" AND d.id < ").push_bind(id);
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
        let not_past = query.direction.reversed().past(true);
        let ids = ArrivalIds::of(self, query.filter).await?;
        let mut q: QueryBuilder<'_, MySql> = QueryBuilder::new("");
        match query.sort {
            SortKey::Time => {
                q.push(format!("SELECT {ROW_COLUMNS} FROM dedup_records d"));
                push_filter(&mut q, query.filter, ids);
                if let Some(c) = query.cursor {
                    q.push(format!(" AND d.id {cmp} ")).push_bind(c.id);
                }
                if let Some(end) = query.window_end {
                    q.push(format!(" AND d.id {not_past} ")).push_bind(end.id);
                }
                q.push(format!(" ORDER BY d.id {dir} LIMIT ")).push_bind(query.rows);
            }
            SortKey::Attempts => {
                push_attempts_parts(&mut q, ROW_COLUMNS, query, ids);
                q.push(" LIMIT ").push_bind(query.rows);
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
                    push_filter(&mut q, query.filter, ids);
                    q.push(" AND d.consumer_group = ").push_bind(group);
                    if let Some(c) = query.cursor {
                        // (message_id, id) past the cursor, spelled as one range of the dedup key
                        // from the cursor's id on, less the rows not past it (a row comparison or an
                        // OR of two ranges read 2-4× slower on MariaDB).
                        let CursorKey::MessageId(m) = &c.key else { unreachable!("the cursor's sort is checked") };
                        q.push(format!(" AND d.message_id {cmp}= ")).push_bind(m.as_bytes().to_vec());
                        q.push(" AND NOT (d.message_id = ").push_bind(m.as_bytes().to_vec());
                        q.push(format!(" AND d.id {not_past} ")).push_bind(c.id).push(")");
                    }
                    if let Some(end) = query.window_end {
                        // Not past the window's far end, spelled as the cursor is.
                        let CursorKey::MessageId(m) = &end.key else { unreachable!("the window's sort is the list's") };
                        q.push(format!(" AND d.message_id {not_past} ")).push_bind(m.as_bytes().to_vec());
                        q.push(" AND NOT (d.message_id = ").push_bind(m.as_bytes().to_vec());
                        q.push(format!(" AND d.id {cmp} ")).push_bind(end.id).push(")");
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

    async fn attempts_window_end(
        &self,
        from: Option<&Cursor>,
        direction: SortOrder,
        rows: i64,
    ) -> Result<Option<Cursor>, QueryError> {
        // The parts' (attempts, id) alone, of every record, from `dedup_records_attempts_idx`.
        let mut q: QueryBuilder<'_, MySql> = QueryBuilder::new("");
        let every = RecordFilter::default();
        let query = RowsQuery { filter: &every, sort: SortKey::Attempts, cursor: from, direction, rows, window_end: None };
        push_attempts_parts(&mut q, "d.attempts, d.id", &query, ArrivalIds::default());
        q.push(" LIMIT 2 OFFSET ").push_bind(rows - 1);
        let ends: Vec<(i32, i64)> = q.build_query_as().fetch_all(self).await?;
        // The window's far end only when a record lies past it.
        let end = ends.first().copied().filter(|_| ends.len() == 2);
        Ok(end.map(|(a, id)| Cursor { key: CursorKey::Attempts(a), id }))
    }

    async fn message_id_window_end(
        &self,
        group: Option<&str>,
        from: Option<&Cursor>,
        direction: SortOrder,
        rows: i64,
    ) -> Result<Option<Cursor>, QueryError> {
        let (cmp, dir) = match direction {
            SortOrder::Desc => ("<", "DESC"),
            SortOrder::Asc => (">", "ASC"),
        };
        let groups: Vec<Vec<u8>> = match group {
            Some(group) => vec![group.as_bytes().to_vec()],
            None => sqlx::query_scalar(KNOWN_GROUPS_SQL).fetch_all(self).await?,
        };
        // Each group's key `rows` keys on, from the dedup key alone (it holds the id); then the
        // nearest (UTF-8 compares as its bytes). A message id is unique in its group, so the cursor's id does not matter there.
        let mut ends: Vec<(String, i64)> = Vec::new();
        for group in groups {
            let mut q: QueryBuilder<'_, MySql> =
                QueryBuilder::new("SELECT CAST(message_id AS CHAR), id FROM dedup_records WHERE consumer_group = ");
            q.push_bind(group);
            if let Some(c) = from {
                let CursorKey::MessageId(m) = &c.key else { unreachable!("the cursor's sort is checked") };
                q.push(format!(" AND message_id {cmp} ")).push_bind(m.as_bytes().to_vec());
            }
            // The key and the one after it: a group whose keys end there has no window.
            q.push(format!(" ORDER BY message_id {dir} LIMIT 2 OFFSET ")).push_bind(rows - 1);
            let mut keys: Vec<(String, i64)> = q.build_query_as().fetch_all(self).await?;
            if keys.len() == 2 {
                ends.push(keys.swap_remove(0));
            }
        }
        let nearest = match direction {
            SortOrder::Desc => ends.into_iter().max(),
            SortOrder::Asc => ends.into_iter().min(),
        };
        Ok(nearest.map(|(m, id)| Cursor { key: CursorKey::MessageId(m), id }))
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

/// Attempts order as PostgreSQL reads it: three ordered parts (tried more than once, once,
/// never) merged, each bounded by ranges of `dedup_records_attempts_idx` (or, under a status,
/// `dedup_records_status_cells_idx`), the cursor and the window's far end reduced per part
/// ([`push_part_bound`]). `columns` of each part's rows; the rows merged, not yet limited.
fn push_attempts_parts(q: &mut QueryBuilder<'_, MySql>, columns: &str, query: &RowsQuery<'_>, ids: ArrivalIds) {
    let dir = match query.direction {
        SortOrder::Desc => "DESC",
        SortOrder::Asc => "ASC",
    };
    let position = |c: &Cursor| match c.key {
        CursorKey::Attempts(a) => (a, c.id),
        _ => unreachable!("the cursor's sort is checked"),
    };
    q.push("SELECT * FROM (");
    for (n, part) in AttemptsPart::ALL.into_iter().enumerate() {
        if n > 0 {
            q.push(" UNION ALL ");
        }
        q.push(format!("(SELECT {columns} FROM dedup_records d{}", attempts_index_hint(query.filter)));
        push_filter(q, query.filter, ids);
        q.push(format!(" AND {}", part.condition("d.")));
        if let Some(c) = query.cursor {
            push_part_bound(q, part, query.direction, false, position(c));
        }
        if let Some(end) = query.window_end {
            push_part_bound(q, part, query.direction.reversed(), true, position(end));
        }
        q.push(format!(" ORDER BY d.attempts {dir}, d.id {dir} LIMIT ")).push_bind(query.rows).push(")");
    }
    q.push(format!(") parts ORDER BY attempts {dir}, id {dir}"));
}

/// The index attempts order is read through, named where the filter leaves it the only good one:
/// MariaDB 10.11 reads the first tries before an id by `ref` on attempts alone rather than as a
/// range of (attempts, id), and looks every one of them up (a page past a first try half-way
/// down 1 M records: 1.7 s, named 20 ms). A status reads `dedup_records_status_cells_idx`; a
/// message id, a prefix, a flag or a time range is left to the optimizer (another index narrows
/// first).
fn attempts_index_hint(filter: &RecordFilter) -> &'static str {
    let elsewhere = filter.message_id.is_some()
        || filter.id_prefix.is_some()
        || filter.flag.is_some()
        || filter.from.is_some()
        || filter.to.is_some();
    match filter.status {
        _ if elsewhere => "",
        Some(_) => " FORCE INDEX (dedup_records_status_cells_idx)",
        None => " FORCE INDEX (dedup_records_attempts_idx)",
    }
}

/// Appends the bound "`(attempts, id)` past `(attempts, id)` in `direction`" (`inclusive`: or at
/// it) for the rows of `part` ([`AttemptsPart::bound`]): MariaDB takes no range from a row
/// comparison, so attempts past, or equal with the id past, as two ranges of the index.
fn push_part_bound(
    q: &mut QueryBuilder<'_, MySql>,
    part: AttemptsPart,
    direction: SortOrder,
    inclusive: bool,
    (attempts, id): (i32, i64),
) {
    let cmp = direction.past(inclusive);
    match part.bound(direction, attempts) {
        PartBound::Every => {}
        PartBound::No => {
            q.push(" AND FALSE");
        }
        PartBound::Id => {
            q.push(format!(" AND d.id {cmp} ")).push_bind(id);
        }
        PartBound::Row => {
            let strict = direction.past(false);
            q.push(" AND ((d.attempts = ").push_bind(attempts);
            q.push(format!(" AND d.id {cmp} ")).push_bind(id);
            q.push(format!(") OR d.attempts {strict} ")).push_bind(attempts).push(")");
        }
    }
}
