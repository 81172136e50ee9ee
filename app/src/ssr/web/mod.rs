//! The web layer: the console as HTTP — the router a host mounts, the REST API, sign-in,
//! sessions, authorisation and security headers. It serves the app's pages and calls
//! [`crate::ssr::service`] for everything it shows or does.
//!
//! Modules, each importing only those above it in this list (the app's `tests/layers.rs`
//! checks there is no circle):
//!
//! - [`config`]: what a host configures ([`config::ConsoleConfig`], [`config::ConsoleAuth`],
//!   [`config::AuthSettings`], ...).
//! - [`error`]: the JSON error body of every endpoint.
//! - [`state`]: [`state::AppState`], and [`state::RouteSpec`], a route with its access rule.
//! - [`security`]: access rules, sessions, sign-in, the authorisation layer, security headers.
//! - [`health`] and [`api`]: the handlers (`/healthz`, `/readyz`, `/metrics`; `/api/v1/...`).
//! - [`router`]: every route with its rule, the Leptos pages and server functions, the layers.
//! - [`mount`]: [`mount::console_router`] and [`mount::mount`], what a host calls.
//!
//! Where things go: a new REST endpoint goes in [`api`] (see there); a new page's route in
//! [`router::PAGES`] and its server functions in [`router::SERVER_FNS`] (both with their access
//! rule), the page itself under `crate::pages`, and what it reads or does in
//! [`crate::ssr::service`].

pub mod api;
pub mod config;
pub mod error;
pub mod health;
pub mod mount;
pub mod router;
pub mod security;
pub mod state;
