//! `serve` on MySQL 8 or MariaDB 10.11 (`DATABASE_URL=mysql://…`): the engine consumes with the
//! order example's MySQL handlers (and the groups' HTTP handlers), and the console is mounted
//! on it as on PostgreSQL.

use std::time::Duration;

use anyhow::Context;
use dedup_engine::{EnginePool, PoolSettings, Schema};
use dedup_example_orders as orders;
use metrics_exporter_prometheus::PrometheusHandle;
use sqlx::MySqlPool;

use super::{Application, bind, console, console_auth, engine_builder, probes, warn_of_dependencies};
use crate::config::{GroupConfig, Settings};

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

impl Application {
    /// [`Application::build`] on MySQL: the order example's MySQL tables (when a group uses its
    /// handlers), the engine, and the console.
    ///
    /// Errors: `serve --demo` (PostgreSQL only so far), the database, the listener.
    pub(super) async fn build_on_mysql(
        settings: Settings,
        groups: Vec<GroupConfig>,
        demo: bool,
        metrics: PrometheusHandle,
    ) -> anyhow::Result<Self> {
        anyhow::ensure!(!demo, "serve --demo runs on PostgreSQL only so far; DATABASE_URL names MySQL");
        let auth = console_auth(&settings)?;
        let shop = shop(&settings)?;
        let pool = connect(&settings).await?;
        // The example's tables only where its handlers will run: with the consumer off, none do.
        if settings.consumer.enabled && groups.iter().any(GroupConfig::uses_example) {
            shop.migrate(&pool).await?;
            shop.stock_inventory(&pool, &settings.orders).await?;
        }
        let example = shop.handlers(pool.clone(), &settings.orders);
        let builder = engine_builder(&settings, pool.clone(), &groups, &example)?;
        let listener = bind(&settings).await?;
        let local_addr = listener.local_addr()?;
        let engine = builder.start().await?;
        let probes = probes(&settings, engine.handle().pool().clone(), &groups)?;
        warn_of_dependencies(&probes);
        let (router, console_shutdown) =
            console(&settings, auth, engine.handle().clone(), probes, metrics, local_addr).await?;
        Ok(Self {
            listener,
            router,
            pool: EnginePool::MySql(pool),
            engine,
            demo: None,
            console_shutdown,
            shutdown_timeout: Duration::from_millis(settings.shutdown_timeout_ms),
        })
    }
}
