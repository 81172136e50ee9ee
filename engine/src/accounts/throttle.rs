//! Login throttling: failed sign-ins counted per key (`account:<lower name>`,
//! `address:<client ip>`) in the `login_failures` table, so every server instance sees the same
//! counts. A key with `limit` failures inside its window is refused until the window ends;
//! a successful sign-in clears its account key.

use std::time::Duration;

use sqlx::PgExecutor;

use super::AccountError;

/// The throttle key of an account name.
pub fn account_key(name: &str) -> String {
    format!("account:{}", name.trim().to_lowercase())
}

/// The throttle key of a client address.
pub fn address_key(address: &str) -> String {
    format!("address:{address}")
}

/// Seconds until the first of `keys` over its limit is let through again; `None` when none is
/// throttled. `limits` pairs each key with its limit.
///
/// # Errors
/// The database error.
pub async fn throttle_check<'e>(
    db: impl PgExecutor<'e>,
    limits: &[(String, u32)],
    window: Duration,
) -> Result<Option<u64>, AccountError> {
    let keys: Vec<&str> = limits.iter().map(|(k, _)| k.as_str()).collect();
    let max: Vec<i32> = limits.iter().map(|(_, l)| i32::try_from(*l).unwrap_or(i32::MAX)).collect();
    let wait: Option<f64> = sqlx::query_scalar(
        "SELECT max(extract(epoch FROM f.window_start + make_interval(secs => $3) - now()))::float8
         FROM login_failures f JOIN unnest($1::text[], $2::int[]) AS l(key, max_failures) USING (key)
         WHERE f.failures >= l.max_failures AND f.window_start + make_interval(secs => $3) > now()",
    )
    .bind(&keys)
    .bind(&max)
    .bind(window.as_secs_f64())
    .fetch_one(db)
    .await?;
    Ok(wait.map(|s| s.ceil().max(1.0) as u64))
}

/// Counts one failure for each key (a key whose window has ended starts a new one).
///
/// # Errors
/// The database error.
pub async fn throttle_fail<'e>(db: impl PgExecutor<'e>, keys: &[String], window: Duration) -> Result<(), AccountError> {
    sqlx::query(
        "INSERT INTO login_failures AS f (key, failures, window_start) SELECT k, 1, now() FROM unnest($1::text[]) k
         ON CONFLICT (key) DO UPDATE SET
           failures = CASE WHEN f.window_start + make_interval(secs => $2) > now() THEN f.failures + 1 ELSE 1 END,
           window_start = CASE WHEN f.window_start + make_interval(secs => $2) > now() THEN f.window_start ELSE now() END",
    )
    .bind(keys)
    .bind(window.as_secs_f64())
    .execute(db)
    .await?;
    Ok(())
}

/// Forgets the failures of `key` (after a successful sign-in).
///
/// # Errors
/// The database error.
pub async fn throttle_clear<'e>(db: impl PgExecutor<'e>, key: &str) -> Result<(), AccountError> {
    sqlx::query("DELETE FROM login_failures WHERE key = $1").bind(key).execute(db).await?;
    Ok(())
}
