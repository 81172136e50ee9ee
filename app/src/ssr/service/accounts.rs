//! The Users and Account pages' server side: one engine call per operation, each written to the
//! audit log (`user.add`, `user.update`, `user.set_password`, `token.create`, `token.revoke`) with
//! the acting user as actor and the client address as source.

use dedup_engine::console::accounts::passwords::{self, hash_password};
use dedup_engine::console::accounts::tokens::{self, ApiToken};
use dedup_engine::console::accounts::users::UserChange;
use dedup_engine::console::accounts::{AccountError, Role, User, UserName};
use dedup_engine::console::audit::{AuditOutcome, NewAuditEntry};
use serde_json::json;

use super::auth::RequestAuth;
use super::convert::time;
use super::state::ConsoleState;
use crate::error::ConsoleError;
use crate::wire::account::{CurrentUser, NewTokenView, RoleView, TokenView, UserView};

/// A role name from a form.
///
/// # Errors
/// [`ConsoleError::BadRequest`] naming the accepted roles.
pub fn parse_role(role: &str) -> Result<RoleView, ConsoleError> {
    RoleView::parse(role)
        .ok_or_else(|| ConsoleError::BadRequest(format!("unknown role {role:?}: use viewer, operator or admin")))
}

/// The engine's role of a wire role.
pub fn role(r: RoleView) -> Role {
    match r {
        RoleView::Viewer => Role::Viewer,
        RoleView::Operator => Role::Operator,
        RoleView::Admin => Role::Admin,
    }
}

/// The wire role of an engine role.
pub fn role_view(r: Role) -> RoleView {
    match r {
        Role::Viewer => RoleView::Viewer,
        Role::Operator => RoleView::Operator,
        Role::Admin => RoleView::Admin,
    }
}

/// The signed-in user as the browser sees it.
pub fn current_user(u: &User) -> CurrentUser {
    CurrentUser { id: u.id, name: u.name.clone(), role: role_view(u.role) }
}

fn user_view(u: User) -> UserView {
    UserView {
        id: u.id,
        name: u.name,
        role: role_view(u.role),
        disabled: u.disabled,
        created_at: time(u.created_at),
        last_login_at: u.last_login_at.map(time),
    }
}

fn token_view(t: ApiToken) -> TokenView {
    TokenView {
        id: t.id,
        name: t.name,
        prefix: t.prefix,
        created_at: time(t.created_at),
        last_used_at: t.last_used_at.map(time),
        revoked_at: t.revoked_at.map(time),
    }
}

/// Writes an account event to the audit log: `ok` for a success, `refused` for invalid input or a
/// guard, `failed` for an error. A failed audit write is logged, not returned: the change is
/// already made.
async fn audit<T>(
    state: &ConsoleState,
    auth: &RequestAuth,
    action: &str,
    detail: serde_json::Value,
    result: &Result<T, AccountError>,
) {
    let outcome = match result {
        Ok(_) => AuditOutcome::Ok,
        Err(AccountError::Unexpected(_)) => AuditOutcome::Failed,
        Err(_) => AuditOutcome::Refused,
    };
    let entry = NewAuditEntry {
        actor: &auth.actor(),
        action,
        outcome,
        reason: None,
        consumer_group: None,
        message_ids: &[],
        detail,
        source: auth.source.as_deref(),
    };
    if let Err(e) = state.store().record(&entry).await {
        tracing::error!(error = %e, action, "writing the audit log failed");
    }
}

/// Every user, by name.
pub async fn list_users(state: &ConsoleState) -> Result<Vec<UserView>, ConsoleError> {
    Ok(state.store().user_list().await?.into_iter().map(user_view).collect())
}

/// Adds a user (`user.add`).
pub async fn add_user(
    state: &ConsoleState,
    auth: &RequestAuth,
    name: &str,
    role_name: RoleView,
    password: String,
) -> Result<UserView, ConsoleError> {
    let result = async {
        let name = UserName::parse(name)?;
        let hash = passwords::blocking(move || hash_password(&password)).await??;
        state.store().user_add(&name, role(role_name), &hash).await
    }
    .await;
    audit(state, auth, "user.add", json!({ "user": name, "role": role_name.as_str() }), &result).await;
    Ok(user_view(result?))
}

/// Changes a user's role or enabled state (`user.update`); refuses to leave no enabled admin.
pub async fn update_user(
    state: &ConsoleState,
    auth: &RequestAuth,
    id: i64,
    new_role: Option<RoleView>,
    disabled: Option<bool>,
) -> Result<UserView, ConsoleError> {
    let change = UserChange { role: new_role.map(role), disabled };
    let result = state.store().user_update(id, change).await;
    let detail = json!({
        "user_id": id,
        "user": result.as_ref().ok().map(|u| u.name.clone()),
        "role": new_role.map(RoleView::as_str),
        "disabled": disabled,
    });
    audit(state, auth, "user.update", detail, &result).await;
    Ok(user_view(result?))
}

/// Sets a user's password (`user.set_password`): an admin resetting it.
pub async fn reset_password(
    state: &ConsoleState,
    auth: &RequestAuth,
    name: &str,
    password: String,
) -> Result<(), ConsoleError> {
    let result = async {
        let hash = passwords::blocking(move || hash_password(&password)).await??;
        state.store().user_set_password(name, &hash).await
    }
    .await;
    audit(state, auth, "user.set_password", json!({ "user": name }), &result).await;
    result?;
    Ok(())
}

/// The signed-in user's API tokens.
pub async fn list_tokens(state: &ConsoleState, user: &CurrentUser) -> Result<Vec<TokenView>, ConsoleError> {
    Ok(state.store().token_list(user.id).await?.into_iter().map(token_view).collect())
}

/// Creates an API token for the signed-in user (`token.create`); its secret is returned once.
pub async fn create_token(
    state: &ConsoleState,
    auth: &RequestAuth,
    user: &CurrentUser,
    name: &str,
) -> Result<NewTokenView, ConsoleError> {
    let result = tokens::token_create(state.store(), user.id, name).await;
    let detail = json!({ "name": name, "token_id": result.as_ref().ok().map(|(t, _)| t.id) });
    audit(state, auth, "token.create", detail, &result).await;
    let (token, secret) = result?;
    Ok(NewTokenView { token: token_view(token), secret })
}

/// Revokes one of the signed-in user's API tokens (`token.revoke`).
pub async fn revoke_token(
    state: &ConsoleState,
    auth: &RequestAuth,
    user: &CurrentUser,
    id: i64,
) -> Result<TokenView, ConsoleError> {
    let result = state.store().token_revoke(user.id, id).await;
    audit(state, auth, "token.revoke", json!({ "token_id": id }), &result).await;
    Ok(token_view(result?))
}
