//! The router: health endpoints, static files, Leptos pages and server functions, and the
//! tower-http layers around them.

mod api;
mod api_actions;
mod api_operations;
mod events;
mod health;

use std::time::Duration;

use axum::Router;
use axum::http::{HeaderName, StatusCode};
use axum::routing::get;
use dedup_app::{App, shell};
use leptos::prelude::provide_context;
use leptos_axum::{LeptosRoutes, generate_route_list};
use tower::ServiceBuilder;
use tower_http::compression::CompressionLayer;
use tower_http::request_id::{MakeRequestUuid, PropagateRequestIdLayer, SetRequestIdLayer};
use tower_http::services::ServeDir;
use tower_http::timeout::TimeoutLayer;
use tower_http::trace::{DefaultOnResponse, TraceLayer};
use tracing::Level;

use crate::startup::AppState;

/// Header carrying the request id (generated when the client sent none, echoed in the response
/// and recorded in every log line of the request).
pub const REQUEST_ID_HEADER: &str = "x-request-id";

/// Builds the whole router.
pub fn router(state: AppState) -> Router {
    let routes = generate_route_list(App);
    let leptos_options = state.leptos_options.clone();
    let console = state.console.clone();
    let pkg_dir = std::path::Path::new(&*leptos_options.site_root).join(&*leptos_options.site_pkg_dir);
    let request_id = HeaderName::from_static(REQUEST_ID_HEADER);

    Router::new()
        .route("/healthz", get(health::healthz))
        .route("/readyz", get(health::readyz))
        .route("/metrics", get(health::metrics))
        .merge(api::router())
        .nest_service("/pkg", ServeDir::new(pkg_dir))
        .leptos_routes_with_context(
            &state,
            routes,
            move || provide_context(console.clone()),
            move || shell(leptos_options.clone()),
        )
        .fallback(leptos_axum::file_and_error_handler::<AppState, _>(shell))
        .layer(
            ServiceBuilder::new()
                .layer(SetRequestIdLayer::new(request_id.clone(), MakeRequestUuid))
                .layer(
                    TraceLayer::new_for_http()
                        .make_span_with(|request: &axum::http::Request<_>| {
                            let id = request
                                .headers()
                                .get(REQUEST_ID_HEADER)
                                .and_then(|v| v.to_str().ok())
                                .unwrap_or("-");
                            tracing::info_span!("request", method = %request.method(), uri = %request.uri(), request_id = %id)
                        })
                        .on_response(DefaultOnResponse::new().level(Level::DEBUG)),
                )
                .layer(PropagateRequestIdLayer::new(request_id))
                .layer(CompressionLayer::new())
                .layer(TimeoutLayer::with_status_code(
                    StatusCode::REQUEST_TIMEOUT,
                    Duration::from_millis(state.settings.request_timeout_ms),
                )),
        )
        .with_state(state)
}
