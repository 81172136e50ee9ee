//! The records list (filters, keyset pages) and one record's detail with its attempt history
//! and Redis marker state ([`record_detail`], [`record_marker`]).

use chrono::{DateTime, Utc};
use sqlx::{PgPool, Postgres, QueryBuilder};

use super::QueryError;
use super::filter::{
    Cursor, CursorKey, PageAt, RecordFilter, RecordFlag, RecordListParams, SortKey, SortOrder, prefix_upper_bound,
};
use crate::record::RecordStatus;

/// One row of a records list.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct RecordRow {
    /// Record id.
    pub id: i64,
    /// Consumer group.
    pub consumer_group: String,
    /// Message id.
    pub message_id: String,
    /// `<entity>.<event>`, or `POISON`.
    pub message_type: String,
    /// Status.
    #[sqlx(try_from = "String")]
    pub status: RecordStatus,
    /// `transactional` or `leased`; `None` for poison messages.
    pub handler_mode: Option<String>,
    /// Handler executions so far.
    pub attempts: i32,
    /// Attempts allowed.
    pub max_attempts: i32,
    /// First delivery (database clock).
    pub first_seen_at: DateTime<Utc>,
    /// Last change.
    pub updated_at: DateTime<Utc>,
    /// For failed records: when the retry copy is due.
    pub next_attempt_at: Option<DateTime<Utc>>,
    /// Error kind + first line of the last failure.
    pub error_class: Option<String>,
    /// Duplicate deliveries seen.
    pub duplicate_count: i32,
}

impl RecordRow {
    /// This row's position under `sort`.
    pub fn cursor(&self, sort: SortKey) -> Cursor {
        let key = match sort {
            SortKey::Time => CursorKey::Time(self.first_seen_at.timestamp_micros()),
            SortKey::Attempts => CursorKey::Attempts(self.attempts),
            SortKey::MessageId => CursorKey::MessageId(self.message_id.clone()),
        };
        Cursor { key, id: self.id }
    }
}

/// One page of a records list.
#[derive(Debug, Clone, PartialEq)]
pub struct RecordPage {
    /// The rows, in the requested order.
    pub rows: Vec<RecordRow>,
    /// Cursor of the next page (`after`), `None` on the last page.
    pub next: Option<Cursor>,
    /// Cursor of the previous page (`before`), `None` on the first page.
    pub prev: Option<Cursor>,
    /// Set when the page searched a bounded stretch of the table and stopped short of its end:
    /// the filter has no index to narrow it (a group, message type or error class over the
    /// succeeded bulk), so a time-ordered page reads at most [`SCAN_WINDOW`] records past its
    /// cursor. The id of the last record searched; `next` (or `prev`, going back) continues
    /// from there. The console says so rather than scan the whole table.
    pub searched_to: Option<i64>,
}

/// Records a time-ordered page reads at most when its filter has no index (see
/// [`RecordPage::searched_to`]): a primary-key scan that filters them, 20 000 rows in about 25 ms
/// on this project's loaded 2-core machine at 10 M records (50 000 took 60 ms there;
/// BENCHMARKS.md, "Lean write path"), so a page stays under the console's 50 ms.
pub const SCAN_WINDOW: i64 = 20_000;

/// How far a time range is widened when it is turned into an id range
/// (`dedup_records_id_at`): ids follow arrival up to the length of the inserting transaction,
/// which a lease bounds. The time filter itself is applied exactly.
pub(crate) const ARRIVAL_SLACK: &str = "interval '10 minutes'";

/// The list's columns.
const ROW_COLUMNS: &str = "id, consumer_group, message_id, message_type, status, handler_mode, attempts, \
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
pub(crate) fn push_filter(q: &mut QueryBuilder<'_, Postgres>, filter: &RecordFilter) {
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

/// Whether a time-ordered list under `filter` must be bounded by [`SCAN_WINDOW`]: a group,
/// type or error class is asked for, and nothing an index serves narrows the records first.
fn needs_window(filter: &RecordFilter) -> bool {
    let narrowed = filter.status.is_some_and(|s| s != RecordStatus::Succeeded)
        || filter.message_id.is_some()
        || filter.id_prefix.is_some()
        || filter.min_attempts.is_some_and(|n| n > 1)
        || filter.flag.is_some();
    let selective = filter.group.is_some() || filter.message_type.is_some() || filter.error_class.is_some();
    selective && !narrowed
}

/// One page of records matching `params.filter`, ordered by `params.sort` (ties by id), by
/// keyset: a page is "the `limit` rows past a cursor", so it stays stable while new records
/// arrive and costs the same at any depth.
///
/// Time order is arrival order: the record id (the primary key), which the engine hands out as
/// records arrive; `first_seen_at` follows it within ten minutes (a time filter becomes an id
/// range widened by that much). Attempts order reads the
/// records tried more than once (or never) from `dedup_records_retried_idx` and the first tries
/// from the primary key. Message-id order walks the dedup key of each group.
///
/// Errors: [`QueryError::Database`].
pub async fn records_list(pool: &PgPool, params: &RecordListParams) -> Result<RecordPage, QueryError> {
    // A previous page reads backwards from its cursor, then flips the rows.
    let (direction, cursor) = match &params.at {
        PageAt::First => (params.order, None),
        PageAt::After(c) => (params.order, Some(c)),
        PageAt::Before(c) => (params.order.reversed(), Some(c)),
    };
    let (cmp, dir) = match direction {
        SortOrder::Desc => ("<", "DESC"),
        SortOrder::Asc => (">", "ASC"),
    };
    let window = if params.sort == SortKey::Time && needs_window(&params.filter) {
        Window::of(pool, cursor.map(|c| c.id), direction).await?
    } else {
        None
    };
    let mut q = QueryBuilder::new("");
    match params.sort {
        SortKey::Time => {
            q.push(format!("SELECT {ROW_COLUMNS} FROM dedup_records"));
            push_filter(&mut q, &params.filter);
            if let Some(c) = cursor {
                q.push(format!(" AND id {cmp} ")).push_bind(c.id);
            }
            if let Some(w) = &window {
                w.push(&mut q);
            }
            q.push(format!(" ORDER BY id {dir} LIMIT ")).push_bind(params.limit + 1);
        }
        SortKey::Attempts => push_attempts_page(&mut q, params, cursor, direction),
        SortKey::MessageId => {
            // The dedup key leads with the group: the page is read per group, then merged.
            q.push(format!("SELECT {ROW_COLUMNS} FROM "));
            match &params.filter.group {
                Some(group) => q.push("(SELECT ").push_bind(group.clone()).push(" AS g) groups"),
                None => q.push(format!("unnest({KNOWN_GROUPS_SQL}) AS groups(g)")),
            };
            q.push(format!(", LATERAL (SELECT {ROW_COLUMNS} FROM dedup_records"));
            push_filter(&mut q, &params.filter);
            q.push(" AND consumer_group = groups.g");
            if let Some(c) = cursor {
                let CursorKey::MessageId(m) = &c.key else { unreachable!("the cursor's sort is checked") };
                q.push(format!(" AND (message_id, id) {cmp} ("))
                    .push_bind(m.clone())
                    .push(", ")
                    .push_bind(c.id)
                    .push(")");
            }
            q.push(format!(" ORDER BY message_id {dir}, id {dir} LIMIT ")).push_bind(params.limit + 1);
            q.push(format!(") r ORDER BY message_id {dir}, id {dir} LIMIT ")).push_bind(params.limit + 1);
        }
    }
    let mut rows: Vec<RecordRow> = q.build_query_as().fetch_all(pool).await?;
    let more = rows.len() as i64 > params.limit;
    rows.truncate(params.limit as usize);
    // The window stopped the search short: the page continues from its far end.
    let searched_to = window.filter(|_| !more).and_then(|w| w.end_short_of_the_table());
    let backwards = matches!(params.at, PageAt::Before(_));
    if backwards {
        rows.reverse();
    }
    let first = rows.first().map(|r| r.cursor(params.sort));
    let last = rows.last().map(|r| r.cursor(params.sort));
    let resume = searched_to.map(|id| Cursor { key: CursorKey::Time(0), id });
    let (next, prev) = match params.at {
        PageAt::First => (last.filter(|_| more).or(resume), None),
        PageAt::After(ref c) => (last.filter(|_| more).or(resume), first.or_else(|| Some(c.clone()))),
        PageAt::Before(ref c) => (last.or_else(|| Some(c.clone())), first.filter(|_| more).or(resume)),
    };
    Ok(RecordPage { rows, next, prev, searched_to })
}

/// The stretch of ids a time-ordered page under a filter without an index searches:
/// [`SCAN_WINDOW`] ids from its cursor (or from the newest record, or the oldest, for a first
/// page) in its direction.
#[derive(Debug, Clone, Copy)]
struct Window {
    /// The far end, included.
    end: i64,
    direction: SortOrder,
    /// The table's smallest and largest ids.
    min: i64,
    max: i64,
}

impl Window {
    /// `None` for an empty table. Two probes of the primary key's ends.
    async fn of(pool: &PgPool, from: Option<i64>, direction: SortOrder) -> Result<Option<Self>, QueryError> {
        let (min, max): (Option<i64>, Option<i64>) =
            sqlx::query_as("SELECT min(id), max(id) FROM dedup_records").fetch_one(pool).await?;
        let (Some(min), Some(max)) = (min, max) else { return Ok(None) };
        let end = match direction {
            SortOrder::Desc => from.unwrap_or(max + 1) - SCAN_WINDOW,
            SortOrder::Asc => from.unwrap_or(min - 1) + SCAN_WINDOW,
        };
        Ok(Some(Self { end, direction, min, max }))
    }

    fn push(&self, q: &mut QueryBuilder<'_, Postgres>) {
        match self.direction {
            SortOrder::Desc => q.push(" AND id >= ").push_bind(self.end),
            SortOrder::Asc => q.push(" AND id <= ").push_bind(self.end),
        };
    }

    /// The far end when records lie beyond it.
    fn end_short_of_the_table(self) -> Option<i64> {
        let short = match self.direction {
            SortOrder::Desc => self.end > self.min,
            SortOrder::Asc => self.end < self.max,
        };
        short.then_some(self.end)
    }
}

/// Attempts order, by keyset on (attempts, id), as three ordered parts (tried more than once,
/// once, never) merged: the first and last come from `dedup_records_retried_idx`, the first
/// tries in id order from the primary key, so no part sorts the bulk.
fn push_attempts_page(
    q: &mut QueryBuilder<'_, Postgres>,
    params: &RecordListParams,
    cursor: Option<&Cursor>,
    direction: SortOrder,
) {
    let (cmp, dir) = match direction {
        SortOrder::Desc => ("<", "DESC"),
        SortOrder::Asc => (">", "ASC"),
    };
    q.push("SELECT * FROM (");
    for (n, part) in ["attempts > 1", "attempts = 1", "attempts < 1"].into_iter().enumerate() {
        if n > 0 {
            q.push(" UNION ALL ");
        }
        q.push(format!("(SELECT {ROW_COLUMNS} FROM dedup_records"));
        push_filter(q, &params.filter);
        q.push(format!(" AND {part}"));
        if let Some(c) = cursor {
            let CursorKey::Attempts(a) = c.key else { unreachable!("the cursor's sort is checked") };
            if part == "attempts = 1" {
                // On the primary key: the row comparison reduced to what it means for attempts 1.
                match (a.cmp(&1), direction) {
                    (std::cmp::Ordering::Equal, _) => {
                        q.push(format!(" AND id {cmp} ")).push_bind(c.id);
                    }
                    (std::cmp::Ordering::Greater, SortOrder::Asc) | (std::cmp::Ordering::Less, SortOrder::Desc) => {
                        q.push(" AND false");
                    }
                    _ => {}
                }
            } else {
                q.push(format!(" AND (attempts, id) {cmp} (")).push_bind(a).push(", ").push_bind(c.id).push(")");
            }
        }
        q.push(format!(" ORDER BY attempts {dir}, id {dir} LIMIT ")).push_bind(params.limit + 1).push(")");
    }
    q.push(format!(") parts ORDER BY attempts {dir}, id {dir} LIMIT ")).push_bind(params.limit + 1);
}

mod detail;
pub use detail::{
    ANSWER_CHARS, AttemptRow, MarkerState, RecordDetail, UNRECORDED_WORKER, record_detail, record_marker,
};
