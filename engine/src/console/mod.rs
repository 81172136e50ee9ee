//! The console's read side: every query the overview, records, stuck, retries, dead-letter and
//! record pages run, shared by the server functions, the REST API (`/api/v1`) and the bench.
//!
//! Counts and charts come from the aggregates the engine keeps as it works (`record_counts`,
//! `stats_minute`, `table_samples`, `duplicate_delays`), never from `COUNT(*)` over the dedup
//! table; lists use keyset pagination on the indexes of the `console_indexes` migration. Times
//! are the database's (`now()`), as everywhere in the engine.

pub mod failures;
pub mod filter;
pub mod overview;
pub mod records;
pub mod seed;

/// Why a console query failed.
#[derive(Debug, thiserror::Error)]
pub enum QueryError {
    /// A filter, cursor or parameter is invalid; the text says which and why (safe to show).
    #[error("{0}")]
    BadFilter(String),
    /// The database failed the query (details are for the log, not the browser).
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
}
