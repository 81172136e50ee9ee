//! [`NamedLock`] on MySQL: `GET_LOCK` on a connection of its own (closing it releases the lock,
//! also on a crash), named by a prefix and a digest of the database's name and an id: two
//! engines' databases on one server do not share it, within MySQL 8's 64 characters.

use std::time::Duration;

use async_trait::async_trait;
use sqlx::mysql::MySqlPool;
use sqlx::{Connection, MySqlConnection};

use crate::actions::NamedLock;

/// The lock's name, SQL of two binds: the prefix (`requeue_job.`, `cleanup_schedule.`,
/// [`NAMED_PREFIX`]), then the id (or name).
pub(crate) const LOCK_NAME: &str = "CONCAT(?, LEFT(SHA2(CONCAT(COALESCE(DATABASE(), ''), '.', ?), 256), 40))";

/// The prefix of the locks named by text ([`lock_named`]).
const NAMED_PREFIX: &str = "named.";

/// Takes the lock of `prefix` and `id` without waiting; `None` when another session holds it.
pub(crate) async fn try_lock(
    pool: &MySqlPool,
    prefix: &'static str,
    id: i64,
) -> Result<Option<Box<dyn NamedLock>>, sqlx::Error> {
    take(pool, prefix, id.to_string(), 0).await
}

/// Takes the lock of `name` ([`NAMED_PREFIX`]), waiting at most `wait` (in whole seconds, rounded
/// up); `None` when another session held it all that time.
pub(crate) async fn lock_named(
    pool: &MySqlPool,
    name: &str,
    wait: Duration,
) -> Result<Option<Box<dyn NamedLock>>, sqlx::Error> {
    let seconds = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
    take(pool, NAMED_PREFIX, name.to_owned(), seconds).await
}

/// Takes the lock of `prefix` and `key` (an id as decimal digits, or a name), waiting at most
/// `seconds`.
async fn take(
    pool: &MySqlPool,
    prefix: &'static str,
    key: String,
    seconds: u64,
) -> Result<Option<Box<dyn NamedLock>>, sqlx::Error> {
    let mut conn: MySqlConnection = pool.acquire().await?.detach();
    let taken: Option<i64> = sqlx::query_scalar(&format!("SELECT GET_LOCK({LOCK_NAME}, ?)"))
        .bind(prefix)
        .bind(&key)
        .bind(seconds)
        .fetch_one(&mut conn)
        .await?;
    if taken != Some(1) {
        let _ = conn.close().await;
        return Ok(None);
    }
    Ok(Some(Box::new(MySqlNamedLock { conn, prefix, key })))
}

/// A held `GET_LOCK`, by a connection of its own.
struct MySqlNamedLock {
    conn: MySqlConnection,
    prefix: &'static str,
    key: String,
}

#[async_trait]
impl NamedLock for MySqlNamedLock {
    /// `IS_USED_LOCK(name) <=> CONNECTION_ID()`: held by this very session.
    async fn held(&mut self) -> bool {
        let sql = format!("SELECT IS_USED_LOCK({LOCK_NAME}) <=> CONNECTION_ID()");
        let held: Result<bool, _> =
            sqlx::query_scalar(&sql).bind(self.prefix).bind(&self.key).fetch_one(&mut self.conn).await;
        held.unwrap_or(false)
    }

    async fn release(mut self: Box<Self>) {
        // Closing the connection releases the lock as well; released first, so that a close
        // that fails leaves no one waiting.
        let _ = sqlx::query(&format!("SELECT RELEASE_LOCK({LOCK_NAME})"))
            .bind(self.prefix)
            .bind(&self.key)
            .execute(&mut self.conn)
            .await;
        let _ = self.conn.close().await;
    }
}
