//! A fresh MariaDB database per test for the engine ([`TestMySqlDatabase`]) and one for the
//! shop beside it (`<name>_shop`, migrated by [`Shop::migrate`]), both dropped afterwards; a
//! pipeline of the order handlers on them.

use std::sync::Arc;
use std::time::Duration;

use dedup_engine::fastpath::FastPath;
use dedup_engine::message::{IdPolicy, TypePolicy};
use dedup_engine::pipeline::{Pipeline, PipelineSettings};
use dedup_engine::record::ConsumerGroup;
use dedup_engine::retry::Backoff;
use dedup_engine::stats::Stats;
use dedup_engine::store::mysql::MySqlStore;
use dedup_engine::testing::mysql::{TestMySqlDatabase, admin_url};
use dedup_engine::testing::redis_url;
use dedup_engine::{FastPathSettings, LateDuplicatePolicy, Schema};
use dedup_example_orders::OrderSettings;
use dedup_example_orders::mysql::Shop;
use sqlx::mysql::{MySqlConnectOptions, MySqlPool};
use sqlx::{ConnectOptions, Connection};

/// The engine's database and the shop's.
pub struct ShopDatabase {
    pub db: TestMySqlDatabase,
    pub shop: Shop,
    pub settings: OrderSettings,
}

impl ShopDatabase {
    /// Creates both, migrates the shop and stocks 3 SKUs of `stock` units.
    pub async fn create(stock: i32) -> Self {
        let db = TestMySqlDatabase::create().await;
        let shop = Shop::new(Schema::parse(format!("{}_shop", db.name)).unwrap());
        shop.migrate(&db.pool).await.expect("migrate the shop");
        let settings = OrderSettings { skus: 3, initial_stock: stock, sms_latency_ms: 0, ..OrderSettings::default() };
        shop.stock_inventory(&db.pool, &settings).await.unwrap();
        Self { db, shop, settings }
    }

    /// The pool (on the engine's database; the shop's statements name their database).
    pub fn pool(&self) -> &MySqlPool {
        &self.db.pool
    }

    /// The engine's database, as the verifier takes it.
    pub fn engine_schema(&self) -> Schema {
        Schema::parse(self.db.name.clone()).unwrap()
    }

    /// A pipeline of the order handlers on the MySQL store (a worker of its own), with a Redis
    /// prefix of its own: its duplicates are judged by the database.
    pub fn pipeline(&self) -> Pipeline<MySqlStore> {
        let store = MySqlStore::new(self.db.pool.clone(), &self.engine_schema());
        let prefix = format!("test-{:032x}", rand::random::<u128>());
        let fast_path =
            Arc::new(FastPath::new(&redis_url(), FastPathSettings { prefix, ..FastPathSettings::default() }));
        let settings = PipelineSettings {
            group: ConsumerGroup::parse("orders").unwrap(),
            max_attempts: 5,
            lease: Duration::from_secs(30),
            backoff: Backoff { initial_ms: 200, max_ms: 200 },
            id_policy: IdPolicy::default(),
            type_policy: TypePolicy::default(),
            keep_poison_payload_bytes: 1024,
            late_duplicates: LateDuplicatePolicy::Process,
        };
        let handlers = self.shop.handlers(self.db.pool.clone(), &self.settings);
        Pipeline::new(store, fast_path, Arc::new(Stats::default()), handlers, settings)
    }

    /// `SELECT CAST(count(*) AS SIGNED) FROM <shop>.<from>`.
    #[allow(dead_code, reason = "each test file compiles this module; mysql_verify does not count")]
    pub async fn count(&self, from: &str) -> i64 {
        let sql = format!("SELECT CAST(count(*) AS SIGNED) FROM `{}`.{from}", self.shop.database());
        sqlx::query_scalar(&sql).fetch_one(self.pool()).await.unwrap()
    }
}

impl Drop for ShopDatabase {
    fn drop(&mut self) {
        let name = self.shop.database().to_owned();
        // Drop runs inside the test's runtime; use a separate thread with its own runtime.
        let dropped = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().ok()?;
            runtime.block_on(async move {
                let admin: MySqlConnectOptions = admin_url().parse().ok()?;
                let mut conn = admin.connect().await.ok()?;
                sqlx::query("SET SESSION lock_wait_timeout = 10").execute(&mut conn).await.ok()?;
                sqlx::query(&format!("DROP DATABASE IF EXISTS `{name}`")).execute(&mut conn).await.ok()?;
                conn.close().await.ok()
            })
        })
        .join();
        if !matches!(dropped, Ok(Some(()))) {
            eprintln!("warning: could not drop MySQL test database {}", self.shop.database());
        }
    }
}
