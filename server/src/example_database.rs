//! The order example's database, for `migrate`, `simulate` and `verify`: PostgreSQL (the
//! engine's and the example's migrations, each in its schema) or, with `DATABASE_URL=mysql://…`,
//! MySQL 8 or MariaDB 10.11 (the example's tables in the URL's database, the engine's in the
//! database named by `schema`).

use std::time::Duration;

use dedup_engine::{IdPolicy, Publish, Schema};
use dedup_example_orders as orders;
use orders::OrderSettings;
use orders::simulate::{SimulateParams, SimulationReport};
use orders::verify::VerifyReport;
use sqlx::MySqlPool;

use crate::config::Settings;
use crate::startup::{Databases, open_database_with_example};

/// An open, migrated database of the order example.
pub(crate) enum ExampleDatabase {
    /// PostgreSQL: the host and engine pools.
    Postgres(Databases),
    /// MySQL or MariaDB: the host pool, and the example's tables' database.
    MySql(MySqlPool, orders::mysql::Shop),
}

impl ExampleDatabase {
    /// Connects to `settings.database_url` and applies the engine's and the example's
    /// migrations.
    ///
    /// Errors: the database unreachable, a failed migration.
    pub(crate) async fn open(settings: &Settings) -> anyhow::Result<Self> {
        if !settings.on_mysql() {
            return Ok(Self::Postgres(open_database_with_example(settings).await?));
        }
        let shop = crate::startup::mysql::shop(settings)?;
        let pool = crate::startup::mysql::connect(settings).await?;
        dedup_engine::mysql::migrate_engine(&pool, &settings.schema).await?;
        shop.migrate(&pool).await?;
        Ok(Self::MySql(pool, shop))
    }

    /// Publishes a simulated run through `publisher` and records it ([`orders::simulate`]).
    ///
    /// Errors: the database's or the broker's.
    pub(crate) async fn simulate(
        &self,
        publisher: &dyn Publish,
        params: &SimulateParams,
        orders: &OrderSettings,
        ids: &IdPolicy,
        progress: impl Fn(u64, u64),
    ) -> anyhow::Result<SimulationReport> {
        match self {
            Self::Postgres(db) => orders::simulate::simulate(&db.host, publisher, params, orders, ids, progress).await,
            Self::MySql(pool, shop) => shop.simulate(pool, publisher, params, orders, ids, progress).await,
        }
    }

    /// Checks a run's effects ([`orders::verify`]), the records in the engine's `schema`.
    ///
    /// Errors: no such run, or the database's.
    pub(crate) async fn verify(
        &self,
        schema: &Schema,
        run: Option<i64>,
        wait: Duration,
    ) -> anyhow::Result<VerifyReport> {
        match self {
            Self::Postgres(db) => orders::verify::verify(&db.host, schema, run, wait).await,
            Self::MySql(pool, shop) => shop.verify(pool, schema, run, wait).await,
        }
    }

    /// Closes the pools.
    pub(crate) async fn close(self) {
        match self {
            Self::Postgres(db) => db.close().await,
            Self::MySql(pool, _) => pool.close().await,
        }
    }
}
