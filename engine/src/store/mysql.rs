//! The MySQL 8 / MariaDB 10.11 dedup store (issue 25): [`MySqlStore`] makes every statement of
//! [`DedupStore`] and [`crate::store::LeaseStore`] (the hot path: claims of every kind,
//! completions, failures, poison records, the fast path's duplicate counts, leases, heartbeats,
//! deferrals, releases, late effects) and every role the pipeline asks of a store
//! (`store/roles.rs`: conflicting copies in `record_conflicts`, `conflicts.rs`; fingerprints and
//! late duplicates, `late.rs`; handler pauses in `handler_pauses`, `pauses.rs`; the handler
//! savepoint), and passes the conformance suite (`store/conformance/`). `Pipeline<MySqlStore>`
//! runs on it, and an engine built on a `MySqlPool` starts it (with the runtime's tables,
//! `runtime.rs`); the console's roles, bulk requeue and cleanup (which writes the fingerprints,
//! `cleanup.rs`) are implemented on the `MySqlPool` itself.
//!
//! The schema is the lean one of the PostgreSQL store (docs/DESIGN.md, "The lean write path"),
//! in MySQL's terms: keys and compared text are `VARBINARY` or `_bin` (byte comparison: no
//! collation folds case, no PAD SPACE makes `'a'` equal `'a '`); times are `DATETIME(6)` in UTC,
//! from the database's `UTC_TIMESTAMP(6)`; the only unique keys of `dedup_records` are its
//! primary key and the dedup key, since `INSERT … ON DUPLICATE KEY UPDATE` fires on any; a
//! stored generated column stands in for the partial index over the records not succeeded
//! (MariaDB has no functional index); a claim nonce is read back where PostgreSQL has
//! `RETURNING` (BENCHMARKS.md, "MariaDB's claim floor").
//!
//! How the statements work (docs/DESIGN.md, "MySQL store"): a claim is one `INSERT … ON
//! DUPLICATE KEY UPDATE` whose first assignment gives the rows it takes the statement's random
//! nonce, read back by that nonce (affected rows decide nothing: sqlx always sends
//! `CLIENT_FOUND_ROWS`, and a batch sums them); the rows it did not take are judged by a locking
//! read and counted by an update. Completions and failures read the claims still held under the
//! lease token with `FOR UPDATE`, then update those. No trigger counts anything: every
//! transition appends its own count deltas, and inserts its new message types
//! (`mysql/books.rs`). A batch is several statements, so callers run it in a transaction (a
//! transactional claim's caller does; leased statements and the testing-only single claim and
//! completion open their own, a savepoint inside the caller's if it has one).
//!
//! The roles' tables follow the same rules: `record_conflicts` keeps one open row per record and
//! payload by a unique key over a stored generated column that is NULL once the row is settled
//! (PostgreSQL's partial unique index); a fingerprint is PostgreSQL's 64 bits as `BINARY(8)`,
//! computed in the statements (no stored function: creating one needs `SUPER` where binary
//! logging is on); what PostgreSQL's statements return is read back — by a nonce (late
//! duplicates noted, a held record) or by the primary key in the write's transaction (pauses).

mod accounts;
mod arrival;
pub(crate) mod audit;
pub(crate) mod cleanup;
mod overview;
mod failures;
mod endpoints;
mod handler_books;
mod operator_tx;
mod record_books;
mod conflict_books;
mod drill_books;
pub(crate) mod requeue_jobs;
mod records;
mod books;
mod claims;
mod conflicts;
#[cfg(feature = "testing")]
pub(crate) mod conformance;
#[cfg(feature = "testing")]
pub(crate) mod conformance_reads;
pub(super) mod errors;
mod late;
mod leases;
pub(crate) mod named_lock;
mod pauses;
mod pool;
pub(crate) mod runtime;
mod seed;
mod settle;
mod sql;
#[cfg(feature = "testing")]
pub(crate) mod test_database;

pub use pool::migrate_engine;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::migrate::Migrator;
use sqlx::mysql::{MySqlConnectOptions, MySqlPool, MySqlPoolOptions, MySqlRow};
use sqlx::{Connection, Executor, MySql, MySqlConnection, Row};

#[cfg(feature = "testing")]
use super::ClaimRequest;
use super::{
    ClaimAs, ClaimBatch, ClaimOutcome, ClaimedRecord, DedupStore, FailureOutcome, FailureReport, Lease, PoisonRecord,
    PoisonStored, StoreError,
};
use crate::db::{PoolSettings, Schema};
use crate::service::{Service, Unreachable};
#[cfg(feature = "testing")]
use crate::handler::EffectAnswer;
#[cfg(feature = "testing")]
use crate::record::HandlerMode;

/// The MySQL store's migrations, applied to the database its pool connects to (MySQL's schema
/// is a database). MySQL commits each DDL statement at once, so each file is small.
pub static MIGRATOR: Migrator = sqlx::migrate!("src/store/mysql/migrations");

/// A pool on `options` as the store uses its connections: `READ COMMITTED` (a claim reads the
/// rows as committed, as PostgreSQL's does; MySQL's default `REPEATABLE READ` would take gap
/// locks), and the session time zone UTC (sqlx's default for `options`, which must keep it), so
/// that `DATETIME` values are UTC whatever the server's zone.
///
/// Errors: the first connection's (unreachable server, refused login, unknown database).
#[cfg(feature = "testing")]
pub async fn connect(options: MySqlConnectOptions, max_connections: u32) -> Result<MySqlPool, sqlx::Error> {
    pool_options(max_connections).connect_with(options).await
}

fn pool_options(max_connections: u32) -> MySqlPoolOptions {
    MySqlPoolOptions::new().max_connections(max_connections).after_connect(|conn, _| {
        Box::pin(async move {
            conn.execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED").await?;
            Ok(())
        })
    })
}

/// Opens the pool an engine runs on from `url` (`mysql://user:password@host:3306/database`):
/// connections `READ COMMITTED` in UTC (claims read rows as committed, without gap locks; lease
/// times are UTC), at most `settings.max_connections`, a wait for one
/// bounded by `settings.acquire_timeout`; the database is created when it does not exist yet.
/// `settings.statement_timeout` is not applied: MariaDB (`max_statement_time`) and MySQL 8
/// (`max_execution_time`, reads only) bound statements differently.
///
/// Errors: [`Unreachable`] naming MySQL and the redacted URL, when the URL does not parse or no
/// connection can be made.
pub async fn connect_url(url: &str, settings: &PoolSettings) -> Result<MySqlPool, Unreachable> {
    let unreachable = |e: sqlx::Error| Unreachable::new(Service::MySql, url, e);
    let options: MySqlConnectOptions = url.parse().map_err(unreachable)?;
    let open = || pool_options(settings.max_connections).acquire_timeout(settings.acquire_timeout);
    match open().connect_with(options.clone()).await {
        Err(e) if super::DbErrorKind::of(&e) == super::DbErrorKind::UnknownDatabase => {
            let mut server = sqlx::MySqlConnection::connect_with(&options.clone().database("")).await.map_err(unreachable)?;
            create_database(&mut server, options.get_database().unwrap_or_default()).await.map_err(unreachable)?;
            open().connect_with(options).await.map_err(unreachable)
        }
        other => other.map_err(unreachable),
    }
}

/// Creates the database `name` on `conn`'s server unless it exists (another process creating it
/// at the same time is no error).
pub(crate) async fn create_database(conn: &mut MySqlConnection, name: &str) -> Result<(), sqlx::Error> {
    let quoted = name.replace('`', "``");
    sqlx::query(&format!("CREATE DATABASE IF NOT EXISTS `{quoted}`")).execute(conn).await.map(drop)
}

/// Longest wait for another process's migrations ([`migrate`]).
const MIGRATION_WAIT_SECONDS: i64 = 300;

/// The name of the migration lock of the connection's database: `<database>.migrations`, or
/// for a database name over 53 characters a digest of it (MySQL 8 refuses lock names over 64
/// characters; database names take up to 64).
const MIGRATION_LOCK: &str = "IF(CHAR_LENGTH(DATABASE()) <= 53, CONCAT(DATABASE(), '.migrations'), \
     CONCAT('migrations.', LEFT(SHA2(DATABASE(), 256), 48)))";

/// Applies `migrator` to the database `pool` connects to, one process at a time: the whole run
/// holds `GET_LOCK('<database>.migrations', …)` (`MIGRATION_LOCK`) on a connection of its own
/// (opened with the pool's options, beside the pool), waiting at most 300 s for another
/// process's run. sqlx's own migration lock asks `GET_LOCK(…, -1)`, which
/// MySQL 8 takes as "wait forever" but MariaDB 10.11 answers at once with NULL (measured): two
/// processes starting together on MariaDB would both apply the first migration, and one fails
/// on a "dirty" history.
///
/// Errors: the lock not taken within the wait ([`sqlx::migrate::MigrateError::Execute`] with a
/// protocol error naming it), the database's, or a migration's.
pub async fn migrate(pool: &MySqlPool, migrator: &Migrator) -> Result<(), sqlx::migrate::MigrateError> {
    // A connection of its own, beside the pool's: a pool of one connection must still migrate.
    let mut holder = sqlx::MySqlConnection::connect_with(&pool.connect_options()).await?;
    let taken: Option<i64> = sqlx::query_scalar(&format!("SELECT GET_LOCK({MIGRATION_LOCK}, ?)"))
        .bind(MIGRATION_WAIT_SECONDS)
        .fetch_one(&mut holder)
        .await?;
    if taken != Some(1) {
        return Err(sqlx::Error::Protocol(format!(
            "the migration lock was not taken within {MIGRATION_WAIT_SECONDS} s (GET_LOCK answered {taken:?}): \
             another process is migrating; not migrating"
        ))
        .into());
    }
    let applied = migrator.run(pool).await;
    // Closing the connection releases the lock as well; released first, so that a close that
    // fails leaves no one waiting.
    let released = sqlx::query(&format!("SELECT RELEASE_LOCK({MIGRATION_LOCK})")).execute(&mut holder).await;
    holder.close().await.ok();
    applied?;
    released?;
    Ok(())
}

/// The MySQL/MariaDB implementation of [`DedupStore`] and [`crate::store::LeaseStore`]. Cheap to
/// clone.
///
/// Its statements name the engine's tables with the database they were migrated into (MySQL's
/// schema), so they run on any connection of the server — a team's transaction on its own
/// database above all. Connections must run `READ COMMITTED` in UTC, as [`connect`] sets them.
#[derive(Debug, Clone)]
pub struct MySqlStore {
    pool: MySqlPool,
    database: String,
}

impl MySqlStore {
    /// A store on `pool`, with its tables in the database `schema` (migrated with [`MIGRATOR`]).
    pub fn new(pool: MySqlPool, schema: &Schema) -> Self {
        Self { pool, database: format!("`{}`", schema.as_str()) }
    }

    /// `template` with each `{s}` replaced by the store's database, quoted.
    fn render(&self, template: &str) -> String {
        template.replace("{s}", &self.database)
    }
}

/// A text column stored as bytes (`VARBINARY`, `_bin`: sqlx reads those as bytes only), as text.
fn text(row: &MySqlRow, column: &str) -> Result<String, sqlx::Error> {
    let bytes: Vec<u8> = row.try_get(column)?;
    String::from_utf8(bytes).map_err(|e| sqlx::Error::Decode(Box::new(e)))
}

#[async_trait]
impl DedupStore for MySqlStore {
    type Db = MySql;

    fn pool(&self) -> &MySqlPool {
        &self.pool
    }

    #[cfg(feature = "testing")]
    async fn claim(&self, conn: &mut MySqlConnection, req: &ClaimRequest<'_>) -> Result<ClaimOutcome, StoreError> {
        use sqlx::Connection;
        let batch = ClaimBatch {
            group: req.group,
            max_attempts: req.max_attempts,
            lease: req.lease,
            claim_as: match req.mode {
                HandlerMode::Transactional => ClaimAs::Processing,
                HandlerMode::Leased => ClaimAs::Leased,
            },
            items: Vec::new(),
        };
        let claim = claims::Claim {
            message_id: req.message_id,
            message_type: req.message_type,
            payload_hash: req.payload_hash,
            message: req.message,
            id_source: None,
            reclaim: req.reclaim_expired,
            starts_at_once: None,
        };
        let mut tx = conn.begin().await?;
        let mut outcomes = self.claim_rows(&mut tx, &batch, std::slice::from_ref(&claim)).await?;
        tx.commit().await?;
        outcomes.pop().ok_or_else(|| StoreError::Database(sqlx::Error::RowNotFound))
    }

    #[cfg(feature = "testing")]
    async fn complete(
        &self,
        conn: &mut MySqlConnection,
        claim: &ClaimedRecord,
        lease: &Lease,
        mode: HandlerMode,
        answer: Option<&EffectAnswer>,
    ) -> Result<bool, StoreError> {
        use sqlx::Connection;
        if mode == HandlerMode::Leased {
            let done = crate::store::LeaseStore::complete_many_leased(self, conn, &[(claim, answer)]).await?;
            return Ok(done == [claim.id]);
        }
        // Fenced by the claim's own token, as PostgreSQL's single completion is.
        let lease = Lease { token: claim.lease_token, ..lease.clone() };
        let mut tx = conn.begin().await?;
        let done = self.complete_claims(&mut tx, &[claim], &lease).await?;
        tx.commit().await?;
        Ok(done == [claim.id])
    }

    #[tracing::instrument(
        level = "debug",
        name = "claim",
        skip_all,
        fields(count = batch.items.len(), mode = batch.claim_as.mode(), into = batch.claim_as.as_str())
    )]
    async fn claim_many(
        &self,
        conn: &mut MySqlConnection,
        batch: &ClaimBatch<'_>,
    ) -> Result<Vec<ClaimOutcome>, StoreError> {
        let claims: Vec<claims::Claim<'_>> = batch
            .items
            .iter()
            .map(|it| claims::Claim {
                message_id: it.message_id,
                message_type: it.message_type,
                payload_hash: it.payload_hash,
                message: it.message,
                id_source: Some(it.id_source),
                reclaim: it.reclaim_expired,
                starts_at_once: Some(it.starts_at_once),
            })
            .collect();
        if batch.claim_as != ClaimAs::Leased {
            return self.claim_rows(conn, batch, &claims).await;
        }
        // A leased claim's statements are one unit: a transaction of their own, or a savepoint
        // in the caller's (the pipeline claims a batch's rounds in one transaction).
        let mut tx = sqlx::Connection::begin(conn).await?;
        let outcomes = self.claim_rows(&mut tx, batch, &claims).await?;
        tx.commit().await?;
        Ok(outcomes)
    }

    #[tracing::instrument(level = "debug", name = "complete", skip_all, fields(count = claims.len(), mode = "transactional"))]
    async fn complete_many(
        &self,
        conn: &mut MySqlConnection,
        claims: &[&ClaimedRecord],
        lease: &Lease,
    ) -> Result<Vec<i64>, StoreError> {
        self.complete_claims(conn, claims, lease).await
    }

    #[tracing::instrument(
        level = "debug",
        name = "record_failure",
        skip_all,
        fields(record = failure.claim.id, mode = failure.mode.as_str())
    )]
    async fn fail_claimed(
        &self,
        conn: &mut MySqlConnection,
        failure: &FailureReport<'_>,
    ) -> Result<FailureOutcome, StoreError> {
        self.fail_claim(conn, failure).await
    }

    #[tracing::instrument(level = "debug", name = "record_poison", skip_all, fields(message_id = %p.message_id, poison = p.poison))]
    async fn record_poison(&self, conn: &mut MySqlConnection, p: &PoisonRecord<'_>) -> Result<PoisonStored, StoreError> {
        self.store_poison(conn, p).await
    }

    async fn add_fast_path_duplicates(
        &self,
        entries: &[(String, String, i32, DateTime<Utc>)],
    ) -> Result<(), StoreError> {
        self.fast_path_duplicates(entries).await
    }
}

#[async_trait]
impl super::roles::HandlerSavepoints for MySqlStore {
    const DEADLOCK_LOSES_TRANSACTION: bool = true;

    /// Two statements when reopening (InnoDB's `SAVEPOINT` of an existing name moves it, but
    /// releasing first keeps the same shape as PostgreSQL's).
    async fn open_savepoint(&self, conn: &mut MySqlConnection, reopen: bool) -> Result<(), sqlx::Error> {
        if reopen {
            conn.execute("RELEASE SAVEPOINT handler").await?;
        }
        conn.execute("SAVEPOINT handler").await.map(drop)
    }

    async fn rollback_to_savepoint(&self, conn: &mut MySqlConnection) -> Result<(), sqlx::Error> {
        conn.execute("ROLLBACK TO SAVEPOINT handler").await.map(drop)
    }
}
