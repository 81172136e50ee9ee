//! Per-user API tokens (`api_tokens`): random, shown once, stored as SHA-256, revocable.
//!
//! A token reads `dct_<43 base64url characters>` (32 random bytes). It acts with its owner's
//! current role; disabling the owner stops it too.

use chrono::{DateTime, Utc};
use rand::RngCore;
use serde::Serialize;
use sha2::{Digest, Sha256};
use sqlx::{FromRow, PgExecutor};

use super::AccountError;
use super::users::{User, user_by_id};

/// What every token starts with (lets secret scanners recognise leaked tokens).
pub const TOKEN_PREFIX: &str = "dct_";
/// Longest token name.
pub const MAX_TOKEN_NAME_CHARS: usize = 64;

/// A token as listed (never the secret).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, FromRow)]
pub struct ApiToken {
    /// Row id.
    pub id: i64,
    /// The owner's user id.
    pub user_id: i64,
    /// What the owner calls it.
    pub name: String,
    /// The token's first characters.
    pub prefix: String,
    /// Creation time.
    pub created_at: DateTime<Utc>,
    /// Last use (updated at most once a minute).
    pub last_used_at: Option<DateTime<Utc>>,
    /// Revocation time; a revoked token no longer authenticates.
    pub revoked_at: Option<DateTime<Utc>>,
}

const COLUMNS: &str = "id, user_id, name, prefix, created_at, last_used_at, revoked_at";

fn digest(secret: &str) -> Vec<u8> {
    Sha256::digest(secret.as_bytes()).to_vec()
}

fn new_secret() -> String {
    use base64::Engine as _;
    let mut bytes = [0u8; 32];
    rand::rng().fill_bytes(&mut bytes);
    format!("{TOKEN_PREFIX}{}", base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes))
}

/// Creates a token named `name` for `user_id`; returns it and the secret (shown once).
///
/// # Errors
/// [`AccountError::Invalid`] for an empty or too long name; the database error.
pub async fn token_create<'e>(
    db: impl PgExecutor<'e>,
    user_id: i64,
    name: &str,
) -> Result<(ApiToken, String), AccountError> {
    let name = name.trim();
    if name.is_empty() || name.chars().count() > MAX_TOKEN_NAME_CHARS || name.chars().any(char::is_control) {
        return Err(AccountError::Invalid(format!(
            "a token name has 1 to {MAX_TOKEN_NAME_CHARS} characters and no control characters"
        )));
    }
    let secret = new_secret();
    let token: ApiToken = sqlx::query_as(&format!(
        "INSERT INTO api_tokens (user_id, name, prefix, token_sha256) VALUES ($1, $2, $3, $4) RETURNING {COLUMNS}"
    ))
    .bind(user_id)
    .bind(name)
    .bind(&secret[..TOKEN_PREFIX.len() + 6])
    .bind(digest(&secret))
    .fetch_one(db)
    .await?;
    Ok((token, secret))
}

/// The tokens of `user_id`, newest first, revoked ones included.
///
/// # Errors
/// The database error.
pub async fn token_list<'e>(db: impl PgExecutor<'e>, user_id: i64) -> Result<Vec<ApiToken>, AccountError> {
    Ok(sqlx::query_as(&format!("SELECT {COLUMNS} FROM api_tokens WHERE user_id = $1 ORDER BY id DESC"))
        .bind(user_id)
        .fetch_all(db)
        .await?)
}

/// Revokes token `id` of `user_id` (a no-op on an already revoked one); returns it.
///
/// # Errors
/// [`AccountError::NotFound`] when `user_id` has no such token; the database error.
pub async fn token_revoke<'e>(db: impl PgExecutor<'e>, user_id: i64, id: i64) -> Result<ApiToken, AccountError> {
    let token: Option<ApiToken> = sqlx::query_as(&format!(
        "UPDATE api_tokens SET revoked_at = coalesce(revoked_at, now()) WHERE id = $1 AND user_id = $2
         RETURNING {COLUMNS}"
    ))
    .bind(id)
    .bind(user_id)
    .fetch_optional(db)
    .await?;
    token.ok_or_else(|| AccountError::NotFound(format!("no token with id {id}")))
}

/// The enabled user a presented token belongs to, if the token is known and not revoked.
///
/// # Errors
/// The database error.
pub async fn token_authenticate(db: &sqlx::PgPool, secret: &str) -> Result<Option<User>, AccountError> {
    if !secret.starts_with(TOKEN_PREFIX) || secret.len() > 128 {
        return Ok(None);
    }
    let user_id: Option<i64> = sqlx::query_scalar(
        "UPDATE api_tokens SET last_used_at = CASE WHEN last_used_at IS NULL OR last_used_at < now() - interval '1 minute'
                                                   THEN now() ELSE last_used_at END
         WHERE token_sha256 = $1 AND revoked_at IS NULL RETURNING user_id",
    )
    .bind(digest(secret))
    .fetch_optional(db)
    .await?;
    let Some(user_id) = user_id else { return Ok(None) };
    Ok(user_by_id(db, user_id).await?.filter(|u| !u.disabled))
}
