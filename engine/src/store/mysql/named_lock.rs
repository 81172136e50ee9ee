//! [`NamedLock`] on MySQL: `GET_LOCK` on a connection of its own (closing it releases the lock,
//! also on a crash), named by a prefix and a digest of the database's name and an id: two
//! engines' databases on one server do not share it, within MySQL 8's 64 characters.

use async_trait::async_trait;
use sqlx::mysql::MySqlPool;
use sqlx::{Connection, MySqlConnection};

use crate::actions::NamedLock;

/// The lock's name, SQL of two binds: the prefix (`requeue_job.`, `cleanup_schedule.`), then the
/// id.
pub(crate) const LOCK_NAME: &str = "CONCAT(?, LEFT(SHA2(CONCAT(DATABASE(), '.', ?), 256), 40))";

/// Takes the lock of `prefix` and `id` without waiting; `None` when another session holds it.
pub(crate) async fn try_lock(
    pool: &MySqlPool,
    prefix: &'static str,
    id: i64,
) -> Result<Option<Box<dyn NamedLock>>, sqlx::Error> {
    let mut conn: MySqlConnection = pool.acquire().await?.detach();
    let taken: Option<i64> = sqlx::query_scalar(&format!("SELECT GET_LOCK({LOCK_NAME}, 0)"))
        .bind(prefix)
        .bind(id)
        .fetch_one(&mut conn)
        .await?;
    if taken != Some(1) {
        let _ = conn.close().await;
        return Ok(None);
    }
    Ok(Some(Box::new(MySqlNamedLock { conn, prefix, id })))
}

/// A held `GET_LOCK`, by a connection of its own.
struct MySqlNamedLock {
    conn: MySqlConnection,
    prefix: &'static str,
    id: i64,
}

#[async_trait]
impl NamedLock for MySqlNamedLock {
    /// `IS_USED_LOCK(name) <=> CONNECTION_ID()`: held by this very session.
    async fn held(&mut self) -> bool {
        let sql = format!("SELECT IS_USED_LOCK({LOCK_NAME}) <=> CONNECTION_ID()");
        let held: Result<bool, _> =
            sqlx::query_scalar(&sql).bind(self.prefix).bind(self.id).fetch_one(&mut self.conn).await;
        held.unwrap_or(false)
    }

    async fn release(mut self: Box<Self>) {
        // Closing the connection releases the lock as well; released first, so that a close
        // that fails leaves no one waiting.
        let _ = sqlx::query(&format!("SELECT RELEASE_LOCK({LOCK_NAME})"))
            .bind(self.prefix)
            .bind(self.id)
            .execute(&mut self.conn)
            .await;
        let _ = self.conn.close().await;
    }
}
