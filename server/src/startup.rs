//! Building and running the server: database, dependency checks, engine, router, listener.
//!
//! [`Application::build`] does everything that can fail at start (so errors surface before the
//! port opens); [`Application::run_until_stopped`] serves until the shutdown signal, then stops
//! the engine (in-flight deliveries finish and are acked). Tests build an application on port 0
//! and read [`Application::port`].

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use axum::Router;
use dedup_app::ssr::ConsoleState;
use dedup_engine::db::{self, PoolSettings};
use dedup_engine::health::HealthProbes;
use dedup_engine::message::Broker;
use dedup_engine::runtime::Engine;
use futures::FutureExt;
use leptos::prelude::LeptosOptions;
use sqlx::PgPool;
use tokio::net::TcpListener;
use tower_sessions::ExpiredDeletion;

use crate::config::Settings;
use crate::routes;

/// State shared by the axum handlers.
#[derive(Clone)]
pub struct AppState {
    /// Leptos rendering options (site root, output name).
    pub leptos_options: LeptosOptions,
    /// What the console's server functions get as context.
    pub console: ConsoleState,
    /// The server's settings.
    pub settings: Arc<Settings>,
}

impl axum::extract::FromRef<AppState> for LeptosOptions {
    fn from_ref(state: &AppState) -> Self {
        state.leptos_options.clone()
    }
}

/// A built, not yet running server.
pub struct Application {
    listener: TcpListener,
    router: Router,
    pool: PgPool,
    engine: Engine,
    session_cleanup: tokio::task::JoinHandle<()>,
}

/// Connects to PostgreSQL (creating the database if needed), applies migrations and verifies
/// the schema.
///
/// Errors: PostgreSQL unreachable (names the service, the redacted URL and how to start it), a
/// failed migration, or a missing dedup UNIQUE constraint.
pub async fn open_database(settings: &Settings) -> anyhow::Result<PgPool> {
    let pool = db::connect(
        settings.database_url.expose(),
        &PoolSettings { max_connections: settings.db_max_connections, ..PoolSettings::default() },
    )
    .await?;
    db::migrate(&pool).await?;
    Ok(pool)
}

impl Application {
    /// Opens the database, checks Redis and the broker (RabbitMQ, or Kafka when it is the
    /// consumer's source; a warning, not a failure: the console still serves, `/readyz` reports
    /// them down and the consumer keeps reconnecting), starts
    /// the engine, builds the router and binds the listener.
    /// `demo` turns on demo mode (see `serve --demo`).
    pub async fn build(settings: Settings, demo: bool) -> anyhow::Result<Self> {
        crate::telemetry::metrics_handle();
        let pool = open_database(&settings).await?;
        let mut probes = HealthProbes::new(
            pool.clone(),
            settings.database_url.expose(),
            settings.redis_url.expose(),
            settings.amqp_url.expose(),
            Duration::from_millis(settings.probe_timeout_ms),
        );
        if settings.consumer.source == Broker::Kafka {
            probes = probes.with_kafka(&settings.consumer.kafka.brokers)?;
        }
        let (redis, broker) = tokio::join!(probes.check_redis(), probes.check_broker());
        for dependency in [redis, broker] {
            if let Some(error) = dependency.error {
                tracing::warn!(service = dependency.service, "{error}");
            }
        }

        let listener = TcpListener::bind(settings.listen)
            .await
            .with_context(|| format!("cannot listen on {}", settings.listen))?;
        let local_addr = listener.local_addr()?;
        let engine = Engine::start(pool.clone(), settings.engine_config(demo)).await?;
        let leptos_options = LeptosOptions::builder()
            .output_name("dedup-console")
            .site_root(settings.site_root.to_string_lossy().into_owned())
            .site_pkg_dir("pkg")
            .site_addr(local_addr)
            .env(leptos::config::Env::PROD)
            .build();
        let console = ConsoleState {
            probes,
            pool: pool.clone(),
            fast_path: engine.fast_path.clone(),
            source: engine.source.clone(),
            consumer: engine.consumer_status().cloned(),
            group: settings.consumer.group.clone(),
        };
        let sessions = crate::auth::session::store(&pool).await?;
        let session_cleanup = tokio::spawn(
            sessions.clone().continuously_delete_expired(crate::auth::session::CLEANUP_PERIOD).map(|result| {
                if let Err(e) = result {
                    tracing::warn!(error = %e, "deleting expired sessions failed; no more cleanup until restart");
                }
            }),
        );
        let state = AppState { leptos_options, console, settings: Arc::new(settings) };
        let router = routes::router(state, sessions);
        tracing::info!("console listening on http://{local_addr}");
        Ok(Self { listener, router, pool, engine, session_cleanup })
    }

    /// The port the listener is bound to (useful with port 0).
    pub fn port(&self) -> u16 {
        self.listener.local_addr().map(|a| a.port()).unwrap_or_default()
    }

    /// Serves until `shutdown` resolves, then stops the engine (the consumer finishes and acks
    /// its in-flight batches), lets in-flight requests finish and closes the database pool.
    /// Stopping the engine is bounded by [`ENGINE_STOP_TIMEOUT`] and closing the pool by
    /// [`POOL_CLOSE_TIMEOUT`] (sqlx waits for every checked-out connection): past them the
    /// process exits anyway, with a warning — what was not acked is redelivered, the database
    /// decides.
    pub async fn run_until_stopped(self, shutdown: impl Future<Output = ()> + Send + 'static) -> anyhow::Result<()> {
        let service = self.router.into_make_service_with_connect_info::<std::net::SocketAddr>();
        axum::serve(self.listener, service).with_graceful_shutdown(shutdown).await?;
        self.session_cleanup.abort();
        if tokio::time::timeout(ENGINE_STOP_TIMEOUT, self.engine.stop()).await.is_err() {
            tracing::warn!(
                timeout_s = ENGINE_STOP_TIMEOUT.as_secs(),
                "the engine did not stop in time; exiting anyway"
            );
        }
        if tokio::time::timeout(POOL_CLOSE_TIMEOUT, self.pool.close()).await.is_err() {
            tracing::warn!(
                timeout_s = POOL_CLOSE_TIMEOUT.as_secs(),
                "database connections still checked out at shutdown; exiting anyway"
            );
        }
        tracing::info!("stopped");
        Ok(())
    }
}

/// Longest wait for the engine to stop at shutdown (in-flight batches finish and are acked).
pub const ENGINE_STOP_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);
/// Longest wait for the database pool to close at shutdown.
pub const POOL_CLOSE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);
