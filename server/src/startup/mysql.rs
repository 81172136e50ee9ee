//! `serve` and the commands on MySQL 8 or MariaDB 10.11 (`DATABASE_URL=mysql://…`): the
//! server's pool, the engine's database (named by `schema`), and the order example's tables in
//! the URL's database ([`shop`]). Everything else — the engine, the console, the demo — is
//! [`super::Application::build`]'s, as on PostgreSQL.

use anyhow::Context;
use dedup_engine::{EnginePool, PoolSettings, Schema};
use dedup_example_orders as orders;
use sqlx::MySqlPool;

use crate::config::Settings;

/// The order example on MySQL: its tables in the database `DATABASE_URL` names (the team's own;
/// the engine's go in the database named by `schema`).
///
/// Errors: a URL without a database, or one whose name is not a plain lowercase name.
pub(crate) fn shop(settings: &Settings) -> anyhow::Result<orders::mysql::Shop> {
    let options: sqlx::mysql::MySqlConnectOptions =
        settings.database_url.expose().parse().context("DATABASE_URL is not a MySQL URL")?;
    let database = options.get_database().context("DATABASE_URL names no database (mysql://…/<database>)")?;
    anyhow::ensure!(
        database != settings.schema.as_str(),
        "DATABASE_URL's database {database:?} is the engine's (schema): on MySQL the engine's tables need a database \
         of their own (each database keeps one migration history)"
    );
    Ok(orders::mysql::Shop::new(Schema::parse(database)?))
}

/// Connects to MySQL or MariaDB with the server's pool (creating the database if needed).
///
/// Errors: the server unreachable (names it, the redacted URL and how to start it).
pub(crate) async fn connect(settings: &Settings) -> anyhow::Result<MySqlPool> {
    let pool = PoolSettings { max_connections: settings.db_max_connections, ..PoolSettings::default() };
    dedup_engine::mysql::connect(settings.database_url.expose(), &pool).await.map_err(crate::hints::with_hint)
}

/// A pool on the engine's database (named by `schema`, created if missing, migrated), for the
/// commands that touch only the engine's tables ([`super::open_engine_database`]).
///
/// Errors: the server unreachable, a session not `READ COMMITTED` in UTC, a failed migration.
pub(super) async fn open_engine_database(settings: &Settings) -> anyhow::Result<EnginePool> {
    let host = connect(settings).await?;
    let engine = dedup_engine::console::mysql_engine_pool(&host, &settings.schema, 2).await;
    host.close().await;
    Ok(engine?.into())
}

/// The server's pool on the order example's [`shop`], as its [`orders::ShopPool`]: what `serve`
/// builds the engine on ([`super::Application::build`]).
///
/// Errors: those of [`shop`] and [`connect`].
pub(super) async fn shop_pool(settings: &Settings) -> anyhow::Result<orders::ShopPool> {
    let shop = shop(settings)?;
    Ok(orders::ShopPool::MySql(connect(settings).await?, shop))
}
