//! PostgreSQL's records list ([`RecordReads`]) and the filter it shares with bulk requeue
//! ([`push_filter`]): indexes of migration `..._lean_write_path` (a status other than
//! `succeeded` narrows to `dedup_records_unsettled_idx`; a time range becomes an id range on the
//! primary key, `dedup_records_id_at`; a message id or prefix goes to the dedup key, once per
//! group).

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::{PgPool, Postgres, QueryBuilder};

use crate::console::QueryError;
use crate::console::filter::{Cursor, CursorKey, RecordFilter, RecordFlag, SortKey, SortOrder, prefix_upper_bound};
use crate::console::records::{ANSWER_CHARS, AttemptRow, RecordDetail, RecordReads, RecordRow, RowsQuery};
use crate::store::attempts_order::{AttemptsPart, PartBound};

/// How far a time range is widened when it is turned into an id range
/// (`dedup_records_id_at`): ids follow arrival up to the length of the inserting transaction,
/// which a lease bounds. The time filter itself is applied exactly.
pub(crate) const ARRIVAL_SLACK: &str = "interval '10 minutes'";

/// The list's columns.
pub(crate) const ROW_COLUMNS: &str = "id, consumer_group, message_id, message_type, status, handler_mode, attempts, \
     max_attempts, first_seen_at, updated_at, next_attempt_at, error_class, duplicate_count";

/// The consumer groups that have records, for a message-id search across groups: the dedup key
/// leads with the group, so the search probes it once per group.
const KNOWN_GROUPS_SQL: &str = "ARRAY(SELECT consumer_group FROM record_counts GROUP BY 1)";

/// Appends the `WHERE` conditions of `filter` (always at least `true`), every value bound. Also
/// selects the records of a bulk requeue ([`crate::actions::bulk`]).
///
/// Indexes (migration `..._lean_write_path`): a status other than `succeeded` narrows to
/// `dedup_records_unsettled_idx`; a time range becomes an id range on the primary key
/// (`dedup_records_id_at`); a message id or prefix goes to the dedup key, once per group.
pub(super) fn push_filter(q: &mut QueryBuilder<'_, Postgres>, filter: &RecordFilter) {
    q.push(" WHERE true");
    if let Some(group) = &filter.group {
        q.push(" AND consumer_group = ").push_bind(group.clone());
    } else if filter.message_id.is_some() || filter.id_prefix.is_some() {
        q.push(format!(" AND consumer_group = ANY({KNOWN_GROUPS_SQL})"));
    }
    if let Some(status) = filter.status {
        q.push(" AND status = ").push_bind(status.as_str());
    }
    if let Some(t) = &filter.message_type {
        q.push(" AND message_type = ").push_bind(t.clone());
    }
    if let Some(class) = &filter.error_class {
        q.push(" AND error_class = ").push_bind(class.clone());
    }
    if let Some(from) = filter.from {
        q.push(" AND first_seen_at >= ").push_bind(from);
        q.push(" AND id >= (SELECT dedup_records_id_at(").push_bind(from).push(format!(" - {ARRIVAL_SLACK}))"));
    }
    if let Some(to) = filter.to {
        q.push(" AND first_seen_at < ").push_bind(to);
        q.push(" AND id < (SELECT dedup_records_id_at(").push_bind(to).push(format!(" + {ARRIVAL_SLACK}))"));
    }
    if let Some(n) = filter.min_attempts {
        q.push(" AND attempts >= ").push_bind(n);
    }
    if let Some(id) = &filter.message_id {
        q.push(" AND message_id = ").push_bind(id.clone());
    }
    if let Some(prefix) = &filter.id_prefix {
        q.push(" AND message_id >= ").push_bind(prefix.clone());
        if let Some(upper) = prefix_upper_bound(prefix) {
            q.push(" AND message_id < ").push_bind(upper);
        }
    }
    match filter.flag {
        // The few ids, read once from the partial index, then found by the primary key.
        Some(RecordFlag::DoubleEffect) => {
            q.push(" AND id = ANY(ARRAY(SELECT record_id FROM record_attempts WHERE late_effect))");
        }
        Some(RecordFlag::LateDuplicate) => {
            q.push(" AND id = ANY(ARRAY(SELECT record_id FROM late_duplicates))");
        }
        Some(RecordFlag::Conflict) => {
            q.push(" AND id = ANY(ARRAY(SELECT record_id FROM record_conflicts WHERE settled_at IS NULL))");
        }
        None => {}
    }
}

#[async_trait]
impl RecordReads for PgPool {
    async fn record_rows(&self, query: &RowsQuery<'_>) -> Result<Vec<RecordRow>, QueryError> {
        let (cmp, dir) = match query.direction {
            SortOrder::Desc => ("<", "DESC"),
            SortOrder::Asc => (">", "ASC"),
        };
        let cursor = query.cursor;
        let mut q = QueryBuilder::new("");
        match query.sort {
            SortKey::Time => {
                q.push(format!("SELECT {ROW_COLUMNS} FROM dedup_records"));
                push_filter(&mut q, query.filter);
                if let Some(c) = cursor {
                    q.push(format!(" AND id {cmp} ")).push_bind(c.id);
                }
                if let Some(end) = query.window_end {
                    q.push(format!(" AND id {} ", query.direction.reversed().past(true))).push_bind(end.id);
                }
                q.push(format!(" ORDER BY id {dir} LIMIT ")).push_bind(query.rows);
            }
            SortKey::Attempts => {
                push_attempts_parts(&mut q, ROW_COLUMNS, query);
                q.push(" LIMIT ").push_bind(query.rows);
            }
            SortKey::MessageId => {
                // The dedup key leads with the group: the page is read per group, then merged.
                q.push(format!("SELECT {ROW_COLUMNS} FROM "));
                match &query.filter.group {
                    Some(group) => q.push("(SELECT ").push_bind(group.clone()).push(" AS g) groups"),
                    None => q.push(format!("unnest({KNOWN_GROUPS_SQL}) AS groups(g)")),
                };
                q.push(format!(", LATERAL (SELECT {ROW_COLUMNS} FROM dedup_records"));
                push_filter(&mut q, query.filter);
                q.push(" AND consumer_group = groups.g");
                if let Some(c) = cursor {
                    let CursorKey::MessageId(m) = &c.key else { unreachable!("the cursor's sort is checked") };
                    q.push(format!(" AND (message_id, id) {cmp} ("))
                        .push_bind(m.clone())
                        .push(", ")
                        .push_bind(c.id)
                        .push(")");
                }
                if let Some(end) = query.window_end {
                    let CursorKey::MessageId(m) = &end.key else { unreachable!("the window's sort is the list's") };
                    q.push(format!(" AND (message_id, id) {} (", query.direction.reversed().past(true)))
                        .push_bind(m.clone())
                        .push(", ")
                        .push_bind(end.id)
                        .push(")");
                }
                q.push(format!(" ORDER BY message_id {dir}, id {dir} LIMIT ")).push_bind(query.rows);
                q.push(format!(") r ORDER BY message_id {dir}, id {dir} LIMIT ")).push_bind(query.rows);
            }
        }
        Ok(q.build_query_as().fetch_all(self).await?)
    }

    async fn id_bounds(&self) -> Result<Option<(i64, i64)>, QueryError> {
        let (min, max): (Option<i64>, Option<i64>) =
            sqlx::query_as("SELECT min(id), max(id) FROM dedup_records").fetch_one(self).await?;
        Ok(min.zip(max))
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
        // Each group's key `rows` keys on, and the one after it (a group whose keys end there
        // has no window), by an index-only scan of the dedup key (a message id is unique in its
        // group, so the cursor's id does not matter there); then the nearest.
        let mut q = QueryBuilder::new("SELECT e.ends[1], d.id FROM ");
        match group {
            Some(group) => q.push("(SELECT ").push_bind(group.to_owned()).push(" AS g) groups"),
            None => q.push(format!("unnest({KNOWN_GROUPS_SQL}) AS groups(g)")),
        };
        q.push(format!(
            " CROSS JOIN LATERAL (SELECT array_agg(message_id ORDER BY message_id {dir}) AS ends FROM
               (SELECT message_id FROM dedup_records WHERE consumer_group = groups.g"
        ));
        if let Some(c) = from {
            let CursorKey::MessageId(m) = &c.key else { unreachable!("the cursor's sort is checked") };
            q.push(format!(" AND message_id {cmp} ")).push_bind(m.clone());
        }
        q.push(format!(" ORDER BY message_id {dir} OFFSET ")).push_bind(rows - 1).push(" LIMIT 2) k) e");
        q.push(" JOIN dedup_records d ON d.consumer_group = groups.g AND d.message_id = e.ends[1]");
        q.push(format!(" WHERE cardinality(e.ends) = 2 ORDER BY e.ends[1] {dir}, d.id {dir} LIMIT 1"));
        let end: Option<(String, i64)> = q.build_query_as().fetch_optional(self).await?;
        Ok(end.map(|(m, id)| Cursor { key: CursorKey::MessageId(m), id }))
    }

    async fn attempts_window_end(
        &self,
        from: Option<&Cursor>,
        direction: SortOrder,
        rows: i64,
    ) -> Result<Option<Cursor>, QueryError> {
        // The parts' (attempts, id) alone, of every record, read from the same indexes.
        let mut q = QueryBuilder::new("");
        let every = RecordFilter::default();
        let query = RowsQuery { filter: &every, sort: SortKey::Attempts, cursor: from, direction, rows, window_end: None };
        push_attempts_parts(&mut q, "attempts, id", &query);
        q.push(" OFFSET ").push_bind(rows - 1).push(" LIMIT 2");
        let ends: Vec<(i32, i64)> = q.build_query_as().fetch_all(self).await?;
        // The window's far end only when a record lies past it.
        let end = ends.first().copied().filter(|_| ends.len() == 2);
        Ok(end.map(|(a, id)| Cursor { key: CursorKey::Attempts(a), id }))
    }

    async fn record_fields(&self, id: i64) -> Result<Option<RecordDetail>, QueryError> {
        let sql = format!(
            "SELECT {ROW_COLUMNS}, reentries, lease_owner, lease_token, lease_expires_at,
                    COALESCE(lease_expires_at < now(), false) AS lease_expired, version,
                    completed_at, last_error, encode(payload_hash, 'hex') AS payload_hash, payload, payload_truncated,
                    headers, content_type, source_broker, source_exchange, source_routing_key, source_queue,
                    last_duplicate_at,
                    (extract(epoch FROM last_duplicate_at - first_seen_at) * 1000)::bigint AS last_duplicate_delay_ms,
                    payload_conflicts, parked_at, id_source
             FROM dedup_records WHERE id = $1"
        );
        Ok(sqlx::query_as(&sql).bind(id).fetch_optional(self).await?)
    }

    async fn attempt_rows(&self, id: i64) -> Result<Vec<AttemptRow>, QueryError> {
        Ok(sqlx::query_as(
            "SELECT attempt, worker, started_at, ended_at, outcome, error, taken_over_by, late_effect,
                    answer_status, latency_ms, left(answer, $2) AS answer
             FROM record_attempts WHERE record_id = $1 ORDER BY attempt, id",
        )
        .bind(id)
        .bind(ANSWER_CHARS)
        .fetch_all(self)
        .await?)
    }

    async fn late_duplicate_note(&self, id: i64) -> Result<Option<(DateTime<Utc>, i64, bool)>, QueryError> {
        Ok(sqlx::query_as("SELECT first_seen_at, delay_ms, held FROM late_duplicates WHERE record_id = $1")
            .bind(id)
            .fetch_optional(self)
            .await?)
    }
}

/// Attempts order, by keyset on (attempts, id), as three ordered parts (tried more than once,
/// once, never) merged: the first and last come from `dedup_records_retried_idx`, the first
/// tries in id order from the primary key, so no part sorts the bulk. `columns` of each part's
/// rows; the rows merged, not yet limited.
fn push_attempts_parts(q: &mut QueryBuilder<'_, Postgres>, columns: &str, query: &RowsQuery<'_>) {
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
        q.push(format!("(SELECT {columns} FROM dedup_records"));
        push_filter(q, query.filter);
        q.push(format!(" AND {}", part.condition("")));
        if let Some(c) = query.cursor {
            push_part_bound(q, part, query.direction, false, position(c));
        }
        if let Some(end) = query.window_end {
            push_part_bound(q, part, query.direction.reversed(), true, position(end));
        }
        q.push(format!(" ORDER BY attempts {dir}, id {dir} LIMIT ")).push_bind(query.rows).push(")");
    }
    q.push(format!(") parts ORDER BY attempts {dir}, id {dir}"));
}

/// Appends the bound "`(attempts, id)` past `(attempts, id)` in `direction`" (`inclusive`: or at
/// it) for the rows of `part` ([`AttemptsPart::bound`]): a row comparison, a range of
/// `dedup_records_retried_idx`.
fn push_part_bound(
    q: &mut QueryBuilder<'_, Postgres>,
    part: AttemptsPart,
    direction: SortOrder,
    inclusive: bool,
    (attempts, id): (i32, i64),
) {
    let cmp = direction.past(inclusive);
    match part.bound(direction, attempts) {
        PartBound::Every => {}
        PartBound::No => {
            q.push(" AND false");
        }
        PartBound::Id => {
            q.push(format!(" AND id {cmp} ")).push_bind(id);
        }
        PartBound::Row => {
            q.push(format!(" AND (attempts, id) {cmp} (")).push_bind(attempts).push(", ").push_bind(id).push(")");
        }
    }
}
