//! PostgreSQL's migrations: the engine's applied inside its schema with a history of their own
//! ([`migrate`], [`migrate_schema`]), the upgrade of a database from before the engine had a
//! schema, and the start-up check of the dedup key ([`verify_schema`]).

use sqlx::migrate::Migrator;
use sqlx::postgres::PgConnectOptions;
use sqlx::{Connection, PgConnection, PgPool};

use crate::db::{Schema, SchemaError};

/// The engine's migrations (`migrations/` at the workspace root), embedded in the binary. They
/// name no schema: [`migrate`] runs them with `search_path` set to the engine's.
pub static MIGRATOR: Migrator = sqlx::migrate!("../migrations");

/// Advisory-lock key serialising [`migrate_schema`] across processes: creating a schema and
/// moving tables concurrently can collide in the catalog. (sqlx's migrator takes a lock of its
/// own, per database, around each run.)
const MIGRATE_LOCK: i64 = 0x6465_6475_705f_6d67; // "dedup_mg"

/// Applies `migrator` inside `schema` with a history of its own (`<schema>._sqlx_migrations`):
/// creates the schema when missing, and runs the migrations on a connection of their own whose
/// `search_path` is `schema` alone, so the tables they create without a schema land in it.
/// The whole run holds an advisory lock, so processes starting together take turns.
///
/// The engine applies its own migrations this way ([`migrate`]); an application can apply its
/// own next to them (the examples do: `orders`, `billing`).
///
/// Errors: the database's, or a migration's.
pub async fn migrate_schema(pool: &PgPool, schema: &Schema, migrator: &Migrator) -> Result<(), SchemaError> {
    migrate_with(pool, schema, migrator, false).await
}

/// Applies the engine's migrations in `schema` ([`migrate_schema`]), after moving the tables of
/// a database from before the engine had a schema of its own into it, then verifies the dedup
/// key (a UNIQUE constraint on `dedup_records (consumer_group, message_id)`; start-up refuses a
/// table without it).
///
/// Errors: [`SchemaError`].
pub async fn migrate(pool: &PgPool, schema: &Schema) -> Result<(), SchemaError> {
    migrate_with(pool, schema, &MIGRATOR, true).await?;
    let mut conn = PgConnection::connect_with(&schema_options(pool, schema)).await?;
    let verified = verify_schema_on(&mut conn, schema).await;
    conn.close().await?;
    verified
}

/// [`migrate_schema`], first moving the engine's tables of a database from before schemas when
/// `move_legacy`.
async fn migrate_with(
    pool: &PgPool,
    schema: &Schema,
    migrator: &Migrator,
    move_legacy: bool,
) -> Result<(), SchemaError> {
    let mut conn = PgConnection::connect_with(&schema_options(pool, schema)).await?;
    sqlx::query("SELECT pg_advisory_lock($1)").bind(MIGRATE_LOCK).execute(&mut conn).await?;
    let result = migrate_locked(&mut conn, schema, migrator, move_legacy).await;
    // Closing the connection releases the lock whatever happened.
    conn.close().await?;
    result
}

/// [`migrate_with`]'s work on `conn`, which holds the migration lock. (A function, not an async
/// block, and `run_direct`, not `run`'s `Acquire`: rustc cannot prove either `Send` for every
/// lifetime, which the engine's start, boxed as `Send` per database, needs.)
async fn migrate_locked(
    conn: &mut PgConnection,
    schema: &Schema,
    migrator: &Migrator,
    move_legacy: bool,
) -> Result<(), SchemaError> {
    if move_legacy {
        legacy::move_into(conn, schema).await?;
    }
    sqlx::query(&format!("CREATE SCHEMA IF NOT EXISTS {}", schema.quoted())).execute(&mut *conn).await?;
    migrator.run_direct(conn).await?;
    Ok(())
}

/// The options of `pool` with `search_path` set to `schema` alone and no statement timeout (a
/// migration may rebuild an index of a large table), and no notices below warnings (every start
/// would log "schema … already exists, skipping" and the like at INFO).
fn schema_options(pool: &PgPool, schema: &Schema) -> PgConnectOptions {
    pool.connect_options().as_ref().clone().options([
        ("search_path", schema.as_str()),
        ("statement_timeout", "0"),
        ("client_min_messages", "warning"),
    ])
}

/// Verifies that `<schema>.dedup_records` has a UNIQUE (or primary key) constraint on exactly
/// `(consumer_group, message_id)`, whatever its name.
///
/// Errors: [`SchemaError::MissingUniqueConstraint`], or the database's.
#[cfg(feature = "testing")]
pub async fn verify_schema(pool: &PgPool, schema: &Schema) -> Result<(), SchemaError> {
    let mut conn = pool.acquire().await?;
    verify_schema_on(&mut conn, schema).await
}

async fn verify_schema_on(conn: &mut PgConnection, schema: &Schema) -> Result<(), SchemaError> {
    let found: bool = sqlx::query_scalar(
        r#"
        SELECT EXISTS (
            SELECT 1
            FROM pg_constraint c
            WHERE c.conrelid = to_regclass(format('%I.dedup_records', $1::text))
              AND c.contype IN ('u', 'p')
              AND (SELECT array_agg(a.attname::text ORDER BY a.attname)
                   FROM unnest(c.conkey) AS k(attnum)
                   JOIN pg_attribute a ON a.attrelid = c.conrelid AND a.attnum = k.attnum)
                  = ARRAY['consumer_group', 'message_id']
        )
        "#,
    )
    .bind(schema.as_str())
    .fetch_one(conn)
    .await?;
    if found { Ok(()) } else { Err(SchemaError::MissingUniqueConstraint { schema: schema.clone() }) }
}

/// Databases from before the engine had a schema of its own kept its tables, functions and
/// migration history in `public`, next to the order example's tables.
mod legacy {
    use sqlx::PgConnection;

    use super::Schema;

    /// The engine's tables as they were in `public` (the order example's stay there; its own
    /// migrations adopt them).
    const TABLES: &[&str] = &[
        "dedup_records",
        "record_counts",
        "record_attempts",
        "stats_minute",
        "stats_hour",
        "duplicate_delays",
        "table_samples",
        "audit_log",
        "users",
        "api_tokens",
        "login_failures",
        "requeue_jobs",
        "requeue_job_items",
        "cleanup_schedules",
        "cleanup_runs",
        "drills",
    ];

    /// The engine's functions as they were in `public`.
    const FUNCTIONS: &[&str] = &[
        "record_counts_apply",
        "record_counts_fold",
        "dedup_records_count_inserted",
        "dedup_records_count_updated",
        "dedup_records_count_deleted",
        "stats_minute_rollup",
    ];

    /// The history rows of the order example's migrations, which the engine's history carried
    /// then: `orders_domain` and `simulation`.
    const ORDER_EXAMPLE_VERSIONS: &[i64] = &[20261130000005, 20261130000006];

    /// When `public.dedup_records` exists and `<schema>.dedup_records` does not, moves the
    /// engine's tables (with their indexes, constraints, triggers and sequences) and functions
    /// into `schema`, and its rows of `public._sqlx_migrations` into `<schema>._sqlx_migrations`,
    /// in one transaction: nothing is copied, so no row can be lost. The order example's
    /// history rows are dropped (that example now keeps a history of its own); `public`'s
    /// history table is dropped once empty. A database without `public.dedup_records` is left
    /// alone.
    pub(super) async fn move_into(conn: &mut PgConnection, schema: &Schema) -> Result<(), sqlx::Error> {
        let legacy: bool = sqlx::query_scalar(
            "SELECT to_regclass('public.dedup_records') IS NOT NULL
                AND to_regclass(format('%I.dedup_records', $1::text)) IS NULL",
        )
        .bind(schema.as_str())
        .fetch_one(&mut *conn)
        .await?;
        if !legacy {
            return Ok(());
        }
        let s = schema.quoted();
        let mut tx = sqlx::Connection::begin(&mut *conn).await?;
        sqlx::query(&format!("CREATE SCHEMA IF NOT EXISTS {s}")).execute(&mut *tx).await?;
        for table in TABLES {
            sqlx::query(&format!("ALTER TABLE IF EXISTS public.{table} SET SCHEMA {s}")).execute(&mut *tx).await?;
        }
        let functions: Vec<String> = sqlx::query_scalar(
            "SELECT p.oid::regprocedure::text FROM pg_proc p
             WHERE p.pronamespace = 'public'::regnamespace AND p.proname = ANY($1)",
        )
        .bind(FUNCTIONS)
        .fetch_all(&mut *tx)
        .await?;
        for function in functions {
            sqlx::query(&format!("ALTER FUNCTION {function} SET SCHEMA {s}")).execute(&mut *tx).await?;
        }
        let history: bool =
            sqlx::query_scalar("SELECT to_regclass('public._sqlx_migrations') IS NOT NULL").fetch_one(&mut *tx).await?;
        if history {
            let engine_versions: Vec<i64> = super::MIGRATOR.iter().map(|m| m.version).collect();
            sqlx::query(&format!("CREATE TABLE {s}._sqlx_migrations (LIKE public._sqlx_migrations INCLUDING ALL)"))
                .execute(&mut *tx)
                .await?;
            sqlx::query(&format!(
                "WITH moved AS (DELETE FROM public._sqlx_migrations WHERE version = ANY($1) RETURNING *)
                 INSERT INTO {s}._sqlx_migrations SELECT * FROM moved"
            ))
            .bind(&engine_versions)
            .execute(&mut *tx)
            .await?;
            sqlx::query("DELETE FROM public._sqlx_migrations WHERE version = ANY($1)")
                .bind(ORDER_EXAMPLE_VERSIONS)
                .execute(&mut *tx)
                .await?;
            sqlx::query(
                "DO $$ BEGIN
                     IF NOT EXISTS (SELECT 1 FROM public._sqlx_migrations) THEN DROP TABLE public._sqlx_migrations; END IF;
                 END $$",
            )
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        tracing::warn!(schema = %schema, "moved the engine's tables from public into their own schema");
        Ok(())
    }
}

