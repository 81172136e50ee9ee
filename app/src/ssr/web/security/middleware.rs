//! The authorisation layer, run on every routed request (pages, server functions, REST):
//!
//! 1. Who, by the console's [`ConsoleAuth`]: with its own accounts, an `Authorization: Bearer`
//!    API token (a wrong one is 401, never a fall-back to the cookie), else the session's user
//!    (disabled users are nobody); with delegated auth, the host's resolver; with auth off, the
//!    local admin — for loopback clients only.
//! 2. CSRF, for every method but GET/HEAD/OPTIONS: the `Origin` (or `Sec-Fetch-Site`) must be
//!    this site, and a request authenticated by the session cookie must carry the session's
//!    token in `x-csrf-token` or the form field `csrf_token` (public routes, i.e. signing in,
//!    rely on the origin check alone). Host and local users' pages carry a token derived from
//!    their name (HMAC with a key of this process), required from browsers. API-token requests
//!    need neither: browsers never attach them on their own.
//! 3. A read-only console refuses every route that changes something (403), whatever the role.
//! 4. May they: the matched route's [`Rule`] (looked up without the console's base path);
//!    routes without one are refused.
//!
//! Refusals: anonymous visitors of a page are redirected to the sign-in page (the console's, or
//! the host's) with `next=<the page>`; server functions get a `ConsoleError` as JSON, REST calls
//! the API's error body; 401 when not signed in, 403 when the role is too low, the console is
//! read-only or the CSRF check fails.
//!
//! A page request goes on with its original URI (the host's prefix included): the Leptos
//! router matches pages under the base path, as the browser does.

use std::borrow::Cow;
use std::sync::Arc;

use crate::base::ConsoleBase;
use crate::csrf::{CSRF_FIELD, CSRF_HEADER};
use crate::error::ConsoleError;
use crate::ssr::service::accounts::{current_user, role_view};
use crate::ssr::service::auth::{RequestAuth, SignIn};
use crate::wire::account::CurrentUser;
use axum::Json;
use axum::body::{Body, to_bytes};
use axum::extract::{MatchedPath, OriginalUri, Request, State};
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{Html, IntoResponse, Redirect, Response};
use dedup_engine::EnginePool;
use dedup_engine::console::accounts::Role;
use dedup_engine::console::accounts::tokens::token_authenticate;
use dedup_engine::console::console_store;
use hmac::{Hmac, Mac};
use tower_sessions::Session;

use super::access::{Access, Policy, RouteKind, Rule};
use super::client::{client_address, peer_is_loopback};
use super::session;
use crate::ssr::web::config::{AuthSettings, ConsoleAuth, ConsoleConfig, DelegatedAuth};
use crate::ssr::web::error::ErrorBody;

/// What the layer needs.
#[derive(Clone)]
pub struct AuthLayerState {
    /// Users and tokens (the console's pool).
    pool: EnginePool,
    /// Who may use the console.
    auth: ConsoleAuth,
    /// The rules.
    policy: Arc<Policy>,
    /// Largest form body read for its CSRF field, in bytes.
    max_body_bytes: usize,
    /// The base path (stripped from matched route patterns; prefixed to redirects).
    base: ConsoleBase,
    /// Refuse every route that changes something.
    read_only: bool,
    /// The scheme pages are served with is `https` (unless a proxy's `X-Forwarded-Proto` says).
    https: bool,
    /// Key of the CSRF tokens of host and local users, random per process.
    csrf_key: Arc<[u8; 32]>,
}

impl AuthLayerState {
    /// The layer's state for a console served as `config` says under `base`, with `policy`.
    pub fn new(pool: EnginePool, config: &ConsoleConfig, base: ConsoleBase, policy: Policy) -> Self {
        let mut key = [0u8; 32];
        key[..16].copy_from_slice(uuid::Uuid::new_v4().as_bytes());
        key[16..].copy_from_slice(uuid::Uuid::new_v4().as_bytes());
        Self {
            pool,
            auth: config.auth.clone(),
            policy: Arc::new(policy),
            max_body_bytes: config.max_body_bytes,
            base,
            read_only: config.read_only,
            https: config.https || matches!(&config.auth, ConsoleAuth::Accounts(s) if s.secure_cookies),
            csrf_key: Arc::new(key),
        }
    }

    /// The CSRF token of a host or local user's pages: HMAC-SHA256 of their sign-in kind and
    /// name with this process's key, hex.
    fn derived_token(&self, kind: &str, name: &str) -> String {
        let mut mac = Hmac::<sha2::Sha256>::new_from_slice(self.csrf_key.as_slice()).expect("any key length");
        mac.update(kind.as_bytes());
        mac.update(b"\0");
        mac.update(name.as_bytes());
        mac.finalize().into_bytes().iter().map(|b| format!("{b:02x}")).collect()
    }
}

/// A refusal: status and a message safe to show.
struct Refusal {
    status: StatusCode,
    message: Cow<'static, str>,
    /// The whole console refuses this client (not one page or action of it), so a refused
    /// page must not link back into it: that link would be refused again.
    everywhere: bool,
}

impl Refusal {
    fn new(status: StatusCode, message: impl Into<Cow<'static, str>>) -> Self {
        Self { status, message: message.into(), everywhere: false }
    }

    fn everywhere(self) -> Self {
        Self { everywhere: true, ..self }
    }
}

fn unauthorized() -> Refusal {
    Refusal::new(StatusCode::UNAUTHORIZED, "sign in first")
}

/// The layer's handler (`axum::middleware::from_fn_with_state`, as a route layer so that the
/// matched route pattern is known).
pub async fn authorize(State(ctx): State<AuthLayerState>, req: Request, next: Next) -> Response {
    let method = req.method().clone();
    let pattern = req.extensions().get::<MatchedPath>().map(|m| without_base(m.as_str(), &ctx.base));
    if let Some(response) = sign_in_elsewhere(&ctx, pattern.as_deref(), &method, &req) {
        return response;
    }
    let Some(rule) = pattern.as_deref().and_then(|p| ctx.policy.rule(&method, p)) else {
        let allowed = pattern.as_deref().map(|p| ctx.policy.methods(p)).unwrap_or_default();
        if !allowed.is_empty() {
            // A route of the console asked with another method: the caller's mistake, not ours.
            let allow = allowed.iter().map(Method::as_str).collect::<Vec<_>>().join(", ");
            let mut response =
                refuse(&ctx, RouteKind::Api, &req, Refusal::new(StatusCode::METHOD_NOT_ALLOWED, "method not allowed"));
            if let Ok(value) = header::HeaderValue::from_str(&allow) {
                response.headers_mut().insert(header::ALLOW, value);
            }
            return response;
        }
        tracing::error!(?pattern, %method, "no access rule for this route: refused");
        return refuse(&ctx, RouteKind::Api, &req, Refusal::new(StatusCode::FORBIDDEN, "no access rule"));
    };
    let (req, identity) = match identify(&ctx, req).await {
        (req, Ok(identity)) => (req, identity),
        (req, Err(refusal)) => return refuse(&ctx, rule.kind, &req, refusal),
    };
    let (req, csrf_ok) =
        if is_safe(&method) { (req, true) } else { check_csrf(&ctx, req, rule, identity.as_ref()).await };
    if !csrf_ok {
        let refusal = Refusal::new(
            StatusCode::FORBIDDEN,
            "cross-site request refused (CSRF check): send the session's token in the x-csrf-token header",
        );
        return refuse(&ctx, rule.kind, &req, refusal);
    }
    if ctx.read_only && rule.mutates {
        let refusal = Refusal::new(StatusCode::FORBIDDEN, "this console is read-only: nothing can be changed here");
        return refuse(&ctx, rule.kind, &req, refusal);
    }
    if let Err(refusal) = allowed(rule, identity.as_ref().map(|i| &i.user)) {
        return refuse(&ctx, rule.kind, &req, refusal);
    }
    let mut req = req;
    if rule.kind == RouteKind::Page
        && let Some(OriginalUri(original)) = req.extensions().get::<OriginalUri>().cloned()
    {
        *req.uri_mut() = original;
    }
    let auth = RequestAuth {
        sign_in: identity.as_ref().map_or(SignIn::Account, |i| i.sign_in),
        user: identity.as_ref().map(|i| i.user.clone()),
        csrf_token: identity.and_then(|i| i.csrf_token),
        source: client_address(req.extensions()),
    };
    req.extensions_mut().insert(auth);
    next.run(req).await
}

/// A matched route pattern without the console's base path (`/ops/dedup/records` → `/records`,
/// `/ops/dedup` → `/`).
fn without_base(pattern: &str, base: &ConsoleBase) -> String {
    match pattern.strip_prefix(base.as_str()) {
        Some("") => "/".to_owned(),
        Some(rest) if rest.starts_with('/') => rest.to_owned(),
        _ => pattern.to_owned(),
    }
}

/// Without the console's own accounts, its sign-in and sign-out are the host's (or nobody's):
/// `GET /login` goes to the host's sign-in (back to the console's home after it), `GET /logout`
/// to the host's sign-out when it has one (auth off: both to the console's home), posting to
/// them is refused.
fn sign_in_elsewhere(ctx: &AuthLayerState, pattern: Option<&str>, method: &Method, req: &Request) -> Option<Response> {
    if matches!(ctx.auth, ConsoleAuth::Accounts(_)) || !matches!(pattern, Some("/login" | "/logout")) {
        return None;
    }
    if method == Method::GET {
        // Back to the console's home after signing in (not to `/login`: that would loop).
        let home = ctx.base.join("/");
        let to = match (&ctx.auth, pattern) {
            (ConsoleAuth::Delegated(d), Some("/login")) => with_next(&d.sign_in_url, &home),
            (ConsoleAuth::Delegated(DelegatedAuth { sign_out_url: Some(out), .. }), _) => out.clone(),
            _ => home,
        };
        return Some(Redirect::to(&to).into_response());
    }
    let refusal = Refusal::new(StatusCode::FORBIDDEN, "signing in and out happens in the host application");
    Some(refuse(ctx, RouteKind::Api, req, refusal))
}

/// The page to come back to after signing in: the request's original path and query.
fn next_of(req: &Request) -> String {
    let original = req.extensions().get::<OriginalUri>().map(|o| &o.0).unwrap_or(req.uri());
    original.path_and_query().map_or_else(|| "/".to_owned(), |p| p.as_str().to_owned())
}

/// `url` with `next=<next>` added to its query.
fn with_next(url: &str, next: &str) -> String {
    let next: String = url::form_urlencoded::byte_serialize(next.as_bytes()).collect();
    let separator = if url.contains('?') { '&' } else { '?' };
    format!("{url}{separator}next={next}")
}

struct Identity {
    user: CurrentUser,
    sign_in: SignIn,
    /// The token the page's state-changing requests must carry; `None` for API-token requests.
    csrf_token: Option<String>,
}

fn is_safe(method: &Method) -> bool {
    matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS)
}

fn allowed(rule: Rule, user: Option<&CurrentUser>) -> Result<(), Refusal> {
    let Some(needed) = rule.access.role() else { return Ok(()) };
    match user {
        None => Err(unauthorized()),
        Some(u) if u.role < role_view(needed) => {
            Err(Refusal::new(StatusCode::FORBIDDEN, "your role does not allow this"))
        }
        Some(_) => Ok(()),
    }
}

/// A failure of the lookup behind authentication: 503 when the database did not answer within
/// the console's bound (the request may be tried again), else 500.
fn internal(e: &(dyn std::error::Error + 'static)) -> Refusal {
    if crate::error::database_timed_out(e) {
        tracing::warn!(error = %e, "authentication: the database did not answer within the console's bound");
        return Refusal::new(StatusCode::SERVICE_UNAVAILABLE, crate::error::DATABASE_TIMED_OUT);
    }
    tracing::error!(error = %e, "authentication failed");
    Refusal::new(StatusCode::INTERNAL_SERVER_ERROR, "internal error; see the server log")
}

/// Who is asking, by the console's auth; the request back (the resolver sees its parts).
async fn identify(ctx: &AuthLayerState, req: Request) -> (Request, Result<Option<Identity>, Refusal>) {
    match &ctx.auth {
        ConsoleAuth::Accounts(settings) => {
            let session = req.extensions().get::<Session>().cloned();
            let identity = identify_account(ctx, settings, session.as_ref(), req.headers()).await;
            (req, identity)
        }
        ConsoleAuth::Delegated(delegated) => {
            let (parts, body) = req.into_parts();
            let resolved = delegated.resolver.resolve(&parts).await;
            let identity = match resolved {
                Ok(Some(host)) => Ok(Some(Identity {
                    csrf_token: Some(ctx.derived_token("host", &host.name)),
                    user: CurrentUser { id: 0, name: host.name, role: role_view(host.role) },
                    sign_in: SignIn::Host,
                })),
                Ok(None) => Ok(None),
                Err(reason) => Err(Refusal::new(StatusCode::FORBIDDEN, reason).everywhere()),
            };
            (Request::from_parts(parts, body), identity)
        }
        ConsoleAuth::Off => {
            // A loopback peer and a loopback Host: a page of another site that a DNS rebinding
            // points at 127.0.0.1 sends its own name as Host (and Origin), so it is refused.
            let identity = if peer_is_loopback(req.extensions()) && host_is_loopback(req.headers()) {
                Ok(Some(Identity {
                    csrf_token: Some(ctx.derived_token("local", "local")),
                    user: CurrentUser { id: 0, name: "local".to_owned(), role: role_view(Role::Admin) },
                    sign_in: SignIn::Local,
                }))
            } else {
                Err(Refusal::new(
                    StatusCode::FORBIDDEN,
                    "this console has no sign-in configured, so it answers loopback clients only, addressed by a \
                     loopback name (localhost, 127.0.0.1, [::1])",
                )
                .everywhere())
            };
            (req, identity)
        }
    }
}

async fn identify_account(
    ctx: &AuthLayerState,
    settings: &AuthSettings,
    session: Option<&Session>,
    headers: &HeaderMap,
) -> Result<Option<Identity>, Refusal> {
    if let Some(value) = headers.get(header::AUTHORIZATION) {
        let bad = || Refusal::new(StatusCode::UNAUTHORIZED, "invalid or revoked API token");
        let secret = value.to_str().ok().and_then(|v| v.strip_prefix("Bearer ")).map(str::trim).ok_or_else(bad)?;
        return match token_authenticate(console_store(&ctx.pool), secret).await {
            Ok(Some(user)) => {
                Ok(Some(Identity { user: current_user(&user), sign_in: SignIn::Account, csrf_token: None }))
            }
            Ok(None) => Err(bad()),
            Err(e) => Err(internal(&e)),
        };
    }
    let Some(session) = session else { return Ok(None) };
    let Some(state) = session::current(session, settings).await.map_err(|e| internal(&e))? else {
        return Ok(None);
    };
    match console_store(&ctx.pool).user_by_id(state.user_id).await.map_err(|e| internal(&e))? {
        Some(user) if !user.disabled => Ok(Some(Identity {
            user: current_user(&user),
            sign_in: SignIn::Account,
            csrf_token: Some(state.csrf_token),
        })),
        _ => {
            session.flush().await.map_err(|e| internal(&e))?;
            Ok(None)
        }
    }
}

/// The origin check, then (requests of a signed-in page to non-public routes) the token check.
/// Public routes (signing in, possibly over a stale session) rely on the origin check alone.
/// Host and local users' requests need the token only from a browser (a cookie, `Origin` or
/// `Sec-Fetch-Site` header): a script behind the host's gateway has no page to take it from,
/// and a browser always names its origin. Returns the request (its form body put back after
/// reading the token field) and whether it passed.
async fn check_csrf(ctx: &AuthLayerState, req: Request, rule: Rule, identity: Option<&Identity>) -> (Request, bool) {
    let expected = match identity {
        Some(Identity { csrf_token: None, .. }) => return (req, true), // API token: not a cookie.
        Some(Identity { csrf_token: Some(t), sign_in, .. }) => {
            let browser = ["cookie", "origin", "sec-fetch-site"].iter().any(|h| req.headers().contains_key(*h));
            (*sign_in == SignIn::Account || browser).then_some(t)
        }
        None => None,
    };
    if !same_origin(req.headers(), ctx.https) {
        return (req, false);
    }
    let Some(expected) = expected.filter(|_| rule.access != Access::Public) else { return (req, true) };
    let (req, token) = presented_token(req, ctx.max_body_bytes).await;
    let ok = token.is_some_and(|t| constant_time_eq(t.as_bytes(), expected.as_bytes()));
    (req, ok)
}

/// Whether the request comes from this site: `Origin` equal to `<scheme>://<Host>` (the scheme
/// from `X-Forwarded-Proto` when a proxy sent it, else `https` or `http` as configured: an
/// `http://` page of the same host is another origin), or, without `Origin`, a `Sec-Fetch-Site`
/// of `same-origin` or `none` (or neither header: not a browser).
fn same_origin(headers: &HeaderMap, https: bool) -> bool {
    let host = headers.get(header::HOST).and_then(|h| h.to_str().ok());
    if let Some(origin) = headers.get(header::ORIGIN) {
        let forwarded = headers.get("x-forwarded-proto").and_then(|v| v.to_str().ok());
        let scheme =
            forwarded.and_then(|v| v.split(',').next()).map(str::trim).unwrap_or(if https { "https" } else { "http" });
        let Some((origin_scheme, authority)) = origin.to_str().ok().and_then(|o| o.split_once("://")) else {
            return false;
        };
        return origin_scheme.eq_ignore_ascii_case(scheme) && Some(authority) == host;
    }
    match headers.get("sec-fetch-site").and_then(|v| v.to_str().ok()) {
        Some(site) => matches!(site, "same-origin" | "none"),
        None => true,
    }
}

/// Whether the `Host` header names this machine's loopback (`localhost`, `127.x.x.x`, `[::1]`,
/// with or without a port).
fn host_is_loopback(headers: &HeaderMap) -> bool {
    let Some(host) = headers.get(header::HOST).and_then(|h| h.to_str().ok()) else { return false };
    let name = match host.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or_default(),
        None => host.rsplit_once(':').map_or(host, |(name, _)| name),
    };
    name.eq_ignore_ascii_case("localhost") || name.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
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

fn refuse(ctx: &AuthLayerState, kind: RouteKind, req: &Request, refusal: Refusal) -> Response {
    let Refusal { status, message, everywhere } = refusal;
    match kind {
        RouteKind::Page if status == StatusCode::UNAUTHORIZED => {
            let sign_in = match &ctx.auth {
                ConsoleAuth::Delegated(d) => d.sign_in_url.clone(),
                _ => ctx.base.join("/login"),
            };
            Redirect::to(&with_next(&sign_in, &next_of(req))).into_response()
        }
        RouteKind::Page => {
            // Refused everywhere, a link back into the console would loop: the host's sign-out
            // (to sign in as someone else), or none.
            let sign_out = match &ctx.auth {
                ConsoleAuth::Delegated(d) => d.sign_out_url.clone(),
                _ => None,
            };
            let (href, label) = match (everywhere, sign_out) {
                (false, _) => (Some(ctx.base.join("/")), "Back to the console"),
                (true, Some(url)) => (Some(url), "Sign out"),
                (true, None) => (None, ""),
            };
            let link = href.map_or_else(String::new, |href| {
                format!("<p><a href=\"{}\">{label}</a></p>", html_escape::encode_double_quoted_attribute(&href))
            });
            (
                status,
                Html(format!(
                    "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>Refused</title></head>\
                     <body><h1>Refused</h1><p>{}.</p>{link}</body></html>",
                    html_escape::encode_text(&message),
                )),
            )
                .into_response()
        }
        RouteKind::ServerFn => {
            let error = match status {
                StatusCode::UNAUTHORIZED => ConsoleError::Unauthorized(message.into_owned()),
                StatusCode::SERVICE_UNAVAILABLE => ConsoleError::Unavailable(message.into_owned()),
                _ => ConsoleError::Forbidden(message.into_owned()),
            };
            let body = serde_json::to_string(&error).unwrap_or_default();
            (status, [(header::CONTENT_TYPE, "application/json")], body).into_response()
        }
        RouteKind::Api => {
            let code = match status {
                StatusCode::UNAUTHORIZED => "unauthorized",
                StatusCode::FORBIDDEN => "forbidden",
                StatusCode::METHOD_NOT_ALLOWED => "method_not_allowed",
                StatusCode::SERVICE_UNAVAILABLE => "unavailable",
                _ => "internal",
            };
            let mut response =
                (status, Json(ErrorBody { error: code.to_owned(), message: message.into_owned() })).into_response();
            if status == StatusCode::UNAUTHORIZED {
                response.headers_mut().insert(header::WWW_AUTHENTICATE, header::HeaderValue::from_static("Bearer"));
            }
            response
        }
    }
}
