//! The REST API under `/api/v1` — reads ([`reads`]), operator actions ([`actions`]), bulk
//! requeue, cleanup, drills and audit ([`operations`]), handlers' pauses ([`handlers`]), the live event stream ([`events`]) — and
//! its OpenAPI document at `/api/openapi.json`.
//!
//! Where things go: a new endpoint is a handler in the file of its kind, taking the
//! [`AppState`] and calling one function of [`crate::ssr::service`]; its route (with its access
//! rule) goes in that file's `routes()`, and its `#[utoipa::path]` in [`ApiDoc`] below.
//!
//! Every endpoint calls the same function as the console page that shows the data
//! (`crate::ssr::service`), so the API and the UI never disagree. Errors are JSON
//! `{ "error": code, "message": text }`: 400 `bad_request` for an invalid filter or body (the
//! message says which), 404 `not_found`, 409 `conflict` (the record's state refuses an action;
//! nothing changed), 503 `unavailable` (the broker failed an action; nothing changed), 500
//! `internal` (details only in the server log, under the request id).

pub mod actions;
pub mod events;
pub mod handlers;
pub mod operations;
pub mod reads;

use axum::Json;
use axum::extract::State;
use axum::routing::get;
use utoipa::OpenApi;

use super::error::ErrorBody;
use super::security::access::Access;
use super::state::{AppState, RouteSpec};

/// The OpenAPI document of this API.
#[derive(OpenApi)]
#[openapi(
    info(
        title = "dedup-console API",
        description = "Dedup records, aggregates and failures, as the console shows them, and the operator \
                       actions on them (every action is a guarded compare-and-set and is audited)."
    ),
    paths(
        reads::aggregates,
        reads::growth,
        reads::groups,
        reads::message_types,
        reads::records,
        reads::record,
        reads::stuck,
        reads::retries,
        reads::dead_letters,
        events::events,
        actions::release,
        actions::mark_succeeded,
        actions::dead_letter,
        actions::requeue_conflict,
        actions::dismiss_conflict,
        actions::requeue,
        operations::requeue_preview,
        operations::requeue_start,
        operations::requeue_jobs,
        operations::requeue_job,
        operations::requeue_control,
        operations::cleanup,
        operations::schedule_create,
        operations::schedule_update,
        operations::schedule_dry_run,
        operations::schedule_run,
        operations::drill_start,
        operations::drill,
        operations::audit,
        handlers::handlers,
        handlers::control
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
        RouteSpec::get(crate::components::live::LIVE_EVENTS_PATH, Viewer, get(events::events)),
    ];
    routes.extend(reads::routes());
    routes.extend(actions::routes());
    routes.extend(operations::routes());
    routes.extend(handlers::routes());
    routes
}
