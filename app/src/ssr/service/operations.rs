//! Bulk requeue, cleanup schedules, drills and the audit log as the web layer calls them
//! (server functions and the REST API): parse, one engine call, convert.

use dedup_engine::console::QueryError;
use dedup_engine::console::RecordStatus;
use dedup_engine::console::actions::bulk::{self, JobControl, RequeueJob, RequeueJobParams};
use dedup_engine::console::actions::cleanup::{self, CleanupRun, CleanupSchedule, ScheduleInput, scheduler};
use dedup_engine::console::actions::drill::{self, DrillReport, DrillTarget};
use dedup_engine::console::audit::{AuditEntry, AuditFilter, AuditOutcome};
use dedup_engine::console::filter::{RecordFilter, parse_time};

use super::console::filter_text;
use super::convert::{opt_time, time};
use super::state::ConsoleState;
use crate::error::ConsoleError;
use crate::format::millis;
use crate::wire::operations::{
    AuditEntryView, AuditPageView, AuditQuery, CleanupRunView, CleanupView, DrillRequest, DrillView, JobControlKind,
    LateDeliveriesView, LateDuplicatesView, RequeueJobView, RequeuePreviewView, RequeueStartRequest, ScheduleRequest,
    ScheduleView, SkipCountView,
};
use crate::wire::records::RecordsQuery;

/// Jobs listed on the requeue page.
const JOBS_SHOWN: i64 = 50;
/// Cleanup runs listed.
const RUNS_SHOWN: i64 = 50;
/// Audit entries per page.
const AUDIT_PAGE: i64 = 50;

fn record_filter(q: &RecordsQuery) -> Result<RecordFilter, ConsoleError> {
    Ok(RecordFilter::parse(&filter_text(q))?)
}

/// What a bulk requeue of `filter` would do now.
pub async fn requeue_preview(state: &ConsoleState, filter: &RecordsQuery) -> Result<RequeuePreviewView, ConsoleError> {
    let p = bulk::requeue_preview(state.store(), &record_filter(filter)?).await?;
    Ok(RequeuePreviewView {
        matched: p.matched,
        would_requeue: p.would_requeue,
        skipped: p.skipped.into_iter().map(|(reason, count)| SkipCountView { reason, count }).collect(),
    })
}

/// Freezes the selection and starts a bulk requeue job as `actor`.
pub async fn requeue_start(
    state: &ConsoleState,
    actor: &str,
    request: &RequeueStartRequest,
) -> Result<RequeueJobView, ConsoleError> {
    let filter = record_filter(&request.filter)?;
    if request.expected_count.is_none() {
        return Err(ConsoleError::BadRequest(
            "expected_count is required: give the preview's would_requeue, so a changed selection is refused"
                .to_owned(),
        ));
    }
    let params = RequeueJobParams {
        filter: &filter,
        rate_per_sec: request.rate_per_sec.unwrap_or(bulk::DEFAULT_RATE),
        canary_size: request.canary_size.unwrap_or(bulk::DEFAULT_CANARY),
        failure_threshold: request.failure_threshold.unwrap_or(bulk::DEFAULT_FAILURE_THRESHOLD),
        expected_count: request.expected_count,
        reason: request.reason.as_deref(),
    };
    Ok(job_view(bulk::requeue_job_start(state.store(), actor, &params).await?))
}

/// One job's progress.
pub async fn requeue_job(state: &ConsoleState, id: i64) -> Result<RequeueJobView, ConsoleError> {
    Ok(job_view(bulk::requeue_job(state.store(), id).await?))
}

/// The latest jobs.
pub async fn requeue_jobs(state: &ConsoleState) -> Result<Vec<RequeueJobView>, ConsoleError> {
    Ok(bulk::requeue_jobs(state.store(), JOBS_SHOWN).await?.into_iter().map(job_view).collect())
}

/// Pauses, resumes or cancels a job as `actor`.
pub async fn requeue_control(
    state: &ConsoleState,
    actor: &str,
    id: i64,
    kind: JobControlKind,
) -> Result<RequeueJobView, ConsoleError> {
    let control = match kind {
        JobControlKind::Pause => JobControl::Pause,
        JobControlKind::Resume => JobControl::Resume,
        JobControlKind::Cancel => JobControl::Cancel,
    };
    Ok(job_view(bulk::requeue_job_control(state.store(), actor, id, control, None).await?))
}

fn job_view(j: RequeueJob) -> RequeueJobView {
    RequeueJobView {
        pending: j.pending(),
        observed_rate: j.observed_rate(),
        eta_secs: j.eta_secs(),
        id: j.id,
        created_at: time(j.created_at),
        created_by: j.created_by,
        reason: j.reason,
        filter: j.filter.to_string(),
        state: j.state,
        paused_reason: j.paused_reason,
        rate_per_sec: j.rate_per_sec,
        canary_size: j.canary_size,
        failure_threshold: j.failure_threshold,
        total: j.total,
        done: j.done,
        skipped: j.skipped,
        failed: j.failed,
        finished_at: opt_time(j.finished_at),
    }
}

/// The cleanup page's data.
pub async fn cleanup_overview(state: &ConsoleState) -> Result<CleanupView, ConsoleError> {
    let pool = state.store();
    let (schedules, runs, advice, late, late_duplicates) = tokio::try_join!(
        cleanup::cleanup_schedules(pool),
        cleanup::cleanup_runs(pool, None, RUNS_SHOWN),
        cleanup::retention_advice(pool),
        cleanup::late::late_deliveries(pool, cleanup::late::WINDOW_DAYS),
        cleanup::late::late_duplicates(pool, cleanup::late::WINDOW_DAYS),
    )?;
    Ok(CleanupView {
        schedules: schedules.into_iter().map(|s| schedule_view(s, &advice)).collect(),
        runs: runs.into_iter().map(run_view).collect(),
        longest_duplicate_delay_ms: advice.longest_delay_ms,
        safety_factor: advice.safety_factor,
        minimum_retention_ms: advice.minimum_retention_ms,
        late_deliveries: late
            .into_iter()
            .map(|l| LateDeliveriesView { consumer_group: l.consumer_group, count: l.count, max_age_ms: l.max_age_ms })
            .collect(),
        late_duplicates: late_duplicates
            .into_iter()
            .map(|l| LateDuplicatesView {
                consumer_group: l.consumer_group,
                count: l.count,
                held: l.held,
                longest_delay_ms: l.longest_delay_ms,
                last_seen_at: time(l.last_seen_at),
            })
            .collect(),
    })
}

/// The warning of a schedule whose retention is shorter than the advice, durations in the unit
/// that fits.
fn retention_warning(retention_days: i32, advice: &cleanup::RetentionAdvice) -> Option<String> {
    let minimum = advice.minimum_retention_ms.filter(|_| advice.is_too_short(retention_days))?;
    Some(format!(
        "retention {} is shorter than {} ({}× the longest delay a copy was seen to arrive late, {}): a late duplicate of a deleted \
         record would run its handler again",
        millis(i64::from(retention_days) * 86_400_000),
        millis(minimum),
        advice.safety_factor,
        millis(advice.longest_delay_ms.unwrap_or_default()),
    ))
}

fn schedule_view(s: CleanupSchedule, advice: &cleanup::RetentionAdvice) -> ScheduleView {
    ScheduleView {
        id: s.id,
        fingerprint_horizon_days: s.fingerprint_horizon_days(),
        retention_warning: retention_warning(s.retention_days, advice),
        last_run_for: opt_time(s.last_run_for),
        next_run_at: opt_time(s.next_run_at),
        settings: ScheduleRequest {
            name: s.name,
            cron: s.cron,
            retention_days: s.retention_days,
            batch_size: s.batch_size,
            statuses: s.statuses,
            consumer_group: s.consumer_group,
            enabled: s.enabled,
            fingerprint_days: s.fingerprint_days,
        },
    }
}

fn run_view(r: CleanupRun) -> CleanupRunView {
    CleanupRunView {
        seconds: r.finished_at.map(|f| (f - r.started_at).num_milliseconds() as f64 / 1000.0),
        id: r.id,
        schedule_id: r.schedule_id,
        trigger: r.trigger,
        actor: r.actor,
        cutoff: time(r.cutoff),
        started_at: time(r.started_at),
        finished_at: opt_time(r.finished_at),
        rows_deleted: r.rows_deleted,
        batches: r.batches,
        error: r.error,
    }
}

/// Creates (`id = None`) or edits a schedule as `actor`.
pub async fn schedule_save(
    state: &ConsoleState,
    actor: &str,
    id: Option<i64>,
    request: &ScheduleRequest,
) -> Result<ScheduleView, ConsoleError> {
    let statuses = request
        .statuses
        .iter()
        .map(|s| s.parse::<RecordStatus>().map_err(|e| ConsoleError::BadRequest(format!("statuses: {e}"))))
        .collect::<Result<Vec<_>, _>>()?;
    let input = ScheduleInput {
        name: request.name.clone(),
        cron: request.cron.clone(),
        retention_days: request.retention_days,
        batch_size: request.batch_size,
        statuses,
        consumer_group: request.consumer_group.clone(),
        enabled: request.enabled,
        fingerprint_days: request.fingerprint_days,
    };
    let pool = state.store();
    let saved = cleanup::cleanup_schedule_save(pool, actor, id, &input).await?;
    let advice = cleanup::retention_advice(pool).await?;
    Ok(schedule_view(saved, &advice))
}

/// Records schedule `id` would delete now.
pub async fn schedule_dry_run(state: &ConsoleState, id: i64) -> Result<i64, ConsoleError> {
    Ok(cleanup::cleanup_dry_run(state.store(), id).await?)
}

/// Starts a manual run of schedule `id` as `actor`; returns the run id. The run outlives the
/// request and its batches may take longer than the console's statement timeout: it runs on the
/// engine's pool, as scheduled runs do.
pub async fn schedule_run_now(state: &ConsoleState, actor: &str, id: i64) -> Result<i64, ConsoleError> {
    Ok(scheduler::cleanup_run_now(&state.engine_pool, actor, id).await?)
}

/// Publishes a drill copy as `actor`.
pub async fn drill_start(state: &ConsoleState, actor: &str, request: &DrillRequest) -> Result<DrillView, ConsoleError> {
    let target = match (request.record_id, request.message_type.as_deref().map(str::trim)) {
        (Some(id), _) => DrillTarget::Record(id),
        (None, Some(t)) if !t.is_empty() => DrillTarget::LatestOfType(t.to_owned()),
        _ => return Err(ConsoleError::BadRequest("give a record_id or a message_type to drill".to_owned())),
    };
    let original = request.original_payload.as_deref().filter(|p| !p.is_empty()).map(str::as_bytes);
    let report =
        drill::drill_start(state.store(), state.fast_path(), state.publishers(), actor, &target, original).await?;
    Ok(drill_view(report))
}

/// A drill's state.
pub async fn drill(state: &ConsoleState, id: i64) -> Result<DrillView, ConsoleError> {
    Ok(drill_view(drill::drill_report(state.store(), id).await?))
}

fn drill_view(d: DrillReport) -> DrillView {
    DrillView {
        id: d.id,
        record_id: d.record_id,
        message_id: d.message_id,
        published_at: time(d.published_at),
        marker_present: d.marker_present,
        caught_by: d.caught_by,
        duplicates_added: d.duplicates_added,
        attempts_added: d.attempts_added,
        status: d.status,
        passed: d.passed,
    }
}

/// One page of the audit log.
pub async fn audit_page(state: &ConsoleState, q: &AuditQuery) -> Result<AuditPageView, ConsoleError> {
    let bad = |e: QueryError| ConsoleError::from(e);
    let present = |v: &Option<String>| v.as_deref().map(str::trim).filter(|s| !s.is_empty()).map(str::to_owned);
    for (name, value) in [("actor", &q.actor), ("action", &q.action)] {
        let value = value.as_deref().unwrap_or_default();
        if value.chars().any(char::is_control) || value.len() > 512 {
            return Err(ConsoleError::BadRequest(format!("{name}: at most 512 bytes, no control characters")));
        }
    }
    let outcome = match present(&q.outcome).as_deref() {
        None => None,
        Some("ok") => Some(AuditOutcome::Ok),
        Some("refused") => Some(AuditOutcome::Refused),
        Some("failed") => Some(AuditOutcome::Failed),
        Some(other) => {
            return Err(ConsoleError::BadRequest(format!("unknown outcome {other:?}; expected ok, refused or failed")));
        }
    };
    let before_id = present(&q.before)
        .map(|b| b.parse::<i64>().map_err(|_| ConsoleError::BadRequest(format!("before {b:?} is not an entry id"))))
        .transpose()?;
    let filter = AuditFilter {
        actor: present(&q.actor),
        action_prefix: present(&q.action),
        outcome,
        since: present(&q.from).map(|v| parse_time("from", &v)).transpose().map_err(bad)?,
        until: present(&q.to).map(|v| parse_time("to", &v)).transpose().map_err(bad)?,
        before_id,
        limit: Some(AUDIT_PAGE),
    };
    let entries = state.store().list(&filter).await.map_err(ConsoleError::internal)?;
    let next = (entries.len() as i64 == AUDIT_PAGE).then(|| entries.last().map(|e| e.id.to_string())).flatten();
    Ok(AuditPageView { entries: entries.into_iter().map(audit_view).collect(), next })
}

/// The audit entries naming a record (its detail page).
pub async fn record_audit(
    state: &ConsoleState,
    group: &str,
    message_id: &str,
) -> Result<Vec<AuditEntryView>, ConsoleError> {
    let entries = state.store().for_message(group, message_id).await.map_err(ConsoleError::internal)?;
    Ok(entries.into_iter().map(audit_view).collect())
}

fn audit_view(e: AuditEntry) -> AuditEntryView {
    AuditEntryView {
        id: e.id,
        at: time(e.at),
        actor: e.actor,
        action: e.action,
        outcome: e.outcome,
        reason: e.reason,
        consumer_group: e.consumer_group,
        message_count: e.message_ids.len(),
        message_ids: e.message_ids.into_iter().take(20).collect(),
        detail: e.detail.to_string(),
    }
}
