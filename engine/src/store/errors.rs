//! What a database error means to the engine, whichever database raised it. Each store reads
//! its own database's codes (PostgreSQL's SQLSTATEs in `postgres/errors.rs`); the engine acts on
//! the [`DbErrorKind`] alone, so a retry rule or a timeout check is written once for every
//! database (issue 25, "Store errors are classified by each database's own codes").

use sqlx::error::DatabaseError;

/// The database errors the engine tells apart. Anything else is [`DbErrorKind::Other`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DbErrorKind {
    /// The transaction was chosen as a deadlock victim (PostgreSQL 40P01) and rolled back.
    Deadlock,
    /// A serialization failure (PostgreSQL 40001): the transaction was rolled back.
    SerializationFailure,
    /// The connection is gone: an I/O error, a closed pool, the server shutting the session
    /// (PostgreSQL 57P01 `admin_shutdown`).
    ConnectionLost,
    /// No connection of the pool came within its acquire timeout.
    PoolTimedOut,
    /// The server cancelled the statement at its statement timeout (PostgreSQL 57014
    /// `query_canceled`); the transaction is lost.
    StatementTimeout,
    /// The database named in the connection URL does not exist (PostgreSQL 3D000).
    UnknownDatabase,
    /// A database of that name exists already (PostgreSQL 42P04), e.g. created meanwhile by
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
