//! MySQL's and MariaDB's error numbers (the server error reference of each; the client errors
//! 2006 and 2013 arrive as server errors through sqlx) as the engine's [`DbErrorKind`].

use sqlx::mysql::MySqlDatabaseError;

use crate::store::DbErrorKind;

/// The kind of an error MySQL or MariaDB answered.
pub(in crate::store) fn kind(error: &MySqlDatabaseError) -> DbErrorKind {
    match error.number() {
        1213 => DbErrorKind::Deadlock,
        1205 => DbErrorKind::LockWaitTimeout,
        // Server gone away, lost connection, connection killed, disconnected for inactivity.
        2006 | 2013 | 1927 | 4031 => DbErrorKind::ConnectionLost,
        // MySQL's max_execution_time, MariaDB's max_statement_time.
        3024 | 1969 => DbErrorKind::StatementTimeout,
        1049 => DbErrorKind::UnknownDatabase,
        1007 => DbErrorKind::DatabaseExists,
        _ => DbErrorKind::Other,
    }
}
