//! Runs cleanup schedules: every tick of a schedule's cron runs once, on exactly one server
//! instance — an advisory lock per schedule (`pg_try_advisory_lock`) decides who may try, and the
//! compare-and-set on `next_run_at` (plus the unique `(schedule_id, tick_at)` of the runs) makes
//! a tick that one instance ran invisible to the others. "Run now" takes the same lock.

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::{Connection, PgConnection, PgPool};
use tokio_util::sync::CancellationToken;

use super::late::RetentionWatch;
use super::{CleanupSchedule, MAX_CRON_CHARS, SCHEDULE_COLUMNS, cleanup_schedule, execute_run};
use crate::actions::ActionError;
use crate::actions::bulk::audit_on_pool;

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

/// First key of the schedules' advisory locks (`pg_try_advisory_lock(key, schedule id)`).
pub const CLEANUP_LOCK_KEY: i32 = 0x434c_4e52; // "CLNR"
/// How often the scheduler looks for due schedules.
pub const TICK_EVERY: Duration = Duration::from_secs(5);
/// The audit actor of scheduled runs.
pub const SCHEDULER_ACTOR: &str = "scheduler";

/// A held schedule lock: a dedicated connection (closing it releases the lock, also on a crash).
struct ScheduleLock(PgConnection);

async fn try_lock(pool: &PgPool, id: i64) -> Result<Option<ScheduleLock>, sqlx::Error> {
    let mut conn = pool.acquire().await?.detach();
    let locked: bool = sqlx::query_scalar("SELECT pg_try_advisory_lock($1, $2::int)")
        .bind(CLEANUP_LOCK_KEY)
        .bind(i32::try_from(id).unwrap_or(i32::MAX))
        .fetch_one(&mut conn)
        .await?;
    if locked {
        Ok(Some(ScheduleLock(conn)))
    } else {
        let _ = conn.close().await;
        Ok(None)
    }
}

impl ScheduleLock {
    async fn release(self) {
        let _ = self.0.close().await;
    }
}

async fn cutoff(pool: &PgPool, retention_days: i32) -> Result<DateTime<Utc>, sqlx::Error> {
    sqlx::query_scalar("SELECT now() - make_interval(days => $1)").bind(retention_days).fetch_one(pool).await
}

/// One scheduler pass: runs every enabled schedule whose tick is due and that no other instance
/// holds. Returns the ids of the runs this call made (each finished).
///
/// Errors: database errors (a schedule that failed to start is tried again next pass).
pub async fn run_due(pool: &PgPool) -> Result<Vec<i64>, ActionError> {
    let due: Vec<CleanupSchedule> = sqlx::query_as(&format!(
        "SELECT {SCHEDULE_COLUMNS} FROM cleanup_schedules WHERE enabled AND next_run_at <= now() ORDER BY id"
    ))
    .fetch_all(pool)
    .await?;
    let mut runs = Vec::new();
    for schedule in due {
        let Some(lock) = try_lock(pool, schedule.id).await? else { continue };
        let result = run_tick(pool, &schedule).await;
        lock.release().await;
        if let Some(run) = result? {
            runs.push(run);
        }
    }
    Ok(runs)
}

/// Claims the schedule's due tick (compare-and-set on `next_run_at`) and runs it.
async fn run_tick(pool: &PgPool, schedule: &CleanupSchedule) -> Result<Option<i64>, ActionError> {
    let Some(tick) = schedule.next_run_at else { return Ok(None) };
    let next = CronSchedule::parse(&schedule.cron)?.next_after(Utc::now())?;
    let cutoff = cutoff(pool, schedule.retention_days).await?;
    let mut tx = pool.begin().await?;
    let claimed = sqlx::query(
        "UPDATE cleanup_schedules SET last_run_for = next_run_at, next_run_at = $3
         WHERE id = $1 AND enabled AND next_run_at = $2",
    )
    .bind(schedule.id)
    .bind(tick)
    .bind(next)
    .execute(&mut *tx)
    .await?;
    if claimed.rows_affected() == 0 {
        return Ok(None);
    }
    let run_id: Option<i64> = sqlx::query_scalar(
        "INSERT INTO cleanup_runs (schedule_id, trigger, tick_at, actor, cutoff) VALUES ($1, 'schedule', $2, $3, $4)
         ON CONFLICT (schedule_id, tick_at) DO NOTHING RETURNING id",
    )
    .bind(schedule.id)
    .bind(tick)
    .bind(SCHEDULER_ACTOR)
    .bind(cutoff)
    .fetch_optional(&mut *tx)
    .await?;
    tx.commit().await?;
    let Some(run_id) = run_id else { return Ok(None) };
    execute_run(pool, schedule, run_id, cutoff, SCHEDULER_ACTOR).await;
    Ok(Some(run_id))
}

/// "Run now": starts a manual run of schedule `id` in the background (holding the schedule's
/// lock, so it never overlaps a scheduled run) and returns the run's id at once; its progress
/// is in `cleanup_runs`.
///
/// Errors: [`ActionError::UnknownJob`]; [`ActionError::Refused`] when a run of the schedule is in
/// progress (here or on another instance).
#[tracing::instrument(skip_all, fields(actor, schedule = id), err(level = "warn"))]
pub async fn cleanup_run_now(pool: &PgPool, actor: &str, id: i64) -> Result<i64, ActionError> {
    let started = async {
        let schedule = cleanup_schedule(pool, id).await?;
        let lock = try_lock(pool, id).await?.ok_or_else(|| {
            ActionError::Refused(format!("a run of cleanup schedule {id} is in progress; wait for it"))
        })?;
        let cutoff = cutoff(pool, schedule.retention_days).await?;
        let run_id: i64 = sqlx::query_scalar(
            "INSERT INTO cleanup_runs (schedule_id, trigger, actor, cutoff) VALUES ($1, 'manual', $2, $3) RETURNING id",
        )
        .bind(id)
        .bind(actor)
        .bind(cutoff)
        .fetch_one(pool)
        .await?;
        Ok::<_, ActionError>((schedule, lock, cutoff, run_id))
    }
    .await;
    match started {
        Ok((schedule, lock, cutoff, run_id)) => {
            let (pool, actor) = (pool.clone(), actor.to_owned());
            tokio::spawn(async move {
                execute_run(&pool, &schedule, run_id, cutoff, &actor).await;
                lock.release().await;
            });
            Ok(run_id)
        }
        Err(error) => {
            let detail = serde_json::json!({ "schedule_id": id, "trigger": "manual", "error": error.to_string() });
            audit_on_pool(pool, actor, "cleanup.run", error.audit_outcome(), None, detail).await;
            Err(error)
        }
    }
}

/// Calls [`run_due`] every [`TICK_EVERY`] until `shutdown` (a run in progress finishes first),
/// and refreshes `retention` (the pipelines' view of the schedules' retention) each time.
pub async fn supervise(pool: PgPool, retention: Arc<RetentionWatch>, shutdown: CancellationToken) {
    let mut ticker = tokio::time::interval(TICK_EVERY);
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            _ = ticker.tick() => {}
        }
        if let Err(e) = retention.refresh(&pool).await {
            tracing::warn!(error = %e, "reading the cleanup schedules' retention failed; retrying next tick");
        }
        if let Err(e) = run_due(&pool).await {
            tracing::warn!(error = %e, "cleanup scheduler pass failed; retrying next tick");
        }
    }
}
