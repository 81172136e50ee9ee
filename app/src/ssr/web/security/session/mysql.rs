//! The console's sessions on MySQL and MariaDB (feature `mysql`): tower-sessions' `MySqlStore`,
//! table `session` in the engine's database.

use anyhow::Context;
use sqlx::mysql::MySqlPool;
use tower_sessions_sqlx_store::MySqlStore;

/// The store on `pool`, its table created in the database `schema` if missing. MySQL takes a
/// metadata lock for `CREATE TABLE IF NOT EXISTS`, so servers starting together need no lock of
/// their own.
///
/// # Errors
/// The database error of the store's migration.
pub(super) async fn store(pool: &MySqlPool, schema: &str) -> anyhow::Result<MySqlStore> {
    let store = MySqlStore::new(pool.clone()).with_schema_name(schema).map_err(|e| anyhow::anyhow!("{e}"))?;
    store.migrate().await.context("creating the session table")?;
    Ok(store)
}
