//! MySQL's accounts ([`AccountBooks`]): `users` (names unique by the stored `name_key`,
//! `LOWER(name)` as bytes), `api_tokens` and `login_failures` (migration
//! `20261205000005_accounts`). Without `RETURNING`, a write reads its row back by its key in
//! the same transaction, or by `LAST_INSERT_ID()`; times are the database's `UTC_TIMESTAMP(6)`.

use std::time::Duration;

use async_trait::async_trait;
use sqlx::mysql::MySqlPool;
use sqlx::{Executor, MySql, QueryBuilder};

use crate::accounts::AccountError;
use crate::accounts::books::{AccountBooks, CredentialRow, UserRow, is_user_name, throttle_window, wait_secs};
use crate::accounts::tokens::ApiToken;
use crate::accounts::users::{Role, User, UserChange, UserName};

const USER: &str = "id, name, role, disabled, created_at, last_login_at";
const TOKEN: &str = "id, user_id, name, prefix, created_at, last_used_at, revoked_at";
/// The `name_key` of a name given as a parameter.
const NAME_KEY: &str = "name_key = CAST(LOWER(?) AS BINARY)";
/// MySQL's and MariaDB's "duplicate entry" (ER_DUP_ENTRY).
const DUPLICATE_ENTRY: u16 = 1062;

/// The user matching `filter`, a condition with one parameter, `value`.
async fn user_where<'e, T>(
    db: impl Executor<'e, Database = MySql>,
    filter: &str,
    value: T,
) -> Result<Option<User>, AccountError>
where
    T: Send + for<'q> sqlx::Encode<'q, MySql> + sqlx::Type<MySql>,
{
    let row: Option<UserRow> =
        sqlx::query_as(&format!("SELECT {USER} FROM users WHERE {filter}")).bind(value).fetch_optional(db).await?;
    row.map(User::try_from).transpose()
}

#[async_trait]
impl AccountBooks for MySqlPool {
    async fn user_add(&self, name: &UserName, role: Role, password_hash: &str) -> Result<User, AccountError> {
        let inserted = sqlx::query(
            "INSERT INTO users (name, role, password_hash, created_at, updated_at)
             VALUES (?, ?, ?, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6))",
        )
        .bind(name.as_str())
        .bind(role.as_str())
        .bind(password_hash)
        .execute(self)
        .await;
        let id = match inserted {
            Err(sqlx::Error::Database(e))
                if e.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>().map(|e| e.number()) == Some(DUPLICATE_ENTRY) =>
            {
                return Err(AccountError::NameTaken(name.as_str().to_owned()));
            }
            other => other?.last_insert_id(),
        };
        let id = i64::try_from(id).map_err(|e| AccountError::Unexpected(e.into()))?;
        self.user_by_id(id).await?.ok_or_else(|| AccountError::NotFound(format!("user {id} is gone")))
    }

    async fn user_list(&self) -> Result<Vec<User>, AccountError> {
        let rows: Vec<UserRow> =
            sqlx::query_as(&format!("SELECT {USER} FROM users ORDER BY name_key")).fetch_all(self).await?;
        rows.into_iter().map(User::try_from).collect()
    }

    async fn user_by_id(&self, id: i64) -> Result<Option<User>, AccountError> {
        user_where(self, "id = ?", id).await
    }

    async fn user_credentials(&self, name: &str) -> Result<Option<(User, String)>, AccountError> {
        if !is_user_name(name) {
            return Ok(None);
        }
        let row: Option<CredentialRow> =
            sqlx::query_as(&format!("SELECT {USER}, password_hash FROM users WHERE {NAME_KEY}"))
                .bind(name)
                .fetch_optional(self)
                .await?;
        row.map(CredentialRow::into_pair).transpose()
    }

    async fn user_touch_login(&self, id: i64) -> Result<(), AccountError> {
        sqlx::query("UPDATE users SET last_login_at = UTC_TIMESTAMP(6) WHERE id = ?").bind(id).execute(self).await?;
        Ok(())
    }

    async fn user_set_password(&self, name: &str, password_hash: &str) -> Result<User, AccountError> {
        let mut tx = self.begin().await?;
        sqlx::query(&format!("UPDATE users SET password_hash = ?, updated_at = UTC_TIMESTAMP(6) WHERE {NAME_KEY}"))
            .bind(password_hash)
            .bind(name)
            .execute(&mut *tx)
            .await?;
        let user = user_where(&mut *tx, NAME_KEY, name).await?;
        tx.commit().await?;
        user.ok_or_else(|| AccountError::NotFound(format!("no user named {name:?}")))
    }

    async fn user_update(&self, id: i64, change: UserChange) -> Result<User, AccountError> {
        let mut tx = self.begin().await?;
        sqlx::query("SELECT id FROM users WHERE role = 'admin' AND NOT disabled FOR UPDATE").execute(&mut *tx).await?;
        sqlx::query(
            "UPDATE users SET role = COALESCE(?, role), disabled = COALESCE(?, disabled), updated_at = UTC_TIMESTAMP(6)
             WHERE id = ?",
        )
        .bind(change.role.map(Role::as_str))
        .bind(change.disabled)
        .bind(id)
        .execute(&mut *tx)
        .await?;
        let user = user_where(&mut *tx, "id = ?", id)
            .await?
            .ok_or_else(|| AccountError::NotFound(format!("no user with id {id}")))?;
        let admins: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM users WHERE role = 'admin' AND NOT disabled")
            .fetch_one(&mut *tx)
            .await?;
        if admins == 0 {
            return Err(AccountError::LastAdmin);
        }
        tx.commit().await?;
        Ok(user)
    }

    async fn token_insert(&self, user_id: i64, name: &str, prefix: &str, sha256: &[u8]) -> Result<ApiToken, AccountError> {
        let id = sqlx::query(
            "INSERT INTO api_tokens (user_id, name, prefix, token_sha256, created_at) VALUES (?, ?, ?, ?, UTC_TIMESTAMP(6))",
        )
        .bind(user_id)
        .bind(name)
        .bind(prefix)
        .bind(sha256)
        .execute(self)
        .await?
        .last_insert_id();
        Ok(sqlx::query_as(&format!("SELECT {TOKEN} FROM api_tokens WHERE id = ?")).bind(id).fetch_one(self).await?)
    }

    async fn token_list(&self, user_id: i64) -> Result<Vec<ApiToken>, AccountError> {
        Ok(sqlx::query_as(&format!("SELECT {TOKEN} FROM api_tokens WHERE user_id = ? ORDER BY id DESC"))
            .bind(user_id)
            .fetch_all(self)
            .await?)
    }

    async fn token_revoke(&self, user_id: i64, id: i64) -> Result<ApiToken, AccountError> {
        let mut tx = self.begin().await?;
        sqlx::query(
            "UPDATE api_tokens SET revoked_at = COALESCE(revoked_at, UTC_TIMESTAMP(6)) WHERE id = ? AND user_id = ?",
        )
        .bind(id)
        .bind(user_id)
        .execute(&mut *tx)
        .await?;
        let token: Option<ApiToken> =
            sqlx::query_as(&format!("SELECT {TOKEN} FROM api_tokens WHERE id = ? AND user_id = ?"))
                .bind(id)
                .bind(user_id)
                .fetch_optional(&mut *tx)
                .await?;
        tx.commit().await?;
        token.ok_or_else(|| AccountError::NotFound(format!("no token with id {id}")))
    }

    async fn token_owner(&self, sha256: &[u8]) -> Result<Option<i64>, AccountError> {
        let owner: Option<(i64, i64)> =
            sqlx::query_as("SELECT id, user_id FROM api_tokens WHERE token_sha256 = ? AND revoked_at IS NULL")
                .bind(sha256)
                .fetch_optional(self)
                .await?;
        let Some((id, user_id)) = owner else { return Ok(None) };
        sqlx::query(
            "UPDATE api_tokens SET last_used_at = UTC_TIMESTAMP(6)
             WHERE id = ? AND (last_used_at IS NULL OR last_used_at < UTC_TIMESTAMP(6) - INTERVAL 1 MINUTE)",
        )
        .bind(id)
        .execute(self)
        .await?;
        Ok(Some(user_id))
    }

    async fn throttle_check(&self, limits: &[(String, u32)], window: Duration) -> Result<Option<u64>, AccountError> {
        if limits.is_empty() {
            return Ok(None);
        }
        let window_us = micros(throttle_window(window));
        let mut q: QueryBuilder<'_, MySql> = QueryBuilder::new(
            "SELECT MAX(TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), window_start + INTERVAL ",
        );
        q.push_bind(window_us).push(" MICROSECOND)) FROM login_failures WHERE window_start + INTERVAL ");
        q.push_bind(window_us).push(" MICROSECOND > UTC_TIMESTAMP(6) AND (");
        let mut separated = q.separated(" OR ");
        for (key, limit) in limits {
            separated.push("(throttle_key = ").push_bind_unseparated(key.as_bytes());
            separated.push_unseparated(" AND failures >= ").push_bind_unseparated(i64::from(*limit)).push_unseparated(")");
        }
        q.push(")");
        let left_us: Option<i64> = q.build_query_scalar().fetch_one(self).await?;
        Ok(wait_secs(left_us.map(|us| us as f64 / 1e6)))
    }

    async fn throttle_fail(&self, keys: &[String], window: Duration) -> Result<(), AccountError> {
        if keys.is_empty() {
            return Ok(());
        }
        let mut sorted: Vec<&String> = keys.iter().collect();
        // One lock order for concurrent failures of the same keys.
        sorted.sort();
        sorted.dedup();
        let mut q: QueryBuilder<'_, MySql> = QueryBuilder::new("INSERT INTO login_failures (throttle_key, failures, window_start) ");
        q.push_values(sorted, |mut row, key| {
            row.push_bind(key.as_bytes()).push("1").push("UTC_TIMESTAMP(6)");
        });
        // Assignments run left to right: `failures` is judged on the old `window_start`, which
        // the second assignment then changes.
        let window_us = micros(throttle_window(window));
        q.push(" ON DUPLICATE KEY UPDATE failures = IF(window_start + INTERVAL ");
        q.push_bind(window_us).push(" MICROSECOND > UTC_TIMESTAMP(6), failures + 1, 1), window_start = IF(window_start + INTERVAL ");
        q.push_bind(window_us).push(" MICROSECOND > UTC_TIMESTAMP(6), window_start, UTC_TIMESTAMP(6))");
        q.build().execute(self).await?;
        Ok(())
    }

    async fn throttle_clear(&self, key: &str) -> Result<(), AccountError> {
        sqlx::query("DELETE FROM login_failures WHERE throttle_key = ?").bind(key.as_bytes()).execute(self).await?;
        Ok(())
    }
}

/// A duration in whole microseconds, as `INTERVAL … MICROSECOND` takes it.
fn micros(d: Duration) -> i64 {
    i64::try_from(d.as_micros()).unwrap_or(i64::MAX)
}
