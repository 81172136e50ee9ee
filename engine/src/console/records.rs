//! The records list (filters, keyset pages) and one record's detail with its attempt history
//! and Redis marker state.

use chrono::{DateTime, Utc};
use serde_json::Value;
use sqlx::{PgPool, Postgres, QueryBuilder};

use super::QueryError;
use super::filter::{
    Cursor, CursorKey, PageAt, RecordFilter, RecordFlag, RecordListParams, SortKey, SortOrder, prefix_upper_bound,
};
use crate::fastpath::FastPath;
use crate::message::IdSourceKind;
use crate::record::{HandlerMode, RecordStatus};

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

/// One handler attempt of a record.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct AttemptRow {
    /// 1 for the first attempt.
    pub attempt: i32,
    /// `<host>:<pid>:<worker>` that ran it.
    pub worker: String,
    /// Start (database clock).
    pub started_at: DateTime<Utc>,
    /// End; `None` while a leased attempt runs or after its worker died.
    pub ended_at: Option<DateTime<Utc>>,
    /// `succeeded`, `failed`, `dead`, `lease_lost`, `released`, `deferred` (not counted: the far
    /// side was still working on it); `None` while open.
    pub outcome: Option<String>,
    /// The error of a failed attempt.
    pub error: Option<String>,
    /// For a `lease_lost` attempt taken over: the worker that took it.
    pub taken_over_by: Option<String>,
    /// Its worker reported the effect done after the lease was lost: the effect may have run
    /// twice.
    pub late_effect: bool,
    /// Leased handlers that report it (HTTP): the status the far side answered; `None` for no
    /// answer (timeout, connection error).
    pub answer_status: Option<i16>,
    /// Leased handlers that report it: the call's latency, in ms.
    pub latency_ms: Option<i32>,
    /// Leased handlers that report it: the answer's first 2 KiB, or the transport error (cut
    /// to [`ANSWER_CHARS`] characters, whatever a handler reported).
    pub answer: Option<String>,
}

/// Longest answer excerpt an attempt row is read with, in characters (an HTTP handler keeps
/// 2 KiB of a body; other leased handlers report what they like).
pub const ANSWER_CHARS: i32 = 2048;

impl AttemptRow {
    /// Whether the attempt called the far side and got an answer or a transport error (its
    /// handler reported the call).
    pub fn called(&self) -> bool {
        self.latency_ms.is_some()
    }

    /// The answer class: the error kind of the attempt's error (`HTTP_CONFLICT`, …), see
    /// [`super::endpoints::error_kind`]; `None` for a success or an error without a kind.
    pub fn answer_class(&self) -> Option<&str> {
        super::endpoints::error_kind(self.error.as_deref()?)
    }
}

/// Every stored field of one record.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct RecordDetail {
    /// The list columns.
    #[sqlx(flatten)]
    pub row: RecordRow,
    /// Re-entries into processing after an expired lease.
    pub reentries: i32,
    /// Lease holder (processing only).
    pub lease_owner: Option<String>,
    /// Lease fencing token (processing only): operator actions on a processing record must
    /// present it, so they cannot hit a newer claim.
    pub lease_token: Option<uuid::Uuid>,
    /// Lease expiry (processing only).
    pub lease_expires_at: Option<DateTime<Utc>>,
    /// Whether the lease has expired by the database clock (the record is stuck).
    pub lease_expired: bool,
    /// The record's version (raised by every state transition, not by duplicates or lease
    /// heartbeats); operator actions give it back
    /// so they are refused when the record changed since it was shown.
    pub version: i64,
    /// When the record became succeeded.
    pub completed_at: Option<DateTime<Utc>>,
    /// Full text of the last error.
    pub last_error: Option<String>,
    /// SHA-256 of the first payload, hex.
    pub payload_hash: String,
    /// The stored payload (kept while not succeeded).
    pub payload: Option<Vec<u8>>,
    /// True when only the payload's start was kept.
    pub payload_truncated: bool,
    /// Broker headers as JSON.
    pub headers: Option<Value>,
    /// Content type property.
    pub content_type: Option<String>,
    /// `rabbitmq` or `kafka`.
    pub source_broker: String,
    /// Exchange (topic).
    pub source_exchange: Option<String>,
    /// Routing key (record key).
    pub source_routing_key: Option<String>,
    /// Queue (partition).
    pub source_queue: Option<String>,
    /// Latest duplicate arrival.
    pub last_duplicate_at: Option<DateTime<Utc>>,
    /// Latest duplicate's arrival minus first seen, in milliseconds.
    pub last_duplicate_delay_ms: Option<i64>,
    /// Deliveries with this id but another payload.
    pub payload_conflicts: i32,
    /// When a redelivery of this stuck record was parked.
    pub parked_at: Option<DateTime<Utc>>,
    /// Where its message id came from, as stored ([`RecordDetail::id_source`]).
    #[sqlx(rename = "id_source")]
    id_source_code: Option<i8>,
    /// The history, oldest first (filled by [`record_detail`]).
    #[sqlx(skip)]
    pub attempt_history: Vec<AttemptRow>,
}

impl RecordDetail {
    /// Where its message id came from (the kind of the group's `ids.from` source that gave it);
    /// `None` for records from before it was kept, and for poison messages.
    pub fn id_source(&self) -> Option<IdSourceKind> {
        self.id_source_code.and_then(IdSourceKind::from_code)
    }

    /// Whether an attempt's effect ran after its lease was lost, so the effect may have run
    /// twice (an operator should check it).
    pub fn possible_double_effect(&self) -> bool {
        self.attempt_history.iter().any(|a| a.late_effect)
    }

    /// Attempts whose lease another worker took over.
    pub fn takeovers(&self) -> usize {
        self.attempt_history.iter().filter(|a| a.taken_over_by.is_some()).count()
    }

    /// Calls of the far side (HTTP handlers): attempts with an answer or a transport error.
    /// Beside `duplicate_count`, the redeliveries the dedup absorbed without a call.
    pub fn calls(&self) -> usize {
        self.attempt_history.iter().filter(|a| a.called()).count()
    }
}

/// A record with its attempt history; `None` when no record has this id.
///
/// Errors: [`QueryError::Database`].
pub async fn record_detail(pool: &sqlx::PgPool, id: i64) -> Result<Option<RecordDetail>, QueryError> {
    let sql = format!(
        "SELECT {ROW_COLUMNS}, reentries, lease_owner, lease_token, lease_expires_at,
                COALESCE(lease_expires_at < now(), false) AS lease_expired, version,
                completed_at, last_error, encode(payload_hash, 'hex') AS payload_hash, payload, payload_truncated, headers, content_type,
                source_broker, source_exchange, source_routing_key, source_queue, last_duplicate_at,
                (extract(epoch FROM last_duplicate_at - first_seen_at) * 1000)::bigint AS last_duplicate_delay_ms,
                payload_conflicts, parked_at, id_source
         FROM dedup_records WHERE id = $1"
    );
    let Some(mut detail) = sqlx::query_as::<_, RecordDetail>(&sql).bind(id).fetch_optional(pool).await? else {
        return Ok(None);
    };
    detail.attempt_history = sqlx::query_as(
        "SELECT attempt, worker, started_at, ended_at, outcome, error, taken_over_by, late_effect,
                answer_status, latency_ms, left(answer, $2) AS answer
         FROM record_attempts WHERE record_id = $1 ORDER BY attempt, id",
    )
    .bind(id)
    .bind(ANSWER_CHARS)
    .fetch_all(pool)
    .await?;
    if let Some(first_try) = first_try_success(&detail) {
        detail.attempt_history.push(first_try);
    }
    Ok(Some(detail))
}

/// What [`AttemptRow::worker`] says of an attempt shown from its record: a transactional
/// handler's first-try success writes no attempt row, and no worker is kept.
pub const UNRECORDED_WORKER: &str = "(not recorded: first-try success)";

/// The attempt of a transactional first-try success, which has no attempt row (attempt rows
/// start at the first failure; engine/src/store/postgres/sql.rs, `COMPLETE_TX_SQL`): attempt 1,
/// `succeeded`, from first seen (when it was claimed) to its completion.
fn first_try_success(detail: &RecordDetail) -> Option<AttemptRow> {
    let row = &detail.row;
    let shown_from_record = detail.attempt_history.is_empty()
        && row.status == RecordStatus::Succeeded
        && row.attempts == 1
        && row.handler_mode.as_deref() == Some(HandlerMode::Transactional.as_str());
    shown_from_record.then(|| AttemptRow {
        attempt: 1,
        worker: UNRECORDED_WORKER.to_owned(),
        started_at: row.first_seen_at,
        ended_at: detail.completed_at,
        outcome: Some("succeeded".to_owned()),
        error: None,
        taken_over_by: None,
        late_effect: false,
        answer_status: None,
        latency_ms: None,
        answer: None,
    })
}

/// The Redis fast-path marker of a record, next to its database state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MarkerState {
    /// The marker exists; `ttl_secs` is its remaining lifetime (`None`: no expiry).
    Present {
        /// Seconds left.
        ttl_secs: Option<i64>,
    },
    /// No marker: a duplicate would be judged by the database.
    Absent,
    /// Redis did not answer; the text says why.
    Unknown(String),
}

/// Looks up the marker `<prefix>:<group>:<message id>` (its TTL).
pub async fn record_marker(fast_path: &FastPath, group: &str, message_id: &str) -> MarkerState {
    match fast_path.marker_ttl(&fast_path.key(group, message_id)).await {
        Ok(Some(ttl)) => MarkerState::Present { ttl_secs: (ttl >= 0).then_some(ttl) },
        Ok(None) => MarkerState::Absent,
        Err(why) => MarkerState::Unknown(why),
    }
}
