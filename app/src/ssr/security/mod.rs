//! Sign-in, sessions, authorisation, CSRF and security headers.
//!
//! - [`session`]: tower-sessions with the PostgreSQL store; cookies `HttpOnly`,
//!   `SameSite=Strict`, `Secure` with `auth.secure_cookies`; idle expiry (the store's) and
//!   absolute expiry (checked here); the id is rotated at sign-in.
//! - [`login`]: `POST /login` (throttled per account and per client address, generic errors) and
//!   `POST /logout`; every attempt is in the audit log.
//! - [`middleware`]: who is asking (API token or session) and whether their role may use the
//!   matched route ([`access`]), plus the CSRF checks of state-changing requests.
//! - [`headers`]: CSP with a per-request nonce for Leptos's hydration scripts, frame, referrer
//!   and content-type headers.

pub mod access;
pub mod headers;
pub mod login;
pub mod middleware;
pub mod session;

use std::net::SocketAddr;

use axum::extract::ConnectInfo;
use axum::http::Extensions;
use serde::{Deserialize, Serialize};

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
    /// A session unused for this long ends, in seconds. Default 1800 (30 minutes).
    pub idle_timeout_secs: u64,
    /// A session ends this long after sign-in however active, in seconds. Default 43200 (12 h).
    pub absolute_timeout_secs: u64,
    /// Failed sign-ins per account name within the window before further attempts are refused
    /// (429). Default 5.
    pub max_failures_per_account: u32,
    /// Failed sign-ins per client address within the window. Default 50.
    pub max_failures_per_address: u32,
    /// The throttle window, in seconds. Default 900 (15 minutes).
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
/// own sign-in: [`crate::ssr::mount::ConsoleAuth::Delegated`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AuthMode {
    /// The console's own accounts.
    Accounts,
    /// Nobody: loopback only.
    Off,
}

/// The client's IP address (from the connection; the server does not trust forwarded headers).
pub fn client_address(extensions: &Extensions) -> Option<String> {
    extensions.get::<ConnectInfo<SocketAddr>>().map(|ConnectInfo(addr)| addr.ip().to_string())
}

/// Whether the connection comes from a loopback address. Unknown (the host serves without
/// `into_make_service_with_connect_info`): no.
pub fn peer_is_loopback(extensions: &Extensions) -> bool {
    extensions.get::<ConnectInfo<SocketAddr>>().is_some_and(|ConnectInfo(addr)| addr.ip().is_loopback())
}
