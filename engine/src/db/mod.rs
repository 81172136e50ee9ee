//! What the engine's databases share: the pool settings a host opens its pool with
//! ([`PoolSettings`]) and the name of the engine's schema ([`Schema`]; on MySQL a database).
//! Each database's connecting, migrations and engine pool are its store's
//! (`store/postgres/{connection,migrations,pool}.rs`; `store/mysql.rs`, `store/mysql/pool.rs`).

mod schema;
pub(crate) mod storable;

use std::time::Duration;

pub use schema::{Schema, SchemaError, SchemaNameError};

/// Pool settings for [`connect`](crate::connect) (and, with the feature `mysql`, `mysql::connect`).
#[derive(Debug, Clone)]
pub struct PoolSettings {
    /// Most connections the pool opens.
    pub max_connections: u32,
    /// How long to wait for a connection (from the pool or a new one) before failing.
    pub acquire_timeout: Duration,
    /// PostgreSQL's `statement_timeout` on every connection: a statement running longer is
    /// cancelled by the server (SQLSTATE 57014) and its transaction rolls back, so a long lock
    /// cannot hold a consumer's batch (and its connection) for longer. `None` leaves the
    /// server's default (normally no bound). The engine's migrations lift it on their own
    /// connection. Default 30 s.
    pub statement_timeout: Option<Duration>,
}

impl Default for PoolSettings {
    fn default() -> Self {
        Self {
            max_connections: 16,
            acquire_timeout: Duration::from_secs(5),
            statement_timeout: Some(Duration::from_secs(30)),
        }
    }
}

