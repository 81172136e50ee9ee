//! Handlers in the REST API: their pause states, and pausing and resuming them by hand. Each
//! route calls the same function as the Handlers page (`crate::ssr::service::handlers`), acting
//! as the signed-in user (or API token owner). Roles: the list `viewer`; pause and resume
//! `operator`.

use crate::ssr::service::auth::RequestAuth;
use crate::ssr::service::handlers as service;
use crate::wire::handlers::{HandlerControlKind, HandlerControlRequest, HandlerView};
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::routing::{get, post};
use axum::{Extension, Json};

use crate::ssr::web::error::{ApiResult, ErrorBody, JsonObject, rejected};
use crate::ssr::web::security::access::Access;
use crate::ssr::web::state::{AppState, RouteSpec};

/// Every handler (consumer group, message type) with its pause state: `running`, `breaker`,
/// `gone` or `operator`, since when, who set it and why. Role: viewer.
#[utoipa::path(get, path = "/api/v1/handlers", tag = "handlers", responses((status = 200, body = Vec<HandlerView>)))]
pub async fn handlers(State(s): State<AppState>) -> ApiResult<Vec<HandlerView>> {
    Ok(Json(service::handler_list(&s.console).await?))
}

/// Pauses (`pause`: its deliveries wait in the broker until resumed) or resumes (`resume`) a
/// handler; a reason is required, and `expected_version` refuses (409) when it changed since
/// shown. Every process of the group follows within a second. Role: operator.
#[utoipa::path(post, path = "/api/v1/handlers/{group}/{message_type}/{control}", tag = "handlers",
    params(("group" = String, Path, description = "Consumer group"),
        ("message_type" = String, Path, description = "Message type"),
        ("control" = HandlerControlKind, Path, description = "pause or resume")),
    request_body = HandlerControlRequest,
    responses((status = 200, body = HandlerView), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody),
        (status = 409, body = ErrorBody)))]
pub async fn control(
    State(s): State<AppState>,
    Extension(auth): Extension<RequestAuth>,
    path: Result<Path<(String, String, HandlerControlKind)>, PathRejection>,
    JsonObject(request): JsonObject<HandlerControlRequest>,
) -> ApiResult<HandlerView> {
    let Path((group, message_type, kind)) = path.map_err(rejected)?;
    Ok(Json(service::handler_control(&s.console, &auth.actor(), &group, &message_type, kind, &request).await?))
}

/// The routes.
pub fn routes() -> Vec<RouteSpec> {
    use Access::{Operator, Viewer};
    vec![
        RouteSpec::get("/api/v1/handlers", Viewer, get(handlers)),
        RouteSpec::post("/api/v1/handlers/{group}/{message_type}/{control}", Operator, post(control)),
    ]
}
