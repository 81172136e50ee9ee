//! Runs cleanup schedules: every tick of a schedule's cron runs once, on exactly one server
//! instance — a lock per schedule ([`CleanupBooks::lock_schedule`]: PostgreSQL's
//! `pg_try_advisory_lock`, MySQL's `GET_LOCK`) decides who may try, and the compare-and-set on
//! `next_run_at` (plus the unique `(schedule_id, tick_at)` of the runs) makes a tick that one
//! instance ran invisible to the others. "Run now" takes the same lock. A run asks before each
//! batch whether it still holds it and stops when not (its connection closed: another instance
//! may take the schedule), as a bulk requeue runner does.

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio_util::sync::CancellationToken;

use super::late::RetentionWatch;
use super::{CleanupBooks, CleanupSchedule, MAX_CRON_CHARS, cleanup_schedule, execute_run};
use crate::actions::{ActionError, NamedLock};
use crate::actions::bulk::audit_on_pool;
use crate::console::console_store;
use crate::runtime::EnginePool;

/// A validated five-field cron expression (minute hour day-of-month month day-of-week), UTC.
#[derive(Debug, Clone)]
pub struct CronSchedule {
    text: String,
    cron: croner::Cron,
}

impl CronSchedule {
    /// Parses `text`.
    ///
    /// Errors: [`ActionError::Invalid`] when longer than [`MAX_CRON_CHARS`], or naming the
    /// expression, the parser's complaint and the
    /// expected shape.
    pub fn parse(text: &str) -> Result<Self, ActionError> {
        let text = text.trim();
        let chars = text.chars().count();
        if chars > MAX_CRON_CHARS {
            return Err(ActionError::Invalid(format!(
                "a cron expression is at most {MAX_CRON_CHARS} characters; this one has {chars}"
            )));
        }
        let invalid = |why: String| {
            ActionError::Invalid(format!(
                "invalid cron expression {text:?}: {why}; expected five fields (minute hour day-of-month month \
                 day-of-week), e.g. \"0 3 * * *\" for 03:00 UTC every day"
            ))
        };
        if text.split_whitespace().count() != 5 {
            return Err(invalid(format!("it has {} fields", text.split_whitespace().count())));
        }
        let cron = croner::Cron::from_str(text).map_err(|e| invalid(e.to_string()))?;
        Ok(Self { text: text.to_owned(), cron })
    }

    /// The first tick after `after`.
    ///
    /// Errors: [`ActionError::Invalid`] when the expression never matches (e.g. 30 February).
    pub fn next_after(&self, after: DateTime<Utc>) -> Result<DateTime<Utc>, ActionError> {
        self.cron
            .find_next_occurrence(&after, false)
            .map_err(|e| ActionError::Invalid(format!("cron expression {:?} never matches: {e}", self.text)))
    }

    /// The expression.
    pub fn as_str(&self) -> &str {
        &self.text
    }
}

/// How often the scheduler looks for due schedules.
pub const TICK_EVERY: Duration = Duration::from_secs(5);
/// The audit actor of scheduled runs.
pub const SCHEDULER_ACTOR: &str = "scheduler";

/// One scheduler pass: runs every enabled schedule whose tick is due and that no other instance
/// holds. A run that keeps fingerprints says so to `retention` as soon as its first batch did,
/// so the pipelines reading it look up the copies of what the run deletes while it goes on.
/// Returns the ids of the runs this call made (each finished).
///
/// Errors: database errors (a schedule that failed to start is tried again next pass).
pub async fn run_due(books: &dyn CleanupBooks, retention: &RetentionWatch) -> Result<Vec<i64>, ActionError> {
    let mut runs = Vec::new();
    for schedule in books.due_schedules().await? {
        let Some(mut lock) = books.lock_schedule(schedule.id).await? else { continue };
        let result = run_tick(books, &schedule, lock.as_mut(), retention).await;
        lock.release().await;
        if let Some(run) = result? {
            runs.push(run);
        }
    }
    Ok(runs)
}

/// Claims the schedule's due tick (compare-and-set on `next_run_at`) and runs it.
async fn run_tick(
    books: &dyn CleanupBooks,
    schedule: &CleanupSchedule,
    lock: &mut dyn NamedLock,
    retention: &RetentionWatch,
) -> Result<Option<i64>, ActionError> {
    let Some(tick) = schedule.next_run_at else { return Ok(None) };
    let next = CronSchedule::parse(&schedule.cron)?.next_after(Utc::now())?;
    let cutoff = books.cleanup_cutoff(schedule.retention_days).await?;
    let Some(run_id) = books.claim_tick(schedule.id, tick, next, SCHEDULER_ACTOR, cutoff).await? else {
        return Ok(None);
    };
    execute_run(books, schedule, run_id, cutoff, SCHEDULER_ACTOR, lock, Some(retention)).await;
    Ok(Some(run_id))
}

/// "Run now": starts a manual run of schedule `id` on `pool` (the engine's: the run outlasts a
/// request) in the background, holding the schedule's lock so that it never overlaps a
/// scheduled run, and returns the run's id at once; its progress is in the schedule's runs
/// ([`super::cleanup_runs`]). It arms no pipeline's `RetentionWatch`: the scheduler's next
/// pass refreshes them.
///
/// Errors: [`ActionError::UnknownJob`]; [`ActionError::Refused`] when a run of the schedule is in
/// progress (here or on another instance).
#[tracing::instrument(skip_all, fields(actor, schedule = id), err(level = "warn"))]
pub async fn cleanup_run_now(pool: &EnginePool, actor: &str, id: i64) -> Result<i64, ActionError> {
    let store = console_store(pool);
    let started = async {
        let schedule = cleanup_schedule(store, id).await?;
        let lock = store.lock_schedule(id).await?.ok_or_else(|| {
            ActionError::Refused(format!("a run of cleanup schedule {id} is in progress; wait for it"))
        })?;
        let cutoff = store.cleanup_cutoff(schedule.retention_days).await?;
        let run_id = store.start_manual_run(id, actor, cutoff).await?;
        Ok::<_, ActionError>((schedule, lock, cutoff, run_id))
    }
    .await;
    match started {
        Ok((schedule, mut lock, cutoff, run_id)) => {
            let (pool, actor) = (pool.clone(), actor.to_owned());
            tokio::spawn(async move {
                execute_run(console_store(&pool), &schedule, run_id, cutoff, &actor, lock.as_mut(), None).await;
                lock.release().await;
            });
            Ok(run_id)
        }
        Err(error) => {
            let detail = serde_json::json!({ "schedule_id": id, "trigger": "manual", "error": error.to_string() });
            audit_on_pool(store, actor, "cleanup.run", error.audit_outcome(), None, detail).await;
            Err(error)
        }
    }
}

/// Calls [`run_due`] on `pool` every [`TICK_EVERY`] until `shutdown` (a run in progress
/// finishes first), and refreshes `retention` (the pipelines' view of the schedules' retention)
/// each time.
pub async fn supervise(pool: EnginePool, retention: Arc<RetentionWatch>, shutdown: CancellationToken) {
    let books = console_store(&pool);
    let mut ticker = tokio::time::interval(TICK_EVERY);
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            _ = ticker.tick() => {}
        }
        if let Err(e) = retention.refresh(books).await {
            tracing::warn!(error = %e, "reading the cleanup schedules' retention failed; retrying next tick");
        }
        if let Err(e) = run_due(books, &retention).await {
            tracing::warn!(error = %e, "cleanup scheduler pass failed; retrying next tick");
        }
    }
}
