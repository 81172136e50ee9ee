//! The signed-in user on the client: [`use_session`] (one resource per page load, provided by
//! [`crate::App`]), [`IfRole`] (shows its children only to a role that may use them; the server
//! enforces the same rule), and the user box of the top bar with the sign-out button.

use leptos::prelude::*;
use leptos_router::components::A;

use crate::csrf::CSRF_FIELD;
use crate::error::ConsoleError;
use crate::wire::account::{RoleView, SessionView};

/// The signed-in user and the session's CSRF token (public: signed-out visitors get nothing).
#[server(prefix = "/api/fn", endpoint = "get_session", client = crate::csrf::CsrfClient)]
pub async fn get_session() -> Result<SessionView, ConsoleError> {
    let auth = crate::ssr::auth::request_auth();
    Ok(SessionView { user: auth.user, csrf_token: auth.csrf_token })
}

/// The session resource of this page load.
pub type SessionResource = Resource<Result<SessionView, ConsoleError>>;

/// Creates the session resource and provides it as context (done once, by the app).
pub fn provide_session() -> SessionResource {
    let session = Resource::new(|| (), |_| get_session());
    provide_context(session);
    session
}

/// The session resource provided by the app.
pub fn use_session() -> SessionResource {
    use_context::<SessionResource>().unwrap_or_else(provide_session)
}

/// Renders `children` only when the signed-in user's role is at least `role`. Hiding is a
/// convenience: the server refuses the action anyway.
#[component]
pub fn IfRole(role: RoleView, children: ChildrenFn) -> impl IntoView {
    let session = use_session();
    view! {
        <Transition fallback=|| ()>
            {move || {
                let children = children.clone();
                Suspend::new(async move {
                    let allowed = session.await.ok().and_then(|s| s.user).is_some_and(|u| u.role >= role);
                    allowed.then(|| children())
                })
            }}
        </Transition>
    }
}

/// The top bar's right side: the user's name and role, the Account link, and sign-out (a plain
/// form post carrying the CSRF token, so it works before hydration too).
#[component]
pub fn UserBox() -> impl IntoView {
    let session = use_session();
    view! {
        <Transition fallback=|| ()>
            {move || Suspend::new(async move {
                let s = session.await.unwrap_or_default();
                s.user.map(|user| {
                    view! {
                        <div class="userbox" data-testid="userbox" data-role=user.role.as_str()>
                            <A href="/account">{user.name}</A>
                            <span class="muted small">{user.role.as_str()}</span>
                            <form method="post" action="/logout">
                                <input type="hidden" name=CSRF_FIELD value=s.csrf_token.unwrap_or_default() />
                                <button type="submit" data-testid="logout">"Sign out"</button>
                            </form>
                        </div>
                    }
                })
            })}
        </Transition>
    }
}
