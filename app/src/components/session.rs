//! The signed-in user on the client: [`use_session`] (one resource per page load, provided by
//! [`crate::App`]), [`IfRole`] (shows an action only to a role that may use it, never in a
//! read-only console; the server enforces the same rules), and the user box of the top bar with
//! the sign-out button.

use leptos::prelude::*;
use leptos_router::components::A;

use crate::base::href;
use crate::csrf::CSRF_FIELD;
use crate::error::ConsoleError;
use crate::wire::account::{RoleView, SessionView, SignOutView};

/// The signed-in user, the page's CSRF token and what the console allows (public: signed-out
/// visitors get no user and no token).
#[server(prefix = "/api/fn", endpoint = "get_session", client = crate::csrf::CsrfClient)]
pub async fn get_session() -> Result<SessionView, ConsoleError> {
    use crate::ssr::service::auth::SignIn;
    let auth = crate::ssr::service::auth::request_auth();
    let state = crate::ssr::service::console_state()?;
    let sign_out = match auth.sign_in {
        _ if auth.user.is_none() => None,
        SignIn::Account => Some(SignOutView::Console),
        SignIn::Host => state.host_sign_out.clone().map(SignOutView::Host),
        SignIn::Local => None,
    };
    Ok(SessionView {
        accounts: auth.user.is_some() && auth.sign_in == SignIn::Account,
        user: auth.user,
        csrf_token: auth.csrf_token,
        read_only: state.read_only,
        sign_out,
    })
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

/// Renders `children` (an action: a button, a form) only when the signed-in user's role is at
/// least `role` and the console is not read-only. Hiding is a convenience: the server refuses
/// the action anyway.
#[component]
pub fn IfRole(role: RoleView, children: ChildrenFn) -> impl IntoView {
    let session = use_session();
    view! {
        <Transition fallback=|| ()>
            {move || {
                let children = children.clone();
                Suspend::new(async move {
                    let allowed = session.await.ok().is_some_and(|s| {
                        !s.read_only && s.user.is_some_and(|u| u.role >= role)
                    });
                    allowed.then(|| children())
                })
            }}
        </Transition>
    }
}

/// The top bar's right side: the user's name and role, the Account link, and sign-out (a plain
/// form post carrying the CSRF token, so it works before hydration too; or a link to the host's
/// sign-out).
#[component]
pub fn UserBox() -> impl IntoView {
    let session = use_session();
    view! {
        <Transition fallback=|| ()>
            {move || Suspend::new(async move {
                let s = session.await.unwrap_or_default();
                let token = s.csrf_token.unwrap_or_default();
                let sign_out = s.sign_out.map(|out| match out {
                    SignOutView::Console => view! {
                        <form method="post" action=href("/logout")>
                            <input type="hidden" name=CSRF_FIELD value=token />
                            <button type="submit" data-testid="logout">"Sign out"</button>
                        </form>
                    }
                    .into_any(),
                    SignOutView::Host(url) => view! { <a href=url data-testid="logout">"Sign out"</a> }.into_any(),
                });
                s.user.map(|user| {
                    view! {
                        <div class="userbox" data-testid="userbox" data-role=user.role.as_str()>
                            <A href=href("/account")>{user.name}</A>
                            <span class="muted small">{user.role.as_str()}</span>
                            {s.read_only.then(|| view! { <span class="badge" data-testid="read-only">"read-only"</span> })}
                            {sign_out}
                        </div>
                    }
                })
            })}
        </Transition>
    }
}
