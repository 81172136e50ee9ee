//! Operator actions of the REST API (`POST /api/v1/...`, JSON bodies). Each handler calls the
//! same function as the console's server function (`crate::ssr::service::actions`), acting as
//! the signed-in user (or API token owner). Role: every route here needs `operator`.

use crate::ssr::service::actions::act;
use crate::ssr::service::auth::RequestAuth;
use crate::wire::actions::{ActionResultView, RecordActionKind, RecordActionRequest};
use crate::wire::records::{ConflictRequeuedView, DismissConflictRequest};
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::routing::post;
use axum::{Extension, Json};

use crate::ssr::web::error::{ApiResult, ErrorBody, JsonObject, rejected};
use crate::ssr::web::security::access::Access;
use crate::ssr::web::state::{AppState, RouteSpec};

async fn run(
    state: &AppState,
    auth: &RequestAuth,
    id: Result<Path<i64>, PathRejection>,
    JsonObject(body): JsonObject<RecordActionRequest>,
    kind: RecordActionKind,
) -> ApiResult<ActionResultView> {
    let Path(id) = id.map_err(rejected)?;
    Ok(Json(act(&state.console, &auth.actor(), id, kind, &body).await?))
}

/// Releases a stuck record: `processing` → `failed`, lease cleared, claimable. Needs the lease
/// token shown and a reason; a live lease needs `force`. `requeue: true` also republishes the
/// stored message. Role: operator.
#[utoipa::path(post, path = "/api/v1/records/{id}/release", tag = "actions",
    params(("id" = i64, Path, description = "Record id")), request_body = RecordActionRequest,
    responses((status = 200, body = ActionResultView), (status = 400, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 409, body = ErrorBody), (status = 503, body = ErrorBody)))]
pub async fn release(
    State(s): State<AppState>,
    Extension(auth): Extension<RequestAuth>,
    id: Result<Path<i64>, PathRejection>,
    body: JsonObject<RecordActionRequest>,
) -> ApiResult<ActionResultView> {
    run(&s, &auth, id, body, RecordActionKind::Release).await
}

/// Marks a `processing` (stuck), `failed` or `dead` record `succeeded` after the operator
/// verified its effect; the stored payload is dropped. Needs a reason (and the lease token for
/// a processing record). Role: operator.
#[utoipa::path(post, path = "/api/v1/records/{id}/mark-succeeded", tag = "actions",
    params(("id" = i64, Path, description = "Record id")), request_body = RecordActionRequest,
    responses((status = 200, body = ActionResultView), (status = 400, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)))]
pub async fn mark_succeeded(
    State(s): State<AppState>,
    Extension(auth): Extension<RequestAuth>,
    id: Result<Path<i64>, PathRejection>,
    body: JsonObject<RecordActionRequest>,
) -> ApiResult<ActionResultView> {
    run(&s, &auth, id, body, RecordActionKind::MarkSucceeded).await
}

/// Dead-letters a `processing` (stuck) or `failed` record by hand; payload kept. Needs a reason
/// (and the lease token for a processing record). Role: operator.
#[utoipa::path(post, path = "/api/v1/records/{id}/dead-letter", tag = "actions",
    params(("id" = i64, Path, description = "Record id")), request_body = RecordActionRequest,
    responses((status = 200, body = ActionResultView), (status = 400, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)))]
pub async fn dead_letter(
    State(s): State<AppState>,
    Extension(auth): Extension<RequestAuth>,
    id: Result<Path<i64>, PathRejection>,
    body: JsonObject<RecordActionRequest>,
) -> ApiResult<ActionResultView> {
    run(&s, &auth, id, body, RecordActionKind::DeadLetter).await
}

/// Requeues a `failed` or `dead` record: republishes its stored payload, headers and message id
/// to the original exchange and routing key and makes it claimable. Never a `succeeded` one.
/// Role: operator.
#[utoipa::path(post, path = "/api/v1/records/{id}/requeue", tag = "actions",
    params(("id" = i64, Path, description = "Record id")), request_body = RecordActionRequest,
    responses((status = 200, body = ActionResultView), (status = 400, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 409, body = ErrorBody), (status = 503, body = ErrorBody)))]
pub async fn requeue(
    State(s): State<AppState>,
    Extension(auth): Extension<RequestAuth>,
    id: Result<Path<i64>, PathRejection>,
    body: JsonObject<RecordActionRequest>,
) -> ApiResult<ActionResultView> {
    run(&s, &auth, id, body, RecordActionKind::Requeue).await
}

/// Requeues a conflicting copy (a reused id, or a payload conflict) kept on a record: publishes
/// it to where it came from under the new message id `<message id>#conflict-<id>`, once. Role:
/// operator.
#[utoipa::path(post, path = "/api/v1/conflicts/{id}/requeue", tag = "actions",
    params(("id" = i64, Path, description = "Conflict id (a record's `conflicts`)")),
    responses((status = 200, body = ConflictRequeuedView), (status = 404, body = ErrorBody),
        (status = 409, body = ErrorBody), (status = 503, body = ErrorBody)))]
pub async fn requeue_conflict(
    State(s): State<AppState>,
    Extension(auth): Extension<RequestAuth>,
    id: Result<Path<i64>, PathRejection>,
) -> ApiResult<ConflictRequeuedView> {
    let Path(id) = id.map_err(rejected)?;
    Ok(Json(crate::ssr::service::actions::requeue_conflict(&s.console, &auth.actor(), id).await?))
}

/// Dismisses a conflicting copy kept on a record: settled without a requeue (its event needs no
/// run of its own, e.g. a producer's retry with another send time), with a reason. Role:
/// operator.
#[utoipa::path(post, path = "/api/v1/conflicts/{id}/dismiss", tag = "actions",
    params(("id" = i64, Path, description = "Conflict id (a record's `conflicts`)")), request_body = DismissConflictRequest,
    responses((status = 204), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody),
        (status = 409, body = ErrorBody)))]
pub async fn dismiss_conflict(
    State(s): State<AppState>,
    Extension(auth): Extension<RequestAuth>,
    id: Result<Path<i64>, PathRejection>,
    JsonObject(body): JsonObject<DismissConflictRequest>,
) -> Result<axum::http::StatusCode, crate::ssr::web::error::ApiError> {
    let Path(id) = id.map_err(rejected)?;
    crate::ssr::service::actions::dismiss_conflict(&s.console, &auth.actor(), id, &body.reason).await?;
    Ok(axum::http::StatusCode::NO_CONTENT)
}

/// The action routes.
pub fn routes() -> Vec<RouteSpec> {
    use Access::Operator;
    vec![
        RouteSpec::post("/api/v1/conflicts/{id}/requeue", Operator, post(requeue_conflict)),
        RouteSpec::post("/api/v1/conflicts/{id}/dismiss", Operator, post(dismiss_conflict)),
        RouteSpec::post("/api/v1/records/{id}/release", Operator, post(release)),
        RouteSpec::post("/api/v1/records/{id}/mark-succeeded", Operator, post(mark_succeeded)),
        RouteSpec::post("/api/v1/records/{id}/dead-letter", Operator, post(dead_letter)),
        RouteSpec::post("/api/v1/records/{id}/requeue", Operator, post(requeue)),
    ]
}
