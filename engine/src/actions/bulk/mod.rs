//! Bulk requeue (DESIGN.md, "Operator actions"): requeue the `failed` and `dead` records a
//! filter matches, rate-limited, in the background, with a preview first.
//!
//! 1. [`requeue_preview`]: how many records the filter matches now, how many would be
//!    requeued and how many skipped, by reason (already succeeded, lease live, stuck, poison,
//!    payload missing).
//! 2. [`requeue_job_start`]: the operator confirmed the count; the selection is **frozen** as one
//!    `requeue_job_items` row per matched record (records arriving later are not included), and
//!    refused when it no longer has the confirmed count.
//! 3. [`runner::run_job`] works through the pending items, skipping those whose record changed
//!    since the freeze (another version: requeued by another job or by hand, retried, released): a canary batch first (all must
//!    publish, else the job pauses), then the rest at `rate_per_sec`, pausing itself when the
//!    share of failed publishes among the recent items passes the threshold. One runner per job
//!    (a lock of the database's: PostgreSQL's advisory lock, MySQL's `GET_LOCK`);
//!    [`runner::supervise`] starts runners for running jobs, so a job survives a server restart.
//! 4. [`requeue_job_control`]: pause, resume, cancel.
//!
//! The rules are here and in `runner.rs`; each database's statements are behind
//! [`RequeueJobBooks`] (`store/<database>/requeue_jobs.rs`).

mod books;
pub mod runner;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::json;
use sqlx::FromRow;

pub use books::{
    FrozenJob, FrozenSelection, ItemVerdict, JobChange, LockedCandidate, NewRequeueJob, PendingItem, RequeueBatch,
    RequeueJobBooks, RunnerView,
};

use super::{ActionError, OperatorTx, end_action, optional_reason};
use crate::audit::{AuditLog, AuditOutcome, NewAuditEntry};
use crate::console::ConsoleStore;
use crate::console::filter::RecordFilter;

/// Most records one job may take (and one preview counts).
pub const MAX_JOB_RECORDS: i64 = 1_000_000;
/// Default rate, messages per second.
pub const DEFAULT_RATE: f64 = 50.0;
/// Default canary size.
pub const DEFAULT_CANARY: i32 = 10;
/// Default failure threshold (share of failed publishes among recent items).
pub const DEFAULT_FAILURE_THRESHOLD: f64 = 0.2;
/// Most messages per second a job may ask for.
pub const MAX_RATE: f64 = 10_000.0;

/// What a bulk requeue of a filter would do now.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RequeuePreview {
    /// Records the filter matches now.
    pub matched: i64,
    /// Of those, records that would be requeued.
    pub would_requeue: i64,
    /// Records that would be skipped, by reason (`already succeeded`, `lease live`, `stuck:
    /// release it first`, `poison message`, `payload missing`), largest first.
    pub skipped: Vec<(String, i64)>,
}

/// Counts what a bulk requeue of `filter` would do.
///
/// Errors: [`ActionError::Refused`] when the filter matches more than `MAX_JOB_RECORDS` (1 000 000).
pub async fn requeue_preview(store: &dyn ConsoleStore, filter: &RecordFilter) -> Result<RequeuePreview, ActionError> {
    let mut rows = store.requeue_counts(filter, MAX_JOB_RECORDS + 1).await?;
    rows.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    let mut preview = RequeuePreview::default();
    for (skip, n) in rows {
        preview.matched += n;
        match skip {
            None => preview.would_requeue = n,
            Some(reason) => preview.skipped.push((reason, n)),
        }
    }
    if preview.matched > MAX_JOB_RECORDS {
        return Err(ActionError::Refused(format!(
            "the filter matches more than {MAX_JOB_RECORDS} records; narrow it (group, type, error class, time range)"
        )));
    }
    Ok(preview)
}

/// How to run a bulk requeue.
#[derive(Debug, Clone)]
pub struct RequeueJobParams<'a> {
    /// Which records (the records page's filter).
    pub filter: &'a RecordFilter,
    /// Messages per second, in (0, 10 000].
    pub rate_per_sec: f64,
    /// Items in the canary batch (0: none).
    pub canary_size: i32,
    /// Pause when the share of failed publishes among the recent items passes this, in (0, 1].
    pub failure_threshold: f64,
    /// The number of records the operator confirmed (the preview's `would_requeue`); the job is
    /// refused when the selection no longer has it. `None`: no check (CLI with `--yes`).
    pub expected_count: Option<i64>,
    /// Why (optional).
    pub reason: Option<&'a str>,
}

/// A bulk requeue job and its progress.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, FromRow)]
pub struct RequeueJob {
    /// Job id.
    pub id: i64,
    /// When it was confirmed.
    pub created_at: DateTime<Utc>,
    /// Who confirmed it.
    pub created_by: String,
    /// Why.
    pub reason: Option<String>,
    /// The filter (JSON of [`RecordFilter`]).
    pub filter: serde_json::Value,
    /// `running`, `paused`, `cancelled` or `completed`.
    pub state: String,
    /// Why it paused.
    pub paused_reason: Option<String>,
    /// Messages per second.
    pub rate_per_sec: f64,
    /// Canary batch size.
    pub canary_size: i32,
    /// Failure threshold (0..1].
    pub failure_threshold: f64,
    /// Records in the frozen selection.
    pub total: i64,
    /// Requeued.
    pub done: i64,
    /// Skipped (see the items' details).
    pub skipped: i64,
    /// Publish failed (record unchanged).
    pub failed: i64,
    /// When it started.
    pub started_at: DateTime<Utc>,
    /// When it completed or was cancelled.
    pub finished_at: Option<DateTime<Utc>>,
    /// Seconds it has run (until finished, else until now), database clock.
    pub elapsed_secs: f64,
}

impl RequeueJob {
    /// Items not handled yet.
    pub fn pending(&self) -> i64 {
        (self.total - self.done - self.skipped - self.failed).max(0)
    }

    /// Publishes per second so far.
    pub fn observed_rate(&self) -> f64 {
        if self.elapsed_secs > 0.0 { (self.done + self.failed) as f64 / self.elapsed_secs } else { 0.0 }
    }

    /// Seconds until done at the job's rate; `None` unless running.
    pub fn eta_secs(&self) -> Option<f64> {
        (self.state == "running").then(|| self.pending() as f64 / self.rate_per_sec)
    }
}

/// One job.
///
/// Errors: [`ActionError::UnknownJob`].
pub async fn requeue_job(store: &dyn ConsoleStore, id: i64) -> Result<RequeueJob, ActionError> {
    store.requeue_job(id).await?.ok_or(ActionError::UnknownJob { what: "requeue job", id })
}

/// The latest `limit` jobs (1 to 500), newest first.
pub async fn requeue_jobs(store: &dyn ConsoleStore, limit: i64) -> Result<Vec<RequeueJob>, ActionError> {
    Ok(store.requeue_jobs(limit.clamp(1, 500)).await?)
}

fn validate(params: &RequeueJobParams<'_>) -> Result<(), ActionError> {
    let bad = |m: String| Err(ActionError::Invalid(m));
    optional_reason(params.reason)?;
    if !(params.rate_per_sec > 0.0 && params.rate_per_sec <= MAX_RATE) {
        return bad(format!("rate must be more than 0 and at most {MAX_RATE} messages/s, got {}", params.rate_per_sec));
    }
    if !(0..=10_000).contains(&params.canary_size) {
        return bad(format!("canary size must be 0 to 10000, got {}", params.canary_size));
    }
    if !(params.failure_threshold > 0.0 && params.failure_threshold <= 1.0) {
        return bad(format!("failure threshold must be in (0, 1], got {}", params.failure_threshold));
    }
    Ok(())
}

/// Most message ids named in the start entry of the audit log (the job's items name them all).
const AUDITED_IDS: i64 = 10_000;

/// Freezes the selection of `params.filter` and creates a running job (the runner picks it up).
/// Audited as `bulk.requeue.start` with the filter, the counts and (up to 10 000) message ids.
///
/// Errors: [`ActionError::Invalid`] for bad settings; [`ActionError::Refused`] when nothing would
/// be requeued, the selection is too large, or it no longer has `expected_count` records (then
/// preview again).
#[tracing::instrument(skip_all, fields(actor), err(level = "warn"))]
pub async fn requeue_job_start(
    store: &dyn ConsoleStore,
    actor: &str,
    params: &RequeueJobParams<'_>,
) -> Result<RequeueJob, ActionError> {
    const ACTION: &str = "bulk.requeue.start";
    let filter_json = serde_json::to_value(params.filter).map_err(|e| ActionError::Unexpected(e.into()))?;
    // A reason too long to accept is not stored either.
    let reason = optional_reason(params.reason).ok().flatten();
    let mut detail = json!({
        "filter": filter_json,
        "rate_per_sec": params.rate_per_sec,
        "canary_size": params.canary_size,
        "failure_threshold": params.failure_threshold,
        "expected_count": params.expected_count,
    });
    let job = NewRequeueJob {
        actor,
        reason,
        filter: params.filter,
        filter_json: &filter_json,
        rate_per_sec: params.rate_per_sec,
        canary_size: params.canary_size,
        failure_threshold: params.failure_threshold,
    };
    let frozen = match validate(params) {
        Ok(()) => store.freeze_requeue_job(&job, MAX_JOB_RECORDS + 1).await.map_err(ActionError::from),
        Err(error) => Err(error),
    };
    let (selection, mut tx) = match frozen {
        Ok(frozen) => frozen,
        Err(error) => {
            detail["error"] = json!(error.to_string());
            audit_on_pool(store, actor, ACTION, error.audit_outcome(), reason, detail).await;
            return Err(error);
        }
    };
    let result = match check_selection(&selection, params.expected_count) {
        Ok(()) => async {
            let ids = tx.pending_message_ids(selection.id, AUDITED_IDS).await?;
            let mut detail = detail.clone();
            detail["job_id"] = json!(selection.id);
            detail["total"] = json!(selection.total);
            detail["skipped"] = json!(selection.skipped);
            let entry = NewAuditEntry {
                actor,
                action: ACTION,
                outcome: AuditOutcome::Ok,
                reason,
                consumer_group: params.filter.group.as_deref(),
                message_ids: &ids,
                detail,
                source: None,
            };
            tx.audit(&entry).await?;
            Ok(())
        }
        .await,
        Err(error) => Err(error),
    };
    let tx: Box<dyn OperatorTx> = tx;
    end_action(store, tx, actor, ACTION, reason, detail, result).await?;
    tracing::info!(actor, job_id = selection.id, selection.total, selection.skipped, "bulk requeue started");
    requeue_job(store, selection.id).await
}

/// Whether a frozen selection may run: not more than [`MAX_JOB_RECORDS`], the count the
/// operator confirmed (when given), and something to requeue.
fn check_selection(selection: &FrozenSelection, expected_count: Option<i64>) -> Result<(), ActionError> {
    let requeueable = selection.total - selection.skipped;
    if selection.total > MAX_JOB_RECORDS {
        return Err(ActionError::Refused(format!("the filter matches more than {MAX_JOB_RECORDS} records; narrow it")));
    }
    if let Some(expected) = expected_count.filter(|e| *e != requeueable) {
        return Err(ActionError::Refused(format!(
            "the selection changed: {requeueable} records would be requeued now, {expected} were confirmed; preview again"
        )));
    }
    if requeueable == 0 {
        return Err(ActionError::Refused("the filter matches no record that can be requeued".to_owned()));
    }
    Ok(())
}

/// Writes an entry outside any transaction (refusals, failures, runner events); a failure to
/// write is logged.
pub(crate) async fn audit_on_pool(
    log: &dyn AuditLog,
    actor: &str,
    action: &str,
    outcome: AuditOutcome,
    reason: Option<&str>,
    detail: serde_json::Value,
) {
    let entry =
        NewAuditEntry { actor, action, outcome, reason, consumer_group: None, message_ids: &[], detail, source: None };
    if let Err(e) = log.record(&entry).await {
        tracing::error!(error = %e, action, "could not write an audit entry");
    }
}

/// What an operator does to a job.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum JobControl {
    /// `running` → `paused`.
    Pause,
    /// `paused` → `running` (a runner picks it up within a second).
    Resume,
    /// `running` or `paused` → `cancelled`; pending items stay untouched.
    Cancel,
}

impl JobControl {
    fn verb(self) -> &'static str {
        match self {
            JobControl::Pause => "bulk.requeue.pause",
            JobControl::Resume => "bulk.requeue.resume",
            JobControl::Cancel => "bulk.requeue.cancel",
        }
    }
}

/// Pauses, resumes or cancels a job: a guarded compare-and-set on its state, audited.
///
/// Errors: [`ActionError::UnknownJob`]; [`ActionError::Refused`] when the job's state does not
/// allow it (e.g. resuming a completed job).
#[tracing::instrument(skip_all, fields(actor, job_id = id), err(level = "warn"))]
pub async fn requeue_job_control(
    store: &dyn ConsoleStore,
    actor: &str,
    id: i64,
    control: JobControl,
    reason: Option<&str>,
) -> Result<RequeueJob, ActionError> {
    let reason = optional_reason(reason)?;
    let (from, to, note): (&[&str], &str, Option<String>) = match control {
        JobControl::Pause => (&["running"], "paused", Some(format!("paused by {actor}"))),
        JobControl::Resume => (&["paused"], "running", None),
        JobControl::Cancel => (&["running", "paused"], "cancelled", None),
    };
    let detail = json!({ "job_id": id, "to": to });
    let mut tx = store.begin_job_change().await?;
    let result = async {
        match tx.lock_job(id).await? {
            None => return Err(ActionError::UnknownJob { what: "requeue job", id }),
            Some(state) if !from.contains(&state.as_str()) => {
                return Err(ActionError::Refused(format!(
                    "requeue job {id} is {state}; it can be {}d only when {}",
                    control.verb().rsplit('.').next().unwrap_or_default(),
                    from.join(" or ")
                )));
            }
            Some(_) => {}
        }
        tx.set_job_state(id, to, note.as_deref()).await?;
        let entry = NewAuditEntry {
            actor,
            action: control.verb(),
            outcome: AuditOutcome::Ok,
            reason,
            consumer_group: None,
            message_ids: &[],
            detail: detail.clone(),
            source: None,
        };
        tx.audit(&entry).await?;
        Ok(())
    }
    .await;
    let tx: Box<dyn OperatorTx> = tx;
    end_action(store, tx, actor, control.verb(), reason, detail, result).await?;
    requeue_job(store, id).await
}
