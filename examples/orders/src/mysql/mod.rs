//! The order example on MySQL 8 / MariaDB 10.11 (feature `mysql`, issue 25): the same tables,
//! handlers, simulator and verifier as on PostgreSQL, with only their statements written again.
//! What is not SQL — the payloads' parsing and the handlers' judgements, the SMS stand-in, the
//! simulator's planning and publishing, the verifier's waiting and judging — is the PostgreSQL
//! example's own, reached through small seams (the SMS log, `RunBook`, `RunLedger`).
//!
//! MySQL's schema is a database: the example's tables live in a database of their own ([`Shop`]:
//! `shop` by default; the `dedup-console` binary uses its URL's database, tests one per test),
//! on the server the pool connects to, with a migration history of their own
//! (`examples/orders/migrations-mysql`, [`MIGRATOR`]); its statements name them
//! `<database>.<table>`, so they run on a connection to any database of that server — the
//! claim's transaction on the engine's database above all. Pools must be as the engine's MySQL
//! store makes them (`dedup_engine::mysql::connect`: `READ COMMITTED`, UTC).

mod handlers;
mod simulate;
mod verify;

use std::sync::Arc;
use std::time::Duration;

use dedup_engine::{Handler, HandlerRegistry, IdPolicy, Publish, Schema};
use sqlx::migrate::{MigrateError, Migrator};
use sqlx::mysql::{MySqlPool, MySqlPoolOptions};
use sqlx::{MySql, QueryBuilder};

pub use handlers::{CreateOrder, PayOrder};

use super::sms::SqlSendLog;
use super::{NotifyOrder, OrderSettings, SmsGateway, sku};
use crate::simulate::{SimulateParams, SimulationReport};
use crate::verify::VerifyReport;

/// The example's MySQL migrations (`examples/orders/migrations-mysql`), applied in the shop's
/// database by [`Shop::migrate`].
pub static MIGRATOR: Migrator = sqlx::migrate!("./migrations-mysql");

/// The database that holds the example's tables: `shop` unless named otherwise. Cheap to clone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shop {
    database: Schema,
}

impl Default for Shop {
    fn default() -> Self {
        Self::new(Schema::parse(crate::SCHEMA).expect("a valid database name"))
    }
}

impl Shop {
    /// The shop in database `database` (on the pools' server).
    pub fn new(database: Schema) -> Self {
        Self { database }
    }

    /// The database's name.
    pub fn database(&self) -> &str {
        self.database.as_str()
    }

    /// `template` with each `{shop}` replaced by the database, quoted.
    fn sql(&self, template: &str) -> String {
        template.replace("{shop}", &format!("`{}`", self.database.as_str()))
    }

    /// Creates the database if missing (`utf8mb4_bin`) and applies [`MIGRATOR`] there, through
    /// a pool of its own on it (`pool`'s options with that database), one process at a time
    /// (`dedup_engine::mysql::migrate`).
    ///
    /// Errors: the server's (creating the database, connecting), or a migration's.
    pub async fn migrate(&self, pool: &MySqlPool) -> Result<(), MigrateError> {
        sqlx::query(&self.sql("CREATE DATABASE IF NOT EXISTS {shop} CHARACTER SET utf8mb4 COLLATE utf8mb4_bin"))
            .execute(pool)
            .await?;
        let options = pool.connect_options().as_ref().clone().database(self.database());
        let own = MySqlPoolOptions::new().max_connections(1).connect_with(options).await?;
        let migrated = dedup_engine::mysql::migrate(&own, &MIGRATOR).await;
        own.close().await;
        migrated
    }

    /// Stocks the SKUs that do not exist yet (`settings.skus`, `settings.initial_stock` each).
    ///
    /// Errors: the database's.
    pub async fn stock_inventory(&self, pool: &MySqlPool, settings: &OrderSettings) -> Result<(), sqlx::Error> {
        let skus: Vec<String> = (1..=settings.skus.max(1)).map(sku).collect();
        for chunk in skus.chunks(5000) {
            let mut insert = QueryBuilder::<MySql>::new(self.sql("INSERT INTO {shop}.inventory (sku, available) "));
            insert.push_values(chunk, |mut row, sku| {
                row.push_bind(sku).push_bind(settings.initial_stock);
            });
            // A SKU that exists keeps its stock (PostgreSQL's ON CONFLICT DO NOTHING).
            insert.push(" ON DUPLICATE KEY UPDATE sku = sku");
            insert.build().execute(pool).await?;
        }
        Ok(())
    }

    /// The order handlers: CREATE and PAY transactional on MySQL
    /// (`Handler::transactional_on::<MySql, _>`), NOTIFY leased through the SMS stand-in, which
    /// logs sends on `pool`.
    pub fn handlers(&self, pool: MySqlPool, settings: &OrderSettings) -> HandlerRegistry {
        let insert = self
            .sql("INSERT INTO {shop}.notifications (order_no, kind, phone, body, message_id) VALUES (?, ?, ?, ?, ?)");
        let log = SqlSendLog { pool, insert };
        let gateway = SmsGateway::with_log(Arc::new(log), settings.sms_latency_ms, settings.sms_failure_rate);
        let mut registry = HandlerRegistry::new();
        registry
            .register("ORDER.CREATE", Handler::transactional_on::<MySql, _>(CreateOrder::new(self.clone())))
            .register("ORDER.PAY", Handler::transactional_on::<MySql, _>(PayOrder::new(self.clone())))
            .register(
                "ORDER.NOTIFY",
                Handler::Leased {
                    handler: Arc::new(NotifyOrder::new(gateway)),
                    on_lease_expiry: settings.notify_on_lease_expiry,
                },
            );
        registry
    }

    /// [`crate::simulate::simulate`] (its parameters and report), recording the run in this
    /// shop.
    ///
    /// Errors: database (recording the run) or broker (a publish not confirmed) errors, as text.
    pub async fn simulate(
        &self,
        pool: &MySqlPool,
        publisher: &dyn Publish,
        params: &SimulateParams,
        orders: &OrderSettings,
        policy: &IdPolicy,
        progress: impl Fn(u64, u64),
    ) -> anyhow::Result<SimulationReport> {
        let book = simulate::MySqlRunBook { pool, shop: self };
        crate::simulate::simulate_on(&book, publisher, params, orders, policy, progress).await
    }

    /// [`crate::verify::verify`] on this shop, the dedup records read from the database
    /// `engine_schema` (e.g. `dedup`).
    ///
    /// Errors: no such run, or a database error.
    pub async fn verify(
        &self,
        pool: &MySqlPool,
        engine_schema: &Schema,
        run: Option<i64>,
        wait: Duration,
    ) -> anyhow::Result<VerifyReport> {
        let ledger = verify::MySqlLedger { pool, shop: self, engine: engine_schema };
        crate::verify::verify_on(&ledger, run, wait).await
    }
}
