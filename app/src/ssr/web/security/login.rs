//! `POST /login` and `POST /logout`.
//!
//! Sign-in takes a URL-encoded form `username`, `password`, `next`. Browsers (requests accepting
//! `text/html`) are redirected: to `next` (a path on this site) on success, back to
//! `/login?error=invalid|throttled` otherwise. Other clients get 204 with the session cookie,
//! 401 or 429 (with `Retry-After`) and the API's JSON error body. Messages never tell a wrong
//! name from a wrong password. Failures are counted per account name and per client address
//! (`[auth]` limits); every attempt is in the audit log: `auth.login`, `auth.login_failed`,
//! `auth.login_throttled` (actor `anonymous`, the name tried in the detail), `auth.logout`.

use std::time::Duration;

use crate::ssr::service::auth::RequestAuth;
use axum::Form;
use axum::Json;
use axum::extract::{FromRequest, Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use dedup_engine::console::accounts::passwords::{self, verify_password};
use dedup_engine::console::accounts::throttle::{account_key, address_key};
use dedup_engine::console::audit::{AuditLog, AuditOutcome, NewAuditEntry};
use serde::Deserialize;
use serde_json::json;
use tower_sessions::Session;

use super::client::client_address;
use super::session;
use crate::ssr::web::config::ConsoleAuth;
use crate::ssr::web::error::ErrorBody;
use crate::ssr::web::state::AppState;

/// The sign-in form.
#[derive(Debug, Deserialize)]
pub struct LoginForm {
    /// User name (compared ignoring case).
    pub username: String,
    /// Password.
    pub password: String,
    /// Where to go after signing in: a path on this site; `/` otherwise.
    #[serde(default)]
    pub next: Option<String>,
}

/// The generic failure message.
pub const INVALID: &str = "invalid user name or password";
const THROTTLED: &str = "too many failed sign-ins; try again later";

enum Outcome {
    SignedIn,
    Invalid,
    Throttled(u64),
}

/// `POST /login`.
pub async fn login(State(state): State<AppState>, session: Session, req: Request) -> Response {
    let wants_html = accepts_html(req.headers());
    let source = client_address(req.extensions());
    let Ok(Form(form)) = Form::<LoginForm>::from_request(req, &()).await else {
        return (StatusCode::BAD_REQUEST, Json(error("bad_request", "expected a form with username and password")))
            .into_response();
    };
    let next = safe_next(form.next.as_deref()).unwrap_or_else(|| state.base.join("/"));
    let login = state.base.join("/login");
    match sign_in(&state, &session, &form, source.as_deref()).await {
        Ok(Outcome::SignedIn) if wants_html => Redirect::to(&next).into_response(),
        Ok(Outcome::SignedIn) => StatusCode::NO_CONTENT.into_response(),
        Ok(Outcome::Invalid) if wants_html => {
            Redirect::to(&format!("{login}?error=invalid&next={}", encode(&next))).into_response()
        }
        Ok(Outcome::Invalid) => (StatusCode::UNAUTHORIZED, Json(error("unauthorized", INVALID))).into_response(),
        Ok(Outcome::Throttled(_)) if wants_html => {
            Redirect::to(&format!("{login}?error=throttled&next={}", encode(&next))).into_response()
        }
        Ok(Outcome::Throttled(wait)) => (
            StatusCode::TOO_MANY_REQUESTS,
            [(header::RETRY_AFTER, wait.to_string())],
            Json(error("too_many_requests", THROTTLED)),
        )
            .into_response(),
        Err(e) => {
            tracing::error!(error = %format!("{e:#}"), "sign-in failed");
            (StatusCode::INTERNAL_SERVER_ERROR, Json(error("internal", "internal error; see the server log")))
                .into_response()
        }
    }
}

async fn sign_in(
    state: &AppState,
    session: &Session,
    form: &LoginForm,
    source: Option<&str>,
) -> anyhow::Result<Outcome> {
    let ConsoleAuth::Accounts(settings) = &state.config.auth else {
        anyhow::bail!("signing in with the console's accounts, but the console does not use them");
    };
    let accounts = state.console.store();
    // No account name holds a NUL, which PostgreSQL would refuse in the throttle and audit rows.
    let name = form.username.trim().replace('\0', "\u{FFFD}");
    // At least a second: a window of 0 would end as it starts and turn the throttle off.
    let window = Duration::from_secs(settings.throttle_window_secs.max(1));
    let mut limits = vec![(account_key(&name), settings.max_failures_per_account)];
    if let Some(address) = source {
        limits.push((address_key(address), settings.max_failures_per_address));
    }
    let audit =
        |actor: String, action: &'static str, outcome| AuditLogin { actor, action, outcome, name: &name, source };
    if let Some(wait) = accounts.throttle_check(&limits, window).await? {
        audit("anonymous".to_owned(), "auth.login_throttled", AuditOutcome::Refused).write(accounts).await?;
        return Ok(Outcome::Throttled(wait));
    }
    let credentials = accounts.user_credentials(&name).await?;
    let password = form.password.clone();
    let hash = credentials.as_ref().map(|(_, h)| h.clone());
    let verified = passwords::blocking(move || verify_password(&password, hash.as_deref())).await?;
    let user = credentials.map(|(u, _)| u).filter(|u| verified && !u.disabled);
    let Some(user) = user else {
        let keys: Vec<String> = limits.into_iter().map(|(k, _)| k).collect();
        accounts.throttle_fail(&keys, window).await?;
        audit("anonymous".to_owned(), "auth.login_failed", AuditOutcome::Refused).write(accounts).await?;
        return Ok(Outcome::Invalid);
    };
    session::start(session, user.id).await?;
    accounts.throttle_clear(&account_key(&name)).await?;
    accounts.user_touch_login(user.id).await?;
    audit(user.actor(), "auth.login", AuditOutcome::Ok).write(accounts).await?;
    Ok(Outcome::SignedIn)
}

/// A sign-in attempt's audit entry (the name tried goes in the detail).
struct AuditLogin<'a> {
    actor: String,
    action: &'static str,
    outcome: AuditOutcome,
    name: &'a str,
    source: Option<&'a str>,
}

impl AuditLogin<'_> {
    async fn write(self, log: &dyn AuditLog) -> Result<i64, sqlx::Error> {
        let entry = NewAuditEntry {
            actor: &self.actor,
            action: self.action,
            outcome: self.outcome,
            reason: None,
            consumer_group: None,
            message_ids: &[],
            detail: json!({ "user": self.name }),
            source: self.source,
        };
        log.record(&entry).await
    }
}

/// `POST /logout`: ends the session and goes to the sign-in page (204 for non-browsers).
pub async fn logout(State(state): State<AppState>, session: Session, req: Request) -> Response {
    let auth = req.extensions().get::<RequestAuth>().cloned().unwrap_or_default();
    let wants_html = accepts_html(req.headers());
    if let Err(e) = session.flush().await {
        tracing::error!(error = %e, "ending a session failed");
        return StatusCode::INTERNAL_SERVER_ERROR.into_response();
    }
    let entry = NewAuditEntry {
        actor: &auth.actor(),
        action: "auth.logout",
        outcome: AuditOutcome::Ok,
        reason: None,
        consumer_group: None,
        message_ids: &[],
        detail: json!({}),
        source: auth.source.as_deref(),
    };
    if let Err(e) = state.console.store().record(&entry).await {
        tracing::error!(error = %e, "writing the audit log failed");
    }
    if wants_html {
        Redirect::to(&state.base.join("/login?signed_out=1")).into_response()
    } else {
        StatusCode::NO_CONTENT.into_response()
    }
}

fn accepts_html(headers: &HeaderMap) -> bool {
    headers.get(header::ACCEPT).and_then(|v| v.to_str().ok()).is_some_and(|v| v.contains("text/html"))
}

/// `next` if it is a path on this site (`/...`, not `//host` or `/\host`).
fn safe_next(next: Option<&str>) -> Option<String> {
    next.filter(|n| n.starts_with('/') && !n.starts_with("//") && !n.starts_with("/\\") && n.len() <= 2048)
        .map(str::to_owned)
}

fn encode(value: &str) -> String {
    url::form_urlencoded::byte_serialize(value.as_bytes()).collect()
}

fn error(code: &str, message: &str) -> ErrorBody {
    ErrorBody { error: code.to_owned(), message: message.to_owned() }
}

#[cfg(test)]
mod tests {
    use super::safe_next;

    #[test]
    fn next_stays_on_this_site() {
        assert_eq!(safe_next(Some("/records?status=dead")).as_deref(), Some("/records?status=dead"));
        for bad in ["https://evil.example/", "//evil.example/", "/\\evil.example", "records"] {
            assert_eq!(safe_next(Some(bad)), None, "{bad}");
        }
        assert_eq!(safe_next(None), None);
    }
}
