//! The console's sessions on PostgreSQL: tower-sessions' `PostgresStore`, table `session` in the
//! engine's schema.

use anyhow::Context;
use sqlx::PgPool;
use tower_sessions_sqlx_store::PostgresStore;

/// Advisory-lock key serialising the session store's migration across server instances
/// (`CREATE TABLE IF NOT EXISTS` run concurrently can still collide in PostgreSQL's catalog).
const MIGRATE_LOCK: i64 = 0x6465_6475_7073_6573; // "dedupses"

/// The store on `pool`, its table created in `schema` if missing, under an advisory lock so
/// servers starting together do not race.
///
/// # Errors
/// The database error of the lock or the store's migration.
pub(super) async fn store(pool: &PgPool, schema: &str) -> anyhow::Result<PostgresStore> {
    let store = PostgresStore::new(pool.clone()).with_schema_name(schema).map_err(|e| anyhow::anyhow!("{e}"))?;
    let mut lock = pool.acquire().await.context("locking the session table migration")?;
    sqlx::query("SELECT pg_advisory_lock($1)").bind(MIGRATE_LOCK).execute(&mut *lock).await?;
    let migrated = store.migrate().await.context("creating the session table");
    sqlx::query("SELECT pg_advisory_unlock($1)").bind(MIGRATE_LOCK).execute(&mut *lock).await?;
    migrated?;
    Ok(store)
}
