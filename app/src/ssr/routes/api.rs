//! The REST API under `/api/v1` (reads here, operator actions in [`super::api_actions`]) and its
//! OpenAPI document at `/api/openapi.json`.
//!
//! Every endpoint calls the same function as the console page that shows the data
//! (`crate::ssr::console`), so the API and the UI never disagree. Errors are JSON
//! `{ "error": code, "message": text }`: 400 `bad_request` for an invalid filter or body (the
//! message says which), 404 `not_found`, 409 `conflict` (the record's state refuses an action;
//! nothing changed), 503 `unavailable` (the broker failed an action; nothing changed), 500
//! `internal` (details only in the server log, under the request id).

use crate::error::ConsoleError;
use crate::ssr::console;
use crate::wire::failures::{DeadLetterGroupView, RetriesView, StuckView};
use crate::wire::overview::{GroupView, GrowthView, OverviewView};
use crate::wire::records::{RecordDetailView, RecordPageView, RecordsQuery};
use axum::Json;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde::{Deserialize, Serialize};
use utoipa::OpenApi;

use super::{RouteSpec, api_actions, api_operations, events};
use crate::ssr::routes::AppState;
use crate::ssr::security::access::Access;

/// The body of every API error.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ErrorBody {
    /// `bad_request`, `unauthorized`, `forbidden`, `not_found`, `conflict`, `too_many_requests`,
    /// `payload_too_large`, `unavailable` or `internal`.
    pub error: String,
    /// What went wrong, for a person.
    pub message: String,
}

/// A [`ConsoleError`] as an HTTP response.
pub struct ApiError(ConsoleError);

impl From<ConsoleError> for ApiError {
    fn from(e: ConsoleError) -> Self {
        ApiError(e)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let (status, code) = self.0.http_status();
        (status, Json(ErrorBody { error: code.to_owned(), message: self.0.to_string() })).into_response()
    }
}

/// A malformed query string, path or body is a bad request too.
pub(super) fn rejected(e: impl std::fmt::Display) -> ApiError {
    ApiError(ConsoleError::BadRequest(e.to_string()))
}

pub(super) type ApiResult<T> = Result<Json<T>, ApiError>;

/// The growth chart's range.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct RangeQuery {
    /// `1h`, `24h` (default), `7d` or `30d`.
    #[param(pattern = "^(|1h|24h|7d|30d)$")]
    pub range: Option<String>,
}

/// Counts by status and group, stuck records, traffic and duplicate rates (last hour, last
/// day), the consumer's state and duplicate delays, all from aggregates.
#[utoipa::path(get, path = "/api/v1/aggregates", tag = "aggregates",
    responses((status = 200, body = OverviewView), (status = 500, body = ErrorBody)))]
pub async fn aggregates(State(s): State<AppState>) -> ApiResult<OverviewView> {
    Ok(Json(console::overview(&s.console).await?))
}

/// Dedup-table growth: records created per bucket, total records and size on disk over time.
#[utoipa::path(get, path = "/api/v1/aggregates/growth", tag = "aggregates", params(RangeQuery),
    responses((status = 200, body = GrowthView), (status = 400, body = ErrorBody)))]
pub async fn growth(State(s): State<AppState>, q: Result<Query<RangeQuery>, QueryRejection>) -> ApiResult<GrowthView> {
    let Query(q) = q.map_err(rejected)?;
    Ok(Json(console::growth(&s.console, q.range.as_deref()).await?))
}

/// Consumer groups with their records by status.
#[utoipa::path(get, path = "/api/v1/groups", tag = "aggregates",
    responses((status = 200, body = Vec<GroupView>)))]
pub async fn groups(State(s): State<AppState>) -> ApiResult<Vec<GroupView>> {
    Ok(Json(console::groups(&s.console).await?))
}

/// Known message types.
#[utoipa::path(get, path = "/api/v1/message-types", tag = "records",
    responses((status = 200, body = Vec<String>)))]
pub async fn message_types(State(s): State<AppState>) -> ApiResult<Vec<String>> {
    Ok(Json(console::message_types(&s.console).await?))
}

/// One page of records (keyset pagination: pass `next` as `after`, `prev` as `before`).
#[utoipa::path(get, path = "/api/v1/records", tag = "records", params(RecordsQuery),
    responses((status = 200, body = RecordPageView), (status = 400, body = ErrorBody)))]
pub async fn records(
    State(s): State<AppState>,
    q: Result<Query<RecordsQuery>, QueryRejection>,
) -> ApiResult<RecordPageView> {
    let Query(q) = q.map_err(rejected)?;
    Ok(Json(console::records(&s.console, &q).await?))
}

/// One record: every field, payload, headers, source, attempt history, Redis marker.
#[utoipa::path(get, path = "/api/v1/records/{id}", tag = "records",
    params(("id" = i64, Path, description = "Record id")),
    responses((status = 200, body = RecordDetailView), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub async fn record(State(s): State<AppState>, id: Result<Path<i64>, PathRejection>) -> ApiResult<RecordDetailView> {
    let Path(id) = id.map_err(rejected)?;
    Ok(Json(console::record(&s.console, id).await?))
}

/// Stuck records (processing, lease expired by the database clock), longest stuck first.
#[utoipa::path(get, path = "/api/v1/stuck", tag = "failures", responses((status = 200, body = StuckView)))]
pub async fn stuck(State(s): State<AppState>) -> ApiResult<StuckView> {
    Ok(Json(console::stuck(&s.console).await?))
}

/// Failed records: attempts distribution, most retried types, next retry, most retried records.
#[utoipa::path(get, path = "/api/v1/retries", tag = "failures", responses((status = 200, body = RetriesView)))]
pub async fn retries(State(s): State<AppState>) -> ApiResult<RetriesView> {
    Ok(Json(console::retries(&s.console).await?))
}

/// Dead letters grouped by error class, largest group first.
#[utoipa::path(get, path = "/api/v1/dead-letters", tag = "failures",
    responses((status = 200, body = Vec<DeadLetterGroupView>)))]
pub async fn dead_letters(State(s): State<AppState>) -> ApiResult<Vec<DeadLetterGroupView>> {
    Ok(Json(console::dead_letters(&s.console).await?))
}

/// The OpenAPI document of this API.
#[derive(OpenApi)]
#[openapi(
    info(
        title = "dedup-console API",
        description = "Dedup records, aggregates and failures, as the console shows them, and the operator \
                       actions on them (every action is a guarded compare-and-set and is audited)."
    ),
    paths(
        aggregates,
        growth,
        groups,
        message_types,
        records,
        record,
        stuck,
        retries,
        dead_letters,
        events::events,
        api_actions::release,
        api_actions::mark_succeeded,
        api_actions::dead_letter,
        api_actions::requeue,
        api_operations::requeue_preview,
        api_operations::requeue_start,
        api_operations::requeue_jobs,
        api_operations::requeue_job,
        api_operations::requeue_control,
        api_operations::cleanup,
        api_operations::schedule_create,
        api_operations::schedule_update,
        api_operations::schedule_dry_run,
        api_operations::schedule_run,
        api_operations::drill_start,
        api_operations::drill,
        api_operations::audit
    ),
    components(schemas(ErrorBody)),
    modifiers(&BearerAuth),
    security(("bearer" = []))
)]
pub struct ApiDoc;

/// Declares the `bearer` security scheme: a per-user API token (created on the Account page)
/// sent as `Authorization: Bearer <token>`; without one every `/api/v1` call is 401.
struct BearerAuth;

impl utoipa::Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::security::{Http, HttpAuthScheme, SecurityScheme};
        use utoipa::openapi::{RefOr, ResponseBuilder, content::ContentBuilder};
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme("bearer", SecurityScheme::Http(Http::new(HttpAuthScheme::Bearer)));
        let unauthorized = ResponseBuilder::new()
            .description("No, an invalid or a revoked API token (and no session)")
            .content(
                "application/json",
                ContentBuilder::new().schema(Some(utoipa::openapi::Ref::from_schema_name("ErrorBody"))).build(),
            )
            .build();
        for item in openapi.paths.paths.values_mut() {
            for operation in [&mut item.get, &mut item.post, &mut item.put].into_iter().flatten() {
                operation.responses.responses.entry("401".to_owned()).or_insert_with(|| RefOr::T(unauthorized.clone()));
            }
        }
    }
}

/// `GET /api/openapi.json`: the document, its `servers` entry the console's base path (so
/// clients built from it call the API under the host's prefix).
async fn openapi(State(s): State<AppState>) -> Json<utoipa::openapi::OpenApi> {
    let mut doc = ApiDoc::openapi();
    if !s.base.as_str().is_empty() {
        doc.servers = Some(vec![utoipa::openapi::Server::new(s.base.as_str())]);
    }
    Json(doc)
}

/// The API routes with their access rules: the OpenAPI document is public, every read needs a
/// signed-in user (session or API token).
pub fn routes() -> Vec<RouteSpec> {
    use Access::{Public, Viewer};
    let mut routes = vec![
        RouteSpec::get("/api/openapi.json", Public, get(openapi)),
        RouteSpec::get("/api/v1/aggregates", Viewer, get(aggregates)),
        RouteSpec::get("/api/v1/aggregates/growth", Viewer, get(growth)),
        RouteSpec::get("/api/v1/groups", Viewer, get(groups)),
        RouteSpec::get("/api/v1/message-types", Viewer, get(message_types)),
        RouteSpec::get("/api/v1/records", Viewer, get(records)),
        RouteSpec::get("/api/v1/records/{id}", Viewer, get(record)),
        RouteSpec::get("/api/v1/stuck", Viewer, get(stuck)),
        RouteSpec::get("/api/v1/retries", Viewer, get(retries)),
        RouteSpec::get("/api/v1/dead-letters", Viewer, get(dead_letters)),
        RouteSpec::get(crate::components::live::LIVE_EVENTS_PATH, Viewer, get(events::events)),
    ];
    routes.extend(api_actions::routes());
    routes.extend(api_operations::routes());
    routes
}
