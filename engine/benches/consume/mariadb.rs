//! MariaDB beside PostgreSQL (issue 25, feature `mysql`): the phases of [`ON_MARIADB`] again on
//! `MySqlStore`, each right after PostgreSQL's with the same message ids, workers and batch, in
//! a MariaDB database of its own whose `bench_effects` the same handlers write.

use std::sync::{Arc, Mutex};

use dedup_engine::Schema;
use dedup_engine::fastpath::{FastPath, FastPathSettings};
use dedup_engine::handler::{Handler, HandlerRegistry};
use dedup_engine::pipeline::Pipeline;
use dedup_engine::stats::Stats;
use dedup_engine::store::mysql::MySqlStore;
use dedup_engine::testing::mysql::TestMySqlDatabase;
use dedup_engine::testing::redis_url;
use sqlx::MySql;

use crate::handlers::{InsertRow, NoEffect};
use crate::phases::Phase;
use crate::report::ON_MARIADB;

/// The server's statement counters (`SHOW GLOBAL STATUS`, server-wide), in this order.
const COUNTERS: [&str; 4] = ["Com_commit", "Com_stmt_prepare", "Com_stmt_execute", "Questions"];

/// The MariaDB side: its database, store and fast path.
pub struct MariaDb {
    db: TestMySqlDatabase,
    store: MySqlStore,
    fast_path: Arc<FastPath>,
    /// What each phase moved [`COUNTERS`] by.
    counted: Mutex<Vec<(&'static str, [u64; 4])>>,
}

impl MariaDb {
    /// A fresh migrated database (`DEDUP_TEST_MYSQL_URL`, default the local MariaDB) with the
    /// bench's business table, and Redis under `<prefix>-mariadb`: the bench's fast paths have no
    /// database namespace, so PostgreSQL's markers of the same ids would make every MariaDB
    /// message a Redis hit.
    pub async fn create(prefix: &str) -> Self {
        let db = TestMySqlDatabase::create().await;
        sqlx::query("CREATE TABLE bench_effects (message_id VARCHAR(128) NOT NULL, at DATETIME(6) DEFAULT NOW(6))")
            .execute(&db.pool)
            .await
            .unwrap();
        let store = MySqlStore::new(db.pool.clone(), &Schema::parse(db.name.clone()).unwrap());
        let settings = FastPathSettings { prefix: format!("{prefix}-mariadb"), ..Default::default() };
        let fast_path = Arc::new(FastPath::new(&redis_url(), settings));
        Self { db, store, fast_path, counted: Mutex::default() }
    }

    /// The bench's pipeline on MariaDB: `BENCH.EVENT` and `BENCH.NOEFFECT` as on PostgreSQL
    /// (their handlers writing in MariaDB's transaction), the same settings.
    pub fn pipeline(&self) -> Pipeline<MySqlStore> {
        let mut handlers = HandlerRegistry::new();
        handlers.register("BENCH.EVENT", Handler::transactional_on::<MySql, _>(InsertRow));
        handlers.register("BENCH.NOEFFECT", Handler::transactional_on::<MySql, _>(NoEffect));
        let stats = Arc::new(Stats::default());
        Pipeline::new(self.store.clone(), self.fast_path.clone(), stats, handlers, crate::settings())
    }

    /// Runs a phase and keeps what it moved the server's [`COUNTERS`] by.
    pub async fn counted(&self, phase: impl Future<Output = Phase>) -> Phase {
        let before = self.counters().await;
        let phase = phase.await;
        let after = self.counters().await;
        self.counted.lock().unwrap().push((phase.name, std::array::from_fn(|i| after[i] - before[i])));
        phase
    }

    async fn counters(&self) -> [u64; 4] {
        let rows: Vec<(String, String)> =
            sqlx::query_as(&format!("SHOW GLOBAL STATUS WHERE Variable_name IN ('{}')", COUNTERS.join("', '")))
                .fetch_all(&self.db.pool)
                .await
                .unwrap();
        COUNTERS.map(|name| rows.iter().find(|(n, _)| n == name).unwrap().1.parse().unwrap())
    }

    /// Prints, per MariaDB phase of `messages`, its transactions (a batch each, and the
    /// deadlocked ones run again) and the statements per transaction.
    pub fn print_counters(&self, messages: usize) {
        println!("MariaDB's server counters per phase (server-wide: other clients' statements count too)");
        println!(
            "{:<42} {:>8} {:>10} {:>12} {:>12} {:>12}",
            "phase", "commits", "msg/commit", "prepares/c", "executes/c", "questions/c"
        );
        for (name, [commits, prepares, executes, questions]) in self.counted.lock().unwrap().iter() {
            let per = |n: &u64| *n as f64 / (*commits).max(1) as f64;
            println!(
                "{name:<42} {commits:>8} {:>10.1} {:>12.2} {:>12.2} {:>12.2}",
                messages as f64 / (*commits).max(1) as f64,
                per(prepares),
                per(executes),
                per(questions)
            );
        }
    }

    /// The business rows written.
    pub async fn effects(&self) -> i64 {
        sqlx::query_scalar("SELECT CAST(count(*) AS SIGNED) FROM bench_effects").fetch_one(&self.db.pool).await.unwrap()
    }
}

/// The name of PostgreSQL's phase `name` run again on MariaDB, if it is.
pub fn phase_name(name: &str) -> Option<&'static str> {
    ON_MARIADB.iter().find(|(postgres, _)| *postgres == name).map(|(_, mariadb)| *mariadb)
}
