//! Operator actions (DESIGN.md, "Operator actions"): the only writes the console, the REST API
//! and the CLI make to dedup records. All three call these functions, so they behave the same.
//!
//! Every single-record action is a guarded compare-and-set in one transaction: the row is
//! locked (`SELECT ... FOR UPDATE`), the guards are checked against what the operator was shown
//! (the expected status, the lease token of a `processing` record, an expired lease unless
//! forced), one conditional `UPDATE` makes the transition, and the audit entry is written in the
//! same transaction. A refused action changes nothing but writes a `refused` audit entry; a
//! failed one (broker or database error) rolls back and writes a `failed` entry.
//!
//! Two operators racing on one record: the second waits on the row lock, then sees the first
//! one's result (another status, no lease token, another version) and is refused. The version
//! (`dedup_records.version`, raised by every state transition) matters where the status does not move: two requeues of a `failed`
//! record leave it `failed`, so only the version tells the second one that it came too late.
//!
//! Making a record claimable: `failed` with `attempts < max_attempts`. A record that used up its
//! attempts gets exactly one more (`max_attempts = attempts + 1`) when an operator releases or
//! requeues it: if that attempt fails too, it goes `dead` again and waits for an operator.

pub mod bulk;
pub mod cleanup;
pub mod conflicts;
pub mod drill;
pub mod handlers;
mod named_lock;
pub(crate) mod record;
pub(crate) mod republish;

use async_trait::async_trait;
use uuid::Uuid;

#[cfg(feature = "testing")]
pub use record::HAND_DEAD_LETTER_CLASS;
pub use record::{
    ActionOutcome, LockedRecord, RecordAction, RecordActionKind, RecordBooks, RecordChange, RecordTransition,
    record_action,
};
pub use named_lock::NamedLock;
pub use republish::Publishers;

use crate::audit::NewAuditEntry;
use crate::record::RecordStatus;

/// One operator action's transaction on one database, whatever it changes
/// ([`handlers::HandlerChange`], [`RecordChange`], [`conflicts::ConflictChange`] add the
/// statements): its audit entry goes in it, and nothing is kept unless it commits.
#[async_trait]
pub trait OperatorTx: Send {
    /// Writes `entry` to the audit log in this transaction; returns its id.
    async fn audit(&mut self, entry: &NewAuditEntry<'_>) -> Result<i64, sqlx::Error>;

    /// Commits.
    async fn commit(self: Box<Self>) -> Result<(), sqlx::Error>;

    /// Rolls back.
    async fn rollback(self: Box<Self>) -> Result<(), sqlx::Error>;
}

/// Ends an operator action's transaction `tx` by its `result`: commits it on success (the
/// action's audit entry is in it); otherwise rolls it back and audits the refusal or failure on
/// its own, as `action` by `actor` for `reason`, with `detail` and the error.
pub(crate) async fn end_action<T>(
    log: &dyn crate::audit::AuditLog,
    tx: Box<dyn OperatorTx>,
    actor: &str,
    action: &str,
    reason: Option<&str>,
    mut detail: serde_json::Value,
    result: Result<T, ActionError>,
) -> Result<T, ActionError> {
    match result {
        Ok(done) => {
            tx.commit().await?;
            Ok(done)
        }
        Err(error) => {
            tx.rollback().await?;
            detail["error"] = serde_json::json!(error.to_string());
            bulk::audit_on_pool(log, actor, action, error.audit_outcome(), reason, detail).await;
            Err(error)
        }
    }
}

/// Why an operator action was refused or failed. Refusals (everything but [`ActionError::Publish`]
/// and [`ActionError::Unexpected`]) changed nothing.
#[derive(Debug, thiserror::Error)]
pub enum ActionError {
    /// No record has this id (it may have been cleaned up).
    #[error("no record has id {0}")]
    UnknownRecord(i64),
    /// The record is not in a status this action applies to, or not in the one the operator saw.
    #[error("record {id} is {actual}; {action} applies to {allowed} records")]
    WrongStatus {
        /// Record id.
        id: i64,
        /// The action, e.g. `release`.
        action: &'static str,
        /// The record's status now.
        actual: RecordStatus,
        /// The statuses the action accepts here, e.g. `processing` or `failed or dead`.
        allowed: String,
    },
    /// The lease token differs from the one the operator was shown: the record was claimed
    /// again (or released) meanwhile.
    #[error(
        "record {id} is held under another lease now (token {actual}, not {shown} as shown); reload the record and decide again"
    )]
    StaleLease {
        /// Record id.
        id: i64,
        /// The token the operator saw.
        shown: Uuid,
        /// The token now.
        actual: Uuid,
    },
    /// The record changed since the operator saw it (another version): someone acted on it, or
    /// the consumer retried it, meanwhile.
    #[error(
        "record {id} changed since it was shown (version {actual}, not {shown}); reload the record and decide again"
    )]
    Changed {
        /// Record id.
        id: i64,
        /// The version the operator saw.
        shown: i64,
        /// The version now.
        actual: i64,
    },
    /// The lease has not expired: its worker may still be running the handler.
    #[error(
        "record {id}'s lease is live until {expires_at} (worker {owner}); wait until it expires, or force the action with a reason"
    )]
    LiveLease {
        /// Record id.
        id: i64,
        /// Lease expiry, RFC 3339 (database clock).
        expires_at: String,
        /// The lease holder.
        owner: String,
    },
    /// The record has no (complete) stored payload to republish.
    #[error("record {id} has {what}; there is nothing to republish")]
    MissingPayload {
        /// Record id.
        id: i64,
        /// `no stored payload` or `only a truncated payload`.
        what: &'static str,
    },
    /// A poison message: no handler can ever process it, so republishing would only
    /// dead-letter it again.
    #[error("record {0} is a poison message; requeueing cannot help (fix the producer, or leave it dead)")]
    Poison(i64),
    /// The record came from a broker no consumer group of this engine reads from, so there is
    /// nothing to republish it through.
    #[error("record {id} came from {broker}, and no consumer group here reads from {broker}; it cannot be republished")]
    NoPublisher {
        /// Record id.
        id: i64,
        /// The record's `source_broker`.
        broker: String,
    },
    /// No requeue job (or cleanup schedule) has this id.
    #[error("no {what} has id {id}")]
    UnknownJob {
        /// `requeue job` or `cleanup schedule`.
        what: &'static str,
        /// The id asked for.
        id: i64,
    },
    /// No handler of this message type is registered in this consumer group (no engine of the
    /// group has run with it).
    #[error("no handler of message type {message_type:?} in consumer group {group:?}")]
    UnknownHandler {
        /// The consumer group asked for.
        group: String,
        /// The message type asked for.
        message_type: String,
    },
    /// The job's or selection's state refuses the request; the text says why and what to do.
    #[error("{0}")]
    Refused(String),
    /// The request itself is incomplete or invalid (a missing reason or lease token).
    #[error("{0}")]
    Invalid(String),
    /// The broker did not confirm the republished copy; the transaction rolled back.
    #[error("the broker did not take the copy, nothing changed: {0}")]
    Publish(String),
    /// A database failure or a bug. Its text is the whole cause chain (`operator action:
    /// database error: error returned from database: …`), for the log and the audit entry; the
    /// console and the API show the operator only that something failed.
    #[error("{0:#}")]
    Unexpected(#[from] anyhow::Error),
}

/// The HTTP-like class of an [`ActionError`], for the API and the UI.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// The request is invalid (400).
    Invalid,
    /// Nothing has this id (404).
    NotFound,
    /// The record's state does not allow it (409).
    Conflict,
    /// The broker failed (503).
    Unavailable,
    /// A bug or a database failure (500).
    Internal,
}

impl ActionError {
    /// Its class.
    pub fn kind(&self) -> ErrorKind {
        match self {
            ActionError::Invalid(_) => ErrorKind::Invalid,
            ActionError::UnknownRecord(_) | ActionError::UnknownJob { .. } | ActionError::UnknownHandler { .. } => {
                ErrorKind::NotFound
            }
            ActionError::WrongStatus { .. }
            | ActionError::StaleLease { .. }
            | ActionError::Changed { .. }
            | ActionError::LiveLease { .. }
            | ActionError::MissingPayload { .. }
            | ActionError::Poison(_)
            | ActionError::NoPublisher { .. }
            | ActionError::Refused(_) => ErrorKind::Conflict,
            ActionError::Publish(_) => ErrorKind::Unavailable,
            ActionError::Unexpected(_) => ErrorKind::Internal,
        }
    }

    /// The audit outcome of an action that ended with this error.
    pub(crate) fn audit_outcome(&self) -> crate::audit::AuditOutcome {
        match self.kind() {
            ErrorKind::Unavailable | ErrorKind::Internal => crate::audit::AuditOutcome::Failed,
            _ => crate::audit::AuditOutcome::Refused,
        }
    }
}

impl From<sqlx::Error> for ActionError {
    fn from(e: sqlx::Error) -> Self {
        ActionError::Unexpected(anyhow::Error::new(e).context("operator action: database error"))
    }
}

/// Longest reason accepted, in characters.
pub const MAX_REASON_CHARS: usize = 1000;

/// An optional reason, trimmed; `None` when missing or blank.
///
/// Errors: [`ActionError::Invalid`] when longer than [`MAX_REASON_CHARS`] (nothing is cut:
/// the operator shortens it), or holding a control character other than newline and tab.
pub(crate) fn optional_reason(reason: Option<&str>) -> Result<Option<&str>, ActionError> {
    let reason = reason.map(str::trim).filter(|r| !r.is_empty());
    let control = |r: &str| r.chars().any(|c| c.is_control() && !matches!(c, '\n' | '\t'));
    match reason.map(|r| (r.chars().count(), control(r))) {
        Some((n, _)) if n > MAX_REASON_CHARS => {
            Err(ActionError::Invalid(format!("a reason is at most {MAX_REASON_CHARS} characters; this one has {n}")))
        }
        Some((_, true)) => Err(ActionError::Invalid(
            "a reason cannot hold control characters (other than newlines and tabs)".to_owned(),
        )),
        _ => Ok(reason),
    }
}

/// A required reason, trimmed.
///
/// Errors: [`ActionError::Invalid`] when missing, blank or too long ([`optional_reason`]).
pub(crate) fn required_reason<'a>(reason: Option<&'a str>, what: &str) -> Result<&'a str, ActionError> {
    optional_reason(reason)?.ok_or_else(|| ActionError::Invalid(format!("a reason is required to {what}")))
}
