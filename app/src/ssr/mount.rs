//! The console as a library: [`console_router`] returns the whole console — pages, server
//! functions, REST API, server-sent events, OpenAPI document, static assets — as an
//! [`axum::Router`] for a running engine, to serve at the root or nest under any prefix of a
//! host application ([`mount`]). The prefix is chosen at run time ([`ConsoleConfig::base_path`]):
//! one build serves any.
//!
//! ```no_run
//! # async fn host(engine: &dedup_engine::runtime::Engine, probes: dedup_engine::health::HealthProbes,
//! #               resolver: impl dedup_app::ssr::AuthResolver) -> anyhow::Result<()> {
//! use dedup_app::ssr::mount::{ConsoleAuth, ConsoleConfig, DelegatedAuth, console_router, mount};
//!
//! let auth = ConsoleAuth::Delegated(DelegatedAuth::new(resolver, "/login"));
//! let config = ConsoleConfig::new("target/site", "/ops/dedup", auth);
//! let console = console_router(engine.handle().clone(), probes, config).await?;
//! let app = mount(axum::Router::new() /* the host's routes */, "/ops/dedup", console);
//! # Ok(()) }
//! ```
//!
//! Who may do what: the console's own accounts ([`ConsoleAuth::Accounts`], sessions and API
//! tokens), the host's ([`ConsoleAuth::Delegated`]: a resolver from the request to a user and a
//! role), or none ([`ConsoleAuth::Off`], answered to loopback clients only). Roles, CSRF checks
//! and the audit log work the same in all three. The console installs no global state: no
//! tracing subscriber (it logs through the host's), no metrics recorder (give it a Prometheus
//! handle to serve `/metrics`, or collect the engine's `dedup_*` metrics with the host's own).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

use crate::base::ConsoleBase;
use crate::ssr::ConsoleState;
use async_trait::async_trait;
use axum::Router;
use axum::http::request::Parts;
use dedup_engine::accounts::Role;
use dedup_engine::health::HealthProbes;
use dedup_engine::runtime::EngineHandle;
use leptos::prelude::LeptosOptions;
use metrics_exporter_prometheus::PrometheusHandle;

use crate::ssr::routes;
use crate::ssr::security::AuthSettings;

/// A user of the host application, as its [`AuthResolver`] vouches for them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostUser {
    /// The name shown in the console and written to the audit log (as `host:<name>`).
    pub name: String,
    /// What they may do: `Viewer` reads, `Operator` also acts on records, `Admin` also manages
    /// cleanup schedules.
    pub role: Role,
}

/// The host's auth: who is asking, from the request (the host's session cookie, a header its
/// gateway sets, an extension its own middleware inserted).
///
/// A plain function or closure `Fn(&Parts) -> Result<Option<HostUser>, String>` is one.
#[async_trait]
pub trait AuthResolver: Send + Sync + 'static {
    /// `Ok(Some(user))`: signed in. `Ok(None)`: not signed in (pages redirect to the host's
    /// sign-in page, the API answers 401). `Err(reason)`: refused (403 with the reason).
    async fn resolve(&self, request: &Parts) -> Result<Option<HostUser>, String>;
}

#[async_trait]
impl<F> AuthResolver for F
where
    F: Fn(&Parts) -> Result<Option<HostUser>, String> + Send + Sync + 'static,
{
    async fn resolve(&self, request: &Parts) -> Result<Option<HostUser>, String> {
        self(request)
    }
}

/// Delegated auth: the host signs users in; the console asks its resolver on every request.
#[derive(Clone)]
pub struct DelegatedAuth {
    pub(crate) resolver: Arc<dyn AuthResolver>,
    pub(crate) sign_in_url: String,
    pub(crate) sign_out_url: Option<String>,
}

impl DelegatedAuth {
    /// Users resolved by `resolver`; anonymous visitors of a page are sent to `sign_in_url`
    /// (the host's, a path or a URL) with `next=<the page>` added to its query.
    pub fn new(resolver: impl AuthResolver, sign_in_url: impl Into<String>) -> Self {
        Self { resolver: Arc::new(resolver), sign_in_url: sign_in_url.into(), sign_out_url: None }
    }

    /// Where the console's "Sign out" link goes (the host's sign-out page); without it the
    /// console shows none.
    pub fn sign_out_url(mut self, url: impl Into<String>) -> Self {
        self.sign_out_url = Some(url.into());
        self
    }
}

/// Who may use the console.
#[derive(Clone)]
pub enum ConsoleAuth {
    /// The console's own accounts: sign-in page, sessions (cookie `dedup_session`, its path the
    /// console's base path), API tokens. The default of `dedup-console`.
    Accounts(AuthSettings),
    /// The host's users ([`DelegatedAuth`]).
    Delegated(DelegatedAuth),
    /// No sign-in: every request acts as `local` with the admin role — but only requests from a
    /// loopback address; any other client is refused (403). `dedup-console` refuses to start
    /// with it on an address that is not loopback.
    Off,
}

/// How the console is served.
#[derive(Clone)]
pub struct ConsoleConfig {
    /// The built browser bundle (`pkg/` with wasm, js, css; cargo-leptos writes it to
    /// `target/site`).
    pub site_root: PathBuf,
    /// The prefix the console is served under: `""` (or `/`) at the root, else e.g.
    /// `/ops/dedup`. Every link, redirect, asset, server-function and event-stream URL, the
    /// session cookie's path and the OpenAPI `servers` entry use it. Nest the router there.
    pub base_path: String,
    /// Who may use it.
    pub auth: ConsoleAuth,
    /// Refuse every change (403) whatever the role, and show no action.
    pub read_only: bool,
    /// Served over HTTPS, directly or behind a TLS-terminating proxy: the CSRF check then takes
    /// only `https://` origins (a proxy's `X-Forwarded-Proto`, when sent, names the scheme
    /// instead). With [`ConsoleAuth::Accounts`], `secure_cookies` implies it. Default false.
    pub https: bool,
    /// Requests slower than this get 503 (not 408, which browsers send again on their own).
    pub request_timeout: Duration,
    /// Larger request bodies get 413.
    pub max_body_bytes: usize,
    /// When given, `GET /metrics` (public) renders it.
    pub metrics: Option<PrometheusHandle>,
    /// Cancel it when your app starts shutting down (in its graceful-shutdown future): open
    /// console tabs' event streams end at once, so the server does not wait for them (each
    /// ends within 30 s anyway).
    pub shutdown: CancellationToken,
}

impl ConsoleConfig {
    /// A console served from `site_root` under `base_path` with `auth`; not read-only, plain
    /// HTTP, a shutdown token of its own, 30 s
    /// request timeout, 1 MiB bodies, no `/metrics`.
    pub fn new(site_root: impl Into<PathBuf>, base_path: &str, auth: ConsoleAuth) -> Self {
        Self {
            site_root: site_root.into(),
            base_path: base_path.to_owned(),
            auth,
            read_only: false,
            https: false,
            request_timeout: Duration::from_secs(30),
            max_body_bytes: 1024 * 1024,
            metrics: None,
            shutdown: CancellationToken::new(),
        }
    }

    /// The base path, normalised (`""` or `/ops/dedup`).
    pub fn base(&self) -> ConsoleBase {
        ConsoleBase::new(&self.base_path)
    }
}

/// The console for `engine`, with `probes` for its health panel and `/readyz`.
///
/// May be called again while other consoles serve (a second mount, a rebuild): the console's
/// page list is generated once per process. A host with its own Leptos app should generate its
/// route list before serving too: Leptos suspends data loading process-wide while it does.
///
/// Errors: a base path with characters a URL path cannot carry as they are
/// ([`ConsoleBase::validate`]); with [`ConsoleAuth::Accounts`], creating the session table (in
/// the engine's schema) failed.
pub async fn console_router(
    engine: EngineHandle,
    probes: HealthProbes,
    config: ConsoleConfig,
) -> anyhow::Result<Router> {
    ConsoleBase::validate(&config.base_path).map_err(anyhow::Error::msg)?;
    let base = config.base();
    let sessions = match &config.auth {
        ConsoleAuth::Accounts(_) => {
            Some(crate::ssr::security::session::store(engine.pool(), engine.schema().as_str()).await?)
        }
        _ => None,
    };
    let cleanup = sessions
        .clone()
        .map(|store| Arc::new(TaskGuard(tokio::spawn(crate::ssr::security::session::delete_expired(store)))));
    let leptos_options = LeptosOptions::builder()
        .output_name("dedup-console")
        .site_root(config.site_root.to_string_lossy().into_owned())
        .site_pkg_dir("pkg")
        .env(leptos::config::Env::PROD)
        .build();
    let host_sign_out = match &config.auth {
        ConsoleAuth::Delegated(d) => d.sign_out_url.clone(),
        _ => None,
    };
    let console = ConsoleState { probes, engine, read_only: config.read_only, host_sign_out };
    let state = routes::AppState { leptos_options, console, base, config: Arc::new(config), _cleanup: cleanup };
    Ok(routes::router(state, sessions))
}

/// Aborts its task when the last router holding it is dropped (the session store's cleanup).
pub(crate) struct TaskGuard(tokio::task::JoinHandle<()>);

impl Drop for TaskGuard {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// `console` served by `host` under `base_path`: nested there (`<base>/` redirects to
/// `<base>`, the console's root), or merged at the root.
pub fn mount(host: Router, base_path: &str, console: Router) -> Router {
    let base = ConsoleBase::new(base_path);
    if base.as_str().is_empty() {
        return host.merge(console);
    }
    let root = base.as_str().to_owned();
    host.route(
        &format!("{root}/"),
        axum::routing::get(move || async move { axum::response::Redirect::permanent(&root) }),
    )
    .nest(base.as_str(), console)
}
