//! Cleanup schedules (DESIGN.md, "Operator actions"): delete records of the chosen statuses
//! (default only `succeeded`) older than a retention (default 30 days), in bounded batches that
//! never hold locks long enough to stall consumers. Schedules live in the database and are
//! edited from the console; [`scheduler`] runs them, exactly one instance per tick. What each
//! database keeps and locks is [`CleanupBooks`] (`store/<database>/cleanup.rs`); the rules are
//! here.
//!
//! Age is `completed_at` for `succeeded` records and `updated_at` for `failed` and `dead` ones.
//! `processing` records are never deleted.
//!
//! The transaction that deletes a batch keeps a fingerprint of each record it deletes (its
//! consumer group and message id hashed to 64 bits, and when it was first seen) for the
//! schedule's fingerprint horizon, so that a copy arriving after its record is gone is known as
//! a late duplicate ([`late`], DESIGN.md "Late duplicates"). Each run then forgets the
//! fingerprints past their horizon and the late-duplicate notes older than
//! [`late::KEEP_NOTES_DAYS`].

mod books;
pub mod late;
pub mod scheduler;

pub use books::{CleanupBooks, DeleteBatch, RunEnd, ScheduleRow};
pub use late::{RetentionAdvice, retention_advice};
pub use scheduler::CronSchedule;

use std::time::Instant;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::json;
use sqlx::FromRow;

use super::{ActionError, NamedLock};
use super::bulk::audit_on_pool;
use crate::audit::{AuditOutcome, NewAuditEntry};
use crate::console::ConsoleStore;
use crate::record::RecordStatus;

/// Default retention, days.
pub const DEFAULT_RETENTION_DAYS: i32 = 30;
/// Default records per delete batch.
pub const DEFAULT_BATCH_SIZE: i32 = 5000;
/// Retention should be at least this many times the longest delay observed (duplicates, late
/// deliveries).
pub const RETENTION_SAFETY_FACTOR: f64 = 2.0;

/// Longest schedule name accepted, in characters.
pub const MAX_NAME_CHARS: usize = 100;
/// Longest cron expression accepted, in characters (five fields with lists and ranges fit).
pub const MAX_CRON_CHARS: usize = 200;
/// A schedule keeps the fingerprints of what it deletes this many times its retention, unless
/// it says otherwise ([`ScheduleInput::fingerprint_days`]).
pub const FINGERPRINT_HORIZON_FACTOR: i32 = 10;
/// The longest fingerprint horizon, days (100 years).
pub const MAX_FINGERPRINT_DAYS: i32 = 36_500;

/// What a schedule is made of (create and edit).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ScheduleInput {
    /// A unique name, 1 to 100 characters.
    pub name: String,
    /// A five-field cron expression (minute hour day-of-month month day-of-week), UTC; at most 200
    /// characters.
    pub cron: String,
    /// Delete records older than this many days (1 to 3650).
    pub retention_days: i32,
    /// Records per delete batch (1 to 100 000).
    pub batch_size: i32,
    /// Statuses deleted: `succeeded` (default), and `failed` / `dead` only when asked for.
    pub statuses: Vec<RecordStatus>,
    /// Only this consumer group; `None`: all.
    pub consumer_group: Option<String>,
    /// Whether the scheduler runs it.
    pub enabled: bool,
    /// Days to keep the fingerprints of the records it deletes (0 to 36 500; 0 keeps none);
    /// `None`: ten times the retention.
    #[serde(default)]
    pub fingerprint_days: Option<i32>,
}

impl Default for ScheduleInput {
    fn default() -> Self {
        Self {
            name: String::new(),
            cron: "0 3 * * *".to_owned(),
            retention_days: DEFAULT_RETENTION_DAYS,
            batch_size: DEFAULT_BATCH_SIZE,
            statuses: vec![RecordStatus::Succeeded],
            consumer_group: None,
            enabled: true,
            fingerprint_days: None,
        }
    }
}

impl ScheduleInput {
    fn validate(&self) -> Result<CronSchedule, ActionError> {
        let bad = |m: String| Err(ActionError::Invalid(m));
        let name_chars = self.name.trim().chars().count();
        if !(1..=MAX_NAME_CHARS).contains(&name_chars) {
            return bad(format!("a schedule needs a name of 1 to {MAX_NAME_CHARS} characters, got {name_chars}"));
        }
        if self.name.chars().any(char::is_control) || self.cron.chars().any(|c| c.is_control() && c != '\t') {
            return bad("a schedule's name and cron expression cannot hold control characters".to_owned());
        }
        if let Some(group) = &self.consumer_group {
            crate::record::ConsumerGroup::parse(group.as_str()).map_err(|e| ActionError::Invalid(e.to_string()))?;
        }
        if !(1..=3650).contains(&self.retention_days) {
            return bad(format!("retention must be 1 to 3650 days, got {}", self.retention_days));
        }
        if let Some(days) = self.fingerprint_days.filter(|d| !(0..=MAX_FINGERPRINT_DAYS).contains(d)) {
            return bad(format!("fingerprints are kept 0 to {MAX_FINGERPRINT_DAYS} days, got {days}"));
        }
        if !(1..=100_000).contains(&self.batch_size) {
            return bad(format!("batch size must be 1 to 100000 records, got {}", self.batch_size));
        }
        if self.statuses.is_empty() {
            return bad("choose at least one status to delete (normally succeeded)".to_owned());
        }
        if self.statuses.contains(&RecordStatus::Processing) {
            return bad("processing records are never deleted by cleanup".to_owned());
        }
        CronSchedule::parse(&self.cron)
    }

    fn status_names(&self) -> Vec<&'static str> {
        let mut names: Vec<&'static str> = self.statuses.iter().map(|s| s.as_str()).collect();
        names.sort_unstable();
        names.dedup();
        names
    }
}

/// A stored schedule.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, FromRow)]
pub struct CleanupSchedule {
    /// Id.
    pub id: i64,
    /// Name.
    pub name: String,
    /// Cron expression (UTC).
    pub cron: String,
    /// Retention in days.
    pub retention_days: i32,
    /// Records per batch.
    pub batch_size: i32,
    /// Statuses deleted.
    pub statuses: Vec<String>,
    /// Only this group; `None`: all.
    pub consumer_group: Option<String>,
    /// Run by the scheduler.
    pub enabled: bool,
    /// Days the fingerprints of deleted records are kept; `None`: ten times the retention
    /// (see [`CleanupSchedule::fingerprint_horizon_days`]).
    pub fingerprint_days: Option<i32>,
    /// The tick of the last scheduled run.
    pub last_run_for: Option<DateTime<Utc>>,
    /// The next tick.
    pub next_run_at: Option<DateTime<Utc>>,
    /// Creator.
    pub created_by: String,
    /// Last edit.
    pub updated_at: DateTime<Utc>,
}

/// One run of a schedule.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, FromRow)]
pub struct CleanupRun {
    /// Id.
    pub id: i64,
    /// Schedule.
    pub schedule_id: i64,
    /// `schedule` or `manual`.
    pub trigger: String,
    /// The tick of a scheduled run.
    pub tick_at: Option<DateTime<Utc>>,
    /// Who ran it (`scheduler` for ticks).
    pub actor: String,
    /// Records older than this were deleted.
    pub cutoff: DateTime<Utc>,
    /// Start.
    pub started_at: DateTime<Utc>,
    /// End; `None` while running.
    pub finished_at: Option<DateTime<Utc>>,
    /// Records deleted.
    pub rows_deleted: i64,
    /// Delete statements run.
    pub batches: i32,
    /// Why it stopped early.
    pub error: Option<String>,
}

impl CleanupSchedule {
    /// Days it keeps the fingerprints of what it deletes: its own setting, else ten times its
    /// retention (at most 36 500).
    pub fn fingerprint_horizon_days(&self) -> i32 {
        self.fingerprint_days.unwrap_or((self.retention_days * FINGERPRINT_HORIZON_FACTOR).min(MAX_FINGERPRINT_DAYS))
    }
}

/// Every schedule, by name.
pub async fn cleanup_schedules(books: &dyn CleanupBooks) -> Result<Vec<CleanupSchedule>, ActionError> {
    Ok(books.cleanup_schedules().await?)
}

/// One schedule.
///
/// Errors: [`ActionError::UnknownJob`].
pub async fn cleanup_schedule(books: &dyn CleanupBooks, id: i64) -> Result<CleanupSchedule, ActionError> {
    books.cleanup_schedule(id).await?.ok_or(ActionError::UnknownJob { what: "cleanup schedule", id })
}

/// The latest `limit` runs (clamped to 1..=500) of a schedule (all schedules when `None`),
/// newest first.
pub async fn cleanup_runs(
    books: &dyn CleanupBooks,
    schedule: Option<i64>,
    limit: i64,
) -> Result<Vec<CleanupRun>, ActionError> {
    Ok(books.cleanup_runs(schedule, limit.clamp(1, 500)).await?)
}

/// The refusal of a name another schedule has (the only unique key of a schedule's values).
fn name_taken(e: &sqlx::Error, name: &str) -> Option<ActionError> {
    match e {
        sqlx::Error::Database(db) if db.kind() == sqlx::error::ErrorKind::UniqueViolation => {
            Some(ActionError::Refused(format!("a schedule named {name:?} exists already")))
        }
        _ => None,
    }
}

/// Creates (`id = None`) or replaces a schedule; its next tick is computed from now. Audited as
/// `cleanup.schedule.create` / `cleanup.schedule.update`.
///
/// Errors: [`ActionError::Invalid`] (cron, retention, batch size, statuses, name),
/// [`ActionError::Refused`] (name taken), [`ActionError::UnknownJob`] (no such schedule).
#[tracing::instrument(skip_all, fields(actor), err(level = "warn"))]
pub async fn cleanup_schedule_save(
    store: &dyn ConsoleStore,
    actor: &str,
    id: Option<i64>,
    input: &ScheduleInput,
) -> Result<CleanupSchedule, ActionError> {
    let verb = if id.is_some() { "cleanup.schedule.update" } else { "cleanup.schedule.create" };
    let result = async {
        let cron = input.validate()?;
        let statuses = input.status_names();
        let row = ScheduleRow {
            name: input.name.trim(),
            cron: cron.as_str(),
            retention_days: input.retention_days,
            batch_size: input.batch_size,
            statuses: &statuses,
            consumer_group: input.consumer_group.as_deref().map(str::trim).filter(|g| !g.is_empty()),
            enabled: input.enabled,
            next_run_at: cron.next_after(Utc::now())?,
            fingerprint_days: input.fingerprint_days,
        };
        let saved = store
            .save_cleanup_schedule(actor, id, &row)
            .await
            .map_err(|e| name_taken(&e, &input.name).unwrap_or_else(|| e.into()))?;
        saved.ok_or(ActionError::UnknownJob { what: "cleanup schedule", id: id.unwrap_or_default() })
    }
    .await;
    let (outcome, detail) = match &result {
        Ok(s) => (AuditOutcome::Ok, json!({ "schedule_id": s.id, "input": input })),
        Err(e) => (e.audit_outcome(), json!({ "schedule_id": id, "input": input, "error": e.to_string() })),
    };
    audit_on_pool(store, actor, verb, outcome, None, detail).await;
    result
}

/// Records a schedule would delete now (its statuses older than its retention, those with an
/// open conflicting copy kept).
///
/// Errors: [`ActionError::UnknownJob`], database errors.
pub async fn cleanup_dry_run(books: &dyn CleanupBooks, id: i64) -> Result<i64, ActionError> {
    let schedule = cleanup_schedule(books, id).await?;
    let cutoff = books.cleanup_cutoff(schedule.retention_days).await?;
    let mut total = 0;
    for status in &schedule.statuses {
        total += books.count_deletable(status, cutoff, schedule.consumer_group.as_deref()).await?;
    }
    Ok(total)
}

/// Runs the deletion of `schedule` into the run row `run_id`: batch after batch until a batch
/// comes back short, each in its own short transaction ([`CleanupBooks::delete_batch`]), then
/// forgets what is past its horizon ([`late::forget_expired`]). It stops, failed, before a batch
/// when `lock` (the schedule's) is lost, so that no other instance's run overlaps it. The first
/// batch that keeps fingerprints arms `retention` (this process's pipelines' watch, when the
/// run is the scheduler's). Updates the run row every 20 batches and stores its end with its audit entry
/// (`cleanup.run`) in one transaction: whoever sees the run finished sees its audit entry too.
pub(crate) async fn execute_run(
    books: &dyn CleanupBooks,
    schedule: &CleanupSchedule,
    run_id: i64,
    cutoff: DateTime<Utc>,
    actor: &str,
    lock: &mut dyn NamedLock,
    retention: Option<&late::RetentionWatch>,
) {
    let started = Instant::now();
    let mut deleted = 0i64;
    let mut batches = 0i32;
    let mut error = None;
    'statuses: for status in &schedule.statuses {
        loop {
            if !lock.held().await {
                tracing::warn!(schedule = schedule.id, run_id, "cleanup run lost its schedule's lock; stopping");
                error = Some("the schedule's lock was lost (its connection closed); stopped".to_owned());
                break 'statuses;
            }
            let batch = DeleteBatch {
                status,
                cutoff,
                group: schedule.consumer_group.as_deref(),
                limit: schedule.batch_size,
                fingerprint_days: schedule.fingerprint_horizon_days(),
            };
            match books.delete_batch(&batch).await {
                // Until a batch finds nothing: a short one is not the end, since a store may
                // leave out records it chose (MySQL, a copy kept on one while the batch ran).
                Ok(0) => break,
                Ok(n) => {
                    if let Some(watch) = retention.filter(|_| n > 0 && batch.keeps_fingerprints()) {
                        watch.fingerprints_written();
                    }
                    deleted += n;
                    batches += 1;
                    if batches % 20 == 0 {
                        let _ = books.run_progress(run_id, deleted, batches).await;
                    }
                }
                Err(e) => {
                    tracing::warn!(schedule = schedule.id, error = %e, "cleanup batch failed");
                    error = Some(format!("a delete batch failed: {e}"));
                    break 'statuses;
                }
            }
        }
    }
    if error.is_none()
        && let Err(e) = late::forget_expired(books, schedule.batch_size).await
    {
        tracing::warn!(schedule = schedule.id, error = %e, "forgetting expired fingerprints failed");
        error = Some(format!("forgetting expired fingerprints failed: {e}"));
    }
    let seconds = started.elapsed().as_secs_f64();
    tracing::info!(schedule = schedule.id, run_id, deleted, batches, seconds, "cleanup run finished");
    let outcome = if error.is_some() { AuditOutcome::Failed } else { AuditOutcome::Ok };
    let detail = json!({
        "schedule_id": schedule.id, "run_id": run_id, "cutoff": cutoff, "statuses": schedule.statuses,
        "rows_deleted": deleted, "batches": batches, "seconds": seconds, "error": error,
    });
    let entry = NewAuditEntry {
        actor,
        action: "cleanup.run",
        outcome,
        reason: None,
        consumer_group: None,
        message_ids: &[],
        detail,
        source: None,
    };
    let end = RunEnd { run_id, rows_deleted: deleted, batches, error: error.as_deref() };
    if let Err(e) = books.finish_run(&end, &entry).await {
        tracing::error!(schedule = schedule.id, run_id, error = %e, "could not record the end of a cleanup run");
    }
}
