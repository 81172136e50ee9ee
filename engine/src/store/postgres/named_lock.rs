//! [`NamedLock`] on PostgreSQL: a session advisory lock `(class, key)` taken by
//! `pg_try_advisory_lock(int, int)` on a connection of its own (closing it releases the lock,
//! also on a crash).

use std::time::Duration;

use async_trait::async_trait;
use sqlx::{Connection, PgConnection, PgPool};

use crate::actions::NamedLock;
use crate::store::DbErrorKind;

/// The class of the locks named by text ([`lock_named`]): their key is `hashtext(name)`.
const NAMED_LOCK_CLASS: i32 = 0x4e4d_4c4b; // "NMLK"

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

/// Takes the advisory lock (`NAMED_LOCK_CLASS`, `hashtext(name)`), waiting at most `wait`
/// (`lock_timeout`); `None` when another session held it all that time.
pub(crate) async fn lock_named(
    pool: &PgPool,
    name: &str,
    wait: Duration,
) -> Result<Option<Box<dyn NamedLock>>, sqlx::Error> {
    let mut conn = pool.acquire().await?.detach();
    // At least a millisecond: a `lock_timeout` of 0 waits for ever. The pool's
    // `statement_timeout` (the server's engine pool has 30 s) would cancel the wait first, with
    // an error rather than `None`: off on this connection of its own, `lock_timeout` bounds it.
    // The key and both settings in one round trip.
    let timeout = format!("{}ms", wait.as_millis().max(1));
    let key: i32 = sqlx::query_scalar(
        "SELECT hashtext($1) FROM (SELECT set_config('lock_timeout', $2, false), set_config('statement_timeout', '0', false)) s",
    )
    .bind(name)
    .bind(timeout)
    .fetch_one(&mut conn)
    .await?;
    let locked = sqlx::query("SELECT pg_advisory_lock($1, $2)").bind(NAMED_LOCK_CLASS).bind(key).execute(&mut conn).await;
    match locked {
        Ok(_) => Ok(Some(Box::new(PgNamedLock { conn, class: NAMED_LOCK_CLASS, key }))),
        Err(e) if DbErrorKind::of(&e) == DbErrorKind::LockWaitTimeout => {
            let _ = conn.close().await;
            Ok(None)
        }
        Err(e) => Err(e),
    }
}

/// A held advisory lock: the session of a connection of its own.
struct PgNamedLock {
    conn: PgConnection,
    class: i32,
    key: i32,
}

#[async_trait]
impl NamedLock for PgNamedLock {
    /// Its row in `pg_locks` for this backend (a two-`int` advisory lock has `objsubid` 2, and
    /// its `int`s as `oid`s: their bits unsigned, so a negative `hashtext` key is read right).
    async fn held(&mut self) -> bool {
        let held = sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM pg_locks
                            WHERE locktype = 'advisory' AND granted AND pid = pg_backend_pid()
                              AND classid = $1::bigint::oid AND objid = $2::bigint::oid AND objsubid = 2)",
        )
        .bind(i64::from(u32::from_ne_bytes(self.class.to_ne_bytes())))
        .bind(i64::from(u32::from_ne_bytes(self.key.to_ne_bytes())))
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
