//! The billing service's own sign-in, which the dedup console it mounts trusts (delegated auth):
//! staff accounts from the configuration (`BILLING_STAFF=name:role:password,...`; none given:
//! one operator `ops` with a random password, printed at start), a sign-in form at `/signin`,
//! and a cookie `billing_staff` holding the name and an HMAC of it (the key is random per
//! process: a restart signs everyone out). [`StaffAuth::resolve`] turns that cookie into the
//! console's [`HostUser`].

use std::collections::HashMap;
use std::sync::Arc;

use axum::Form;
use axum::extract::{Query, State};
use axum::http::header::{COOKIE, SET_COOKIE};
use axum::http::request::Parts;
use axum::response::{Html, IntoResponse, Redirect, Response};
use dedup_app::ssr::mount::{HostUser, Role};
use hmac::{Hmac, Mac};
use serde::Deserialize;

/// The session cookie.
const COOKIE_NAME: &str = "billing_staff";

/// Staff accounts and the cookie key.
#[derive(Clone)]
pub struct StaffAuth {
    staff: Arc<HashMap<String, (Role, String)>>,
    key: Arc<[u8; 32]>,
}

impl StaffAuth {
    /// Accounts from `spec` (`name:role:password`, comma-separated; roles `viewer`, `operator`,
    /// `admin`); without one, an operator `ops` with a random password (logged).
    ///
    /// Errors: an entry that is not `name:role:password` with a known role.
    pub fn from_spec(spec: Option<&str>) -> anyhow::Result<Self> {
        let mut staff = HashMap::new();
        match spec.map(str::trim).filter(|s| !s.is_empty()) {
            Some(spec) => {
                for entry in spec.split(',') {
                    let mut parts = entry.trim().splitn(3, ':');
                    let (Some(name), Some(role), Some(password)) = (parts.next(), parts.next(), parts.next()) else {
                        anyhow::bail!("BILLING_STAFF entry {entry:?} is not name:role:password");
                    };
                    let role = match role {
                        "viewer" => Role::Viewer,
                        "operator" => Role::Operator,
                        "admin" => Role::Admin,
                        other => anyhow::bail!("BILLING_STAFF: unknown role {other:?} (viewer, operator, admin)"),
                    };
                    staff.insert(name.to_owned(), (role, password.to_owned()));
                }
            }
            None => {
                let password: String = (0..16).map(|_| rand::random_range(b'a'..=b'z') as char).collect();
                tracing::warn!("no BILLING_STAFF: sign in as `ops` (operator) with the password {password}");
                staff.insert("ops".to_owned(), (Role::Operator, password));
            }
        }
        Ok(Self { staff: Arc::new(staff), key: Arc::new(rand::random()) })
    }

    fn signature(&self, name: &str) -> String {
        let mut mac = Hmac::<sha2::Sha256>::new_from_slice(self.key.as_slice()).expect("any key length");
        mac.update(name.as_bytes());
        mac.finalize().into_bytes().iter().map(|b| format!("{b:02x}")).collect()
    }

    /// The signed-in staff member of a request, for the console: the cookie's name if its
    /// signature holds and the account exists.
    pub fn resolve(&self, request: &Parts) -> Option<HostUser> {
        let cookies = request.headers.get_all(COOKIE).iter().filter_map(|v| v.to_str().ok());
        let value = cookies.flat_map(|c| c.split(';')).find_map(|c| c.trim().strip_prefix("billing_staff="))?;
        let (name, signature) = value.rsplit_once('.')?;
        let expected = self.signature(name);
        let same = expected.len() == signature.len()
            && expected.bytes().zip(signature.bytes()).fold(0u8, |acc, (a, b)| acc | (a ^ b)) == 0;
        let (role, _) = self.staff.get(name).filter(|_| same)?;
        Some(HostUser { name: name.to_owned(), role: *role })
    }
}

/// `?next=` of the sign-in page.
#[derive(Debug, Deserialize)]
pub struct Next {
    next: Option<String>,
    error: Option<String>,
}

/// `GET /signin`: the form.
pub async fn form(Query(q): Query<Next>) -> Html<String> {
    let next = html_escape::encode_double_quoted_attribute(q.next.as_deref().unwrap_or("/ops/dedup")).into_owned();
    let error = q.error.map(|_| "<p role=alert>Wrong name or password.</p>").unwrap_or_default();
    Html(format!(
        "<!doctype html><html lang=en><head><meta charset=utf-8><title>Billing staff sign-in</title><link rel=icon href=data:,></head><body>
<h1>Billing staff</h1>{error}<form method=post action=/signin>
<input type=hidden name=next value=\"{next}\">
<label>Name <input name=name autocomplete=username required></label>
<label>Password <input name=password type=password autocomplete=current-password required></label>
<button type=submit>Sign in</button></form></body></html>"
    ))
}

/// The sign-in form's fields.
#[derive(Debug, Deserialize)]
pub struct SignIn {
    name: String,
    password: String,
    next: Option<String>,
}

/// `POST /signin`: sets the cookie and goes to `next` (a path on this site), or back to the form.
pub async fn sign_in(State(auth): State<StaffAuth>, Form(form): Form<SignIn>) -> Response {
    let next = form.next.filter(|n| n.starts_with('/') && !n.starts_with("//")).unwrap_or_else(|| "/".to_owned());
    let ok = auth.staff.get(&form.name).is_some_and(|(_, password)| *password == form.password);
    if !ok {
        let next: String = url::form_urlencoded::byte_serialize(next.as_bytes()).collect();
        return Redirect::to(&format!("/signin?error=1&next={next}")).into_response();
    }
    let cookie =
        format!("{COOKIE_NAME}={}.{}; Path=/; HttpOnly; SameSite=Strict", form.name, auth.signature(&form.name));
    ([(SET_COOKIE, cookie)], Redirect::to(&next)).into_response()
}

/// `GET /signout`: clears the cookie, back to the home page.
pub async fn sign_out() -> Response {
    ([(SET_COOKIE, format!("{COOKIE_NAME}=; Path=/; Max-Age=0"))], Redirect::to("/")).into_response()
}
