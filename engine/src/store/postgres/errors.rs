//! PostgreSQL's error codes (SQLSTATE, Appendix A of its manual) as the engine's
//! [`DbErrorKind`].

use sqlx::postgres::PgDatabaseError;

use crate::store::DbErrorKind;

/// The kind of an error PostgreSQL answered.
pub(in crate::store) fn kind(error: &PgDatabaseError) -> DbErrorKind {
    match error.code() {
        "40P01" => DbErrorKind::Deadlock,
        "40001" => DbErrorKind::SerializationFailure,
        "57P01" => DbErrorKind::ConnectionLost,
        "57014" => DbErrorKind::StatementTimeout,
        "55P03" => DbErrorKind::LockWaitTimeout,
        "3D000" => DbErrorKind::UnknownDatabase,
        "42P04" => DbErrorKind::DatabaseExists,
        _ => DbErrorKind::Other,
    }
}
