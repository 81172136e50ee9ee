//! [`EngineError`]: why an engine did not start.

use crate::db::SchemaError;
use crate::record::IdError;

/// Why an engine did not start.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// A group's name is not a valid consumer group.
    #[error("consumer group {name:?}: {error}")]
    GroupName {
        /// The name given.
        name: String,
        /// What is wrong with it.
        error: IdError,
    },
    /// Two groups share a name (they would share dedup records).
    #[error("consumer group {0:?} is declared twice")]
    DuplicateGroup(String),
    /// Two groups read the same RabbitMQ queue (or are one Kafka consumer group): each would
    /// get a share of the other's messages, and dead-letter those it has no handler for.
    #[error("consumer groups {first:?} and {second:?} both read the {source_name}")]
    SharedSource {
        /// The group declared first.
        first: String,
        /// The group declared later.
        second: String,
        /// What both read (a queue's or Kafka consumer group's name).
        source_name: String,
    },
    /// A group registers two handlers for one message type: one of them would never run.
    #[error("consumer group {name:?}: message type {message_type:?} has more than one handler")]
    DuplicateHandler {
        /// The group's name.
        name: String,
        /// The message type registered twice.
        message_type: String,
    },
    /// A group's source names no queue or topics to read.
    #[error("consumer group {name:?}: {error}")]
    GroupSource {
        /// The group's name.
        name: String,
        /// What is missing.
        error: String,
    },
    /// A leased handler's run can outlast the group's lease ([`crate::handler::LeasedHandler::longest_run`]):
    /// a worker that stopped extending it could still be calling when another takes the record over.
    #[error(
        "consumer group {name:?}: the handler of {message_type:?} may run {longest_ms} ms (its timeout), \
         not shorter than the group's lease of {lease_ms} ms; raise lease_ms above it"
    )]
    LeaseTooShort {
        /// The group's name.
        name: String,
        /// The handler's message type.
        message_type: String,
        /// The group's lease, in ms.
        lease_ms: u64,
        /// The handler's longest run, in ms.
        longest_ms: u64,
    },
    /// A transactional handler is written for another database than the engine runs on
    /// ([`crate::TransactionalHandler`]'s `DB`): it would get a transaction it cannot use.
    #[error(
        "consumer group {name:?}: the handler of {message_type:?} is written for {handler_database}, \
         but the engine runs on {engine_database}"
    )]
    HandlerDatabase {
        /// The group's name.
        name: String,
        /// The handler's message type.
        message_type: String,
        /// The handler's database (sqlx's `Database::NAME`, e.g. `"MySQL"`).
        handler_database: &'static str,
        /// The engine's database.
        engine_database: &'static str,
    },
    /// The MySQL pool's connections do not run `READ COMMITTED` in UTC, which the MySQL store's
    /// statements rely on (claims read rows as committed, without gap locks; lease times are
    /// UTC). Open the pool with [`crate::mysql::connect`], or set both on connect.
    #[cfg(feature = "mysql")]
    #[error(
        "the MySQL pool's connections run {isolation} with the clock {utc_offset_seconds} s from UTC; the engine \
         needs READ-COMMITTED in UTC (open the pool with dedup_engine::mysql::connect)"
    )]
    MySqlSession {
        /// The connections' isolation level, as MySQL names it (`REPEATABLE-READ`, …).
        isolation: String,
        /// Their session time zone's offset from UTC, in seconds.
        utc_offset_seconds: i64,
    },
    /// On MySQL the engine's database ([`crate::EngineBuilder::schema`]) is the one the team's
    /// pool connects to: the engine's tables would sit among the team's and its migrations
    /// would share their history (each MySQL database keeps one `_sqlx_migrations`). Give the
    /// engine a database of its own.
    #[cfg(feature = "mysql")]
    #[error(
        "the engine's database {database:?} is the one the team's MySQL pool connects to; give the engine a \
         database of its own (schema)"
    )]
    EngineDatabaseIsTheTeams {
        /// The database.
        database: String,
    },
    /// On MySQL the engine's migrations found other migrations in the history of their database
    /// (each MySQL database keeps one `_sqlx_migrations`): the engine's database is also the
    /// team's, which migrates its own tables there. Give the engine a database of its own
    /// ([`crate::EngineBuilder::schema`]).
    #[cfg(feature = "mysql")]
    #[error(
        "the engine's migrations share the history of database {database:?} with others ({error}); on MySQL give \
         the engine a database of its own (schema)"
    )]
    SharedMigrationHistory {
        /// The database.
        database: String,
        /// What sqlx's migrator said.
        error: sqlx::migrate::MigrateError,
    },
    /// Migrating or verifying the engine's schema failed.
    #[error(transparent)]
    Schema(#[from] SchemaError),
}
