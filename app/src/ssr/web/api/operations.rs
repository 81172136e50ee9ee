//! Bulk requeue, cleanup schedules, duplicate drills and the audit log in the REST API. Each
//! handler calls the same function as the console (`crate::ssr::operations`), acting as
//! the signed-in user (or API token owner). Roles: reads and previews `viewer`;
//! starting and controlling requeues and drills `operator`; editing and running cleanup
//! schedules `admin`.

use crate::ssr::service::auth::RequestAuth;
use crate::ssr::service::operations as ops;
use crate::wire::operations::{
    AuditPageView, AuditQuery, CleanupView, DrillRequest, DrillView, JobControlKind, RequeueJobView,
    RequeuePreviewView, RequeueStartRequest, ScheduleRequest, ScheduleView,
};
use crate::wire::records::RecordsQuery;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::routing::{get, post, put};
use axum::{Extension, Json};
use serde::Serialize;

use crate::ssr::web::error::{ApiResult, ErrorBody, JsonObject, rejected};
use crate::ssr::web::security::access::Access;
use crate::ssr::web::state::{AppState, RouteSpec};

type IdPath = Result<Path<i64>, PathRejection>;

/// Records a schedule would delete now.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct DryRunView {
    /// Records older than the retention, of the schedule's statuses.
    pub would_delete: i64,
}

/// A started cleanup run.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct RunStartedView {
    /// The run's id (its progress is in `GET /api/v1/cleanup`).
    pub run_id: i64,
}

/// What a bulk requeue of a filter would do now: matched, would requeue, skipped by reason.
/// Role: viewer.
#[utoipa::path(post, path = "/api/v1/requeue/preview", tag = "requeue", request_body = RecordsQuery,
    responses((status = 200, body = RequeuePreviewView), (status = 400, body = ErrorBody), (status = 409, body = ErrorBody)))]
pub async fn requeue_preview(
    State(s): State<AppState>,
    JsonObject(filter): JsonObject<RecordsQuery>,
) -> ApiResult<RequeuePreviewView> {
    Ok(Json(ops::requeue_preview(&s.console, &filter).await?))
}

/// Freezes the filter's selection and starts a background bulk requeue (canary first, rate
/// limited, pauses itself on failures). Give the preview's `would_requeue` as `expected_count`:
/// 409 when the selection changed. Role: operator.
#[utoipa::path(post, path = "/api/v1/requeue/jobs", tag = "requeue", request_body = RequeueStartRequest,
    responses((status = 200, body = RequeueJobView), (status = 400, body = ErrorBody), (status = 409, body = ErrorBody)))]
pub async fn requeue_start(
    State(s): State<AppState>,
    Extension(auth): Extension<RequestAuth>,
    JsonObject(request): JsonObject<RequeueStartRequest>,
) -> ApiResult<RequeueJobView> {
    Ok(Json(ops::requeue_start(&s.console, &auth.actor(), &request).await?))
}

/// The latest bulk requeue jobs with their progress. Role: viewer.
#[utoipa::path(get, path = "/api/v1/requeue/jobs", tag = "requeue", responses((status = 200, body = Vec<RequeueJobView>)))]
pub async fn requeue_jobs(State(s): State<AppState>) -> ApiResult<Vec<RequeueJobView>> {
    Ok(Json(ops::requeue_jobs(&s.console).await?))
}

/// One job's progress (done / skipped / failed, rate, ETA). Role: viewer.
#[utoipa::path(get, path = "/api/v1/requeue/jobs/{id}", tag = "requeue", params(("id" = i64, Path, description = "Job id")),
    responses((status = 200, body = RequeueJobView), (status = 404, body = ErrorBody)))]
pub async fn requeue_job(State(s): State<AppState>, id: IdPath) -> ApiResult<RequeueJobView> {
    let Path(id) = id.map_err(rejected)?;
    Ok(Json(ops::requeue_job(&s.console, id).await?))
}

/// Pauses (`pause`), resumes (`resume`) or cancels (`cancel`) a job. Role: operator.
#[utoipa::path(post, path = "/api/v1/requeue/jobs/{id}/{control}", tag = "requeue",
    params(("id" = i64, Path, description = "Job id"), ("control" = JobControlKind, Path, description = "pause, resume or cancel")),
    responses((status = 200, body = RequeueJobView), (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)))]
pub async fn requeue_control(
    State(s): State<AppState>,
    Extension(auth): Extension<RequestAuth>,
    path: Result<Path<(i64, JobControlKind)>, PathRejection>,
) -> ApiResult<RequeueJobView> {
    let Path((id, control)) = path.map_err(rejected)?;
    Ok(Json(ops::requeue_control(&s.console, &auth.actor(), id, control).await?))
}

/// Cleanup schedules, recent runs and the retention advice. Role: viewer.
#[utoipa::path(get, path = "/api/v1/cleanup", tag = "cleanup", responses((status = 200, body = CleanupView)))]
pub async fn cleanup(State(s): State<AppState>) -> ApiResult<CleanupView> {
    Ok(Json(ops::cleanup_overview(&s.console).await?))
}

/// Creates a schedule (cron validated; 400 with the reason). Role: admin.
#[utoipa::path(post, path = "/api/v1/cleanup/schedules", tag = "cleanup", request_body = ScheduleRequest,
    responses((status = 200, body = ScheduleView), (status = 400, body = ErrorBody), (status = 409, body = ErrorBody)))]
pub async fn schedule_create(
    State(s): State<AppState>,
    Extension(auth): Extension<RequestAuth>,
    JsonObject(request): JsonObject<ScheduleRequest>,
) -> ApiResult<ScheduleView> {
    Ok(Json(ops::schedule_save(&s.console, &auth.actor(), None, &request).await?))
}

/// Replaces a schedule's settings (also to enable or disable it). Role: admin.
#[utoipa::path(put, path = "/api/v1/cleanup/schedules/{id}", tag = "cleanup", request_body = ScheduleRequest,
    params(("id" = i64, Path, description = "Schedule id")),
    responses((status = 200, body = ScheduleView), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub async fn schedule_update(
    State(s): State<AppState>,
    Extension(auth): Extension<RequestAuth>,
    id: IdPath,
    JsonObject(request): JsonObject<ScheduleRequest>,
) -> ApiResult<ScheduleView> {
    let Path(id) = id.map_err(rejected)?;
    Ok(Json(ops::schedule_save(&s.console, &auth.actor(), Some(id), &request).await?))
}

/// How many records the schedule would delete now. Role: viewer.
#[utoipa::path(post, path = "/api/v1/cleanup/schedules/{id}/dry-run", tag = "cleanup",
    params(("id" = i64, Path, description = "Schedule id")),
    responses((status = 200, body = DryRunView), (status = 404, body = ErrorBody)))]
pub async fn schedule_dry_run(State(s): State<AppState>, id: IdPath) -> ApiResult<DryRunView> {
    let Path(id) = id.map_err(rejected)?;
    Ok(Json(DryRunView { would_delete: ops::schedule_dry_run(&s.console, id).await? }))
}

/// Runs the schedule now in the background (409 while a run of it is in progress). Role: admin.
#[utoipa::path(post, path = "/api/v1/cleanup/schedules/{id}/run", tag = "cleanup",
    params(("id" = i64, Path, description = "Schedule id")),
    responses((status = 200, body = RunStartedView), (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)))]
pub async fn schedule_run(
    State(s): State<AppState>,
    Extension(auth): Extension<RequestAuth>,
    id: IdPath,
) -> ApiResult<RunStartedView> {
    let Path(id) = id.map_err(rejected)?;
    Ok(Json(RunStartedView { run_id: ops::schedule_run_now(&s.console, &auth.actor(), id).await? }))
}

/// Publishes a succeeded record's message id again (duplicate drill). Role: operator.
#[utoipa::path(post, path = "/api/v1/drills", tag = "drills", request_body = DrillRequest,
    responses((status = 200, body = DrillView), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody),
        (status = 409, body = ErrorBody), (status = 503, body = ErrorBody)))]
pub async fn drill_start(
    State(s): State<AppState>,
    Extension(auth): Extension<RequestAuth>,
    JsonObject(request): JsonObject<DrillRequest>,
) -> ApiResult<DrillView> {
    Ok(Json(ops::drill_start(&s.console, &auth.actor(), &request).await?))
}

/// A drill: which layer caught the copy, and whether anything happened twice. Role: viewer.
#[utoipa::path(get, path = "/api/v1/drills/{id}", tag = "drills", params(("id" = i64, Path, description = "Drill id")),
    responses((status = 200, body = DrillView), (status = 404, body = ErrorBody)))]
pub async fn drill(State(s): State<AppState>, id: IdPath) -> ApiResult<DrillView> {
    let Path(id) = id.map_err(rejected)?;
    Ok(Json(ops::drill(&s.console, id).await?))
}

/// The audit log, newest first (filters: actor, action prefix, outcome, time; `before` pages).
/// Role: viewer.
#[utoipa::path(get, path = "/api/v1/audit", tag = "audit", params(AuditQuery),
    responses((status = 200, body = AuditPageView), (status = 400, body = ErrorBody)))]
pub async fn audit(
    State(s): State<AppState>,
    q: Result<Query<AuditQuery>, QueryRejection>,
) -> ApiResult<AuditPageView> {
    let Query(q) = q.map_err(rejected)?;
    Ok(Json(ops::audit_page(&s.console, &q).await?))
}

/// The routes.
pub fn routes() -> Vec<RouteSpec> {
    use Access::{Admin, Operator, Viewer};
    vec![
        RouteSpec::post("/api/v1/requeue/preview", Viewer, post(requeue_preview)).changes_nothing(),
        RouteSpec::post("/api/v1/requeue/jobs", Operator, post(requeue_start)),
        RouteSpec::get("/api/v1/requeue/jobs", Viewer, get(requeue_jobs)),
        RouteSpec::get("/api/v1/requeue/jobs/{id}", Viewer, get(requeue_job)),
        RouteSpec::post("/api/v1/requeue/jobs/{id}/{control}", Operator, post(requeue_control)),
        RouteSpec::get("/api/v1/cleanup", Viewer, get(cleanup)),
        RouteSpec::post("/api/v1/cleanup/schedules", Admin, post(schedule_create)),
        RouteSpec::put("/api/v1/cleanup/schedules/{id}", Admin, put(schedule_update)),
        RouteSpec::post("/api/v1/cleanup/schedules/{id}/dry-run", Viewer, post(schedule_dry_run)).changes_nothing(),
        RouteSpec::post("/api/v1/cleanup/schedules/{id}/run", Admin, post(schedule_run)),
        RouteSpec::post("/api/v1/drills", Operator, post(drill_start)),
        RouteSpec::get("/api/v1/drills/{id}", Viewer, get(drill)),
        RouteSpec::get("/api/v1/audit", Viewer, get(audit)),
    ]
}
