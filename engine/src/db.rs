//! PostgreSQL connection, migrations and the start-up schema check.

use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{ConnectOptions, PgPool};

use crate::service::{Service, Unreachable};

/// The project's migrations (`migrations/` at the workspace root), embedded in the binary.
pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../migrations");

/// Name of the UNIQUE constraint on `dedup_records (consumer_group, message_id)`. The whole
/// product rests on it: without it two concurrent deliveries could both insert a record.
pub const DEDUP_UNIQUE_CONSTRAINT: &str = "dedup_records_group_message_key";

/// Pool settings for [`connect`].
#[derive(Debug, Clone)]
pub struct PoolSettings {
    /// Most connections the pool opens.
    pub max_connections: u32,
    /// How long to wait for a connection (from the pool or a new one) before failing.
    pub acquire_timeout: Duration,
}

impl Default for PoolSettings {
    fn default() -> Self {
        Self { max_connections: 16, acquire_timeout: Duration::from_secs(5) }
    }
}

/// Opens a connection pool and checks that the server answers. When the database named in the
/// URL does not exist yet it is created first (a fresh machine needs no manual `createdb`).
/// Connections run with `jit = off`.
///
/// Errors: [`Unreachable`] naming PostgreSQL, the redacted URL and how to start it, when the URL
/// does not parse or no connection can be made within `acquire_timeout`.
pub async fn connect(url: &str, settings: &PoolSettings) -> Result<PgPool, Unreachable> {
    let unreachable = |e: sqlx::Error| Unreachable::new(Service::PostgreSql, url, e);
    let options: PgConnectOptions = url
        .parse::<PgConnectOptions>()
        .map_err(unreachable)?
        .log_slow_statements(tracing::log::LevelFilter::Warn, Duration::from_millis(500))
        // Every statement of the product is short and index-driven; PostgreSQL's JIT, triggered
        // by cost estimates (set-returning functions, lateral joins), only adds compile time
        // (measured: 230 ms on a 2 ms console query).
        .options([("jit", "off")]);
    let pool_options =
        || PgPoolOptions::new().max_connections(settings.max_connections).acquire_timeout(settings.acquire_timeout);
    match pool_options().connect_with(options.clone()).await {
        Err(e) if is_missing_database(&e) => {
            create_database(&options).await.map_err(unreachable)?;
            pool_options().connect_with(options).await.map_err(unreachable)
        }
        other => other.map_err(unreachable),
    }
}

/// PostgreSQL's `invalid_catalog_name`: the database in the URL does not exist.
fn is_missing_database(error: &sqlx::Error) -> bool {
    error.as_database_error().and_then(|e| e.code()).is_some_and(|code| code == "3D000")
}

/// Creates the database named in `options`, connecting to the `postgres` maintenance database
/// of the same server. A concurrent creation by another process is not an error.
async fn create_database(options: &PgConnectOptions) -> Result<(), sqlx::Error> {
    use sqlx::Connection;
    let name = options.get_database().unwrap_or("postgres").to_owned();
    let mut admin = sqlx::PgConnection::connect_with(&options.clone().database("postgres")).await?;
    let quoted = format!("\"{}\"", name.replace('"', "\"\""));
    let created = sqlx::query(&format!("CREATE DATABASE {quoted}")).execute(&mut admin).await;
    admin.close().await?;
    match created {
        // duplicate_database: another process created it first.
        Err(e) if e.as_database_error().and_then(|d| d.code()).is_some_and(|c| c == "42P04") => Ok(()),
        Err(e) => Err(e),
        Ok(_) => {
            tracing::info!(database = %name, "created database");
            Ok(())
        }
    }
}

/// Schema problems found at start-up.
#[derive(Debug, thiserror::Error)]
pub enum SchemaError {
    /// A migration failed to apply.
    #[error("applying migrations failed: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    /// The dedup table lacks its UNIQUE constraint: refusing to run, since duplicates could slip
    /// through concurrent claims.
    #[error(
        "table dedup_records has no UNIQUE constraint {DEDUP_UNIQUE_CONSTRAINT} on \
         (consumer_group, message_id); refusing to start because concurrent deliveries could \
         both be processed. Restore it with: ALTER TABLE dedup_records ADD CONSTRAINT \
         {DEDUP_UNIQUE_CONSTRAINT} UNIQUE (consumer_group, message_id)"
    )]
    MissingUniqueConstraint,
    /// Querying the catalog failed.
    #[error("checking the schema failed: {0}")]
    Query(#[from] sqlx::Error),
}

/// Applies pending migrations, then verifies the dedup UNIQUE constraint ([`verify_schema`]).
pub async fn migrate(pool: &PgPool) -> Result<(), SchemaError> {
    MIGRATOR.run(pool).await?;
    verify_schema(pool).await
}

/// Verifies that `dedup_records` has a UNIQUE (or primary key) constraint on exactly
/// `(consumer_group, message_id)`, whatever its name.
pub async fn verify_schema(pool: &PgPool) -> Result<(), SchemaError> {
    let found: bool = sqlx::query_scalar(
        r#"
        SELECT EXISTS (
            SELECT 1
            FROM pg_constraint c
            WHERE c.conrelid = to_regclass('dedup_records')
              AND c.contype IN ('u', 'p')
              AND (SELECT array_agg(a.attname::text ORDER BY a.attname)
                   FROM unnest(c.conkey) AS k(attnum)
                   JOIN pg_attribute a ON a.attrelid = c.conrelid AND a.attnum = k.attnum)
                  = ARRAY['consumer_group', 'message_id']
        )
        "#,
    )
    .fetch_one(pool)
    .await?;
    if found { Ok(()) } else { Err(SchemaError::MissingUniqueConstraint) }
}
