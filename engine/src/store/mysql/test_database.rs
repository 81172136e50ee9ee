//! A fresh MySQL/MariaDB database per test, with the MySQL store's migrations applied, dropped
//! afterwards. The server is `DEDUP_TEST_MYSQL_URL` (any database on it; default
//! `mysql://root@127.0.0.1:3306/test`, the local MariaDB).

use sqlx::mysql::{MySqlConnectOptions, MySqlPool};
use sqlx::{ConnectOptions, Connection, MySqlConnection};

/// Base URL of the MySQL server tests create their databases on.
pub fn admin_url() -> String {
    std::env::var("DEDUP_TEST_MYSQL_URL").unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/test".to_owned())
}

/// A database created for one test, migrated ([`crate::store::mysql::MIGRATOR`]), with a pool
/// as the store connects ([`crate::store::mysql::connect`]). Dropped when this value is dropped,
/// whether the test passed or panicked.
pub struct TestMySqlDatabase {
    /// The database name, `dct_<32 hex digits>`.
    pub name: String,
    /// The options of a connection to it.
    pub options: MySqlConnectOptions,
    /// A pool on it.
    pub pool: MySqlPool,
}

impl TestMySqlDatabase {
    /// Creates and migrates a fresh database. Panics when MySQL is unreachable: tests need it.
    pub async fn create() -> Self {
        let name = format!("dct_{}", uuid::Uuid::new_v4().simple());
        let admin: MySqlConnectOptions = admin_url().parse().expect("the MySQL test URL parses");
        let mut conn =
            admin.connect().await.unwrap_or_else(|e| panic!("MySQL for tests unreachable at {}: {e}", admin_url()));
        sqlx::query(&format!("CREATE DATABASE {name}")).execute(&mut conn).await.expect("create test database");
        conn.close().await.ok();
        let options = admin.database(&name);
        let pool = crate::store::mysql::connect(options.clone(), 10).await.expect("connect to the test database");
        crate::store::mysql::MIGRATOR.run(&pool).await.expect("migrate the test database");
        Self { name, options, pool }
    }
}

impl Drop for TestMySqlDatabase {
    fn drop(&mut self) {
        let name = self.name.clone();
        // Drop runs inside the test's runtime; use a separate thread with its own runtime.
        let dropped = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().ok()?;
            runtime.block_on(async move {
                let admin: MySqlConnectOptions = admin_url().parse().ok()?;
                let mut conn = MySqlConnection::connect_with(&admin).await.ok()?;
                // Bounded: a transaction the test left open holds the database's metadata lock.
                sqlx::query("SET SESSION lock_wait_timeout = 10").execute(&mut conn).await.ok()?;
                sqlx::query(&format!("DROP DATABASE IF EXISTS {name}")).execute(&mut conn).await.ok()?;
                conn.close().await.ok()
            })
        })
        .join();
        if !matches!(dropped, Ok(Some(()))) {
            eprintln!("warning: could not drop MySQL test database {}", self.name);
        }
    }
}
