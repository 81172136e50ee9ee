//! Server-side glue: the state the server provides to server functions, and conversions from
//! engine types to [`crate::wire`] types.

pub mod accounts;
pub mod actions;
pub mod auth;
pub mod console;
mod convert;
pub mod operations;

use std::sync::Arc;

use dedup_engine::consumer::ConsumerStatus;
use dedup_engine::fastpath::FastPath;
use dedup_engine::health::{HealthProbes, HealthReport};
use dedup_engine::source::SourceFactory;
use leptos::prelude::use_context;
use sqlx::PgPool;

use crate::error::ConsoleError;
use crate::wire::{DependencyView, HealthView};

/// Everything server functions need, provided by the server as Leptos context for each request.
#[derive(Clone)]
pub struct ConsoleState {
    /// Probes of PostgreSQL, Redis and RabbitMQ.
    pub probes: HealthProbes,
    /// The database (dedup store, aggregates).
    pub pool: PgPool,
    /// The Redis fast path (marker state on record pages).
    pub fast_path: Arc<FastPath>,
    /// The consumer's source (RabbitMQ or Kafka): its connection state and depth (queue depth or
    /// the group's lag) on the overview; operator actions publish through it.
    pub source: Arc<dyn SourceFactory>,
    /// The embedded consumer's status; `None` when it is disabled.
    pub consumer: Option<Arc<ConsumerStatus>>,
    /// The consumer group the embedded consumer runs.
    pub group: String,
}

/// The [`ConsoleState`] of the current request.
///
/// Errors: [`ConsoleError::Internal`] when the server did not provide it (a wiring bug).
pub fn console_state() -> Result<ConsoleState, ConsoleError> {
    use_context::<ConsoleState>().ok_or_else(|| ConsoleError::internal("ConsoleState missing from context"))
}

impl From<HealthReport> for HealthView {
    fn from(report: HealthReport) -> Self {
        HealthView {
            checked_at: report.checked_at.to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
            dependencies: report
                .dependencies()
                .into_iter()
                .map(|d| DependencyView {
                    key: d.service.to_owned(),
                    name: d.name.clone(),
                    url: d.url.clone(),
                    up: d.up,
                    latency_ms: d.latency_ms,
                    error: d.error.clone(),
                })
                .collect(),
        }
    }
}
