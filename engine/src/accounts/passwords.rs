//! Password hashing with argon2id (PHC string form, the `argon2` crate's default parameters:
//! m = 19 MiB, t = 2, p = 1) and the password policy.

use std::sync::LazyLock;

use argon2::Argon2;
use argon2::password_hash::{PasswordHash, PasswordHasher, PasswordVerifier, SaltString};
use rand::RngCore;

use super::AccountError;

/// Shortest accepted password, in characters.
pub const MIN_PASSWORD_CHARS: usize = 10;
/// Longest accepted password, in bytes (bounds the hashing work an attacker can ask for).
pub const MAX_PASSWORD_BYTES: usize = 1024;

/// A hash of no one's password: verified against when a login names an unknown user, so that
/// unknown and known names take the same time.
static DUMMY_HASH: LazyLock<String> =
    LazyLock::new(|| hash_password("dummy password, never valid").unwrap_or_default());

/// Checks the policy: [`MIN_PASSWORD_CHARS`] to [`MAX_PASSWORD_BYTES`].
///
/// # Errors
/// [`AccountError::Invalid`] saying what is wrong.
pub fn check_policy(password: &str) -> Result<(), AccountError> {
    if password.chars().count() < MIN_PASSWORD_CHARS {
        return Err(AccountError::Invalid(format!("a password needs at least {MIN_PASSWORD_CHARS} characters")));
    }
    if password.len() > MAX_PASSWORD_BYTES {
        return Err(AccountError::Invalid(format!("a password may have at most {MAX_PASSWORD_BYTES} bytes")));
    }
    Ok(())
}

/// Hashes `password` (after checking it against the policy: at least 10 characters) with a fresh random salt; returns the PHC string.
///
/// # Errors
/// [`AccountError::Invalid`] from the policy; [`AccountError::Unexpected`] if hashing fails.
pub fn hash_password(password: &str) -> Result<String, AccountError> {
    check_policy(password)?;
    let mut salt = [0u8; 16];
    rand::rng().fill_bytes(&mut salt);
    let salt = SaltString::encode_b64(&salt)
        .map_err(|e| AccountError::Unexpected(anyhow::anyhow!("argon2 salt encoding failed: {e}")))?;
    Argon2::default()
        .hash_password(password.as_bytes(), &salt)
        .map(|h| h.to_string())
        .map_err(|e| AccountError::Unexpected(anyhow::anyhow!("argon2 hashing failed: {e}")))
}

/// Whether `password` matches the PHC string `hash`; `None` as the hash (unknown user) verifies
/// against a dummy hash and returns false, taking the same time.
pub fn verify_password(password: &str, hash: Option<&str>) -> bool {
    let known = hash.is_some();
    let hash = hash.unwrap_or(DUMMY_HASH.as_str());
    let Ok(parsed) = PasswordHash::new(hash) else {
        tracing::error!("a stored password hash does not parse");
        return false;
    };
    password.len() <= MAX_PASSWORD_BYTES
        && Argon2::default().verify_password(password.as_bytes(), &parsed).is_ok()
        && known
}

/// Runs a CPU-heavy hashing call off the async runtime's worker threads.
///
/// # Errors
/// [`AccountError::Unexpected`] if the blocking task panicked.
pub async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> Result<T, AccountError> {
    tokio::task::spawn_blocking(f).await.map_err(|e| AccountError::Unexpected(anyhow::anyhow!("hashing task: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hashes_are_argon2id_salted_and_verify() {
        let a = hash_password("correct horse battery").unwrap();
        let b = hash_password("correct horse battery").unwrap();
        assert!(a.starts_with("$argon2id$"), "{a}");
        assert_ne!(a, b, "salted");
        assert!(verify_password("correct horse battery", Some(&a)));
        assert!(!verify_password("wrong horse battery", Some(&a)));
        assert!(!verify_password("dummy password, never valid", None), "unknown users never verify");
    }

    #[test]
    fn the_policy_names_the_rule() {
        assert!(check_policy("short").unwrap_err().to_string().contains("at least 10"));
        assert!(check_policy(&"x".repeat(2000)).unwrap_err().to_string().contains("at most 1024"));
    }
}
