//! Who is asking: the server's authorisation layer (which has already checked the role the
//! route or server function needs) puts a [`RequestAuth`] in the request's extensions; the
//! server provides it as context to pages and server functions.

use leptos::prelude::use_context;

use crate::error::ConsoleError;
use crate::wire::account::{CurrentUser, RoleView};

/// The signed-in user of the request (if any), the session's CSRF token (sessions only, not
/// API tokens) and the client address.
#[derive(Debug, Clone, Default)]
pub struct RequestAuth {
    /// The user; `None` for anonymous requests (only public routes get that far).
    pub user: Option<CurrentUser>,
    /// The session's CSRF token, rendered into the page for [`crate::csrf::CsrfClient`].
    pub csrf_token: Option<String>,
    /// The client address, for the audit log.
    pub source: Option<String>,
}

impl RequestAuth {
    /// The audit log's actor: `user:<name>`, or `anonymous`.
    pub fn actor(&self) -> String {
        self.user.as_ref().map_or_else(|| "anonymous".to_owned(), |u| format!("user:{}", u.name))
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
