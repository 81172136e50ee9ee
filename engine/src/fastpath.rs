//! The Redis fast path (DESIGN.md, "Redis fast path").
//!
//! Key `<prefix>:<consumer_group>:<message_id>`, value the record's first-seen time in Unix
//! milliseconds (so a hit also yields the duplicate's delay), written with `SET NX EX <ttl>` only
//! after the database commit that made the record `succeeded`. A hit means "duplicate, skip". A
//! miss, a timeout or an error means "ask the database", which always decides: Redis being down
//! slows consumption, it never stops it and never lets a duplicate through.

use std::time::{Duration, Instant};

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use tokio::sync::Mutex;

/// Fast-path settings.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct FastPathSettings {
    /// Key prefix. Default `dedup`.
    pub prefix: String,
    /// Marker lifetime in seconds. Default 7 days. Keep it below the cleanup retention.
    pub ttl_secs: u64,
    /// Bound on each Redis round trip, in milliseconds; slower answers count as fallbacks.
    /// Default 100.
    pub timeout_ms: u64,
    /// After a failed connection attempt, wait this long before trying again, in milliseconds
    /// (lookups fall through to the database meanwhile). Default 1000.
    pub reconnect_ms: u64,
}

impl Default for FastPathSettings {
    fn default() -> Self {
        Self { prefix: "dedup".to_owned(), ttl_secs: 7 * 24 * 3600, timeout_ms: 100, reconnect_ms: 1000 }
    }
}

/// What the fast path said about one message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lookup {
    /// A marker exists: the message already succeeded. Carries the record's first-seen time
    /// (Unix ms) when the marker holds one.
    Hit {
        /// First seen, Unix milliseconds.
        first_seen_ms: Option<i64>,
    },
    /// No marker: ask the database.
    Miss,
    /// Redis did not answer (down, timeout, error): ask the database; count a fallback.
    Unavailable,
}

enum Connection {
    Up(ConnectionManager),
    Down { retry_at: Instant },
}

/// The Redis marker store.
pub struct FastPath {
    client: Option<redis::Client>,
    connection: Mutex<Connection>,
    settings: FastPathSettings,
}

impl FastPath {
    /// A fast path on `url`. Does not connect yet (the first use does), so a server starts
    /// while Redis is down. An unparsable URL yields a fast path that is always unavailable
    /// (and says so in the log).
    pub fn new(url: &str, settings: FastPathSettings) -> Self {
        let client = match redis::Client::open(url) {
            Ok(c) => Some(c),
            Err(e) => {
                tracing::error!(url = %crate::service::redact_url(url), error = %e, "invalid Redis URL; fast path disabled");
                None
            }
        };
        Self { client, connection: Mutex::new(Connection::Down { retry_at: Instant::now() }), settings }
    }

    /// The marker key of a record.
    pub fn key(&self, group: &str, message_id: &str) -> String {
        format!("{}:{group}:{message_id}", self.settings.prefix)
    }

    fn timeout(&self) -> Duration {
        Duration::from_millis(self.settings.timeout_ms)
    }

    /// A connection, or `None` while Redis is considered down. Never waits for another task's
    /// connection attempt.
    async fn connection(&self) -> Option<ConnectionManager> {
        let client = self.client.as_ref()?;
        let mut state = self.connection.try_lock().ok()?;
        match &*state {
            Connection::Up(conn) => Some(conn.clone()),
            Connection::Down { retry_at } if Instant::now() < *retry_at => None,
            Connection::Down { .. } => {
                let config = ConnectionManagerConfig::new()
                    .set_connection_timeout(Some(self.timeout() * 5))
                    .set_response_timeout(Some(self.timeout()))
                    .set_number_of_retries(1)
                    .set_max_delay(Duration::from_millis(self.settings.reconnect_ms));
                match tokio::time::timeout(self.timeout() * 10, client.get_connection_manager_with_config(config)).await
                {
                    Ok(Ok(conn)) => {
                        tracing::info!("Redis fast path connected");
                        *state = Connection::Up(conn.clone());
                        Some(conn)
                    }
                    failed => {
                        let why = match failed {
                            Ok(Err(e)) => e.to_string(),
                            _ => "connection timed out".to_owned(),
                        };
                        tracing::warn!(error = %why, "Redis unavailable; duplicate checks fall through to the database");
                        *state = Connection::Down {
                            retry_at: Instant::now() + Duration::from_millis(self.settings.reconnect_ms),
                        };
                        None
                    }
                }
            }
        }
    }

    /// Looks up markers for `keys` in one round trip (`MGET`). On any failure every key is
    /// [`Lookup::Unavailable`].
    pub async fn lookup_many(&self, keys: &[String]) -> Vec<Lookup> {
        if keys.is_empty() {
            return Vec::new();
        }
        let unavailable = || vec![Lookup::Unavailable; keys.len()];
        let Some(mut conn) = self.connection().await else { return unavailable() };
        let mut cmd = redis::cmd("MGET");
        for key in keys {
            cmd.arg(key);
        }
        match tokio::time::timeout(self.timeout(), cmd.query_async::<Vec<Option<String>>>(&mut conn)).await {
            Ok(Ok(values)) if values.len() == keys.len() => values
                .into_iter()
                .map(|v| match v {
                    Some(text) => Lookup::Hit { first_seen_ms: text.parse().ok() },
                    None => Lookup::Miss,
                })
                .collect(),
            Ok(Ok(_)) => unavailable(),
            Ok(Err(e)) => {
                tracing::debug!(error = %e, "Redis MGET failed");
                unavailable()
            }
            Err(_) => unavailable(),
        }
    }

    /// Writes markers (`SET key first_seen_ms NX EX ttl`), pipelined in one round trip. Call
    /// only after the commit that made the records `succeeded`. Returns false when Redis did
    /// not take them (the records are still protected by the database).
    pub async fn mark_many(&self, markers: &[(String, i64)]) -> bool {
        if markers.is_empty() {
            return true;
        }
        let Some(mut conn) = self.connection().await else { return false };
        let mut pipe = redis::pipe();
        for (key, first_seen_ms) in markers {
            pipe.cmd("SET").arg(key).arg(first_seen_ms).arg("NX").arg("EX").arg(self.settings.ttl_secs).ignore();
        }
        matches!(tokio::time::timeout(self.timeout(), pipe.query_async::<()>(&mut conn)).await, Ok(Ok(())))
    }

    /// The marker of one record: `Some(ttl_secs)` when present (`-1`: no expiry), `None` when
    /// absent; an error when Redis does not answer.
    pub async fn marker_ttl(&self, key: &str) -> Result<Option<i64>, String> {
        let mut conn = self.connection().await.ok_or_else(|| "Redis is unavailable".to_owned())?;
        let ttl: i64 = tokio::time::timeout(self.timeout(), redis::cmd("TTL").arg(key).query_async(&mut conn))
            .await
            .map_err(|_| "Redis timed out".to_owned())?
            .map_err(|e| e.to_string())?;
        Ok(if ttl == -2 { None } else { Some(ttl) })
    }
}
