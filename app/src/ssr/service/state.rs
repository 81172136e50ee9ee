//! What the service layer works with: the console's handle on the engine, its probes and its
//! settings, given to every server function and REST handler.

use std::time::Duration;

use dedup_engine::console::actions::Publishers;
use dedup_engine::console::{ConsoleStore, FastPath, console_store};
use dedup_engine::{EngineHandle, EnginePool, HealthProbes, HealthReport};
use leptos::prelude::use_context;

use crate::error::ConsoleError;
use crate::wire::{DependencyView, HealthView};

/// Everything server functions need, provided by the server as Leptos context for each request.
#[derive(Clone)]
pub struct ConsoleState {
    /// Probes of PostgreSQL, Redis and the broker.
    pub probes: HealthProbes,
    /// The running engine: its fast path, publishers and consumer groups.
    pub engine: EngineHandle,
    /// The console's own pool (statements bounded by [`ConsoleConfig::statement_timeout`](crate::ssr::mount::ConsoleConfig::statement_timeout)):
    /// every query and action of a request.
    pub pool: EnginePool,
    /// The engine's pool (no statement timeout): what outlasts a request, such as a cleanup run
    /// started from the console.
    pub engine_pool: EnginePool,
    /// Every change is refused (the server's layer answers 403) and no action is shown.
    pub read_only: bool,
    /// The host's sign-out page, when the host signs users in (delegated auth).
    pub host_sign_out: Option<String>,
}

impl ConsoleState {
    /// The console's roles (accounts, audit log, reads, operator actions, bulk requeue, cleanup
    /// schedules), on the console's pool.
    pub fn store(&self) -> &dyn ConsoleStore {
        console_store(&self.pool)
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

/// The `application_name` of the console's connections (in `pg_stat_activity`), unless the
/// host named its own; then they are `<host's name> (console)`.
pub const CONSOLE_APPLICATION_NAME: &str = "dedup-console";

/// The console's own pool beside the engine's (`engine`, [`EnginePool::bounded`]): the same
/// database, user and schema, named [`CONSOLE_APPLICATION_NAME`] in PostgreSQL's
/// `pg_stat_activity` (`<host's name> (console)` when the host named its own), at most
/// `max_connections` connections opened on demand, each statement cancelled by the database
/// after `statement_timeout` (lock waits included), and a wait for a connection bounded by it
/// too. Its own connections keep the console's requests from taking the connections the
/// consumers and schedulers need.
pub(crate) fn console_pool(engine: &EnginePool, statement_timeout: Duration, max_connections: u32) -> EnginePool {
    let name = match engine.application_name() {
        Some(host) => format!("{host} (console)"),
        None => CONSOLE_APPLICATION_NAME.to_owned(),
    };
    engine.bounded(statement_timeout, max_connections, &name)
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
