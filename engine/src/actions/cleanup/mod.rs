//! Cleanup schedules (DESIGN.md, "Operator actions"): delete records of the chosen statuses
//! (default only `succeeded`) older than a retention (default 30 days), in bounded batches that
//! never hold locks long enough to stall consumers. Schedules live in the database and are
//! edited from the console; [`scheduler`] runs them, exactly one instance per tick.
//!
//! Age is `completed_at` for `succeeded` records and `updated_at` for `failed` and `dead` ones.
//! `processing` records are never deleted.
//!
//! The statement that deletes a batch keeps a fingerprint of each record it deletes (its
//! consumer group and message id hashed to 64 bits, and when it was first seen) for the
//! schedule's fingerprint horizon, so that a copy arriving after its record is gone is known as
//! a late duplicate ([`late`], DESIGN.md "Late duplicates"). Each run then forgets the
//! fingerprints past their horizon and the late-duplicate notes older than
//! [`late::KEEP_NOTES_DAYS`].

pub mod late;
pub mod scheduler;

pub use late::{RetentionAdvice, retention_advice};
pub use scheduler::CronSchedule;

use std::time::Instant;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::json;
use sqlx::{FromRow, PgConnection, PgPool};

use super::ActionError;
use super::bulk::audit_on_pool;
use crate::audit::{AuditOutcome, NewAuditEntry};
use crate::store::postgres::audit;
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

const SCHEDULE_COLUMNS: &str = "id, name, cron, retention_days, batch_size, statuses, consumer_group, enabled, \
                                fingerprint_days, last_run_for, next_run_at, created_by, updated_at";

impl CleanupSchedule {
    /// Days it keeps the fingerprints of what it deletes: its own setting, else ten times its
    /// retention (at most 36 500).
    pub fn fingerprint_horizon_days(&self) -> i32 {
        self.fingerprint_days.unwrap_or((self.retention_days * FINGERPRINT_HORIZON_FACTOR).min(MAX_FINGERPRINT_DAYS))
    }
}
const RUN_COLUMNS: &str =
    "id, schedule_id, trigger, tick_at, actor, cutoff, started_at, finished_at, rows_deleted, batches, error";

/// Every schedule, by name.
pub async fn cleanup_schedules(pool: &PgPool) -> Result<Vec<CleanupSchedule>, ActionError> {
    Ok(sqlx::query_as(&format!("SELECT {SCHEDULE_COLUMNS} FROM cleanup_schedules ORDER BY name"))
        .fetch_all(pool)
        .await?)
}

/// One schedule.
///
/// Errors: [`ActionError::UnknownJob`].
pub async fn cleanup_schedule(pool: &PgPool, id: i64) -> Result<CleanupSchedule, ActionError> {
    sqlx::query_as(&format!("SELECT {SCHEDULE_COLUMNS} FROM cleanup_schedules WHERE id = $1"))
        .bind(id)
        .fetch_optional(pool)
        .await?
        .ok_or(ActionError::UnknownJob { what: "cleanup schedule", id })
}

/// The latest `limit` runs of a schedule (all schedules when `None`), newest first.
pub async fn cleanup_runs(pool: &PgPool, schedule: Option<i64>, limit: i64) -> Result<Vec<CleanupRun>, ActionError> {
    Ok(sqlx::query_as(&format!(
        "SELECT {RUN_COLUMNS} FROM cleanup_runs WHERE ($1::bigint IS NULL OR schedule_id = $1) ORDER BY id DESC LIMIT $2"
    ))
    .bind(schedule)
    .bind(limit.clamp(1, 500))
    .fetch_all(pool)
    .await?)
}

fn name_taken(e: &sqlx::Error, name: &str) -> Option<ActionError> {
    match e {
        sqlx::Error::Database(db) if db.constraint() == Some("cleanup_schedules_name_key") => {
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
    pool: &PgPool,
    actor: &str,
    id: Option<i64>,
    input: &ScheduleInput,
) -> Result<CleanupSchedule, ActionError> {
    let verb = if id.is_some() { "cleanup.schedule.update" } else { "cleanup.schedule.create" };
    let result = async {
        let cron = input.validate()?;
        let next = cron.next_after(Utc::now())?;
        let sql = match id {
            None => format!(
                "INSERT INTO cleanup_schedules (name, cron, retention_days, batch_size, statuses, consumer_group,
                     enabled, next_run_at, fingerprint_days, created_by)
                 VALUES ($2, $3, $4, $5, $6, $7, $8, $9, $10, $1) RETURNING {SCHEDULE_COLUMNS}"
            ),
            Some(_) => format!(
                "UPDATE cleanup_schedules SET name = $2, cron = $3, retention_days = $4, batch_size = $5,
                     statuses = $6, consumer_group = $7, enabled = $8, next_run_at = $9, fingerprint_days = $10,
                     updated_at = now()
                 WHERE id = $1 RETURNING {SCHEDULE_COLUMNS}"
            ),
        };
        let query = sqlx::query_as::<_, CleanupSchedule>(&sql);
        let query = match id {
            None => query.bind(actor),
            Some(id) => query.bind(id),
        };
        let saved = query
            .bind(input.name.trim())
            .bind(cron.as_str())
            .bind(input.retention_days)
            .bind(input.batch_size)
            .bind(input.status_names())
            .bind(input.consumer_group.as_deref().map(str::trim).filter(|g| !g.is_empty()))
            .bind(input.enabled)
            .bind(next)
            .bind(input.fingerprint_days)
            .fetch_optional(pool)
            .await
            .map_err(|e| name_taken(&e, &input.name).unwrap_or_else(|| e.into()))?;
        saved.ok_or(ActionError::UnknownJob { what: "cleanup schedule", id: id.unwrap_or_default() })
    }
    .await;
    let (outcome, detail) = match &result {
        Ok(s) => (AuditOutcome::Ok, json!({ "schedule_id": s.id, "input": input })),
        Err(e) => (e.audit_outcome(), json!({ "schedule_id": id, "input": input, "error": e.to_string() })),
    };
    audit_on_pool(pool, actor, verb, outcome, None, detail).await;
    result
}

/// Records a schedule would delete now (its statuses older than its retention).
///
/// Errors: [`ActionError::UnknownJob`], database errors.
pub async fn cleanup_dry_run(pool: &PgPool, id: i64) -> Result<i64, ActionError> {
    let schedule = cleanup_schedule(pool, id).await?;
    let cutoff: DateTime<Utc> = sqlx::query_scalar("SELECT now() - make_interval(days => $1)")
        .bind(schedule.retention_days)
        .fetch_one(pool)
        .await?;
    let mut total = 0;
    for status in &schedule.statuses {
        let (column, narrow, _) = age_column(status);
        let n: i64 = sqlx::query_scalar(&format!(
            "SELECT count(*) FROM dedup_records WHERE status = $1 AND {column} < $2 {narrow}
               AND ($3::text IS NULL OR consumer_group = $3) {KEEPS_OPEN_CONFLICTS}"
        ))
        .bind(status)
        .bind(cutoff)
        .bind(&schedule.consumer_group)
        .fetch_one(pool)
        .await?;
        total += n;
    }
    Ok(total)
}

/// Cleanup keeps a record while a conflicting copy of its message id waits for an operator
/// (`record_conflicts`): the record page is where the copy is settled.
const KEEPS_OPEN_CONFLICTS: &str =
    "AND NOT EXISTS (SELECT 1 FROM record_conflicts c WHERE c.record_id = dedup_records.id AND c.settled_at IS NULL)";

/// The age column of a status, a condition that narrows the records to an index, and the
/// order batches take them in. `succeeded` records (no index of their own since migration
/// `..._lean_write_path`): by id, below the first id seen after the cutoff (a record completes
/// after it was first seen; `dedup_records_id_at`); failed and dead ones on
/// `dedup_records_cleanup_unsettled_idx` by `updated_at`.
fn age_column(status: &str) -> (&'static str, String, &'static str) {
    if status == "succeeded" {
        let slack = crate::store::postgres::records::ARRIVAL_SLACK;
        ("completed_at", format!("AND id < (SELECT dedup_records_id_at($2 + {slack}))"), "id")
    } else {
        ("updated_at", String::new(), "updated_at")
    }
}

/// Deletes one batch: at most `limit` records of `status` older than `cutoff`, rows locked by
/// others skipped (a consumer touching a record is never waited for) and records with an open
/// conflicting copy kept (an operator has yet to settle it), and keeps the fingerprints of the
/// succeeded ones for `fingerprint_days` (none when 0; a failed or dead record's copy is no
/// duplicate of an effect that happened). Returns the count deleted.
async fn delete_batch(
    conn: &mut PgConnection,
    status: &str,
    cutoff: DateTime<Utc>,
    group: Option<&str>,
    limit: i32,
    fingerprint_days: i32,
) -> Result<i64, sqlx::Error> {
    let (column, narrow, order) = age_column(status);
    sqlx::query_scalar(&format!(
        // A materialized CTE: as a subquery the planner may rescan the LIMIT per joined row and
        // delete far more than one batch. Fingerprints are written in fingerprint order (one lock
        // order for concurrent runs) and grouped, since two records may share one; a fingerprint
        // kept already keeps its earliest sighting and its latest horizon.
        "WITH d AS MATERIALIZED (
             SELECT id FROM dedup_records WHERE status = $1 AND {column} < $2 {narrow}
               AND ($3::text IS NULL OR consumer_group = $3) {KEEPS_OPEN_CONFLICTS}
             ORDER BY {order} LIMIT $4 FOR UPDATE SKIP LOCKED
         ), gone AS (
             DELETE FROM dedup_records r USING d WHERE r.id = d.id AND r.status = $1
             RETURNING r.consumer_group, r.message_type, r.message_id, r.first_seen_at
         ), kept AS (
             INSERT INTO dedup_fingerprints AS f (fingerprint, first_seen_at, forget_at)
             SELECT dedup_fingerprint(consumer_group, message_type, message_id), min(first_seen_at),
                    now() + make_interval(days => $5)
             FROM gone WHERE $5 > 0 AND $1 = 'succeeded' GROUP BY 1 ORDER BY 1
             ON CONFLICT (fingerprint) DO UPDATE SET
                 first_seen_at = LEAST(f.first_seen_at, EXCLUDED.first_seen_at),
                 forget_at = GREATEST(f.forget_at, EXCLUDED.forget_at)
         )
         SELECT count(*) FROM gone"
    ))
    .bind(status)
    .bind(cutoff)
    .bind(group)
    .bind(i64::from(limit))
    .bind(fingerprint_days)
    .fetch_one(conn)
    .await
}

/// Runs the deletion of `schedule` into the run row `run_id`: batch after batch until a batch
/// comes back short, each in its own short transaction. Updates the run row as it goes and
/// audits the end (`cleanup.run`).
pub(crate) async fn execute_run(
    pool: &PgPool,
    schedule: &CleanupSchedule,
    run_id: i64,
    cutoff: DateTime<Utc>,
    actor: &str,
) {
    let started = Instant::now();
    let mut deleted = 0i64;
    let mut batches = 0i32;
    let mut error = None;
    'statuses: for status in &schedule.statuses {
        loop {
            let result = async {
                let mut conn = pool.acquire().await?;
                let group = schedule.consumer_group.as_deref();
                let horizon = schedule.fingerprint_horizon_days();
                delete_batch(&mut conn, status, cutoff, group, schedule.batch_size, horizon).await
            }
            .await;
            match result {
                Ok(n) => {
                    deleted += n;
                    batches += 1;
                    if batches % 20 == 0 {
                        let _ = sqlx::query("UPDATE cleanup_runs SET rows_deleted = $2, batches = $3 WHERE id = $1")
                            .bind(run_id)
                            .bind(deleted)
                            .bind(batches)
                            .execute(pool)
                            .await;
                    }
                    if n < i64::from(schedule.batch_size) {
                        break;
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
        && let Err(e) = late::forget_expired(pool, schedule.batch_size).await
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
    // The run's end and its audit entry in one transaction: whoever sees the run finished sees
    // its audit entry too.
    let finished = async {
        let mut tx = pool.begin().await?;
        sqlx::query(
            "UPDATE cleanup_runs SET rows_deleted = $2, batches = $3, error = $4, finished_at = now() WHERE id = $1",
        )
        .bind(run_id)
        .bind(deleted)
        .bind(batches)
        .bind(&error)
        .execute(&mut *tx)
        .await?;
        audit::insert(&mut *tx, &entry).await?;
        tx.commit().await
    }
    .await;
    if let Err(e) = finished {
        tracing::error!(schedule = schedule.id, run_id, error = %e, "could not record the end of a cleanup run");
    }
}
