//! The server side of the console, in two layers that import downward only:
//!
//! - [`web`]: the HTTP side — [`web::mount::console_router`] (the whole console as an axum
//!   router a host mounts, [`web::mount::mount`]), the route table and access rules
//!   ([`web::router`]), the REST API ([`web::api`]), sign-in, sessions, authorisation and
//!   security headers ([`web::security`]). It renders the app's pages and calls the service
//!   layer.
//! - [`service`]: what server functions and REST handlers call — the engine behind a
//!   [`service::ConsoleState`], returning [`crate::wire`] views. The pages' server functions
//!   call it too.
//!
//! A host needs only [`mount`] (re-exported from the web layer): `console_router`, `mount`,
//! `ConsoleConfig`, `ConsoleAuth`, `DelegatedAuth`, `HostUser`, `AuthResolver`, `AuthSettings`.

pub mod service;
pub mod web;

pub use web::mount;
pub use web::mount::{AuthResolver, ConsoleAuth, ConsoleConfig, DelegatedAuth, HostUser, console_router};
