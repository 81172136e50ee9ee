//! Types sent between the server functions and the browser. Kept apart from the engine's rows so
//! that the wasm bundle does not depend on the engine; converted in [`crate::ssr`].

use serde::{Deserialize, Serialize};

/// One dependency's health, as shown on the overview.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DependencyView {
    /// `database`, `redis` or `broker`.
    pub key: String,
    /// `PostgreSQL`, `Redis` or `RabbitMQ`.
    pub name: String,
    /// URL with the password redacted.
    pub url: String,
    /// Whether the probe succeeded.
    pub up: bool,
    /// Probe round trip in milliseconds.
    pub latency_ms: f64,
    /// Why it is down, with the command that starts it.
    pub error: Option<String>,
}

/// The health of the three dependencies at one moment.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HealthView {
    /// When the probes ran, RFC 3339 (UTC).
    pub checked_at: String,
    /// Database, Redis, broker, in that order.
    pub dependencies: Vec<DependencyView>,
}

pub mod account;
pub mod actions;
pub mod failures;
pub mod handlers;
pub mod operations;
pub mod overview;
pub mod records;
