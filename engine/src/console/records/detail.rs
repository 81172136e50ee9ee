//! One record in full: every stored field, its attempt history (a transactional first-try
//! success shown from the record itself) and its Redis marker.

use chrono::{DateTime, Utc};
use serde_json::Value;

use super::{QueryError, RecordReads, RecordRow};
use crate::fastpath::FastPath;
use crate::message::IdSourceKind;
use crate::record::{HandlerMode, RecordStatus};

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
    /// [`crate::console::endpoints::error_kind`]; `None` for a success or an error without a kind.
    pub fn answer_class(&self) -> Option<&str> {
        crate::console::endpoints::error_kind(self.error.as_deref()?)
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
    /// The history, oldest first (filled by [`record_detail`]; empty as a store reads the
    /// record).
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
pub async fn record_detail(reads: &dyn RecordReads, id: i64) -> Result<Option<RecordDetail>, QueryError> {
    let Some(mut detail) = reads.record_fields(id).await? else {
        return Ok(None);
    };
    detail.attempt_history = reads.attempt_rows(id).await?;
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
