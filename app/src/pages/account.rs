//! Account: the signed-in user's API tokens for REST automation (`Authorization: Bearer`).
//! A new token's secret is shown once; only its SHA-256 is stored. Revoked tokens stop working
//! at once.

use leptos::prelude::*;

use crate::components::session::use_session;
use crate::error::ConsoleError;
use crate::format::opt_time;
use crate::wire::account::{NewTokenView, TokenView};

/// The signed-in user's tokens, newest first.
#[server(prefix = "/api/fn", endpoint = "list_tokens", client = crate::csrf::CsrfClient)]
pub async fn list_tokens() -> Result<Vec<TokenView>, ConsoleError> {
    let (user, _) = crate::ssr::service::auth::require_account(crate::wire::account::RoleView::Viewer)?;
    crate::ssr::service::accounts::list_tokens(&crate::ssr::service::console_state()?, &user).await
}

/// Creates a token named `name`; the answer holds its secret, shown once.
#[server(prefix = "/api/fn", endpoint = "create_token", client = crate::csrf::CsrfClient)]
pub async fn create_token(name: String) -> Result<NewTokenView, ConsoleError> {
    let (user, auth) = crate::ssr::service::auth::require_account(crate::wire::account::RoleView::Viewer)?;
    // Only a signed-in session (which has a CSRF token) mints tokens: a leaked API token must
    // not outlive its own revocation by minting another.
    if auth.csrf_token.is_none() {
        return Err(ConsoleError::Forbidden(
            "API tokens are created from a signed-in session, not with a token".to_owned(),
        ));
    }
    crate::ssr::service::accounts::create_token(&crate::ssr::service::console_state()?, &auth, &user, &name).await
}

/// Revokes one of the signed-in user's tokens.
#[server(prefix = "/api/fn", endpoint = "revoke_token", client = crate::csrf::CsrfClient)]
pub async fn revoke_token(id: i64) -> Result<TokenView, ConsoleError> {
    let (user, auth) = crate::ssr::service::auth::require_account(crate::wire::account::RoleView::Viewer)?;
    crate::ssr::service::accounts::revoke_token(&crate::ssr::service::console_state()?, &auth, &user, id).await
}

/// The Account page.
#[component]
pub fn AccountPage() -> impl IntoView {
    let session = use_session();
    let create = ServerAction::<CreateToken>::new();
    let revoke = ServerAction::<RevokeToken>::new();
    let tokens = Resource::new(move || (create.version().get(), revoke.version().get()), |_| list_tokens());
    view! {
        <h1>"Account"</h1>
        <Transition fallback=|| ()>
            {move || Suspend::new(async move {
                session
                    .await
                    .ok()
                    .and_then(|s| s.user)
                    .map(|u| view! { <p>"Signed in as " <strong>{u.name}</strong> ", role " {u.role.as_str()} "."</p> })
            })}
        </Transition>
        <Transition fallback=|| ()>
            {move || Suspend::new(async move {
                let s = session.await.unwrap_or_default();
                if !s.accounts {
                    return view! {
                        <p class="muted" data-testid="no-tokens">
                            "API tokens belong to the console's own accounts; this console signs you in through its host."
                        </p>
                    }
                        .into_any();
                }
                view! { <Tokens create revoke tokens writable=!s.read_only /> }.into_any()
            })}
        </Transition>
    }
}

/// The API tokens panel: the creation form (unless read-only), the new token once, the list.
#[component]
fn Tokens(
    create: ServerAction<CreateToken>,
    revoke: ServerAction<RevokeToken>,
    tokens: Resource<Result<Vec<TokenView>, ConsoleError>>,
    writable: bool,
) -> impl IntoView {
    view! {
        <section class="panel">
            <h2>"API tokens"</h2>
            <p class="muted small">
                "For scripts calling the REST API: send " <code>"Authorization: Bearer <token>"</code>
                ". A token acts with your role."
            </p>
            {writable
                .then(|| {
                    view! {
                        <ActionForm action=create attr:class="inline-form" attr:data-testid="create-token">
                            <input name="name" placeholder="token name (e.g. grafana)" required maxlength="64" />
                            <button type="submit" class="primary">"Create token"</button>
                        </ActionForm>
                    }
                })}
            {move || {
                create
                    .value()
                    .get()
                    .map(|r| match r {
                        Ok(t) => {
                            view! {
                                <p class="secret" data-testid="new-token">
                                    "Copy this token now; it will not be shown again: "
                                    <code class="mono">{t.secret}</code>
                                </p>
                            }
                                .into_any()
                        }
                        Err(e) => view! { <p class="error">{e.to_string()}</p> }.into_any(),
                    })
            }}
        </section>
        <Transition fallback=|| view! { <p class="muted">"Loading…"</p> }>
            {move || Suspend::new(async move {
                match tokens.await {
                    Ok(list) if list.is_empty() => view! { <p class="empty">"No tokens yet."</p> }.into_any(),
                    Ok(list) => view! { <TokenTable list revoke writable /> }.into_any(),
                    Err(e) => view! { <p class="error">{e.to_string()}</p> }.into_any(),
                }
            })}
        </Transition>
    }
}

#[component]
fn TokenTable(list: Vec<TokenView>, revoke: ServerAction<RevokeToken>, writable: bool) -> impl IntoView {
    view! {
        <table data-testid="tokens-table">
            <thead>
                <tr>
                    <th>"Name"</th>
                    <th>"Starts with"</th>
                    <th>"Created"</th>
                    <th>"Last used"</th>
                    <th>"Revoked"</th>
                    <th></th>
                </tr>
            </thead>
            <tbody>
                {list
                    .into_iter()
                    .map(|t| {
                        let revoked = t.revoked_at.is_some();
                        view! {
                            <tr>
                                <td>{t.name}</td>
                                <td class="mono">{t.prefix}"…"</td>
                                <td>{opt_time(Some(&t.created_at))}</td>
                                <td>{opt_time(t.last_used_at.as_deref())}</td>
                                <td>{opt_time(t.revoked_at.as_deref())}</td>
                                <td>
                                    {writable
                                        .then(|| {
                                            view! {
                                                <ActionForm action=revoke>
                                                    <input type="hidden" name="id" value=t.id.to_string() />
                                                    <button type="submit" class="danger" disabled=revoked>"Revoke"</button>
                                                </ActionForm>
                                            }
                                        })}
                                </td>
                            </tr>
                        }
                    })
                    .collect_view()}
            </tbody>
        </table>
    }
}
