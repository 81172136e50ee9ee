//! Sign-in: a plain form posted to `POST /login` (handled by the server, which sets the session
//! cookie and redirects to `next`). The only page anonymous visitors may see; the error message
//! never says whether the name or the password was wrong.

use leptos::prelude::*;
use leptos_router::hooks::use_query_map;

use crate::base::href;

/// The sign-in page. Query: `next` (where to go after signing in), `error` (`invalid`,
/// `throttled`), `signed_out`.
#[component]
pub fn LoginPage() -> impl IntoView {
    let query = use_query_map();
    let message = move || {
        query.with(|q| match q.get("error").as_deref() {
            Some("throttled") => Some("Too many failed sign-ins. Wait a few minutes, then try again."),
            Some(_) => Some("Invalid user name or password."),
            None => None,
        })
    };
    let next = move || query.with(|q| q.get("next")).unwrap_or_else(|| href("/"));
    view! {
        <div class="login panel">
            <h1>"Sign in"</h1>
            {move || message().map(|m| view! { <p class="error" data-testid="login-error">{m}</p> })}
            <form method="post" action=href("/login") data-testid="login-form">
                <input type="hidden" name="next" value=next />
                <label>
                    "User name" <input name="username" autocomplete="username" required maxlength="64" />
                </label>
                <label>
                    "Password"
                    <input type="password" name="password" autocomplete="current-password" required />
                </label>
                <button type="submit" class="primary">
                    "Sign in"
                </button>
            </form>
        </div>
    }
}
