//! [`ShopPool`]: the example's tables on either database, behind one type, so what runs the
//! example — `serve` and its demo, the crashing worker, `simulate`, `verify` — is written once
//! and only the statements differ (PostgreSQL's in this crate's root modules, MySQL's in
//! [`crate::mysql`]).

use std::time::Duration;

use dedup_engine::{EnginePool, HandlerRegistry, IdPolicy, Publish, Schema};
use sqlx::PgPool;

use crate::OrderSettings;
use crate::simulate::{SimulateParams, SimulationReport};
use crate::verify::VerifyReport;

/// A pool on the database that holds the example's tables. Cheap to clone.
#[derive(Debug, Clone)]
pub enum ShopPool {
    /// PostgreSQL: the tables in the schema `shop` ([`crate::SCHEMA`]).
    Postgres(PgPool),
    /// MySQL 8 or MariaDB 10.11: the tables in the database of the [`crate::mysql::Shop`], on
    /// the pool's server (a pool made as `dedup_engine::mysql::connect` makes them).
    #[cfg(feature = "mysql")]
    MySql(sqlx::MySqlPool, crate::mysql::Shop),
}

impl ShopPool {
    /// The shop on `pool`, a team's pool as `dedup_engine::EnginePool::connect` opens one by
    /// URL: on PostgreSQL the tables go in the schema `shop`; on MySQL in the database the pool's
    /// connections use, which must not be the engine's `engine_schema` (each database keeps one
    /// migration history).
    ///
    /// Errors: a MySQL pool that uses no database, or the engine's, or one whose name is not a
    /// plain lowercase name; a database the example has no tables for.
    #[cfg_attr(not(feature = "mysql"), allow(unused_variables))]
    pub fn on(pool: &EnginePool, engine_schema: &Schema) -> anyhow::Result<Self> {
        if let Some(pool) = pool.postgres() {
            return Ok(Self::Postgres(pool.clone()));
        }
        #[cfg(feature = "mysql")]
        if let Some(pool) = pool.mysql() {
            use anyhow::Context;
            let options = pool.connect_options();
            let database = options.get_database().context("the MySQL URL names no database (mysql://…/<database>)")?;
            anyhow::ensure!(
                database != engine_schema.as_str(),
                "the MySQL URL's database {database:?} is the engine's (schema): on MySQL the engine's tables need a \
                 database of their own (each database keeps one migration history)"
            );
            let shop = Schema::parse(database).with_context(|| {
                format!("the MySQL URL's database {database:?} cannot hold the order example's tables")
            })?;
            return Ok(Self::MySql(pool.clone(), crate::mysql::Shop::new(shop)));
        }
        anyhow::bail!("the order example has no tables for {}", pool.database())
    }

    /// Applies the example's migrations ([`crate::migrate`], [`crate::mysql::Shop::migrate`]).
    ///
    /// Errors: the database's, or a migration's.
    pub async fn migrate(&self) -> anyhow::Result<()> {
        match self {
            Self::Postgres(pool) => crate::migrate(pool).await?,
            #[cfg(feature = "mysql")]
            Self::MySql(pool, shop) => shop.migrate(pool).await?,
        }
        Ok(())
    }

    /// Stocks the SKUs that do not exist yet.
    ///
    /// Errors: the database's.
    pub async fn stock_inventory(&self, settings: &OrderSettings) -> Result<(), sqlx::Error> {
        match self {
            Self::Postgres(pool) => crate::stock_inventory(pool, settings).await,
            #[cfg(feature = "mysql")]
            Self::MySql(pool, shop) => shop.stock_inventory(pool, settings).await,
        }
    }

    /// The order handlers on this database ([`crate::handlers`], [`crate::mysql::Shop::handlers`]).
    pub fn handlers(&self, settings: &OrderSettings) -> HandlerRegistry {
        match self {
            Self::Postgres(pool) => crate::handlers(pool.clone(), settings),
            #[cfg(feature = "mysql")]
            Self::MySql(pool, shop) => shop.handlers(pool.clone(), settings),
        }
    }

    /// The pool, as an engine is built on it (the host pool of `Engine::builder`).
    pub fn engine_pool(&self) -> EnginePool {
        match self {
            Self::Postgres(pool) => pool.clone().into(),
            #[cfg(feature = "mysql")]
            Self::MySql(pool, _) => pool.clone().into(),
        }
    }

    /// A new pool of at most `max_connections`, made as this one is (its connect and pool
    /// options: on MySQL the session the engine needs), on the same shop: a worker of its own
    /// (the demo's crashing worker) whose connections close with it.
    ///
    /// Errors: the database unreachable.
    pub async fn reconnect(&self, max_connections: u32) -> Result<Self, sqlx::Error> {
        Ok(match self {
            Self::Postgres(pool) => Self::Postgres(reconnect(pool, max_connections).await?),
            #[cfg(feature = "mysql")]
            Self::MySql(pool, shop) => Self::MySql(reconnect(pool, max_connections).await?, shop.clone()),
        })
    }

    /// [`crate::simulate::simulate`] (its parameters and report), recording the run in this
    /// shop.
    ///
    /// Errors: database (recording the run) or broker (a publish not confirmed) errors, as text.
    pub async fn simulate(
        &self,
        publisher: &dyn Publish,
        params: &SimulateParams,
        orders: &OrderSettings,
        ids: &IdPolicy,
        progress: impl Fn(u64, u64),
    ) -> anyhow::Result<SimulationReport> {
        match self {
            Self::Postgres(pool) => crate::simulate::simulate(pool, publisher, params, orders, ids, progress).await,
            #[cfg(feature = "mysql")]
            Self::MySql(pool, shop) => shop.simulate(pool, publisher, params, orders, ids, progress).await,
        }
    }

    /// [`crate::verify::verify`] on this shop, the dedup records read from the engine's
    /// `engine_schema`.
    ///
    /// Errors: no such run, or the database's.
    pub async fn verify(
        &self,
        engine_schema: &Schema,
        run: Option<i64>,
        wait: Duration,
    ) -> anyhow::Result<VerifyReport> {
        match self {
            Self::Postgres(pool) => crate::verify::verify(pool, engine_schema, run, wait).await,
            #[cfg(feature = "mysql")]
            Self::MySql(pool, shop) => shop.verify(pool, engine_schema, run, wait).await,
        }
    }

    /// Closes the pool.
    pub async fn close(&self) {
        match self {
            Self::Postgres(pool) => pool.close().await,
            #[cfg(feature = "mysql")]
            Self::MySql(pool, _) => pool.close().await,
        }
    }
}

/// A new pool of at most `max_connections`, with `pool`'s connect and pool options.
///
/// Errors: the database unreachable.
async fn reconnect<DB: sqlx::Database>(
    pool: &sqlx::Pool<DB>,
    max_connections: u32,
) -> Result<sqlx::Pool<DB>, sqlx::Error> {
    pool.options().clone().max_connections(max_connections).connect_with((*pool.connect_options()).clone()).await
}
