//! Test support: a fresh PostgreSQL database per test, migrated, dropped afterwards.
//!
//! Enabled by the `testing` feature (the engine's and the server's tests turn it on). The server
//! to use is `DEDUP_TEST_DATABASE_URL` (any database on it; default
//! `postgres://postgres@127.0.0.1:5432/postgres`).

use sqlx::postgres::PgConnectOptions;
use sqlx::{Connection, PgConnection, PgPool};

/// Base URL of the PostgreSQL server tests create their databases on.
pub fn admin_url() -> String {
    std::env::var("DEDUP_TEST_DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".to_owned())
}

/// A database created for one test: migrated, with a pool. Dropped (connections terminated)
/// when this value is dropped, whether the test passed or panicked.
pub struct TestDatabase {
    /// The database name, `dct_<32 hex digits>`.
    pub name: String,
    /// URL of this database.
    pub url: String,
    /// A pool on it.
    pub pool: PgPool,
}

impl TestDatabase {
    /// Creates and migrates a fresh database. Panics when PostgreSQL is unreachable: tests need it.
    pub async fn create() -> Self {
        let name = format!("dct_{}", uuid::Uuid::new_v4().simple());
        let admin: PgConnectOptions = admin_url().parse().expect("DEDUP_TEST_DATABASE_URL parses");
        let mut conn = PgConnection::connect_with(&admin)
            .await
            .unwrap_or_else(|e| panic!("PostgreSQL for tests unreachable at {}: {e}", admin_url()));
        sqlx::query(&format!("CREATE DATABASE {name}")).execute(&mut conn).await.expect("create test database");
        conn.close().await.ok();
        let options = admin.database(&name);
        let url = database_url(&admin_url(), &name);
        let pool = sqlx::postgres::PgPoolOptions::new()
            .max_connections(20)
            .connect_with(options)
            .await
            .expect("connect to test database");
        crate::db::migrate(&pool).await.expect("migrate test database");
        Self { name, url, pool }
    }
}

/// `base` (any database URL) with its database replaced by `name`.
pub fn database_url(base: &str, name: &str) -> String {
    let mut url = url::Url::parse(base).expect("database URL parses");
    url.set_path(&format!("/{name}"));
    url.to_string()
}

impl Drop for TestDatabase {
    fn drop(&mut self) {
        let name = self.name.clone();
        // Drop runs inside the test's runtime; use a separate thread with its own runtime.
        let dropped = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().ok()?;
            runtime.block_on(async move {
                let admin: PgConnectOptions = admin_url().parse().ok()?;
                let mut conn = PgConnection::connect_with(&admin).await.ok()?;
                sqlx::query(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)")).execute(&mut conn).await.ok()?;
                conn.close().await.ok()
            })
        })
        .join();
        if !matches!(dropped, Ok(Some(()))) {
            eprintln!("warning: could not drop test database {}", self.name);
        }
    }
}
