//! Single-record actions: release, mark succeeded, dead-letter, requeue, one skeleton
//! ([`record_action`]) for all four. See the module docs of [`crate::actions`] for the guard
//! protocol they share. The rules are here; each database's statements are behind
//! [`RecordBooks`] (`store/postgres/record_books.rs`, `store/mysql/record_books.rs`).

use async_trait::async_trait;
use chrono::{DateTime, SecondsFormat, Utc};
use serde_json::json;
use sqlx::FromRow;
use uuid::Uuid;

use super::republish::{Publishers, StoredMessage, republish};
use super::{ActionError, OperatorTx, optional_reason, required_reason};
use crate::audit::{AuditOutcome, NewAuditEntry};
use crate::console::ConsoleStore;
use crate::record::RecordStatus;

/// What the operator was shown and asks for; the guards of every single-record action.
#[derive(Debug, Clone, Default)]
pub struct RecordAction<'a> {
    /// The record's id.
    pub record_id: i64,
    /// The status the operator saw; the action is refused when the record has moved on.
    /// `None`: any status the action accepts.
    pub expected_status: Option<RecordStatus>,
    /// The lease token shown with a `processing` record; required for one (and must still be
    /// the record's token). Given for a record that is no longer processing, the action is
    /// refused (the operator saw another state).
    pub lease_token: Option<Uuid>,
    /// The record's version as shown (`dedup_records.version`, raised by every state
    /// transition, not by duplicate notes or lease heartbeats): the action is refused when the
    /// record changed since, whatever its status. This is what stops two identical requeues of
    /// a `failed` record (its status stays `failed`) from both republishing. `None`: not
    /// checked.
    pub expected_version: Option<i64>,
    /// Act on a `processing` record whose lease has not expired yet (its worker may still be
    /// running; a reason is required anyway).
    pub force: bool,
    /// Why; required by release, mark succeeded and dead-letter, optional for requeue; at most
    /// 1000 characters.
    pub reason: Option<&'a str>,
    /// Release only: also publish the stored message again at once (refused for the others).
    pub requeue: bool,
}

/// A completed action.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ActionOutcome {
    /// Record id.
    pub record_id: i64,
    /// Its consumer group.
    pub consumer_group: String,
    /// Its message id.
    pub message_id: String,
    /// The status it had.
    pub from: RecordStatus,
    /// The status it has now.
    pub status: RecordStatus,
    /// Whether its stored message was published again (and confirmed by the broker).
    pub republished: bool,
    /// The audit entry's id.
    pub audit_id: i64,
}

/// A record's row as an operator action locked it: what the guards check and what a requeue
/// publishes. Read by [`RecordChange::lock`].
#[derive(Debug, FromRow)]
pub struct LockedRecord {
    pub(crate) consumer_group: String,
    pub(crate) status: String,
    pub(crate) lease_owner: Option<String>,
    pub(crate) lease_token: Option<Uuid>,
    pub(crate) lease_expires_at: Option<DateTime<Utc>>,
    pub(crate) lease_expired: bool,
    /// A redelivery of the stuck record was parked (acked, payload kept): no delivery of it is
    /// left in the broker.
    pub(crate) parked: bool,
    pub(crate) version: i64,
    #[sqlx(flatten)]
    pub(crate) stored: StoredMessage,
}

impl LockedRecord {
    /// The record's id.
    pub fn id(&self) -> i64 {
        self.stored.id
    }

    /// Its consumer group.
    pub fn consumer_group(&self) -> &str {
        &self.consumer_group
    }

    fn status(&self) -> Result<RecordStatus, ActionError> {
        self.status.parse().map_err(|e| ActionError::Unexpected(anyhow::Error::new(e)))
    }
}

/// The transition of one operator action, made by [`RecordChange::transition`] on a row it
/// locked and the guards passed. Each but a requeue closes the open attempt of a `processing`
/// record (the one its lost worker started) with its outcome and note.
#[derive(Debug, Clone, Copy)]
pub enum RecordTransition<'a> {
    /// `processing` → `failed`, the lease cleared, one more attempt if none is left; with
    /// `requeue`, due now and no longer parked. The attempt: `released`, `note`.
    Release {
        /// Also due now (the stored message is published again).
        requeue: bool,
        /// The attempt's note.
        note: &'a str,
    },
    /// → `succeeded`: lease, payload, headers and error class cleared, completed now. The
    /// attempt: `succeeded`, `note`.
    MarkSucceeded {
        /// The attempt's note.
        note: &'a str,
    },
    /// → `dead`, payload kept, `last_error` = `note`, error class [`HAND_DEAD_LETTER_CLASS`].
    /// The attempt: `dead`, `note`.
    DeadLetter {
        /// The attempt's note and the record's last error.
        note: &'a str,
    },
    /// `failed`/`dead` → `failed`, claimable now (one more attempt when none is left).
    Requeue,
}

/// The records' rows on one database for the single-record operator actions: the transaction
/// each runs in. Errors are the database's.
#[async_trait]
pub trait RecordBooks: Send + Sync {
    /// A transaction for one operator's action on a record.
    async fn begin_record_change(&self) -> Result<Box<dyn RecordChange>, sqlx::Error>;
}

/// One operator's action on one record, in one transaction: nothing is kept unless it commits.
#[async_trait]
pub trait RecordChange: OperatorTx {
    /// Record `id`, its row locked until the transaction ends; `None` when there is none.
    async fn lock(&mut self, id: i64) -> Result<Option<LockedRecord>, sqlx::Error>;

    /// Makes `change` on the locked `record`, whose status is `from` (guarded again in the
    /// statement), with the bookkeeping its database needs (the status counts).
    async fn transition(
        &mut self,
        record: &LockedRecord,
        from: RecordStatus,
        change: RecordTransition<'_>,
    ) -> Result<(), sqlx::Error>;

}

/// The shared guards: an accepted status, the version and status the operator saw, and for a
/// `processing` record the shown lease token and an expired lease (unless forced).
fn guard(
    row: &LockedRecord,
    action: &'static str,
    allowed: &[RecordStatus],
    params: &RecordAction<'_>,
) -> Result<RecordStatus, ActionError> {
    let id = row.stored.id;
    let actual = row.status()?;
    let names = |s: &[RecordStatus]| s.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(" or ");
    if !allowed.contains(&actual) {
        return Err(ActionError::WrongStatus { id, action, actual, allowed: names(allowed) });
    }
    if let Some(shown) = params.expected_version.filter(|v| *v != row.version) {
        return Err(ActionError::Changed { id, shown, actual: row.version });
    }
    // A lease token says the operator saw a processing record: it no longer is.
    let shown = params.expected_status.or(params.lease_token.map(|_| RecordStatus::Processing));
    if let Some(expected) = shown.filter(|e| *e != actual) {
        return Err(ActionError::WrongStatus {
            id,
            action,
            actual,
            allowed: format!("{} (as shown; the record changed since)", expected.as_str()),
        });
    }
    if actual == RecordStatus::Processing {
        let shown = params.lease_token.ok_or_else(|| {
            ActionError::Invalid(format!(
                "record {id} is processing: give the lease token shown with it, so the action cannot hit a newer claim"
            ))
        })?;
        let current = row.lease_token.unwrap_or_default();
        if current != shown {
            return Err(ActionError::StaleLease { id, shown, actual: current });
        }
        if !row.lease_expired && !params.force {
            return Err(ActionError::LiveLease {
                id,
                expires_at: row
                    .lease_expires_at
                    .map(|t| t.to_rfc3339_opts(SecondsFormat::Millis, true))
                    .unwrap_or_default(),
                owner: row.lease_owner.clone().unwrap_or_default(),
            });
        }
    }
    Ok(actual)
}

/// The transition an action made, before it is audited and committed.
struct Done {
    from: RecordStatus,
    to: RecordStatus,
    republished: bool,
}

/// What is known of the record for the audit entry, whatever the outcome.
#[derive(Default)]
struct Seen {
    group: Option<String>,
    message_id: Option<String>,
}

/// Audits and commits (on success) or rolls back and audits (on refusal or failure).
async fn conclude(
    store: &dyn ConsoleStore,
    mut tx: Box<dyn RecordChange>,
    actor: &str,
    verb: &str,
    params: &RecordAction<'_>,
    seen: Seen,
    result: Result<Done, ActionError>,
) -> Result<ActionOutcome, ActionError> {
    let message_ids: Vec<String> = seen.message_id.iter().cloned().collect();
    let mut detail = json!({
        "record_id": params.record_id,
        "expected_status": params.expected_status,
        "lease_token": params.lease_token,
        "expected_version": params.expected_version,
        "force": params.force,
        "requeue": params.requeue,
    });
    let entry = |outcome, detail| NewAuditEntry {
        actor,
        action: verb,
        outcome,
        // A reason too long to accept is not stored either.
        reason: optional_reason(params.reason).ok().flatten(),
        consumer_group: seen.group.as_deref(),
        message_ids: &message_ids,
        detail,
        source: None,
    };
    match result {
        Ok(done) => {
            detail["from"] = json!(done.from);
            detail["to"] = json!(done.to);
            detail["republished"] = json!(done.republished);
            let audit_id = tx.audit(&entry(AuditOutcome::Ok, detail)).await?;
            tx.commit().await?;
            tracing::info!(actor, action = verb, record_id = params.record_id, from = %done.from, to = %done.to,
                republished = done.republished, "operator action");
            Ok(ActionOutcome {
                record_id: params.record_id,
                consumer_group: seen.group.unwrap_or_default(),
                message_id: seen.message_id.unwrap_or_default(),
                from: done.from,
                status: done.to,
                republished: done.republished,
                audit_id,
            })
        }
        Err(error) => {
            // Nothing the action did may commit; the entry goes in on its own.
            tx.rollback().await?;
            detail["error"] = json!(error.to_string());
            if let Err(e) = store.record(&entry(error.audit_outcome(), detail)).await {
                tracing::error!(error = %e, "could not write the audit entry of a refused or failed action");
            }
            Err(error)
        }
    }
}

/// A single-record operator action (DESIGN.md, "Operator actions"). [`record_action`] runs
/// each through the same guarded compare-and-set; they differ in the statuses they accept,
/// whether a reason is required, and the transition.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RecordActionKind {
    /// Releases a stuck record: `processing` → `failed` with the lease cleared and the open
    /// attempt closed as `released`, so the next delivery or a requeue can claim it. Guards: the
    /// shown lease token, an expired lease unless `force`; a reason is required. With
    /// [`RecordAction::requeue`] the stored message is also published again at once (in the same
    /// transaction: if the broker does not confirm it, nothing changes).
    Release,
    /// Marks a record `succeeded` because the operator verified its effect happened: a stuck
    /// `processing` record (lease token guard, expired unless `force`), or a `failed` or `dead`
    /// one. The lease and the stored payload are cleared (as on any success); further deliveries
    /// are skipped as duplicates. A reason is required.
    MarkSucceeded,
    /// Dead-letters a record by hand: a stuck `processing` one (lease token guard, expired
    /// unless `force`) or a `failed` one becomes `dead` with its payload kept, `last_error`
    /// naming the operator and the reason, and error class `OPERATOR: dead-lettered by hand`. A reason
    /// is required.
    DeadLetter,
    /// Requeues a `failed` or `dead` record: publishes its stored payload, headers and the same
    /// message id to its original exchange and routing key (Kafka: topic and key) and makes it
    /// claimable (`failed`, one more attempt if it had used them all, due now), in one
    /// transaction held until the broker confirmed the copy. A `succeeded` record is never
    /// requeued; poison messages and records without a complete payload are refused. The
    /// reason is optional.
    Requeue,
}

impl RecordActionKind {
    /// The audit log's action, e.g. `record.release`.
    pub(crate) fn audit_action(self) -> &'static str {
        match self {
            RecordActionKind::Release => "record.release",
            RecordActionKind::MarkSucceeded => "record.mark_succeeded",
            RecordActionKind::DeadLetter => "record.dead_letter",
            RecordActionKind::Requeue => "record.requeue",
        }
    }

    /// How refusals name it, e.g. `mark succeeded`.
    pub fn name(self) -> &'static str {
        match self {
            RecordActionKind::Release => "release",
            RecordActionKind::MarkSucceeded => "mark succeeded",
            RecordActionKind::DeadLetter => "dead-letter",
            RecordActionKind::Requeue => "requeue",
        }
    }

    /// The statuses it applies to.
    pub(crate) fn applies_to(self) -> &'static [RecordStatus] {
        use RecordStatus::{Dead, Failed, Processing};
        match self {
            RecordActionKind::Release => &[Processing],
            RecordActionKind::MarkSucceeded => &[Processing, Failed, Dead],
            RecordActionKind::DeadLetter => &[Processing, Failed],
            RecordActionKind::Requeue => &[Failed, Dead],
        }
    }

    /// What a reason is required for (`None`: it is optional), as refusals say it.
    fn reason_required_to(self) -> Option<&'static str> {
        match self {
            RecordActionKind::Release => Some("release a record"),
            RecordActionKind::MarkSucceeded => Some("mark a record succeeded"),
            RecordActionKind::DeadLetter => Some("dead-letter a record"),
            RecordActionKind::Requeue => None,
        }
    }
}

/// Runs `kind` on one record as `actor` (`user:<name>`, `cli:<user>`, ...): locks the row,
/// checks the guards of `params` against it (what the operator was shown), makes the
/// transition with one conditional `UPDATE`, republishes the stored message through
/// `publishers` where the action does, and writes the audit entry in the same transaction. A
/// refusal or failure rolls back and is audited on its own (see the module docs of
/// [`crate::console::actions`]). The console, the REST API and the CLI all come here.
///
/// Errors: see [`ActionError`]; every refusal leaves the record as it was.
#[tracing::instrument(skip_all, fields(record_id = params.record_id, action = kind.name(), actor), err(level = "warn"))]
pub async fn record_action(
    store: &dyn ConsoleStore,
    actor: &str,
    kind: RecordActionKind,
    params: &RecordAction<'_>,
    publishers: &Publishers,
) -> Result<ActionOutcome, ActionError> {
    let mut tx = store.begin_record_change().await?;
    let mut seen = Seen::default();
    let result = async {
        if params.requeue && kind != RecordActionKind::Release {
            return Err(ActionError::Invalid("requeue only applies to release".to_owned()));
        }
        let reason = match kind.reason_required_to() {
            Some(what) => Some(required_reason(params.reason, what)?),
            None => optional_reason(params.reason)?,
        };
        let row = tx.lock(params.record_id).await?.ok_or(ActionError::UnknownRecord(params.record_id))?;
        seen = Seen { group: Some(row.consumer_group.clone()), message_id: Some(row.stored.message_id.clone()) };
        let from = guard(&row, kind.name(), kind.applies_to(), params)?;
        let note = |done: &str| format!("{done} by {actor}: {}", reason.unwrap_or_default());
        let (to, republished) = match kind {
            RecordActionKind::Release => {
                if params.requeue {
                    row.stored.check_republishable()?;
                }
                // A parked redelivery was acknowledged: without a republish nothing would ever
                // bring the released record back, so it is requeued with the release.
                let requeue = params.requeue || (row.parked && row.stored.check_republishable().is_ok());
                tx.transition(&row, from, RecordTransition::Release { requeue, note: &note("released") }).await?;
                (RecordStatus::Failed, requeue)
            }
            RecordActionKind::MarkSucceeded => {
                let note = note("marked succeeded");
                tx.transition(&row, from, RecordTransition::MarkSucceeded { note: &note }).await?;
                (RecordStatus::Succeeded, false)
            }
            RecordActionKind::DeadLetter => {
                let note = note("dead-lettered");
                tx.transition(&row, from, RecordTransition::DeadLetter { note: &note }).await?;
                (RecordStatus::Dead, false)
            }
            RecordActionKind::Requeue => {
                row.stored.check_republishable()?;
                tx.transition(&row, from, RecordTransition::Requeue).await?;
                (RecordStatus::Failed, true)
            }
        };
        if republished {
            republish(publishers, &row.stored).await?;
        }
        Ok(Done { from, to, republished })
    }
    .await;
    conclude(store, tx, actor, kind.audit_action(), params, seen, result).await
}

/// Error class of records dead-lettered by hand (the dead-letters page groups by it).
pub const HAND_DEAD_LETTER_CLASS: &str = "OPERATOR: dead-lettered by hand";
