//! The dedup store: where records live, and every state transition on them.
//!
//! [`DedupStore`] is the seam for other databases; [`postgres::PgStore`] is the PostgreSQL
//! implementation, `mysql::MySqlStore` (feature `mysql`) the MySQL/MariaDB one.
//! With the `testing` feature, `conformance` holds the cases every store passes. Every
//! transition is one conditional statement fenced by the expected status (and lease token where
//! a lease is held), timed by the database clock (`now()` on PostgreSQL, `UTC_TIMESTAMP(6)` on
//! MySQL), never the worker's.

mod attempts_order;
mod by_url;
mod conflict_copy;
mod held_delivery;
#[cfg(feature = "testing")]
pub mod conformance;
mod errors;
#[cfg(feature = "mysql")]
pub mod mysql;
pub mod postgres;
pub(crate) mod roles;
mod lease_store;

pub use errors::DbErrorKind;
pub(crate) use by_url::connect;
pub use by_url::ConnectError;
pub(crate) use conflict_copy::{ConflictCopy, ConflictKind, MAX_OPEN_PAYLOAD_COPIES, all_locked, records_of};
pub(crate) use errors::count_deadlock_rerun;
pub(crate) use held_delivery::{HeldDelivery, LATE_DUPLICATE_CLASS};
pub use lease_store::LeaseStore;
pub use roles::PipelineStore;

use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use uuid::Uuid;

use crate::handler::EffectAnswer;
use crate::message::{IdSourceKind, InboundMessage};
use crate::record::{ConsumerGroup, HandlerMode, MessageId, RecordStatus};

/// Shortest lease a claim may carry. A claim asked with less (or zero, or negative) is raised to
/// this: a claim without a live lease would let a second worker take the record at once.
pub const MIN_LEASE: Duration = Duration::from_secs(1);

/// Errors from the store. Database errors keep their database's code, read as a
/// [`DbErrorKind`], so callers can tell transient ones (deadlock, serialization failure, lost
/// connection) from the rest.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The database refused or failed the statement.
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
    /// A conflicting copy of a delivery named a record that cleanup deleted while the copy was
    /// being kept (DESIGN.md, "Reused ids and payload conflicts"). Nothing was kept; run again,
    /// the delivery finds no record and is judged as the late duplicate it is.
    #[error("record {0} was deleted while a conflicting copy of it was being kept")]
    RecordDeleted(i64),
}

impl StoreError {
    /// See [`DbErrorKind::is_transient`].
    pub fn is_transient(&self) -> bool {
        match self {
            StoreError::Database(e) => DbErrorKind::of(e).is_transient(),
            StoreError::RecordDeleted(_) => true,
        }
    }

    /// Whether the database chose the transaction as a deadlock victim ([`DbErrorKind::Deadlock`]).
    pub fn is_deadlock(&self) -> bool {
        match self {
            StoreError::Database(e) => DbErrorKind::of(e) == DbErrorKind::Deadlock,
            StoreError::RecordDeleted(_) => false,
        }
    }
}

/// The lease a claim writes: who holds the record, with which token, for how long.
#[derive(Debug, Clone)]
pub struct Lease {
    /// `<host>:<pid>:<worker>` of the claiming worker.
    pub owner: String,
    /// Fencing token; completion and failure must present it.
    pub token: Uuid,
    /// How long the lease lasts from the claim (database clock). Raised to [`MIN_LEASE`].
    pub duration: Duration,
}

impl Lease {
    /// A new lease with a fresh token; `duration` is raised to [`MIN_LEASE`] when shorter.
    pub fn new(owner: impl Into<String>, duration: Duration) -> Self {
        Lease { owner: owner.into(), token: Uuid::new_v4(), duration: duration.max(MIN_LEASE) }
    }

    /// The duration in whole milliseconds, never below [`MIN_LEASE`].
    pub fn millis(&self) -> i64 {
        i64::try_from(self.duration.max(MIN_LEASE).as_millis()).unwrap_or(i64::MAX)
    }
}

/// One message of a [`ClaimBatch`].
#[derive(Debug, Clone, Copy)]
pub struct ClaimItem<'a> {
    /// The business idempotency key.
    pub message_id: &'a MessageId,
    /// `<entity>.<event>`.
    pub message_type: &'a str,
    /// SHA-256 of the payload.
    pub payload_hash: &'a [u8],
    /// The delivery (its source is stored on new records; a leased claim stores its payload
    /// and headers too).
    pub message: &'a InboundMessage,
    /// Where its message id came from (stored on new records).
    pub id_source: IdSourceKind,
    /// Whether a processing record whose lease expired may be taken over (the type's
    /// `on_lease_expiry = reclaim`); read by [`ClaimAs::Leased`] claims only. One whose effect
    /// never started is taken over whatever this says.
    pub reclaim_expired: bool,
    /// [`ClaimAs::Leased`]: whether the effect starts as soon as the claim commits, so the claim
    /// marks it started (`effect_started`); false for one that waits for a slot of its
    /// handler's concurrency, marked by [`LeaseStore::mark_effects_started`] before it starts.
    pub starts_at_once: bool,
}

/// What [`DedupStore::record_poison`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoisonStored {
    /// The record's id.
    pub id: i64,
    /// Whether the delivery is to be dead-lettered: its record was created, or a requeued
    /// `NO_HANDLER` record (still without a handler) is `dead` again. Otherwise it was a
    /// duplicate, counted on its record, or a reused id ([`PoisonStored::reused_of`]).
    pub dead_lettered: bool,
    /// The message type of the record whose id the delivery carried, when that is another type
    /// than the delivery's (a reused id): nothing was counted on the record, and the delivery is
    /// a dead letter with its copy kept, never a duplicate.
    pub reused_of: Option<String>,
}

/// A batch of claims sharing group, limits and lease.
#[derive(Debug, Clone)]
pub struct ClaimBatch<'a> {
    /// Scope of the records.
    pub group: &'a ConsumerGroup,
    /// Attempts allowed before a record goes dead (new records only).
    pub max_attempts: i32,
    /// The lease written on every claimed record (one token for the batch).
    pub lease: &'a Lease,
    /// What the claimed records become.
    pub claim_as: ClaimAs,
    /// The messages, distinct ids.
    pub items: Vec<ClaimItem<'a>>,
}

/// What a batch claim writes on the records it claims.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClaimAs {
    /// `processing` under the batch's lease; the same transaction completes or fails each one
    /// later ([`DedupStore::complete_many`], [`DedupStore::fail_claimed`]).
    Processing,
    /// `succeeded` at once, lease-less, with a `succeeded` attempt row: one statement instead of
    /// a claim and a completion. Only for a transaction that is rolled back as a whole when any
    /// of its handlers or statements fails (the pipeline's optimistic attempt). A transactional
    /// claim is invisible to others until commit (DESIGN.md, "Two handler modes": concurrent
    /// duplicates block on the unique key), and such a transaction commits only if every handler
    /// succeeded, so no one can see the record in a state it would not have had with a
    /// completion. The row lock held until commit is the claim's lease; the lease columns stay
    /// empty because the record is never `processing` outside the transaction.
    Succeeded,
    /// `processing` under the batch's lease for leased handlers, committed at once
    /// (autocommit): the payload, headers and AMQP `type` property are stored (the record must
    /// be requeueable while its effect runs), each claim opens its attempt row and says whether
    /// its effect starts at once ([`ClaimItem::starts_at_once`]), and a record whose lease
    /// expired is taken over when its item's [`ClaimItem::reclaim_expired`] says so or its
    /// effect never started, closing the superseded attempt as `lease_lost`. Completed with
    /// [`LeaseStore::complete_many_leased`].
    Leased,
}

impl ClaimAs {
    /// The handler mode of the claims, as in the `claim` span.
    pub(crate) fn mode(self) -> &'static str {
        match self {
            ClaimAs::Processing | ClaimAs::Succeeded => "transactional",
            ClaimAs::Leased => "leased",
        }
    }

    /// The status it writes, as stored.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            ClaimAs::Processing => "processing",
            ClaimAs::Succeeded => "succeeded",
            ClaimAs::Leased => "processing",
        }
    }
}

#[cfg(feature = "testing")]
/// What a claim needs to know.
#[derive(Debug, Clone, Copy)]
pub struct ClaimRequest<'a> {
    /// Scope of the dedup record.
    pub group: &'a ConsumerGroup,
    /// The business idempotency key.
    pub message_id: &'a MessageId,
    /// `<entity>.<event>`.
    pub message_type: &'a str,
    /// The handler's mode; leased claims also open an attempt row.
    pub mode: HandlerMode,
    /// Attempts allowed before the record goes dead (new records only).
    pub max_attempts: i32,
    /// Whether a processing record whose lease expired may be claimed (`on_lease_expiry =
    /// reclaim`); false for `hold` and for transactional handlers.
    pub reclaim_expired: bool,
    /// The lease to write.
    pub lease: &'a Lease,
    /// The delivery (payload, headers, source are stored on new records).
    pub message: &'a InboundMessage,
    /// SHA-256 of the payload.
    pub payload_hash: &'a [u8],
}

/// A record this worker now holds.
#[derive(Debug, Clone)]
pub struct ClaimedRecord {
    /// Row id.
    pub id: i64,
    /// The attempt number this claim started (1 for a new record).
    pub attempt: i32,
    /// Attempts allowed.
    pub max_attempts: i32,
    /// True when this claim created the record.
    pub created: bool,
    /// True when this claim took over an expired lease (auto-reclaim).
    pub took_over: bool,
    /// When the record was first seen (database clock).
    pub first_seen_at: DateTime<Utc>,
    /// When this claim was made (database clock).
    pub claimed_at: DateTime<Utc>,
    /// The lease token written.
    pub lease_token: Uuid,
    /// Leased claims: runs of the effect for this record, this one included (its attempt rows,
    /// deferred and lease-lost ones too); transactional claims: the attempt.
    pub calls: i32,
    /// Leased claims: the status the previous attempt's far side answered, if it reported one.
    pub previous_status: Option<u16>,
}

/// An existing record that could not be claimed, as the duplicate check saw it.
#[derive(Debug, Clone)]
pub struct ExistingRecord {
    /// Row id.
    pub id: i64,
    /// Current status.
    pub status: RecordStatus,
    /// For processing records: whether the lease has expired (stuck). Read by the store's tests;
    /// the pipeline goes by `parked`.
    #[cfg_attr(not(feature = "testing"), expect(dead_code, reason = "read by the store's tests"))]
    pub lease_expired: bool,
    /// For processing records: when the lease expires.
    pub lease_expires_at: Option<DateTime<Utc>>,
    /// Whether this delivery's payload hash equals the stored one (false: a payload conflict).
    pub same_payload: bool,
    /// Whether this delivery is of the record's message type (false: a reused id, never a
    /// duplicate of it; DESIGN.md, "Reused ids and payload conflicts").
    pub same_type: bool,
    /// Delivery arrival minus first seen, by the database clock, in milliseconds.
    pub delay_ms: i64,
    /// Whether this delivery was parked (stuck record under `hold`).
    pub parked: bool,
}

/// The result of a claim attempt.
#[derive(Debug, Clone)]
pub enum ClaimOutcome {
    /// This worker holds the record now.
    Claimed(ClaimedRecord),
    /// The record exists and is not claimable; the delivery was counted as a duplicate on it.
    Existing(ExistingRecord),
}

/// A handler failure to record.
#[derive(Debug, Clone, Copy)]
pub struct FailureReport<'a> {
    /// The claim being failed.
    pub claim: &'a ClaimedRecord,
    /// The handler's mode: a transactional claim stored no payload and opened no attempt row
    /// (on success neither is needed), so its failure stores both.
    pub mode: HandlerMode,
    /// The delivery (its payload, headers and content type are kept on a failed record).
    pub message: &'a InboundMessage,
    /// The worker's lease (leased mode: fences the update).
    pub lease: &'a Lease,
    /// Error text, stored as `last_error`.
    pub error: &'a str,
    /// The error's class ([`crate::handler::HandlerError::class`]): the grouping key of dead
    /// letters, stored as `error_class`.
    pub error_class: &'a str,
    /// True when the error says retrying cannot help: the record goes dead at once.
    pub permanent: bool,
    /// When the retry copy is due back (for `next_attempt_at`), in ms from now.
    pub retry_delay_ms: i64,
    /// Leased mode: what the effect's far side answered, kept on the attempt row.
    pub answer: Option<&'a EffectAnswer>,
    /// Leased mode: the far side said it is still working on the message
    /// ([`crate::handler::HandlerError::in_progress`]); the attempt is marked so, which keeps
    /// the run of such answers going ([`LeaseStore::defer_claimed`]).
    pub in_progress: bool,
}

impl FailureReport<'_> {
    /// The status the failure leaves its record in: `dead` for a permanent error or at the
    /// claim's last attempt, `failed` (retried later) otherwise.
    pub(crate) fn status(&self) -> RecordStatus {
        if self.permanent || self.claim.attempt >= self.claim.max_attempts {
            RecordStatus::Dead
        } else {
            RecordStatus::Failed
        }
    }
}

/// The attempt row's answer columns, as both stores write them: status, latency in ms, summary
/// (text as stored).
pub(crate) fn answer_columns(answer: Option<&EffectAnswer>) -> (Option<i16>, Option<i32>, Option<String>) {
    match answer {
        None => (None, None, None),
        Some(a) => (
            a.status.and_then(|s| i16::try_from(s).ok()),
            Some(i32::try_from(a.latency.as_millis()).unwrap_or(i32::MAX)),
            Some(crate::db::storable::text(&a.summary).into_owned()),
        ),
    }
}

/// What a failure turned the record into.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureOutcome {
    /// `failed`: claimable again by the retry copy.
    Failed,
    /// `dead`: attempts exhausted (or permanent error); waits for an operator.
    Dead,
    /// Nothing recorded: the record had moved on (the lease was lost or another worker took it).
    Superseded,
}

/// A message that never reaches a handler, to store as a dead record: poison, or a message
/// whose type has no handler.
#[derive(Debug, Clone, Copy)]
pub struct PoisonRecord<'a> {
    /// Scope.
    pub group: &'a ConsumerGroup,
    /// Its id, or the synthetic `POISON...` id.
    pub message_id: &'a MessageId,
    /// Type (`POISON` for synthetic ids).
    pub message_type: &'a str,
    /// The reason, stored as `last_error`.
    pub reason: &'a str,
    /// The reason's grouping key ([`crate::message::PoisonReason::error_class`]), stored as
    /// `error_class`.
    pub reason_kind: &'a str,
    /// The delivery.
    pub message: &'a InboundMessage,
    /// SHA-256 of the payload.
    pub payload_hash: &'a [u8],
    /// Largest payload kept on the record, in bytes (longer ones are truncated and flagged; the
    /// dead-letter copy carries the whole payload).
    pub keep_payload_bytes: usize,
    /// Recorded as `max_attempts`.
    pub max_attempts: i32,
    /// True for poison (never processable, never requeued); false for a message whose type
    /// has no handler (a requeue processes it once the handler exists).
    pub poison: bool,
    /// Where its id came from; `None` for a synthetic id.
    pub id_source: Option<IdSourceKind>,
}

/// A dedup store: claims, transactional completions, failures, poison records and the fast
/// path's duplicate counts (leased handlers' statements are [`LeaseStore`]'s). Methods take a
/// connection so callers compose them with business changes in one transaction (transactional
/// mode) or run them alone (leased mode, autocommit).
#[async_trait]
pub trait DedupStore: Send + Sync + 'static {
    /// The database.
    type Db: sqlx::Database;

    /// The store's pool.
    fn pool(&self) -> &sqlx::Pool<Self::Db>;

    #[cfg(feature = "testing")]
    /// Claims the record (DESIGN.md, "Claim"): creates it as `processing` with the lease, or
    /// takes an existing one that is claimable — `failed` with attempts left, or `processing`
    /// with an expired lease when `reclaim_expired`. Otherwise counts the delivery as a
    /// duplicate on the existing record (and parks it when stuck) and returns what it saw.
    async fn claim(
        &self,
        conn: &mut <Self::Db as sqlx::Database>::Connection,
        request: &ClaimRequest<'_>,
    ) -> Result<ClaimOutcome, StoreError>;

    #[cfg(feature = "testing")]
    /// Marks a claimed record `succeeded`, fenced by status and lease token, clears the lease
    /// and the stored payload, and closes the attempt (leased mode: with the effect's `answer`).
    /// False when the lease was lost.
    async fn complete(
        &self,
        conn: &mut <Self::Db as sqlx::Database>::Connection,
        claim: &ClaimedRecord,
        lease: &Lease,
        mode: HandlerMode,
        answer: Option<&EffectAnswer>,
    ) -> Result<bool, StoreError>;

    /// Claims a batch of messages in one statement (DESIGN.md, "Claim", set-based): the same
    /// rules as [`DedupStore::claim`], rows locked in message-id order (one order for every
    /// batch, so concurrent batches wait instead of deadlocking). The message ids must be
    /// distinct. Transactional claims store no payload: the claim commits only together with
    /// its outcome, and a failure stores it ([`DedupStore::fail_claimed`]); leased ones do
    /// ([`ClaimAs::Leased`]). Claimed records become what [`ClaimBatch::claim_as`] says.
    /// Returns one outcome per item, in the items' order. Runs in the caller's transaction, if
    /// any: the pipeline claims a leased batch in one, so that its claims commit together,
    /// before any call starts, or not at all.
    async fn claim_many(
        &self,
        conn: &mut <Self::Db as sqlx::Database>::Connection,
        batch: &ClaimBatch<'_>,
    ) -> Result<Vec<ClaimOutcome>, StoreError>;

    /// Marks claimed transactional records `succeeded` in one statement (fenced by status and
    /// lease token) and writes their attempt rows. Returns which ids were completed.
    async fn complete_many(
        &self,
        conn: &mut <Self::Db as sqlx::Database>::Connection,
        claims: &[&ClaimedRecord],
        lease: &Lease,
    ) -> Result<Vec<i64>, StoreError>;

    /// Records a handler failure of a claim, fenced by the lease token: `failed` with the retry
    /// due time, or `dead` at max attempts (or for a permanent error).
    async fn fail_claimed(
        &self,
        conn: &mut <Self::Db as sqlx::Database>::Connection,
        failure: &FailureReport<'_>,
    ) -> Result<FailureOutcome, StoreError>;

    /// Stores a poison message as a `dead` record (or counts a duplicate on an existing one);
    /// see [`PoisonStored`].
    async fn record_poison(
        &self,
        conn: &mut <Self::Db as sqlx::Database>::Connection,
        poison: &PoisonRecord<'_>,
    ) -> Result<PoisonStored, StoreError>;

    /// Adds duplicates caught by the Redis fast path to their records' `duplicate_count`
    /// (batched, off the hot path), all or none: the flush keeps the entries of a failed call
    /// for the next one. Entries: (group, message id, copies, latest arrival).
    async fn add_fast_path_duplicates(
        &self,
        entries: &[(String, String, i32, DateTime<Utc>)],
    ) -> Result<(), StoreError>;
}
