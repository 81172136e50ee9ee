//! The PostgreSQL dedup store.
//!
//! PostgreSQL aborts the whole transaction on a unique violation, so a claim never inserts and
//! catches the error: it is one `INSERT ... ON CONFLICT (consumer_group, message_id) DO UPDATE
//! ... WHERE <claimable> RETURNING`. `ON CONFLICT DO UPDATE` locks the conflicting row even when
//! the `WHERE` is false, so a concurrent duplicate waits for the holder's transaction and then
//! judges the committed state.
//!
//! Each statement group of the hot path runs in a `DEBUG` span named by what it does (`claim`,
//! `complete`, `record_failure`, `defer`, `record_poison`, `extend_lease` (a worker's heartbeat), `note_late_effect`), with how
//! many records it covers (`count`) or which (`record`, `message_id`) and the handler mode; a
//! batch's `claim` also records how many it `claimed` (the others exist already: duplicates, or
//! held by someone else).

use std::sync::Arc;

use async_trait::async_trait;
use sqlx::{Executor, PgConnection, PgPool};

use crate::db::Schema;
use crate::db::storable;

#[macro_use]
mod sql;
mod accounts;
mod dedup_store;
mod connection;
#[cfg(feature = "testing")]
pub(crate) mod conformance;
mod migrations;
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
pub(crate) mod records;
pub(crate) mod conflicts;
pub(super) mod errors;
pub(crate) mod late;
mod leases;
pub(crate) mod named_lock;
mod pauses;
mod pool;
pub(crate) mod runtime;
mod seed;
#[cfg(feature = "testing")]
pub(crate) mod test_database;
pub use connection::{connect, engine_pool};
#[cfg(feature = "testing")]
pub use migrations::{MIGRATOR, verify_schema};
pub use migrations::{migrate, migrate_schema};
use sql::Statements;

/// The PostgreSQL implementation of [`DedupStore`](super::DedupStore). Cheap to clone.
///
/// Its statements name the engine's tables with the schema, so they run on any connection of
/// the database whatever its `search_path` — a team's transaction above all (see
/// [`crate::db`]).
#[derive(Debug, Clone)]
pub struct PgStore {
    pool: PgPool,
    sql: Arc<Statements>,
    schema: Schema,
}

impl PgStore {
    /// A store on `pool` (the host pool: transactional batches begin there), with its tables in
    /// `schema` (migrated with [`migrate`]).
    pub fn new(pool: PgPool, schema: &Schema) -> Self {
        Self { pool, sql: Arc::new(Statements::new(schema)), schema: schema.clone() }
    }

    /// `template` with each `{s}` replaced by the engine's schema, quoted: a statement that runs
    /// on any connection of the pool, whatever its `search_path`.
    pub(crate) fn render(&self, template: &str) -> String {
        template.replace("{s}", &self.schema.quoted())
    }
}

#[async_trait]
impl super::roles::HandlerSavepoints for PgStore {
    const DEADLOCK_LOSES_TRANSACTION: bool = false;

    /// One simple query either way: `RELEASE SAVEPOINT handler; SAVEPOINT handler` saves a round
    /// trip per message.
    async fn open_savepoint(&self, conn: &mut PgConnection, reopen: bool) -> Result<(), sqlx::Error> {
        let open = if reopen { "RELEASE SAVEPOINT handler; SAVEPOINT handler" } else { "SAVEPOINT handler" };
        conn.execute(open).await.map(drop)
    }

    async fn rollback_to_savepoint(&self, conn: &mut PgConnection) -> Result<(), sqlx::Error> {
        conn.execute("ROLLBACK TO SAVEPOINT handler").await.map(drop)
    }
}
