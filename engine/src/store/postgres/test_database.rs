//! A fresh PostgreSQL database per test, with the engine's migrations applied, dropped
//! afterwards. The server is `DEDUP_TEST_DATABASE_URL` (any database on it; default
//! `postgres://postgres@127.0.0.1:5432/postgres`).

use sqlx::postgres::PgConnectOptions;
use sqlx::{Connection, PgConnection, PgPool};

use crate::db::Schema;

/// Base URL of the PostgreSQL server tests create their databases on.
pub fn admin_url() -> String {
    std::env::var("DEDUP_TEST_DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".to_owned())
}

/// A database created for one test: migrated (the engine's tables in [`Schema::default`]),
/// with a pool. Dropped (connections terminated) when this value is dropped, whether the test
/// passed or panicked.
pub struct TestDatabase {
    /// The database name, `dct_<32 hex digits>`.
    pub name: String,
    /// The server's URL it was created with ([`admin_url`] unless [`TestDatabase::create_on`]).
    admin: String,
    /// URL of this database.
    pub url: String,
    /// A pool on it whose `search_path` is `public, <engine schema>`: tests' own tables go in
    /// `public`, and their SQL reads the engine's tables without naming the schema. It serves
    /// as the host pool and as the engine's pool alike. (The engine never relies on it: its
    /// claim path names its schema, which `engine/tests/coexistence.rs` checks on a pool that
    /// cannot see the engine's tables.)
    pub pool: PgPool,
    /// The engine's schema.
    pub schema: Schema,
}

impl TestDatabase {
    /// Creates and migrates a fresh database. Panics when PostgreSQL is unreachable: tests need it.
    pub async fn create() -> Self {
        Self::create_unmigrated().await.migrated().await
    }

    /// Applies the engine's migrations ([`crate::migrate`]).
    pub async fn migrated(self) -> Self {
        crate::migrate(&self.pool, &self.schema).await.expect("migrate test database");
        self
    }

    /// Creates a fresh database and its pool, without applying any migration.
    pub async fn create_unmigrated() -> Self {
        Self::create_unmigrated_on(&admin_url()).await
    }

    /// [`TestDatabase::create`] on the server of `admin_url` (any database URL of it): a
    /// server of the test's own, which it may stop and restart.
    pub async fn create_on(admin_url: &str) -> Self {
        Self::create_unmigrated_on(admin_url).await.migrated().await
    }

    async fn create_unmigrated_on(admin_url: &str) -> Self {
        let name = format!("dct_{}", uuid::Uuid::new_v4().simple());
        let admin: PgConnectOptions = admin_url.parse().expect("the test database URL parses");
        let mut conn = PgConnection::connect_with(&admin)
            .await
            .unwrap_or_else(|e| panic!("PostgreSQL for tests unreachable at {admin_url}: {e}"));
        sqlx::query(&format!("CREATE DATABASE {name}")).execute(&mut conn).await.expect("create test database");
        conn.close().await.ok();
        let schema = Schema::default();
        let options = admin.database(&name).options([("search_path", format!("public,{schema}"))]);
        let url = database_url(admin_url, &name);
        let pool = sqlx::postgres::PgPoolOptions::new()
            .max_connections(20)
            .connect_with(options)
            .await
            .expect("connect to test database");
        Self { name, admin: admin_url.to_owned(), url, pool, schema }
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
        let (name, admin_url) = (self.name.clone(), self.admin.clone());
        // Drop runs inside the test's runtime; use a separate thread with its own runtime.
        let dropped = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().ok()?;
            runtime.block_on(async move {
                let admin: PgConnectOptions = admin_url.parse().ok()?;
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
