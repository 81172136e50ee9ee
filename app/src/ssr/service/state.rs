//! What the service layer works with: the console's handle on the engine, its probes and its
//! settings, given to every server function and REST handler.

use dedup_engine::console::FastPath;
use dedup_engine::console::actions::Publishers;
use dedup_engine::{EngineHandle, HealthProbes, HealthReport};
use leptos::prelude::use_context;
use sqlx::PgPool;

use crate::error::ConsoleError;
use crate::wire::{DependencyView, HealthView};

/// Everything server functions need, provided by the server as Leptos context for each request.
#[derive(Clone)]
pub struct ConsoleState {
    /// Probes of PostgreSQL, Redis and the broker.
    pub probes: HealthProbes,
    /// The running engine: its pool, fast path, publishers and consumer groups.
    pub engine: EngineHandle,
    /// Every change is refused (the server's layer answers 403) and no action is shown.
    pub read_only: bool,
    /// The host's sign-out page, when the host signs users in (delegated auth).
    pub host_sign_out: Option<String>,
}

impl ConsoleState {
    /// The engine's pool (the console's queries and the operator actions run there).
    pub fn pool(&self) -> &PgPool {
        self.engine.pool()
    }

    /// The Redis fast path (marker state on record pages).
    pub fn fast_path(&self) -> &FastPath {
        self.engine.fast_path()
    }

    /// The publishers operator actions republish through.
    pub fn publishers(&self) -> &Publishers {
        self.engine.publishers()
    }
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
