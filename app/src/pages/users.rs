//! Users (admins only): add users, change roles, disable and enable, reset passwords. Every
//! change is in the audit log; the last enabled admin cannot be demoted or disabled.

use leptos::prelude::*;

use crate::error::ConsoleError;
use crate::format::opt_time;
use crate::wire::account::{RoleView, UserView};

/// Every user.
#[server(prefix = "/api/fn", endpoint = "list_users", client = crate::csrf::CsrfClient)]
pub async fn list_users() -> Result<Vec<UserView>, ConsoleError> {
    crate::ssr::service::auth::require(RoleView::Admin)?;
    crate::ssr::service::accounts::list_users(&crate::ssr::service::console_state()?).await
}

/// Adds a user with a role and an initial password (at least 10 characters).
#[server(prefix = "/api/fn", endpoint = "add_user", client = crate::csrf::CsrfClient)]
pub async fn add_user(name: String, role: String, password: String) -> Result<UserView, ConsoleError> {
    let (_, auth) = crate::ssr::service::auth::require(RoleView::Admin)?;
    let role = crate::ssr::service::accounts::parse_role(&role)?;
    crate::ssr::service::accounts::add_user(&crate::ssr::service::console_state()?, &auth, &name, role, password).await
}

/// Changes a user's role.
#[server(prefix = "/api/fn", endpoint = "set_user_role", client = crate::csrf::CsrfClient)]
pub async fn set_user_role(id: i64, role: String) -> Result<UserView, ConsoleError> {
    let (_, auth) = crate::ssr::service::auth::require(RoleView::Admin)?;
    let role = crate::ssr::service::accounts::parse_role(&role)?;
    crate::ssr::service::accounts::update_user(&crate::ssr::service::console_state()?, &auth, id, Some(role), None)
        .await
}

/// Disables (`true`) or enables (`false`) a user; a disabled user's sessions and tokens stop
/// working at once.
#[server(prefix = "/api/fn", endpoint = "set_user_disabled", client = crate::csrf::CsrfClient)]
pub async fn set_user_disabled(id: i64, disabled: bool) -> Result<UserView, ConsoleError> {
    let (_, auth) = crate::ssr::service::auth::require(RoleView::Admin)?;
    crate::ssr::service::accounts::update_user(&crate::ssr::service::console_state()?, &auth, id, None, Some(disabled))
        .await
}

/// Sets a new password for a user.
#[server(prefix = "/api/fn", endpoint = "reset_user_password", client = crate::csrf::CsrfClient)]
pub async fn reset_user_password(name: String, password: String) -> Result<(), ConsoleError> {
    let (_, auth) = crate::ssr::service::auth::require(RoleView::Admin)?;
    crate::ssr::service::accounts::reset_password(&crate::ssr::service::console_state()?, &auth, &name, password).await
}

/// The Users page.
#[component]
pub fn UsersPage() -> impl IntoView {
    let add = ServerAction::<AddUser>::new();
    let set_role = ServerAction::<SetUserRole>::new();
    let set_disabled = ServerAction::<SetUserDisabled>::new();
    let reset = ServerAction::<ResetUserPassword>::new();
    let users = Resource::new(
        move || (add.version().get(), set_role.version().get(), set_disabled.version().get()),
        |_| list_users(),
    );
    let error = move || {
        let errors = [
            add.value().get().and_then(Result::err),
            set_role.value().get().and_then(Result::err),
            set_disabled.value().get().and_then(Result::err),
            reset.value().get().and_then(Result::err),
        ];
        errors
            .into_iter()
            .flatten()
            .next()
            .map(|e| view! { <p class="error" data-testid="users-error">{e.to_string()}</p> })
    };
    view! {
        <h1>"Users"</h1>
        {error}
        <section class="panel">
            <h2>"Add a user"</h2>
            <ActionForm action=add attr:class="inline-form" attr:data-testid="add-user">
                <input name="name" placeholder="name" required maxlength="64" />
                <RoleSelect name="role" selected=RoleView::Viewer />
                <input name="password" type="password" placeholder="initial password" required minlength="10" />
                <button type="submit" class="primary">"Add"</button>
            </ActionForm>
        </section>
        <Transition fallback=|| view! { <p class="muted">"Loading…"</p> }>
            {move || Suspend::new(async move {
                match users.await {
                    Ok(list) => {
                        view! {
                            <table data-testid="users-table">
                                <thead>
                                    <tr>
                                        <th>"Name"</th>
                                        <th>"Role"</th>
                                        <th>"State"</th>
                                        <th>"Last sign-in"</th>
                                        <th>"Password"</th>
                                    </tr>
                                </thead>
                                <tbody>
                                    {list
                                        .into_iter()
                                        .map(|u| view! { <UserRow u set_role set_disabled reset /> })
                                        .collect_view()}
                                </tbody>
                            </table>
                        }
                            .into_any()
                    }
                    Err(e) => view! { <p class="error">{e.to_string()}</p> }.into_any(),
                }
            })}
        </Transition>
    }
}

#[component]
fn RoleSelect(name: &'static str, selected: RoleView) -> impl IntoView {
    view! {
        <select name=name>
            {RoleView::ALL
                .into_iter()
                .map(|r| view! { <option value=r.as_str() selected={r == selected}>{r.as_str()}</option> })
                .collect_view()}
        </select>
    }
}

#[component]
fn UserRow(
    u: UserView,
    set_role: ServerAction<SetUserRole>,
    set_disabled: ServerAction<SetUserDisabled>,
    reset: ServerAction<ResetUserPassword>,
) -> impl IntoView {
    let (id, id_again) = (u.id.to_string(), u.id.to_string());
    let (name, label, key) = (u.name.clone(), u.name.clone(), u.name);
    view! {
        <tr data-user=key>
            <td>{label}</td>
            <td>
                <ActionForm action=set_role attr:class="inline-form">
                    <input type="hidden" name="id" value=id />
                    <RoleSelect name="role" selected=u.role />
                    <button type="submit">"Set role"</button>
                </ActionForm>
            </td>
            <td>
                {if u.disabled { "disabled" } else { "enabled" }}
                <ActionForm action=set_disabled attr:class="inline-form">
                    <input type="hidden" name="id" value=id_again />
                    <input type="hidden" name="disabled" value={(!u.disabled).to_string()} />
                    <button type="submit">{if u.disabled { "Enable" } else { "Disable" }}</button>
                </ActionForm>
            </td>
            <td>{opt_time(u.last_login_at.as_deref())}</td>
            <td>
                <ActionForm action=reset attr:class="inline-form">
                    <input type="hidden" name="name" value=name />
                    <input name="password" type="password" placeholder="new password" required minlength="10" />
                    <button type="submit">"Reset"</button>
                </ActionForm>
            </td>
        </tr>
    }
}
