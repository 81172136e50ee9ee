//! Who is asking: the server's authorisation layer (which has already checked the role the
//! route or server function needs) puts a [`RequestAuth`] in the request's extensions; the
//! server provides it as context to pages and server functions.

use leptos::prelude::use_context;

use crate::error::ConsoleError;
use crate::wire::account::{CurrentUser, RoleView};

/// The signed-in user of the request (if any), how they signed in, the CSRF token of the page
/// (sessions and host sign-ins, not API tokens) and the client address.
#[derive(Debug, Clone, Default)]
pub struct RequestAuth {
    /// The user; `None` for anonymous requests (only public routes get that far).
    pub user: Option<CurrentUser>,
    /// Who vouches for the user.
    pub sign_in: SignIn,
    /// The CSRF token, rendered into the page for [`crate::csrf::CsrfClient`].
    pub csrf_token: Option<String>,
    /// The client address, for the audit log.
    pub source: Option<String>,
}

/// Who vouches for a request's user.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum SignIn {
    /// The console's own accounts: a session or an API token.
    #[default]
    Account,
    /// The host application (delegated auth): the user is the host's, by the host's name.
    Host,
    /// Nobody: auth is off, and the request came over loopback.
    Local,
}

impl RequestAuth {
    /// The audit log's actor: `user:<name>` (the console's accounts), `host:<name>` (the host's
    /// user), `local:<name>` (auth off), or `anonymous`.
    pub fn actor(&self) -> String {
        let Some(user) = &self.user else { return "anonymous".to_owned() };
        match self.sign_in {
            SignIn::Account => format!("user:{}", user.name),
            SignIn::Host => format!("host:{}", user.name),
            SignIn::Local => format!("local:{}", user.name),
        }
    }
}

/// The [`RequestAuth`] of the current request (anonymous when none was provided).
pub fn request_auth() -> RequestAuth {
    use_context::<RequestAuth>().unwrap_or_default()
}

/// The signed-in user if their role is at least `role`. The server's layer checks this before
/// any server function runs; server functions call it again as a second line of defence.
///
/// # Errors
/// [`ConsoleError::Unauthorized`] when signed out, [`ConsoleError::Forbidden`] when the role is
/// too low.
pub fn require(role: RoleView) -> Result<(CurrentUser, RequestAuth), ConsoleError> {
    let auth = request_auth();
    let user = auth.user.clone().ok_or_else(|| ConsoleError::Unauthorized("sign in first".to_owned()))?;
    if user.role < role {
        return Err(ConsoleError::Forbidden(format!("this needs the {} role", role.as_str())));
    }
    Ok((user, auth))
}

/// [`require`], for what only the console's own accounts have (API tokens).
///
/// # Errors
/// As [`require`]; [`ConsoleError::Forbidden`] when the user was signed in by the host or auth
/// is off.
pub fn require_account(role: RoleView) -> Result<(CurrentUser, RequestAuth), ConsoleError> {
    let (user, auth) = require(role)?;
    if auth.sign_in != SignIn::Account {
        return Err(ConsoleError::Forbidden(
            "API tokens belong to the console's own accounts; this console signs users in through its host".to_owned(),
        ));
    }
    Ok((user, auth))
}
