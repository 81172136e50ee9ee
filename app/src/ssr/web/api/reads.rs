//! The REST API's reads (`GET /api/v1/...`): each the same service call as the console page
//! that shows the data, so the API and the UI never disagree.

use axum::Json;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::routing::get;
use serde::Deserialize;

use crate::ssr::service::console;
use crate::ssr::web::error::{ApiResult, ErrorBody, rejected};
use crate::ssr::web::security::access::Access;
use crate::ssr::web::state::{AppState, RouteSpec};
use crate::wire::failures::{DeadLetterGroupView, RetriesView, StuckView};
use crate::wire::overview::{GroupView, GrowthView, OverviewView};
use crate::wire::records::{RecordDetailView, RecordPageView, RecordsQuery};

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
/// day), the consumer's state and duplicate delays, all from aggregates; and each HTTP
/// endpoint's calls of the last 15 minutes (at most its newest 5 000).
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

/// Dead letters grouped by error class: HTTP handlers' classes first (with their answer class),
/// then largest group first.
#[utoipa::path(get, path = "/api/v1/dead-letters", tag = "failures",
    responses((status = 200, body = Vec<DeadLetterGroupView>)))]
pub async fn dead_letters(State(s): State<AppState>) -> ApiResult<Vec<DeadLetterGroupView>> {
    Ok(Json(console::dead_letters(&s.console).await?))
}

/// The read routes: each needs a signed-in user (session or API token).
pub fn routes() -> Vec<RouteSpec> {
    use Access::Viewer;
    vec![
        RouteSpec::get("/api/v1/aggregates", Viewer, get(aggregates)),
        RouteSpec::get("/api/v1/aggregates/growth", Viewer, get(growth)),
        RouteSpec::get("/api/v1/groups", Viewer, get(groups)),
        RouteSpec::get("/api/v1/message-types", Viewer, get(message_types)),
        RouteSpec::get("/api/v1/records", Viewer, get(records)),
        RouteSpec::get("/api/v1/records/{id}", Viewer, get(record)),
        RouteSpec::get("/api/v1/stuck", Viewer, get(stuck)),
        RouteSpec::get("/api/v1/retries", Viewer, get(retries)),
        RouteSpec::get("/api/v1/dead-letters", Viewer, get(dead_letters)),
    ]
}
