//! The Redis fast path (DESIGN.md, "Redis fast path").
//!
//! Key `<prefix>:<consumer_group>:<message_id>`, value `<first seen, Unix ms>:<first 16 hex digits
//! of the payload's SHA-256>` (so a hit also yields the duplicate's delay, and a same-id delivery
//! with another payload can be sent on to the database to be flagged as a payload conflict),
//! written with `SET NX EX <ttl>` only after the database commit that made the record
//! `succeeded`. A hit means "duplicate, skip". A
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
    /// A marker exists: the message already succeeded.
    Hit(Marker),
    /// No marker: ask the database.
    Miss,
    /// Redis did not answer (down, timeout, error): ask the database; count a fallback.
    Unavailable,
}

/// What a marker holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Marker {
    /// The record's first-seen time, Unix milliseconds.
    pub first_seen_ms: i64,
    /// The first 8 bytes of the payload's SHA-256, XOR the message type's 64-bit FNV-1a hash
    /// (as 16 hex digits in Redis): a delivery of the same id with another payload or another
    /// type (a reused id) does not match, and goes to the database (DESIGN.md, "Reused ids and
    /// payload conflicts"). Markers written before the type was in them match no delivery:
    /// those duplicates are caught by the database until the markers expire.
    pub payload_hash_prefix: u64,
}

/// 64-bit FNV-1a of `text`: stable across builds and platforms (markers outlive a deploy).
fn fnv1a(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3))
}

impl Marker {
    /// A marker for a record of `message_type` first seen at `first_seen_ms` with payload hash
    /// `payload_hash` (SHA-256; shorter input is zero-padded).
    pub fn new(first_seen_ms: i64, payload_hash: &[u8], message_type: &str) -> Self {
        let mut prefix = [0u8; 8];
        for (dst, src) in prefix.iter_mut().zip(payload_hash) {
            *dst = *src;
        }
        Self { first_seen_ms, payload_hash_prefix: u64::from_be_bytes(prefix) ^ fnv1a(message_type) }
    }

    /// Whether a delivery of `message_type` with `payload_hash` (SHA-256) is the marked one's
    /// copy: the same type, a payload that starts alike.
    pub fn matches(&self, payload_hash: &[u8], message_type: &str) -> bool {
        Marker::new(self.first_seen_ms, payload_hash, message_type).payload_hash_prefix == self.payload_hash_prefix
    }

    fn encode(&self) -> String {
        format!("{}:{:016x}", self.first_seen_ms, self.payload_hash_prefix)
    }

    /// Parses `<ms>:<hex>`; `None` for anything else (treated as a plain hit).
    fn decode(text: &str) -> Option<Self> {
        let (ms, hash) = text.split_once(':')?;
        Some(Self { first_seen_ms: ms.parse().ok()?, payload_hash_prefix: u64::from_str_radix(hash, 16).ok()? })
    }
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
    /// [`Lookup::Unavailable`]. In a `DEBUG` span `redis_lookup` (`count`: keys).
    #[tracing::instrument(level = "debug", name = "redis_lookup", skip_all, fields(count = keys.len()))]
    pub(crate) async fn lookup_many(&self, keys: &[String]) -> Vec<Lookup> {
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
                .map(|v| match v.as_deref().map(Marker::decode) {
                    Some(Some(marker)) => Lookup::Hit(marker),
                    // Not ours (or garbled): the database decides.
                    Some(None) | None => Lookup::Miss,
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

    /// Writes markers (`SET key <marker> NX EX ttl`), pipelined in one round trip. Call only
    /// after the commit that made the records `succeeded`. Returns false when Redis did not take
    /// them (the records are still protected by the database). In a `DEBUG` span `redis_mark`
    /// (`count`: markers).
    #[tracing::instrument(level = "debug", name = "redis_mark", skip_all, fields(count = markers.len()))]
    pub async fn mark_many(&self, markers: &[(String, Marker)]) -> bool {
        if markers.is_empty() {
            return true;
        }
        let Some(mut conn) = self.connection().await else { return false };
        let mut pipe = redis::pipe();
        for (key, marker) in markers {
            pipe.cmd("SET").arg(key).arg(marker.encode()).arg("NX").arg("EX").arg(self.settings.ttl_secs).ignore();
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markers_round_trip_and_compare_payload_hashes_and_types() {
        let hash = [0xabu8; 32];
        let marker = Marker::new(1_700_000_000_000, &hash, "");
        assert_eq!(marker.encode(), "1700000000000:6059374f2f89888e", "the empty type's FNV-1a is its offset basis");
        assert_eq!(Marker::decode(&marker.encode()), Some(marker));
        let pay = Marker::new(1_700_000_000_000, &hash, "ORDER.PAY");
        assert!(pay.matches(&hash, "ORDER.PAY"));
        assert!(!pay.matches(&[0u8; 32], "ORDER.PAY"), "another payload");
        assert!(!pay.matches(&hash, "ORDER.CREATE"), "another type: a reused id");
        assert_eq!(Marker::decode("1700000000000"), None);
        assert_eq!(Marker::decode("x:y"), None);
    }
}
