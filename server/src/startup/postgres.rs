//! `serve` and the commands on PostgreSQL: the server's two pools ([`Databases`]), and the
//! order example's tables in the schema `shop` of the URL's database ([`shop_pool`]).

use std::time::Duration;

use dedup_engine::{EnginePool, PoolSettings};
use dedup_example_orders as orders;
use sqlx::PgPool;

use crate::config::Settings;

/// The server's two pools (see [`dedup_engine::Schema`]): the host pool (the consumers'
/// transactions, the order example's tables) and the engine's (its schema alone).
pub struct Databases {
    /// The host pool.
    pub host: PgPool,
    /// The engine's pool.
    pub engine: PgPool,
}

impl Databases {
    /// Closes both pools.
    pub async fn close(self) {
        self.engine.close().await;
        self.host.close().await;
    }
}

/// Connects to PostgreSQL (creating the database if needed) with the server's pool.
///
/// Errors: PostgreSQL unreachable (names the service, the redacted URL and how to start it).
async fn connect(settings: &Settings) -> anyhow::Result<PgPool> {
    let statement_timeout = Some(Duration::from_millis(settings.db_statement_timeout_ms)).filter(|t| !t.is_zero());
    let pool =
        PoolSettings { max_connections: settings.db_max_connections, statement_timeout, ..PoolSettings::default() };
    let url = settings.database_url.expose();
    dedup_engine::connect(url, &pool).await.map_err(crate::hints::with_hint)
}

/// Connects, applies the engine's migrations (in `schema`), verifies the dedup key, and opens
/// the engine's pool: what the operator and account commands need. They leave a team's database
/// without the order example's tables.
///
/// Errors: PostgreSQL unreachable, a failed migration, or a missing dedup UNIQUE constraint.
pub async fn open_database(settings: &Settings) -> anyhow::Result<Databases> {
    let host = connect(settings).await?;
    dedup_engine::migrate(&host, &settings.schema).await?;
    let engine = dedup_engine::console::engine_pool(&host, &settings.schema, settings.engine_pool_size());
    Ok(Databases { host, engine })
}

/// The engine's pool of [`open_database`], for the commands that touch only the engine's tables
/// ([`super::open_engine_database`]).
///
/// Errors: those of [`open_database`].
pub(crate) async fn open_engine_database(settings: &Settings) -> anyhow::Result<EnginePool> {
    let Databases { host, engine } = open_database(settings).await?;
    host.close().await;
    Ok(engine.into())
}

/// [`open_database`], plus the order example's migrations: what `migrate`, `simulate` and
/// `verify` need.
///
/// Errors: those of [`open_database`], or a failed migration of the example.
pub async fn open_database_with_example(settings: &Settings) -> anyhow::Result<Databases> {
    let databases = open_database(settings).await?;
    orders::migrate(&databases.host).await?;
    Ok(databases)
}

/// The server's pool, as the order example's [`orders::ShopPool`]: what `serve` builds the
/// engine on ([`super::Application::build`]).
///
/// Errors: PostgreSQL unreachable.
pub(super) async fn shop_pool(settings: &Settings) -> anyhow::Result<orders::ShopPool> {
    Ok(orders::ShopPool::Postgres(connect(settings).await?))
}
