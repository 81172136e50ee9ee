//! [`NamedLock`] on PostgreSQL: a session advisory lock `(class, key)` taken by
//! `pg_try_advisory_lock(int, int)` on a connection of its own (closing it releases the lock,
//! also on a crash).

use async_trait::async_trait;
use sqlx::{Connection, PgConnection, PgPool};

use crate::actions::NamedLock;

/// The second half of the advisory lock of `id` (a job's or a schedule's): the ids fit an
/// `int` for two billion jobs or schedules; past that they share the last key.
pub(crate) fn lock_key(id: i64) -> i32 {
    i32::try_from(id).unwrap_or(i32::MAX)
}

/// Takes the advisory lock (`class`, [`lock_key`]`(id)`) without waiting; `None` when another
/// session holds it.
pub(crate) async fn try_lock(pool: &PgPool, class: i32, id: i64) -> Result<Option<Box<dyn NamedLock>>, sqlx::Error> {
    let mut conn = pool.acquire().await?.detach();
    let key = lock_key(id);
    let locked: bool =
        sqlx::query_scalar("SELECT pg_try_advisory_lock($1, $2)").bind(class).bind(key).fetch_one(&mut conn).await?;
    if !locked {
        let _ = conn.close().await;
        return Ok(None);
    }
    Ok(Some(Box::new(PgNamedLock { conn, class, key })))
}

/// A held advisory lock: the session of a connection of its own.
struct PgNamedLock {
    conn: PgConnection,
    class: i32,
    key: i32,
}

#[async_trait]
impl NamedLock for PgNamedLock {
    /// Its row in `pg_locks` for this backend (a two-`int` advisory lock has `objsubid` 2).
    async fn held(&mut self) -> bool {
        let held = sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM pg_locks
                            WHERE locktype = 'advisory' AND granted AND pid = pg_backend_pid()
                              AND classid = $1::bigint::oid AND objid = $2::bigint::oid AND objsubid = 2)",
        )
        .bind(i64::from(self.class))
        .bind(i64::from(self.key))
        .fetch_one(&mut self.conn)
        .await;
        held.unwrap_or(false)
    }

    async fn release(mut self: Box<Self>) {
        // Unlocked first: the server ends a closed session (and frees its locks) after `close`
        // returns, so another instance trying the lock at once could still find it held.
        let _ = sqlx::query("SELECT pg_advisory_unlock($1, $2)").bind(self.class).bind(self.key).execute(&mut self.conn).await;
        let _ = self.conn.close().await;
    }
}
