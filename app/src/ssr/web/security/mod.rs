//! Sign-in, sessions, authorisation, CSRF and security headers.
//!
//! - [`session`]: tower-sessions with the PostgreSQL store; cookies `HttpOnly`,
//!   `SameSite=Strict`, `Secure` with `auth.secure_cookies`; idle expiry (the store's) and
//!   absolute expiry (checked here); the id is rotated at sign-in.
//! - [`login`]: `POST /login` (throttled per account and per client address, generic errors) and
//!   `POST /logout`; every attempt is in the audit log.
//! - [`middleware`]: who is asking (API token or session) and whether their role may use the
//!   matched route ([`access`]), plus the CSRF checks of state-changing requests.
//! - [`client`]: the client's address, and whether it is loopback.
//! - [`headers`]: CSP with a per-request nonce for Leptos's hydration scripts, frame, referrer
//!   and content-type headers.

pub mod access;
pub mod client;
pub mod headers;
pub mod login;
pub mod middleware;
pub mod session;
