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
//!    (PostgreSQL advisory lock); [`runner::supervise`] starts runners for running jobs, so a job
//!    survives a server restart.
//! 4. [`requeue_job_control`]: pause, resume, cancel.

pub mod runner;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::json;
use sqlx::{FromRow, PgPool, Postgres, QueryBuilder};

use super::{ActionError, optional_reason};
use crate::audit::{AuditLog, AuditOutcome, NewAuditEntry};
use crate::store::postgres::audit;
use crate::console::filter::RecordFilter;
use crate::store::postgres::records::push_filter;

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

/// Why a matched record is not requeued (`NULL`: it is), evaluated on `dedup_records` rows. The
/// set-based twin of [`super::StoredMessage::check_republishable`] plus the status rule.
pub(crate) const SKIP_REASON_SQL: &str = "CASE
    WHEN status = 'succeeded' THEN 'already succeeded'
    WHEN status = 'processing' AND lease_expires_at >= now() THEN 'lease live'
    WHEN status = 'processing' THEN 'stuck: release it first'
    WHEN poison THEN 'poison message'
    WHEN payload IS NULL OR payload_truncated THEN 'payload missing'
END";

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
pub async fn requeue_preview(pool: &PgPool, filter: &RecordFilter) -> Result<RequeuePreview, ActionError> {
    let mut outer: QueryBuilder<'_, Postgres> = QueryBuilder::new(format!(
        "SELECT skip, count(*) AS n FROM (SELECT {SKIP_REASON_SQL} AS skip FROM dedup_records"
    ));
    push_filter(&mut outer, filter);
    outer.push(" LIMIT ").push_bind(MAX_JOB_RECORDS + 1).push(") s GROUP BY skip ORDER BY n DESC");
    let rows: Vec<(Option<String>, i64)> = outer.build_query_as().fetch_all(pool).await?;
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

const JOB_COLUMNS: &str = "id, created_at, created_by, reason, filter, state, paused_reason, rate_per_sec, canary_size,
    failure_threshold, total, done, skipped, failed, started_at, finished_at,
    extract(epoch FROM COALESCE(finished_at, now()) - started_at)::float8 AS elapsed_secs";

/// One job.
///
/// Errors: [`ActionError::UnknownJob`].
pub async fn requeue_job(pool: &PgPool, id: i64) -> Result<RequeueJob, ActionError> {
    sqlx::query_as(&format!("SELECT {JOB_COLUMNS} FROM requeue_jobs WHERE id = $1"))
        .bind(id)
        .fetch_optional(pool)
        .await?
        .ok_or(ActionError::UnknownJob { what: "requeue job", id })
}

/// The latest `limit` jobs, newest first.
pub async fn requeue_jobs(pool: &PgPool, limit: i64) -> Result<Vec<RequeueJob>, ActionError> {
    Ok(sqlx::query_as(&format!("SELECT {JOB_COLUMNS} FROM requeue_jobs ORDER BY id DESC LIMIT $1"))
        .bind(limit.clamp(1, 500))
        .fetch_all(pool)
        .await?)
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
    pool: &PgPool,
    actor: &str,
    params: &RequeueJobParams<'_>,
) -> Result<RequeueJob, ActionError> {
    let filter_json = serde_json::to_value(params.filter).map_err(|e| ActionError::Unexpected(e.into()))?;
    let mut tx = pool.begin().await?;
    let result: Result<(i64, i64, i64), ActionError> = async {
        validate(params)?;
        let id: i64 = sqlx::query_scalar(
            "INSERT INTO requeue_jobs (created_by, reason, filter, rate_per_sec, canary_size, failure_threshold, total)
             VALUES ($1, $2, $3, $4, $5, $6, 0) RETURNING id",
        )
        .bind(actor)
        .bind(optional_reason(params.reason)?)
        .bind(&filter_json)
        .bind(params.rate_per_sec)
        .bind(params.canary_size)
        .bind(params.failure_threshold)
        .fetch_one(&mut *tx)
        .await?;
        let mut q: QueryBuilder<'_, Postgres> = QueryBuilder::new(
            "INSERT INTO requeue_job_items (job_id, seq, record_id, state, detail, record_version)
             SELECT ",
        );
        q.push_bind(id).push(format!(
            ", row_number() OVER (ORDER BY id), id, CASE WHEN skip IS NULL THEN 'pending' ELSE 'skipped' END, skip, version
             FROM (SELECT id, {SKIP_REASON_SQL} AS skip, version FROM dedup_records"
        ));
        push_filter(&mut q, params.filter);
        q.push(" ORDER BY id LIMIT ").push_bind(MAX_JOB_RECORDS + 1).push(") s");
        q.build().execute(&mut *tx).await?;
        let (total, skipped): (i64, i64) = sqlx::query_as(
            "UPDATE requeue_jobs j SET total = c.total, skipped = c.skipped
             FROM (SELECT count(*) AS total, count(*) FILTER (WHERE state = 'skipped') AS skipped
                   FROM requeue_job_items WHERE job_id = $1) c
             WHERE j.id = $1 RETURNING c.total, c.skipped",
        )
        .bind(id)
        .fetch_one(&mut *tx)
        .await?;
        let requeueable = total - skipped;
        if total > MAX_JOB_RECORDS {
            return Err(ActionError::Refused(format!(
                "the filter matches more than {MAX_JOB_RECORDS} records; narrow it"
            )));
        }
        if let Some(expected) = params.expected_count.filter(|e| *e != requeueable) {
            return Err(ActionError::Refused(format!(
                "the selection changed: {requeueable} records would be requeued now, {expected} were confirmed; preview again"
            )));
        }
        if requeueable == 0 {
            return Err(ActionError::Refused("the filter matches no record that can be requeued".to_owned()));
        }
        Ok((id, total, skipped))
    }
    .await;
    // A reason too long to accept is not stored either.
    let reason = optional_reason(params.reason).ok().flatten();
    let mut detail = json!({
        "filter": filter_json,
        "rate_per_sec": params.rate_per_sec,
        "canary_size": params.canary_size,
        "failure_threshold": params.failure_threshold,
        "expected_count": params.expected_count,
    });
    match result {
        Ok((id, total, skipped)) => {
            let ids: Vec<String> = sqlx::query_scalar(
                "SELECT r.message_id FROM requeue_job_items i JOIN dedup_records r ON r.id = i.record_id
                 WHERE i.job_id = $1 AND i.state = 'pending' ORDER BY i.seq LIMIT $2",
            )
            .bind(id)
            .bind(AUDITED_IDS)
            .fetch_all(&mut *tx)
            .await?;
            detail["job_id"] = json!(id);
            detail["total"] = json!(total);
            detail["skipped"] = json!(skipped);
            let entry = NewAuditEntry {
                actor,
                action: "bulk.requeue.start",
                outcome: AuditOutcome::Ok,
                reason,
                consumer_group: params.filter.group.as_deref(),
                message_ids: &ids,
                detail,
                source: None,
            };
            audit::insert(&mut *tx, &entry).await?;
            tx.commit().await?;
            tracing::info!(actor, job_id = id, total, skipped, "bulk requeue started");
            requeue_job(pool, id).await
        }
        Err(error) => {
            tx.rollback().await?;
            detail["error"] = json!(error.to_string());
            audit_on_pool(pool, actor, "bulk.requeue.start", error.audit_outcome(), reason, detail).await;
            Err(error)
        }
    }
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
    pool: &PgPool,
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
    let mut tx = pool.begin().await?;
    let changed: Option<String> = sqlx::query_scalar(
        "WITH old AS (SELECT id, state FROM requeue_jobs WHERE id = $1 FOR UPDATE)
         UPDATE requeue_jobs j SET state = $3, paused_reason = $4, updated_at = now(),
                finished_at = CASE WHEN $3 = 'cancelled' THEN now() END
         FROM old WHERE j.id = old.id AND old.state = ANY($2) RETURNING old.state",
    )
    .bind(id)
    .bind(from)
    .bind(to)
    .bind(&note)
    .fetch_optional(&mut *tx)
    .await?;
    let detail = json!({ "job_id": id, "to": to });
    let result = match changed {
        Some(_) => Ok(()),
        None => match sqlx::query_scalar::<_, String>("SELECT state FROM requeue_jobs WHERE id = $1")
            .bind(id)
            .fetch_optional(&mut *tx)
            .await?
        {
            None => Err(ActionError::UnknownJob { what: "requeue job", id }),
            Some(state) => Err(ActionError::Refused(format!(
                "requeue job {id} is {state}; it can be {}d only when {}",
                control.verb().rsplit('.').next().unwrap_or_default(),
                from.join(" or ")
            ))),
        },
    };
    match result {
        Ok(()) => {
            let entry = NewAuditEntry {
                actor,
                action: control.verb(),
                outcome: AuditOutcome::Ok,
                reason,
                consumer_group: None,
                message_ids: &[],
                detail,
                source: None,
            };
            audit::insert(&mut *tx, &entry).await?;
            tx.commit().await?;
            requeue_job(pool, id).await
        }
        Err(error) => {
            tx.rollback().await?;
            let mut detail = detail;
            detail["error"] = json!(error.to_string());
            audit_on_pool(pool, actor, control.verb(), error.audit_outcome(), reason, detail).await;
            Err(error)
        }
    }
}
