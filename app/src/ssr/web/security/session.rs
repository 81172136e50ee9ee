//! Sessions of the console's own accounts: tower-sessions with its sqlx store of the engine's
//! database ([`SessionBooks`]: table `session` in the engine's schema on PostgreSQL, in the
//! engine's database on MySQL, created at start-up by the store's own migration; each
//! database's in its module, `session/<database>.rs`).
//!
//! The cookie `dedup_session` is `HttpOnly`, `SameSite=Strict`, `Secure` with
//! `auth.secure_cookies`, scoped to the console's base path, and holds only the random session
//! id. A session expires after
//! `auth.idle_timeout_secs` without requests (the store's expiry, pushed forward by every
//! request; at most the absolute timeout and a year) and `auth.absolute_timeout_secs` after sign-in (checked by [`current`]). Signing in
//! rotates the id ([`start`]), so an id planted before sign-in is useless after it.

#[cfg(feature = "mysql")]
mod mysql;
mod postgres;

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use async_trait::async_trait;
use dedup_engine::EnginePool;
use serde::{Deserialize, Serialize};
use tower_sessions::cookie::SameSite;
use tower_sessions::cookie::time;
use tower_sessions::session::{Id, Record};
use tower_sessions::session_store::SessionStore;
use tower_sessions::{Expiry, Session, SessionManagerLayer};
#[cfg(feature = "mysql")]
use tower_sessions_sqlx_store::MySqlStore;
use tower_sessions_sqlx_store::PostgresStore;

use crate::base::ConsoleBase;

use crate::ssr::web::config::AuthSettings;

/// The session cookie's name.
pub const COOKIE_NAME: &str = "dedup_session";
/// How often expired sessions are deleted from the store.
pub const CLEANUP_PERIOD: Duration = Duration::from_secs(3600);
const KEY: &str = "auth";

/// The signed-in state a session holds.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SessionAuth {
    /// The user.
    pub user_id: i64,
    /// The token state-changing requests of this session must carry (header `x-csrf-token` or
    /// form field `csrf_token`).
    pub csrf_token: String,
    /// Sign-in time, Unix seconds with milliseconds as the fraction (for the absolute expiry;
    /// whole seconds would end a session up to a second early). Sessions signed in before it
    /// had a fraction hold whole seconds, which read the same.
    pub login_at: f64,
}

/// The sessions' store on the engine's database: tower-sessions' sqlx store of that database
/// (`session/<database>.rs`).
#[derive(Debug, Clone)]
pub struct SessionBooks(Arc<dyn DatabaseSessions>);

/// A database's session store: tower-sessions' [`SessionStore`] that creates its table and
/// deletes its expired sessions (its own migration and [`ExpiredDeletion`](tower_sessions::session_store::ExpiredDeletion), which cannot be a
/// trait object itself), implemented in the database's module.
#[async_trait]
trait DatabaseSessions: SessionStore {
    /// Creates the session table unless it exists.
    async fn create_table(&self) -> Result<(), dedup_engine::sqlx::Error>;

    /// Deletes the expired sessions.
    async fn delete_expired(&self) -> tower_sessions::session_store::Result<()>;
}

/// The engine's named lock ([`EnginePool::while_locked`]) serialising the session table's
/// creation across servers starting together (`CREATE TABLE IF NOT EXISTS` run concurrently can
/// still collide in PostgreSQL's catalog).
const TABLE_LOCK: &str = "dedup_console.session_table";

/// Longest wait for another server creating the session table.
const TABLE_LOCK_WAIT: Duration = Duration::from_secs(300);

/// The session store of `pool`'s database, its table in `schema` (not created yet).
///
/// Errors: a database without a session store here; a schema tower-sessions refuses.
fn database_sessions(pool: &EnginePool, schema: &str) -> anyhow::Result<Arc<dyn DatabaseSessions>> {
    if let Some(pool) = pool.postgres() {
        return Ok(Arc::new(PostgresStore::new(pool.clone()).with_schema_name(schema).map_err(anyhow::Error::msg)?));
    }
    #[cfg(feature = "mysql")]
    if let Some(pool) = pool.mysql() {
        return Ok(Arc::new(MySqlStore::new(pool.clone()).with_schema_name(schema).map_err(anyhow::Error::msg)?));
    }
    anyhow::bail!("no session store on {}", pool.database())
}

/// The store on `pool`'s database, its table created in `schema` if missing, under the
/// engine's named lock `TABLE_LOCK` so that servers starting together do not race.
///
/// # Errors
/// The database error of the lock or the store's migration; the lock held by another server
/// for 300 s; a database without a session store.
pub async fn store(pool: &EnginePool, schema: &str) -> anyhow::Result<SessionBooks> {
    let sessions = database_sessions(pool, schema)?;
    pool.while_locked(TABLE_LOCK, TABLE_LOCK_WAIT, sessions.create_table())
        .await
        .context("locking the session table's creation")?
        .context("another server held the session table's lock for 300 s")?
        .context("creating the session table")?;
    Ok(SessionBooks(sessions))
}

#[async_trait]
impl SessionStore for SessionBooks {
    async fn create(&self, record: &mut Record) -> tower_sessions::session_store::Result<()> {
        self.0.create(record).await
    }

    async fn save(&self, record: &Record) -> tower_sessions::session_store::Result<()> {
        self.0.save(record).await
    }

    async fn load(&self, id: &Id) -> tower_sessions::session_store::Result<Option<Record>> {
        self.0.load(id).await
    }

    async fn delete(&self, id: &Id) -> tower_sessions::session_store::Result<()> {
        self.0.delete(id).await
    }
}

/// Deletes expired sessions every [`CLEANUP_PERIOD`], for ever (the console aborts it when it
/// is dropped); a failure is logged and the deletion tried again a period later.
pub async fn delete_expired(store: SessionBooks) {
    let mut ticker = tokio::time::interval(CLEANUP_PERIOD);
    loop {
        ticker.tick().await;
        if let Err(e) = store.0.delete_expired().await {
            tracing::warn!(error = %e, "deleting expired sessions failed; trying again later");
        }
    }
}

/// Longest idle expiry a session is stored with: a year. A session cannot outlive
/// `auth.absolute_timeout_secs` either, and MySQL's session table keeps the expiry in a
/// `TIMESTAMP`, which ends in 2038: a longer one would end every session at once.
pub const MAX_IDLE_SECS: u64 = 365 * 24 * 3600;

/// The idle expiry sessions are stored with: `auth.idle_timeout_secs`, at most
/// `auth.absolute_timeout_secs` and [`MAX_IDLE_SECS`].
fn idle_expiry(settings: &AuthSettings) -> time::Duration {
    let secs = settings.idle_timeout_secs.min(settings.absolute_timeout_secs).min(MAX_IDLE_SECS);
    time::Duration::seconds(secs as i64)
}

/// The session layer with the cookie and expiry settings described in the module docs.
pub fn layer(store: SessionBooks, settings: &AuthSettings, base: &ConsoleBase) -> SessionManagerLayer<SessionBooks> {
    let idle = idle_expiry(settings);
    let path = if base.as_str().is_empty() { "/".to_owned() } else { base.as_str().to_owned() };
    SessionManagerLayer::new(store)
        .with_name(COOKIE_NAME)
        .with_http_only(true)
        .with_same_site(SameSite::Strict)
        .with_secure(settings.secure_cookies)
        .with_path(path)
        .with_expiry(Expiry::OnInactivity(idle))
        // Saving on every request pushes the idle expiry forward (empty sessions are not saved).
        .with_always_save(true)
}

/// Signs `user_id` in on this session: a new session id (against fixation) and a new CSRF token.
///
/// # Errors
/// The store's error.
pub async fn start(session: &Session, user_id: i64) -> Result<SessionAuth, tower_sessions::session::Error> {
    session.cycle_id().await?;
    let auth =
        SessionAuth { user_id, csrf_token: uuid::Uuid::new_v4().simple().to_string(), login_at: unix_seconds_now() };
    session.insert(KEY, &auth).await?;
    Ok(auth)
}

/// The signed-in state of this session; a session past the absolute expiry is ended and gives
/// `None`.
///
/// # Errors
/// The store's error.
pub async fn current(
    session: &Session,
    settings: &AuthSettings,
) -> Result<Option<SessionAuth>, tower_sessions::session::Error> {
    let Some(auth) = session.get::<SessionAuth>(KEY).await? else { return Ok(None) };
    let age = unix_seconds_now() - auth.login_at;
    if !(-CLOCK_SKEW_SECS..settings.absolute_timeout_secs as f64).contains(&age) {
        session.flush().await?;
        return Ok(None);
    }
    Ok(Some(auth))
}

/// How far another server's clock may be ahead of this one's before a session it signed in
/// looks signed in in the future and is ended.
const CLOCK_SKEW_SECS: f64 = 1.0;

/// Now, in Unix seconds with milliseconds as the fraction.
fn unix_seconds_now() -> f64 {
    chrono::Utc::now().timestamp_millis() as f64 / 1000.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_idle_expiry_is_bounded_by_the_absolute_timeout_and_a_year() {
        let with = |idle, absolute| AuthSettings {
            idle_timeout_secs: idle,
            absolute_timeout_secs: absolute,
            ..AuthSettings::default()
        };
        assert_eq!(idle_expiry(&with(1800, 43_200)), time::Duration::seconds(1800));
        assert_eq!(idle_expiry(&with(86_400, 43_200)), time::Duration::seconds(43_200));
        assert_eq!(idle_expiry(&with(u64::MAX, u64::MAX)), time::Duration::seconds(MAX_IDLE_SECS as i64));
    }
}
