//! The router: every route with its access rule, Leptos pages and server functions, and the
//! layers around them (sessions, authorisation, CSRF, security headers, body limit, request ids,
//! tracing, compression, timeout).
//!
//! Access rules live in three tables: [`route_specs`] (axum routes: health, metrics, sign-in,
//! REST), [`PAGES`] (Leptos pages) and [`SERVER_FNS`] (Leptos server functions). [`policy`]
//! joins them; a routed request without a rule is refused, and the authorisation-matrix test
//! fails on any page or server function missing from the tables. Each rule also says whether
//! the route changes anything: a read-only console refuses those.
//!
//! The router is built for a base path ([`AppState::base`]) and nested there by its host
//! ([`super::mount::mount`]): routes are declared without it (axum strips it), while links,
//! redirects and the page the Leptos router renders carry it.

use std::sync::OnceLock;

use axum::Router;
use axum::http::{HeaderName, Method, StatusCode};
use axum::response::IntoResponse;
use axum::routing::{get, post};
use leptos::prelude::{provide_context, use_context};
use leptos_axum::{AxumRouteListing, LeptosRoutes, generate_route_list};
use tower::ServiceBuilder;
use tower_http::catch_panic::CatchPanicLayer;
use tower_http::compression::CompressionLayer;
use tower_http::limit::RequestBodyLimitLayer;
use tower_http::request_id::{MakeRequestUuid, PropagateRequestIdLayer, SetRequestIdLayer};
use tower_http::services::ServeDir;
use tower_http::timeout::TimeoutLayer;
use tower_http::trace::{DefaultOnResponse, TraceLayer};
use tracing::Level;

use super::api;
use super::config::ConsoleAuth;
use super::error::ApiError;
use super::health;
use super::security::access::{Access, Policy, RouteKind, Rule};
use super::security::headers::{self, CspNonce};
use super::security::middleware::{AuthLayerState, authorize};
use super::security::{login, session};
use super::state::{AppState, RouteSpec};
use crate::base::ConsoleBase;
use crate::error::ConsoleError;
use crate::ssr::service::ConsoleState;
use crate::ssr::service::auth::RequestAuth;
use crate::{App, shell};

/// Header carrying the request id (generated when the client sent none, echoed in the response
/// and recorded in every log line of the request).
pub const REQUEST_ID_HEADER: &str = "x-request-id";

/// The axum routes: probes and metrics (public: load balancers and Prometheus do not sign in),
/// sign-in and sign-out, and the REST API.
pub fn route_specs() -> Vec<RouteSpec> {
    use Access::{Public, Viewer};
    let mut specs = vec![
        RouteSpec::get("/healthz", Public, get(health::healthz)),
        RouteSpec::get("/readyz", Public, get(health::readyz)),
        RouteSpec::get("/metrics", Public, get(health::metrics)),
        RouteSpec::post("/login", Public, post(login::login)).changes_nothing(),
        RouteSpec::post("/logout", Viewer, post(login::logout)).changes_nothing(),
    ];
    specs.extend(api::routes());
    specs
}

/// The Leptos pages (GET) and who may see them. Actions on a page have their own rules.
pub const PAGES: &[(&str, Access)] = &[
    ("/login", Access::Public),
    ("/", Access::Viewer),
    ("/records", Access::Viewer),
    ("/records/{id}", Access::Viewer),
    ("/stuck", Access::Viewer),
    ("/retries", Access::Viewer),
    ("/dead-letters", Access::Viewer),
    ("/requeue", Access::Viewer),
    ("/handlers", Access::Viewer),
    ("/cleanup", Access::Viewer),
    ("/audit", Access::Viewer),
    ("/account", Access::Viewer),
    ("/users", Access::Admin),
];

/// Whether a server function changes anything (a read-only console refuses it).
const WRITES: bool = true;
/// See [`WRITES`].
const READS: bool = false;

/// The Leptos server functions, who may call them, and whether they change anything. Operator
/// actions (release, mark succeeded, requeue, drill) are [`Access::Operator`]; cleanup
/// schedules, users and settings [`Access::Admin`].
pub const SERVER_FNS: &[(&str, Access, bool)] = &[
    ("/api/fn/get_session", Access::Public, READS),
    ("/api/fn/get_health", Access::Viewer, READS),
    ("/api/fn/get_overview", Access::Viewer, READS),
    ("/api/fn/get_growth", Access::Viewer, READS),
    ("/api/fn/list_records", Access::Viewer, READS),
    ("/api/fn/get_record_filters", Access::Viewer, READS),
    ("/api/fn/get_record", Access::Viewer, READS),
    ("/api/fn/list_stuck", Access::Viewer, READS),
    ("/api/fn/get_retries", Access::Viewer, READS),
    ("/api/fn/list_dead_letter_groups", Access::Viewer, READS),
    ("/api/fn/list_tokens", Access::Viewer, READS),
    ("/api/fn/create_token", Access::Viewer, WRITES),
    ("/api/fn/revoke_token", Access::Viewer, WRITES),
    ("/api/fn/get_record_audit", Access::Viewer, READS),
    ("/api/fn/get_audit", Access::Viewer, READS),
    ("/api/fn/get_cleanup", Access::Viewer, READS),
    ("/api/fn/dry_run_schedule", Access::Viewer, READS),
    ("/api/fn/get_drill", Access::Viewer, READS),
    ("/api/fn/list_requeue_jobs", Access::Viewer, READS),
    ("/api/fn/preview_requeue", Access::Viewer, READS),
    ("/api/fn/list_handlers", Access::Viewer, READS),
    ("/api/fn/act_on_record", Access::Operator, WRITES),
    ("/api/fn/requeue_conflict", Access::Operator, WRITES),
    ("/api/fn/dismiss_conflict", Access::Operator, WRITES),
    ("/api/fn/start_requeue", Access::Operator, WRITES),
    ("/api/fn/control_requeue_job", Access::Operator, WRITES),
    ("/api/fn/control_handler", Access::Operator, WRITES),
    ("/api/fn/start_drill", Access::Operator, WRITES),
    ("/api/fn/save_schedule", Access::Admin, WRITES),
    ("/api/fn/run_schedule_now", Access::Admin, WRITES),
    ("/api/fn/list_users", Access::Admin, READS),
    ("/api/fn/add_user", Access::Admin, WRITES),
    ("/api/fn/set_user_role", Access::Admin, WRITES),
    ("/api/fn/set_user_disabled", Access::Admin, WRITES),
    ("/api/fn/reset_user_password", Access::Admin, WRITES),
];

/// Leptos pages and server functions that have no rule (must be empty; the matrix test checks).
pub fn unruled() -> Vec<String> {
    let pages = leptos_routes().iter().map(|r| r.path().to_owned());
    let pages = pages.filter(|p| !PAGES.iter().any(|(path, _)| path == p));
    let fns = leptos::server_fn::axum::server_fn_paths().map(|(p, _)| p.to_owned());
    let fns = fns.filter(|p| !SERVER_FNS.iter().any(|(path, _, _)| path == p));
    pages.chain(fns).collect()
}

/// The console's Leptos pages, generated once per process.
///
/// Leptos generates a route list by rendering the app with resource loading suppressed, and the
/// switch is one flag for the whole process (`leptos_server::SuppressResourceLoad`, leptos
/// issue 4773): a page whose resource first polled while any router was being built waited
/// forever. Generating the list once, before the first console router exists, keeps every later
/// router (a host's second console, a test's next app) from stalling pages being served.
fn leptos_routes() -> &'static [AxumRouteListing] {
    static ROUTES: OnceLock<Vec<AxumRouteListing>> = OnceLock::new();
    ROUTES.get_or_init(|| generate_route_list(App))
}

/// Every rule: the route table, the pages and the server functions (with their registered
/// methods).
pub fn policy() -> Policy {
    let mut policy = Policy::default();
    for spec in route_specs() {
        let rule = Rule { access: spec.access, kind: RouteKind::Api, mutates: spec.mutates };
        policy.insert(spec.method, spec.path, rule);
    }
    for (path, access) in PAGES {
        policy.insert(Method::GET, path, Rule { access: *access, kind: RouteKind::Page, mutates: false });
    }
    for (path, method) in leptos::server_fn::axum::server_fn_paths() {
        if let Some((_, access, mutates)) = SERVER_FNS.iter().find(|(p, _, _)| *p == path) {
            policy.insert(method, path, Rule { access: *access, kind: RouteKind::ServerFn, mutates: *mutates });
        }
    }
    policy
}

/// The answer to a request whose handling panicked (the console's or the host's code, such as a
/// delegated-auth resolver): a 500 `internal` error, logged with the panic's message in the
/// request's span, instead of a connection dropped without an answer.
fn panicked(panic: Box<dyn std::any::Any + Send + 'static>) -> axum::response::Response {
    let message = panic
        .downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| panic.downcast_ref::<&str>().copied())
        .unwrap_or("(not a string)");
    tracing::error!(panic = message, "handling a request panicked");
    ApiError::from(ConsoleError::Internal).into_response()
}

/// Builds the console's router (see the module docs); `sessions` is the session store of the
/// console's own accounts, `None` with another auth.
pub fn router(state: AppState, sessions: Option<session::SessionBooks>) -> Router {
    let routes = leptos_routes().to_vec();
    let leptos_options = state.leptos_options.clone();
    let pkg_dir = std::path::Path::new(&*leptos_options.site_root).join(&*leptos_options.site_pkg_dir);
    let request_id = HeaderName::from_static(REQUEST_ID_HEADER);
    let unruled = unruled();
    if !unruled.is_empty() {
        tracing::error!(?unruled, "pages or server functions without an access rule are refused");
    }
    let config = state.config.clone();
    let auth_state = AuthLayerState::new(state.console.pool.clone(), &config, state.base.clone(), policy());
    let session_layer = match (&config.auth, sessions) {
        (ConsoleAuth::Accounts(settings), Some(store)) => Some(session::layer(store, settings, &state.base)),
        _ => None,
    };

    let mut router = Router::new();
    for spec in route_specs() {
        if spec.path == "/metrics" && config.metrics.is_none() {
            continue;
        }
        router = router.route(spec.path, spec.handler);
    }
    let context = page_context(state.console.clone(), state.base.clone());
    let mut router = router
        .leptos_routes_with_context(&state, routes, context.clone(), move || shell(leptos_options.clone()))
        .route_layer(axum::middleware::from_fn_with_state(auth_state, authorize))
        .nest_service("/pkg", ServeDir::new(pkg_dir))
        .fallback(fallback(context))
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
                .layer(CatchPanicLayer::custom(panicked))
                .layer(CompressionLayer::new())
                .layer(TimeoutLayer::with_status_code(StatusCode::SERVICE_UNAVAILABLE, config.request_timeout))
                .layer(axum::middleware::from_fn(headers::csp))
                .option_layer(session_layer),
        );
    // Outside the ServiceBuilder: it changes the request body type.
    router = router.layer(RequestBodyLimitLayer::new(config.max_body_bytes));
    for layer in headers::fixed() {
        router = router.layer(layer);
    }
    router.with_state(state)
}

/// What no route takes: a path under `/api/` is the API's JSON 404 (`not_found`), not a page; a
/// path with a trailing slash is redirected (308) to the one without, so `/records/` is the
/// Records page; anything else is a static file from the site root or the
/// app's 404 page, rendered with the contexts pages rely on (the console state, the CSP nonce).
fn fallback(
    context: impl Fn() + Clone + Send + 'static,
) -> impl Fn(
    axum::http::Uri,
    axum::extract::State<AppState>,
    axum::extract::Request,
) -> std::pin::Pin<Box<dyn Future<Output = axum::response::Response> + Send>>
+ Clone
+ Send
+ 'static {
    let files = leptos_axum::file_and_error_handler_with_context::<AppState, _>(context, shell);
    move |uri, state: axum::extract::State<AppState>, request| {
        if uri.path() == "/api" || uri.path().starts_with("/api/") {
            let missing = ConsoleError::NotFound(format!("no API endpoint {} {}", request.method(), uri.path()));
            return Box::pin(std::future::ready(ApiError::from(missing).into_response()));
        }
        if let Some(to) = without_trailing_slash(&uri) {
            let to = state.base.join(&to);
            return Box::pin(std::future::ready(axum::response::Redirect::permanent(&to).into_response()));
        }
        files(uri, state, request)
    }
}

/// `uri`'s path and query without the trailing slash(es) of its path; `None` for `/`, for
/// paths without one, and for paths starting `//` (as a Location, `//host` leaves the site).
fn without_trailing_slash(uri: &axum::http::Uri) -> Option<String> {
    let path = uri.path();
    let trimmed = path.trim_end_matches('/');
    if trimmed.len() == path.len() || trimmed.is_empty() || trimmed.starts_with("//") {
        return None;
    }
    Some(uri.query().map_or_else(|| trimmed.to_owned(), |q| format!("{trimmed}?{q}")))
}

/// The contexts every page render and server function needs, for the app's routes and the 404
/// page alike: the console state, its base path and [`provide_request_context`].
fn page_context(console: ConsoleState, base: ConsoleBase) -> impl Fn() + Clone + Send + 'static {
    move || {
        provide_context(console.clone());
        provide_context(base.clone());
        provide_request_context();
    }
}

/// Gives pages and server functions the request's [`RequestAuth`] (from the authorisation
/// layer) and makes Leptos's inline scripts carry the nonce of the response's CSP.
fn provide_request_context() {
    let Some(parts) = use_context::<axum::http::request::Parts>() else { return };
    if let Some(auth) = parts.extensions.get::<RequestAuth>() {
        provide_context(auth.clone());
    }
    if let Some(CspNonce(nonce)) = parts.extensions.get::<CspNonce>() {
        provide_context(leptos::nonce::Nonce::from_value(nonce.as_str()));
    }
}
