//! How a console is served, and who may use it: the settings a host gives
//! [`super::mount::console_router`]. The bottom of the web layer: everything else in it may
//! import this, this imports nothing of it.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use axum::http::request::Parts;
use dedup_engine::console::accounts::Role;
use metrics_exporter_prometheus::PrometheusHandle;
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use crate::base::ConsoleBase;

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
    /// Longest a statement of the console's may run on PostgreSQL (its `statement_timeout`,
    /// which counts time spent waiting for locks), shorter than `request_timeout`: past it the
    /// statement is cancelled and the request answers 503 `unavailable`, so a request the client
    /// gave up on leaves no query waiting behind a lock. Default 10 s. See
    /// [`ConsoleConfig::pool_size`] for the pool it applies to.
    pub statement_timeout: Duration,
    /// Most connections of the console's own pool (default 6). Every query and action a request
    /// runs uses it, so a table lock that holds the console's requests cannot take the
    /// connections the consumers (the host pool) or the engine's schedulers (its own pool)
    /// need. Waiting for one of its connections is bounded by `statement_timeout` too.
    pub pool_size: u32,
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
    /// HTTP, a shutdown token of its own, 30 s request timeout, 10 s statement timeout, a pool
    /// of 6 connections, 1 MiB bodies, no `/metrics`.
    pub fn new(site_root: impl Into<PathBuf>, base_path: &str, auth: ConsoleAuth) -> Self {
        Self {
            site_root: site_root.into(),
            base_path: base_path.to_owned(),
            auth,
            read_only: false,
            https: false,
            request_timeout: Duration::from_secs(30),
            statement_timeout: Duration::from_secs(10),
            pool_size: 6,
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

/// `[auth]`: who signs in (the console's accounts, or nobody), sessions and sign-in throttling.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AuthSettings {
    /// `accounts` (default): the console's own accounts. `off`: no sign-in, every request acts
    /// as a local admin — allowed on a loopback `listen` address only (the server refuses to
    /// start otherwise) and answered to loopback clients only.
    pub mode: AuthMode,
    /// Mark the session cookie `Secure` (set it when the console is served over HTTPS, directly
    /// or behind a TLS-terminating proxy). Default false.
    pub secure_cookies: bool,
    /// A session unused for this long ends, in seconds. Default 1800 (30 minutes); at most the
    /// absolute timeout and a year (a longer one is taken as the shorter of the two).
    pub idle_timeout_secs: u64,
    /// A session ends this long after sign-in however active, in seconds. Default 43200 (12 h).
    pub absolute_timeout_secs: u64,
    /// Failed sign-ins per account name within the window before further attempts are refused
    /// (429). Default 5.
    pub max_failures_per_account: u32,
    /// Failed sign-ins per client address within the window. Default 50.
    pub max_failures_per_address: u32,
    /// The throttle window, in seconds. Default 900 (15 minutes); at least 1 and at most a year
    /// (a window outside is taken as the nearer bound).
    pub throttle_window_secs: u64,
}

impl Default for AuthSettings {
    fn default() -> Self {
        Self {
            mode: AuthMode::Accounts,
            secure_cookies: false,
            idle_timeout_secs: 1800,
            absolute_timeout_secs: 43_200,
            max_failures_per_account: 5,
            max_failures_per_address: 50,
            throttle_window_secs: 900,
        }
    }
}

/// Who signs in to the console of `dedup-console` (a host application may also delegate to its
/// own sign-in: [`ConsoleAuth::Delegated`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AuthMode {
    /// The console's own accounts.
    Accounts,
    /// Nobody: loopback only.
    Off,
}
