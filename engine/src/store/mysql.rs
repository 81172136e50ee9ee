//! The MySQL 8 / MariaDB 10.11 dedup store (issue 25), in construction: so far its schema —
//! the tables a claim writes, in `mysql/migrations/` — its connections, and its database
//! errors (`mysql/errors.rs`). The statements come role by role (docs/research/store-seam.md,
//! "Order of work"); no host can run the engine on MySQL yet.
//!
//! The schema is the lean one of the PostgreSQL store (docs/DESIGN.md, "The lean write path"),
//! in MySQL's terms: keys and compared text are `VARBINARY` or `_bin` (byte comparison: no
//! collation folds case, no PAD SPACE makes `'a'` equal `'a '`); times are `DATETIME(6)` in UTC,
//! from the database's `UTC_TIMESTAMP(6)`; the only unique keys of `dedup_records` are its
//! primary key and the dedup key, since `INSERT … ON DUPLICATE KEY UPDATE` fires on any; a
//! stored generated column stands in for the partial index over the records not succeeded
//! (MariaDB has no functional index); a claim nonce is read back where PostgreSQL has
//! `RETURNING` (BENCHMARKS.md, "MariaDB's claim floor").

pub(super) mod errors;

use sqlx::Executor;
use sqlx::migrate::Migrator;
use sqlx::mysql::{MySqlConnectOptions, MySqlPool, MySqlPoolOptions};

/// The MySQL store's migrations, applied to the database its pool connects to (MySQL's schema
/// is a database). MySQL commits each DDL statement at once, so each file is small.
#[cfg_attr(not(feature = "testing"), expect(dead_code, reason = "the MySQL store's first role lands next"))]
pub static MIGRATOR: Migrator = sqlx::migrate!("src/store/mysql/migrations");

/// A pool on `options` as the store uses its connections: `READ COMMITTED` (a claim reads the
/// rows as committed, as PostgreSQL's does; MySQL's default `REPEATABLE READ` would take gap
/// locks), and the session time zone UTC (sqlx's default for `options`, which must keep it), so
/// that `DATETIME` values are UTC whatever the server's zone.
#[cfg_attr(not(feature = "testing"), expect(dead_code, reason = "the MySQL store's first role lands next"))]
pub async fn connect(options: MySqlConnectOptions, max_connections: u32) -> Result<MySqlPool, sqlx::Error> {
    MySqlPoolOptions::new()
        .max_connections(max_connections)
        .after_connect(|conn, _| {
            Box::pin(async move {
                conn.execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED").await?;
                Ok(())
            })
        })
        .connect_with(options)
        .await
}
