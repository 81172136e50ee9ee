//! What a database error means to the engine, whichever database raised it. Each store reads
//! its own database's codes (PostgreSQL's SQLSTATEs in `postgres/errors.rs`, MySQL's and
//! MariaDB's error numbers in `mysql/errors.rs`); the engine acts on
//! the [`DbErrorKind`] alone, so a retry rule or a timeout check is written once for every
//! database (issue 25, "Store errors are classified by each database's own codes").

use sqlx::error::DatabaseError;

/// Counts a transaction that a deadlock rolled back as a whole and that is run again, for
/// `group` (a consumer group's pipeline; a cleanup batch: its schedule's group, empty for a
/// schedule of every group): `dedup_store_retries_total{group, reason="deadlock"}`.
pub(crate) fn count_deadlock_rerun(group: &str) {
    metrics::counter!("dedup_store_retries_total", "group" => group.to_owned(), "reason" => "deadlock").increment(1);
}

/// The database errors the engine tells apart. Anything else is [`DbErrorKind::Other`]. Kinds
/// are added as stores need them, so a `match` needs a wildcard arm.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum DbErrorKind {
    /// The transaction was chosen as a deadlock victim (PostgreSQL 40P01, MySQL 1213) and rolled
    /// back: all of it, on MySQL too.
    Deadlock,
    /// A serialization failure (PostgreSQL 40001): the transaction was rolled back.
    SerializationFailure,
    /// The connection is gone: an I/O error, a closed pool, the server shutting the session
    /// (PostgreSQL 57P01 `admin_shutdown`; MySQL 2006, 2013, 1927, 4031).
    ConnectionLost,
    /// No connection of the pool came within its acquire timeout.
    PoolTimedOut,
    /// The server cancelled the statement at its statement timeout (PostgreSQL 57014
    /// `query_canceled`, MySQL 3024 `max_execution_time`, MariaDB 1969 `max_statement_time`).
    StatementTimeout,
    /// A row lock was not granted within the lock wait timeout (PostgreSQL 55P03
    /// `lock_not_available`, MySQL 1205). Not transient: InnoDB rolls back the statement only,
    /// and waiting as long again is not a retry worth making inside a batch.
    LockWaitTimeout,
    /// The database named in the connection URL does not exist (PostgreSQL 3D000, MySQL 1049).
    UnknownDatabase,
    /// A database of that name exists already (PostgreSQL 42P04, MySQL 1007), e.g. created meanwhile by
    /// another process.
    DatabaseExists,
    /// Any other error.
    Other,
}

impl DbErrorKind {
    /// The kind of `error`, read from its database's own code.
    pub fn of(error: &sqlx::Error) -> Self {
        match error {
            sqlx::Error::Io(_) | sqlx::Error::PoolClosed => DbErrorKind::ConnectionLost,
            sqlx::Error::PoolTimedOut => DbErrorKind::PoolTimedOut,
            sqlx::Error::Database(db) => Self::of_database(db.as_ref()),
            _ => DbErrorKind::Other,
        }
    }

    /// The kind of an error the server answered, by the database that answered it.
    fn of_database(error: &dyn DatabaseError) -> Self {
        if let Some(pg) = error.try_downcast_ref::<sqlx::postgres::PgDatabaseError>() {
            return super::postgres::errors::kind(pg);
        }
        #[cfg(feature = "mysql")]
        if let Some(my) = error.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>() {
            return super::mysql::errors::kind(my);
        }
        DbErrorKind::Other
    }

    /// Worth running the same work again: a deadlock, a serialization failure, a lost
    /// connection, a pool timeout.
    pub fn is_transient(self) -> bool {
        matches!(
            self,
            DbErrorKind::Deadlock
                | DbErrorKind::SerializationFailure
                | DbErrorKind::ConnectionLost
                | DbErrorKind::PoolTimedOut
        )
    }
}
