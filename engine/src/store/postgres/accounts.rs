//! PostgreSQL's accounts ([`AccountBooks`]): `users` (names unique by `lower(name)`),
//! `api_tokens` and `login_failures` (migration `20261130000021_accounts`).

use std::time::Duration;

use async_trait::async_trait;
use sqlx::PgPool;

use crate::accounts::books::{AccountBooks, CredentialRow, UserRow, is_user_name, throttle_window, wait_secs};
use crate::accounts::tokens::ApiToken;
use crate::accounts::users::{Role, User, UserChange, UserName};
use crate::accounts::AccountError;

const USER: &str = "id, name, role, disabled, created_at, last_login_at";
const TOKEN: &str = "id, user_id, name, prefix, created_at, last_used_at, revoked_at";

#[async_trait]
impl AccountBooks for PgPool {
    async fn user_add(&self, name: &UserName, role: Role, password_hash: &str) -> Result<User, AccountError> {
        let row: Result<UserRow, sqlx::Error> =
            sqlx::query_as(&format!("INSERT INTO users (name, role, password_hash) VALUES ($1, $2, $3) RETURNING {USER}"))
                .bind(name.as_str())
                .bind(role.as_str())
                .bind(password_hash)
                .fetch_one(self)
                .await;
        match row {
            Err(e) if e.as_database_error().and_then(|d| d.constraint()) == Some("users_name_key") => {
                Err(AccountError::NameTaken(name.as_str().to_owned()))
            }
            other => other?.try_into(),
        }
    }

    async fn user_list(&self) -> Result<Vec<User>, AccountError> {
        let rows: Vec<UserRow> =
            sqlx::query_as(&format!("SELECT {USER} FROM users ORDER BY lower(name)")).fetch_all(self).await?;
        rows.into_iter().map(User::try_from).collect()
    }

    async fn user_by_id(&self, id: i64) -> Result<Option<User>, AccountError> {
        let row: Option<UserRow> =
            sqlx::query_as(&format!("SELECT {USER} FROM users WHERE id = $1")).bind(id).fetch_optional(self).await?;
        row.map(User::try_from).transpose()
    }

    async fn user_credentials(&self, name: &str) -> Result<Option<(User, String)>, AccountError> {
        if !is_user_name(name) {
            return Ok(None);
        }
        let row: Option<CredentialRow> =
            sqlx::query_as(&format!("SELECT {USER}, password_hash FROM users WHERE lower(name) = lower($1)"))
                .bind(name)
                .fetch_optional(self)
                .await?;
        row.map(CredentialRow::into_pair).transpose()
    }

    async fn user_touch_login(&self, id: i64) -> Result<(), AccountError> {
        sqlx::query("UPDATE users SET last_login_at = now() WHERE id = $1").bind(id).execute(self).await?;
        Ok(())
    }

    async fn user_set_password(&self, name: &str, password_hash: &str) -> Result<User, AccountError> {
        let row: Option<UserRow> = sqlx::query_as(&format!(
            "UPDATE users SET password_hash = $2, updated_at = now() WHERE lower(name) = lower($1) RETURNING {USER}"
        ))
        .bind(name)
        .bind(password_hash)
        .fetch_optional(self)
        .await?;
        row.ok_or_else(|| AccountError::NotFound(format!("no user named {name:?}")))?.try_into()
    }

    async fn user_update(&self, id: i64, change: UserChange) -> Result<User, AccountError> {
        let mut tx = self.begin().await?;
        sqlx::query("SELECT id FROM users WHERE role = 'admin' AND NOT disabled FOR UPDATE").execute(&mut *tx).await?;
        let row: Option<UserRow> = sqlx::query_as(&format!(
            "UPDATE users SET role = coalesce($2, role), disabled = coalesce($3, disabled), updated_at = now()
             WHERE id = $1 RETURNING {USER}"
        ))
        .bind(id)
        .bind(change.role.map(Role::as_str))
        .bind(change.disabled)
        .fetch_optional(&mut *tx)
        .await?;
        let user: User = row.ok_or_else(|| AccountError::NotFound(format!("no user with id {id}")))?.try_into()?;
        let admins: i64 = sqlx::query_scalar("SELECT count(*) FROM users WHERE role = 'admin' AND NOT disabled")
            .fetch_one(&mut *tx)
            .await?;
        if admins == 0 {
            return Err(AccountError::LastAdmin);
        }
        tx.commit().await?;
        Ok(user)
    }

    async fn token_insert(&self, user_id: i64, name: &str, prefix: &str, sha256: &[u8]) -> Result<ApiToken, AccountError> {
        Ok(sqlx::query_as(&format!(
            "INSERT INTO api_tokens (user_id, name, prefix, token_sha256) VALUES ($1, $2, $3, $4) RETURNING {TOKEN}"
        ))
        .bind(user_id)
        .bind(name)
        .bind(prefix)
        .bind(sha256)
        .fetch_one(self)
        .await?)
    }

    async fn token_list(&self, user_id: i64) -> Result<Vec<ApiToken>, AccountError> {
        Ok(sqlx::query_as(&format!("SELECT {TOKEN} FROM api_tokens WHERE user_id = $1 ORDER BY id DESC"))
            .bind(user_id)
            .fetch_all(self)
            .await?)
    }

    async fn token_revoke(&self, user_id: i64, id: i64) -> Result<ApiToken, AccountError> {
        let token: Option<ApiToken> = sqlx::query_as(&format!(
            "UPDATE api_tokens SET revoked_at = coalesce(revoked_at, now()) WHERE id = $1 AND user_id = $2
             RETURNING {TOKEN}"
        ))
        .bind(id)
        .bind(user_id)
        .fetch_optional(self)
        .await?;
        token.ok_or_else(|| AccountError::NotFound(format!("no token with id {id}")))
    }

    async fn token_owner(&self, sha256: &[u8]) -> Result<Option<i64>, AccountError> {
        Ok(sqlx::query_scalar(
            "UPDATE api_tokens SET last_used_at = CASE WHEN last_used_at IS NULL OR last_used_at < now() - interval '1 minute'
                                                       THEN now() ELSE last_used_at END
             WHERE token_sha256 = $1 AND revoked_at IS NULL RETURNING user_id",
        )
        .bind(sha256)
        .fetch_optional(self)
        .await?)
    }

    async fn throttle_check(&self, limits: &[(String, u32)], window: Duration) -> Result<Option<u64>, AccountError> {
        let keys: Vec<&str> = limits.iter().map(|(k, _)| k.as_str()).collect();
        let max: Vec<i32> = limits.iter().map(|(_, l)| i32::try_from(*l).unwrap_or(i32::MAX)).collect();
        let left: Option<f64> = sqlx::query_scalar(
            "SELECT max(extract(epoch FROM f.window_start + make_interval(secs => $3) - now()))::float8
             FROM login_failures f JOIN unnest($1::text[], $2::int[]) AS l(key, max_failures) USING (key)
             WHERE f.failures >= l.max_failures AND f.window_start + make_interval(secs => $3) > now()",
        )
        .bind(&keys)
        .bind(&max)
        .bind(throttle_window(window).as_secs_f64())
        .fetch_one(self)
        .await?;
        Ok(wait_secs(left))
    }

    async fn throttle_fail(&self, keys: &[String], window: Duration) -> Result<(), AccountError> {
        sqlx::query(
            "INSERT INTO login_failures AS f (key, failures, window_start) SELECT k, 1, now() FROM unnest($1::text[]) k
             ON CONFLICT (key) DO UPDATE SET
               failures = CASE WHEN f.window_start + make_interval(secs => $2) > now() THEN f.failures + 1 ELSE 1 END,
               window_start = CASE WHEN f.window_start + make_interval(secs => $2) > now() THEN f.window_start ELSE now() END",
        )
        .bind(keys)
        .bind(throttle_window(window).as_secs_f64())
        .execute(self)
        .await?;
        Ok(())
    }

    async fn throttle_clear(&self, key: &str) -> Result<(), AccountError> {
        sqlx::query("DELETE FROM login_failures WHERE key = $1").bind(key).execute(self).await?;
        Ok(())
    }
}
