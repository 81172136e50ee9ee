//! The records list (filters, keyset pages) and one record's detail with its attempt history
//! and Redis marker state.

use chrono::{DateTime, Utc};
use serde_json::Value;
use sqlx::{PgExecutor, Postgres, QueryBuilder};

use super::QueryError;
use super::filter::{
    Cursor, CursorKey, PageAt, RecordFilter, RecordListParams, SortKey, SortOrder, prefix_upper_bound,
};
use crate::fastpath::FastPath;
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
}

/// The list's columns.
const ROW_COLUMNS: &str = "id, consumer_group, message_id, message_type, status, handler_mode, attempts, \
     max_attempts, first_seen_at, updated_at, next_attempt_at, error_class, duplicate_count";

/// Appends the `WHERE` conditions of `filter` (always at least `true`), every value bound. Also
/// selects the records of a bulk requeue ([`crate::actions::bulk`]).
pub(crate) fn push_filter(q: &mut QueryBuilder<'_, Postgres>, filter: &RecordFilter) {
    q.push(" WHERE true");
    if let Some(group) = &filter.group {
        q.push(" AND consumer_group = ").push_bind(group.clone());
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
    }
    if let Some(to) = filter.to {
        q.push(" AND first_seen_at < ").push_bind(to);
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
}

/// One page of records matching `params.filter`, ordered by `params.sort` (ties by id), by
/// keyset: a page is "the `limit` rows past a cursor", so it stays stable while new records
/// arrive and costs the same at any depth.
///
/// Errors: [`QueryError::Database`].
pub async fn records_list<'e>(db: impl PgExecutor<'e>, params: &RecordListParams) -> Result<RecordPage, QueryError> {
    let column = match params.sort {
        SortKey::Time => "first_seen_at",
        SortKey::Attempts => "attempts",
        SortKey::MessageId => "message_id",
    };
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
    let mut q = QueryBuilder::new(format!("SELECT {ROW_COLUMNS} FROM dedup_records"));
    push_filter(&mut q, &params.filter);
    if let Some(c) = cursor {
        q.push(format!(" AND ({column}, id) {cmp} ("));
        match &c.key {
            CursorKey::Time(t) => q.push_bind(DateTime::from_timestamp_micros(*t).unwrap_or_default()),
            CursorKey::Attempts(n) => q.push_bind(*n),
            CursorKey::MessageId(m) => q.push_bind(m.clone()),
        };
        q.push(", ").push_bind(c.id).push(")");
    }
    q.push(format!(" ORDER BY {column} {dir}, id {dir} LIMIT ")).push_bind(params.limit + 1);
    let mut rows: Vec<RecordRow> = q.build_query_as().fetch_all(db).await?;
    let more = rows.len() as i64 > params.limit;
    rows.truncate(params.limit as usize);
    let backwards = matches!(params.at, PageAt::Before(_));
    if backwards {
        rows.reverse();
    }
    let first = rows.first().map(|r| r.cursor(params.sort));
    let last = rows.last().map(|r| r.cursor(params.sort));
    let (next, prev) = match params.at {
        PageAt::First => (last.filter(|_| more), None),
        PageAt::After(_) => (last.filter(|_| more), first),
        PageAt::Before(_) => (last, first.filter(|_| more)),
    };
    Ok(RecordPage { rows, next, prev })
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
    /// Leased handlers that report it: the answer's first 2 KiB, or the transport error.
    pub answer: Option<String>,
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
    /// The history, oldest first (filled by [`record_detail`]).
    #[sqlx(skip)]
    pub attempt_history: Vec<AttemptRow>,
}

impl RecordDetail {
    /// Whether an attempt's effect ran after its lease was lost, so the effect may have run
    /// twice (an operator should check it).
    pub fn possible_double_effect(&self) -> bool {
        self.attempt_history.iter().any(|a| a.late_effect)
    }

    /// Attempts whose lease another worker took over.
    pub fn takeovers(&self) -> usize {
        self.attempt_history.iter().filter(|a| a.taken_over_by.is_some()).count()
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
                payload_conflicts, parked_at
         FROM dedup_records WHERE id = $1"
    );
    let Some(mut detail) = sqlx::query_as::<_, RecordDetail>(&sql).bind(id).fetch_optional(pool).await? else {
        return Ok(None);
    };
    detail.attempt_history = sqlx::query_as(
        "SELECT attempt, worker, started_at, ended_at, outcome, error, taken_over_by, late_effect,
                answer_status, latency_ms, answer
         FROM record_attempts WHERE record_id = $1 ORDER BY attempt, id",
    )
    .bind(id)
    .fetch_all(pool)
    .await?;
    Ok(Some(detail))
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
