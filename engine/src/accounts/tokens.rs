//! Per-user API tokens (`api_tokens`, kept by [`AccountBooks`]): random, shown once, stored as SHA-256, revocable.
//!
//! A token reads `dct_<43 base64url characters>` (32 random bytes). It acts with its owner's
//! current role; disabling the owner stops it too.

use chrono::{DateTime, Utc};
use rand::RngCore;
use serde::Serialize;
use sha2::{Digest, Sha256};
use sqlx::FromRow;

use super::AccountError;
use super::books::AccountBooks;
use super::users::User;

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
pub async fn token_create(
    books: &dyn AccountBooks,
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
    let token = books.token_insert(user_id, name, &secret[..TOKEN_PREFIX.len() + 6], &digest(&secret)).await?;
    Ok((token, secret))
}

/// The enabled user a presented token belongs to, if the token is known and not revoked.
///
/// # Errors
/// The database error.
pub async fn token_authenticate(books: &dyn AccountBooks, secret: &str) -> Result<Option<User>, AccountError> {
    if !secret.starts_with(TOKEN_PREFIX) || secret.len() > 128 {
        return Ok(None);
    }
    let Some(user_id) = books.token_owner(&digest(secret)).await? else { return Ok(None) };
    Ok(books.user_by_id(user_id).await?.filter(|u| !u.disabled))
}
