//! The authorisation layer, run on every routed request (pages, server functions, REST):
//!
//! 1. Who: an `Authorization: Bearer` API token (a wrong one is 401, never a fall-back to the
//!    cookie), else the session's user. Disabled users are nobody.
//! 2. CSRF, for every method but GET/HEAD/OPTIONS: the `Origin` (or `Sec-Fetch-Site`) must be
//!    this site, and a request authenticated by the session cookie must carry the session's
//!    token in `x-csrf-token` or the form field `csrf_token` (public routes, i.e. signing in,
//!    rely on the origin check alone). API-token requests need neither:
//!    browsers never attach them on their own.
//! 3. May they: the matched route's [`Rule`]; routes without one are refused.
//!
//! Refusals: anonymous visitors of a page are redirected to `/login?next=...`; server functions
//! get a `ConsoleError` as JSON, REST calls the API's error body; 401 when not signed in, 403
//! when the role is too low or the CSRF check fails.

use std::sync::Arc;

use axum::Json;
use axum::body::{Body, to_bytes};
use axum::extract::{MatchedPath, Request, State};
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{Html, IntoResponse, Redirect, Response};
use dedup_app::csrf::{CSRF_FIELD, CSRF_HEADER};
use dedup_app::error::ConsoleError;
use dedup_app::ssr::accounts::current_user;
use dedup_app::ssr::auth::RequestAuth;
use dedup_engine::accounts::User;
use dedup_engine::accounts::tokens::token_authenticate;
use dedup_engine::accounts::users::user_by_id;
use sqlx::PgPool;
use tower_sessions::Session;

use super::access::{Access, Policy, RouteKind, Rule};
use super::session::{self, SessionAuth};
use super::{AuthSettings, client_address};
use crate::routes::api::ErrorBody;

/// What the layer needs.
#[derive(Clone)]
pub struct AuthLayerState {
    /// Users and tokens.
    pub pool: PgPool,
    /// Expiry settings.
    pub settings: Arc<AuthSettings>,
    /// The rules.
    pub policy: Arc<Policy>,
    /// Largest form body read for its CSRF field, in bytes.
    pub max_body_bytes: usize,
}

/// A refusal: status and a message safe to show.
struct Refusal {
    status: StatusCode,
    message: &'static str,
}

const UNAUTHORIZED: Refusal = Refusal { status: StatusCode::UNAUTHORIZED, message: "sign in first" };

/// The layer's handler (`axum::middleware::from_fn_with_state`, as a route layer so that the
/// matched route pattern is known).
pub async fn authorize(State(ctx): State<AuthLayerState>, session: Session, req: Request, next: Next) -> Response {
    let method = req.method().clone();
    let pattern = req.extensions().get::<MatchedPath>().map(|m| m.as_str().to_owned());
    let Some(rule) = pattern.as_deref().and_then(|p| ctx.policy.rule(&method, p)) else {
        tracing::error!(?pattern, %method, "no access rule for this route: refused");
        return refuse(RouteKind::Api, &req, Refusal { status: StatusCode::FORBIDDEN, message: "no access rule" });
    };
    let identity = match identify(&ctx, &session, req.headers()).await {
        Ok(identity) => identity,
        Err(refusal) => return refuse(rule.kind, &req, refusal),
    };
    let (req, csrf_ok) =
        if is_safe(&method) { (req, true) } else { check_csrf(&ctx, req, rule, identity.as_ref()).await };
    if !csrf_ok {
        let refusal = Refusal { status: StatusCode::FORBIDDEN, message: "cross-site request refused (CSRF check)" };
        return refuse(rule.kind, &req, refusal);
    }
    if let Err(refusal) = allowed(rule, identity.as_ref().map(|i| &i.user)) {
        return refuse(rule.kind, &req, refusal);
    }
    let mut req = req;
    let auth = RequestAuth {
        user: identity.as_ref().map(|i| current_user(&i.user)),
        csrf_token: identity.and_then(|i| i.session).map(|s| s.csrf_token),
        source: client_address(req.extensions()),
    };
    req.extensions_mut().insert(auth);
    next.run(req).await
}

struct Identity {
    user: User,
    /// `None` for API-token requests.
    session: Option<SessionAuth>,
}

fn is_safe(method: &Method) -> bool {
    matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS)
}

fn allowed(rule: Rule, user: Option<&User>) -> Result<(), Refusal> {
    let Some(needed) = rule.access.role() else { return Ok(()) };
    match user {
        None => Err(UNAUTHORIZED),
        Some(u) if u.role < needed => {
            Err(Refusal { status: StatusCode::FORBIDDEN, message: "your role does not allow this" })
        }
        Some(_) => Ok(()),
    }
}

async fn identify(ctx: &AuthLayerState, session: &Session, headers: &HeaderMap) -> Result<Option<Identity>, Refusal> {
    let internal = |e: &dyn std::fmt::Display| {
        tracing::error!(error = %e, "authentication failed");
        Refusal { status: StatusCode::INTERNAL_SERVER_ERROR, message: "internal error; see the server log" }
    };
    if let Some(value) = headers.get(header::AUTHORIZATION) {
        let bad = Refusal { status: StatusCode::UNAUTHORIZED, message: "invalid or revoked API token" };
        let secret = value.to_str().ok().and_then(|v| v.strip_prefix("Bearer ")).map(str::trim).ok_or(bad)?;
        return match token_authenticate(&ctx.pool, secret).await {
            Ok(Some(user)) => Ok(Some(Identity { user, session: None })),
            Ok(None) => Err(Refusal { status: StatusCode::UNAUTHORIZED, message: "invalid or revoked API token" }),
            Err(e) => Err(internal(&e)),
        };
    }
    let Some(state) = session::current(session, &ctx.settings).await.map_err(|e| internal(&e))? else {
        return Ok(None);
    };
    match user_by_id(&ctx.pool, state.user_id).await.map_err(|e| internal(&e))? {
        Some(user) if !user.disabled => Ok(Some(Identity { user, session: Some(state) })),
        _ => {
            session.flush().await.map_err(|e| internal(&e))?;
            Ok(None)
        }
    }
}

/// The origin check, then (session requests to non-public routes) the token check. Public
/// routes (signing in, possibly over a stale session) rely on the origin check alone. Returns
/// the request (its form body put back after reading the token field) and whether it passed.
async fn check_csrf(ctx: &AuthLayerState, req: Request, rule: Rule, identity: Option<&Identity>) -> (Request, bool) {
    let session = match identity {
        Some(Identity { session: None, .. }) => return (req, true), // API token: not a cookie.
        Some(Identity { session: Some(s), .. }) => Some(s),
        None => None,
    };
    if !same_origin(req.headers()) {
        return (req, false);
    }
    let Some(session) = session.filter(|_| rule.access != Access::Public) else { return (req, true) };
    let (req, token) = presented_token(req, ctx.max_body_bytes).await;
    let ok = token.is_some_and(|t| constant_time_eq(t.as_bytes(), session.csrf_token.as_bytes()));
    (req, ok)
}

/// Whether the request comes from this site: `Origin` equal to `<scheme>://<Host>`, or, without
/// `Origin`, a `Sec-Fetch-Site` of `same-origin` or `none` (or neither header: not a browser).
fn same_origin(headers: &HeaderMap) -> bool {
    let host = headers.get(header::HOST).and_then(|h| h.to_str().ok());
    if let Some(origin) = headers.get(header::ORIGIN) {
        let authority = origin.to_str().ok().and_then(|o| o.split_once("://")).map(|(_, a)| a);
        return authority.is_some() && authority == host;
    }
    match headers.get("sec-fetch-site").and_then(|v| v.to_str().ok()) {
        Some(site) => matches!(site, "same-origin" | "none"),
        None => true,
    }
}

/// The CSRF token from the header, else from a URL-encoded form body's `csrf_token` field.
async fn presented_token(req: Request, max_body_bytes: usize) -> (Request, Option<String>) {
    if let Some(token) = req.headers().get(CSRF_HEADER).and_then(|v| v.to_str().ok()) {
        let token = token.to_owned();
        return (req, Some(token));
    }
    let is_form = req
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/x-www-form-urlencoded"));
    if !is_form {
        return (req, None);
    }
    let (parts, body) = req.into_parts();
    match to_bytes(body, max_body_bytes).await {
        Ok(bytes) => {
            let token = url::form_urlencoded::parse(&bytes).find(|(k, _)| k == CSRF_FIELD).map(|(_, v)| v.into_owned());
            (Request::from_parts(parts, Body::from(bytes)), token)
        }
        Err(_) => (Request::from_parts(parts, Body::empty()), None),
    }
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn refuse(kind: RouteKind, req: &Request, refusal: Refusal) -> Response {
    let Refusal { status, message } = refusal;
    match kind {
        RouteKind::Page if status == StatusCode::UNAUTHORIZED => {
            let next = req.uri().path_and_query().map_or("/", |p| p.as_str());
            let next: String = url::form_urlencoded::byte_serialize(next.as_bytes()).collect();
            Redirect::to(&format!("/login?next={next}")).into_response()
        }
        RouteKind::Page => (
            status,
            Html(format!(
                "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>Refused</title></head>\
                 <body><h1>Refused</h1><p>{message}.</p><p><a href=\"/\">Back to the console</a></p></body></html>"
            )),
        )
            .into_response(),
        RouteKind::ServerFn => {
            let error = if status == StatusCode::UNAUTHORIZED {
                ConsoleError::Unauthorized(message.to_owned())
            } else {
                ConsoleError::Forbidden(message.to_owned())
            };
            let body = serde_json::to_string(&error).unwrap_or_default();
            (status, [(header::CONTENT_TYPE, "application/json")], body).into_response()
        }
        RouteKind::Api => {
            let code = match status {
                StatusCode::UNAUTHORIZED => "unauthorized",
                StatusCode::FORBIDDEN => "forbidden",
                _ => "internal",
            };
            let mut response =
                (status, Json(ErrorBody { error: code.to_owned(), message: message.to_owned() })).into_response();
            if status == StatusCode::UNAUTHORIZED {
                response.headers_mut().insert(header::WWW_AUTHENTICATE, header::HeaderValue::from_static("Bearer"));
            }
            response
        }
    }
}
