//! Building and running the server: database, dependency checks, engine, router, listener.
//!
//! [`Application::build`] does everything that can fail at start (so errors surface before the
//! port opens); [`Application::run_until_stopped`] serves until the shutdown signal, then stops
//! within the stop bound (in-flight deliveries finish and are acked, or are left to the broker's
//! redelivery). Tests build an application on port 0
//! and read [`Application::port`].

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use axum::Router;
use axum::serve::ListenerExt;
use dedup_engine::console::console_store;
use dedup_engine::{
    Broker, ConnectError, Engine, EngineBuilder, EngineHandle, EnginePool, HandlerRegistry, HealthProbes, PoolSettings,
};
use dedup_example_orders as orders;
use metrics_exporter_prometheus::PrometheusHandle;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::config::{GroupConfig, Settings};

mod demo;
use demo::Demo;

use dedup_app::ssr::mount::AuthMode;
use dedup_app::ssr::mount::{ConsoleAuth, ConsoleConfig, console_router, mount};

/// A built, not yet running server.
pub struct Application {
    listener: TcpListener,
    router: Router,
    /// The host pool (PostgreSQL or MySQL).
    pool: EnginePool,
    engine: Engine,
    demo: Option<Demo>,
    /// The console's shutdown token: cancelled when the shutdown signal comes.
    console_shutdown: CancellationToken,
    /// The stop bound, from the shutdown signal to the exit (`shutdown_timeout_ms`).
    shutdown_timeout: Duration,
}

/// Connects to `settings.database_url` with the server's pool: PostgreSQL, or MySQL 8 or
/// MariaDB for a `mysql://` or `mariadb://` URL ([`EnginePool::connect`], which creates the
/// database if it is missing).
///
/// Errors: the database unreachable (names it, the redacted URL and how to start it).
pub(crate) async fn connect(settings: &Settings) -> anyhow::Result<EnginePool> {
    let statement_timeout = Some(Duration::from_millis(settings.db_statement_timeout_ms)).filter(|t| !t.is_zero());
    let pool =
        PoolSettings { max_connections: settings.db_max_connections, statement_timeout, ..PoolSettings::default() };
    EnginePool::connect(settings.database_url.expose(), &pool).await.map_err(|e| match e {
        ConnectError::Unreachable(e) => crate::hints::with_hint(e),
        other => other.into(),
    })
}

/// The engine's pool alone, its tables migrated, for the commands that touch only the engine's
/// tables (`user`, the operator commands, `cleanup`): on PostgreSQL its schema `schema`, on
/// MySQL the database `schema` (created if missing).
///
/// Errors: the database unreachable, a MySQL session not `READ COMMITTED` in UTC, a failed
/// migration.
pub async fn open_engine_database(settings: &Settings) -> anyhow::Result<EnginePool> {
    let host = connect(settings).await?;
    let engine = host.open_engine_pool(&settings.schema, settings.engine_pool_size()).await;
    host.close().await;
    Ok(engine?)
}

/// The engine of `settings` on the host pool `pool`, with `groups` bound to `example`'s handlers
/// (or their HTTP handlers).
///
/// Errors: a group whose handlers are not in `example`.
fn engine_builder(
    settings: &Settings,
    pool: EnginePool,
    groups: &[GroupConfig],
    example: &HandlerRegistry,
) -> anyhow::Result<EngineBuilder> {
    let mut builder = Engine::builder(pool)
        .schema(settings.schema.clone())
        .redis(settings.redis_url.expose())
        .fast_path(settings.fast_path.clone())
        .stats_flush(Duration::from_millis(settings.stats_flush_ms))
        .pool_size(settings.engine_pool_size())
        .consume(settings.consumer.enabled);
    for group in groups {
        builder = builder.group(group.engine_group(settings.amqp_url.expose(), example)?);
    }
    Ok(builder)
}

/// The listener on `settings.listen`.
///
/// Errors: the address is taken or not ours.
async fn bind(settings: &Settings) -> anyhow::Result<TcpListener> {
    TcpListener::bind(settings.listen).await.with_context(|| format!("cannot listen on {}", settings.listen))
}

/// Probes Redis and the broker in the background and warns of those down: the server serves at
/// once, and `/readyz` probes on its own.
fn warn_of_dependencies(probes: &HealthProbes) {
    tokio::spawn({
        let probes = probes.clone();
        async move {
            let (redis, broker) = tokio::join!(probes.check_redis(), probes.check_broker());
            for dependency in [redis, broker] {
                if let Some(error) = dependency.error {
                    tracing::warn!(service = dependency.service, "{error}");
                }
            }
        }
    });
}

/// The health probes: the database on `pool`, Redis, and the broker of the first group.
///
/// Errors: an invalid Kafka client configuration.
fn probes(settings: &Settings, pool: impl Into<EnginePool>, groups: &[GroupConfig]) -> anyhow::Result<HealthProbes> {
    let probes = HealthProbes::new(
        pool,
        settings.database_url.expose(),
        settings.redis_url.expose(),
        Duration::from_millis(settings.probe_timeout_ms),
    )
    .with_start_hints(crate::hints::start_hint);
    Ok(match groups.first() {
        Some(g) if g.source == Broker::Kafka => probes.with_kafka(&g.kafka.brokers)?,
        _ => probes.with_rabbitmq(settings.amqp_url.expose()),
    })
}

impl Application {
    /// Opens the database — PostgreSQL, or MySQL with a `mysql://` URL — and applies the order
    /// example's migrations where its handlers will run (a group uses them and the consumer is
    /// on) or in demo mode (the engine applies its own), checks Redis and the broker in the
    /// background without waiting for them (a warning, not a failure: the console serves at
    /// once, `/readyz` reports them down and the consumers keep reconnecting), starts the
    /// engine with the configured consumer groups bound to the order example's handlers (or
    /// their HTTP handlers), builds the router and binds the listener. `demo` turns on demo
    /// mode (see `serve --demo`), on either database.
    ///
    /// Errors: the configuration's groups, the database, the listener.
    pub async fn build(settings: Settings, demo: bool) -> anyhow::Result<Self> {
        let metrics = crate::telemetry::metrics_handle().clone();
        let groups = settings.consumer_groups().context("invalid consumer groups")?;
        let auth = console_auth(&settings)?;
        let pool = connect(&settings).await?;
        let shop = orders::ShopPool::on(&pool, &settings.schema)?;
        // Groups with HTTP handlers alone need none of the order example's tables, nor does a
        // console whose consumer is off; the demo records its traffic's runs in them.
        let consume = settings.consumer.enabled;
        let example_used = demo || (consume && groups.iter().any(GroupConfig::uses_example));
        if example_used {
            shop.migrate().await?;
        }
        let order_settings =
            if demo { orders::demo::demo_order_settings(&settings.orders) } else { settings.orders.clone() };
        if consume && example_used {
            shop.stock_inventory(&order_settings).await?;
        }
        let example = shop.handlers(&order_settings);
        let builder = engine_builder(&settings, pool.clone(), &groups, &example)?;

        let listener = bind(&settings).await?;
        let local_addr = listener.local_addr()?;
        let engine = builder.start().await?;
        let handle = engine.handle().clone();
        let served = async {
            let probes = probes(&settings, handle.pool().clone(), &groups)?;
            warn_of_dependencies(&probes);
            console(&settings, auth, handle, probes, metrics, local_addr).await
        };
        let (router, console_shutdown) = match served.await {
            Ok(served) => served,
            Err(e) => {
                engine.stop().await; // its consumers would otherwise run on in a host's runtime
                return Err(e);
            }
        };
        let demo = demo.then(|| Demo::start(&settings, &shop, &engine, &groups, order_settings));
        let shutdown_timeout = Duration::from_millis(settings.shutdown_timeout_ms);
        Ok(Self { listener, router, pool, engine, demo, console_shutdown, shutdown_timeout })
    }

    /// The port the listener is bound to (useful with port 0).
    pub fn port(&self) -> u16 {
        self.listener.local_addr().map(|a| a.port()).unwrap_or_default()
    }

    /// Serves until `shutdown` resolves, then stops within the stop bound
    /// (`shutdown_timeout_ms`, counted from the signal): requests in flight finish, then the demo
    /// and the engine stop (the consumer finishes and acks its in-flight batches), then the
    /// database pool closes (sqlx waits for every checked-out connection). What is still running
    /// at the bound — a request or a batch waiting on a database that went away — is dropped with
    /// a warning and the process exits: a batch that did not commit was not acked, so the broker
    /// redelivers it and the database decides.
    pub async fn run_until_stopped(self, shutdown: impl Future<Output = ()> + Send + 'static) -> anyhow::Result<()> {
        let service = self.router.into_make_service_with_connect_info::<std::net::SocketAddr>();
        let console_shutdown = self.console_shutdown.clone();
        let signalled = Arc::new(std::sync::OnceLock::new());
        let shutdown = {
            let signalled = signalled.clone();
            async move {
                shutdown.await;
                let _ = signalled.set(tokio::time::Instant::now());
                console_shutdown.cancel(); // open console tabs' event streams end now
            }
        };
        // Pages go out in several writes (streamed HTML, compression): with Nagle's algorithm a
        // client's delayed ACK holds the last one back about 40 ms.
        let listener = self.listener.tap_io(|tcp| {
            if let Err(e) = tcp.set_nodelay(true) {
                tracing::debug!(error = %e, "TCP_NODELAY not set");
            }
        });
        let serve = axum::serve(listener, service).with_graceful_shutdown(shutdown).into_future();
        let bound = self.shutdown_timeout;
        let signal_seen = self.console_shutdown.clone();
        let drain_bound = async move {
            signal_seen.cancelled().await;
            tokio::time::sleep(bound).await;
        };
        tokio::select! {
            served = serve => served?,
            () = drain_bound => tracing::warn!(timeout_ms = bound.as_millis(), "requests still in flight at the stop bound; dropped"),
        }
        let deadline = signalled.get().copied().unwrap_or_else(tokio::time::Instant::now) + bound;
        let engine = async {
            if let Some(demo) = self.demo {
                demo.stop().await;
            }
            self.engine.stop().await;
        };
        if tokio::time::timeout_at(deadline, engine).await.is_err() {
            tracing::warn!(
                timeout_ms = bound.as_millis(),
                "the engine did not stop within the stop bound; exiting anyway (what was not acked is redelivered)"
            );
        }
        if tokio::time::timeout_at(deadline, self.pool.close()).await.is_err() {
            tracing::warn!(
                timeout_ms = bound.as_millis(),
                "database connections still checked out at the stop bound; exiting anyway"
            );
        }
        tracing::info!("stopped");
        Ok(())
    }
}

/// Warns when the database has no console account yet: nobody can sign in until one is added
/// from the command line (a team's own configuration starts on an empty database).
async fn warn_without_accounts(pool: &EnginePool) {
    match console_store(pool).user_list().await {
        Ok(users) if users.is_empty() => tracing::warn!(
            "no console account yet, so nobody can sign in: add the first with `dedup-console user add admin --role \
             admin` (password from DEDUP_USER_PASSWORD or stdin; the same --config or DEDUP_CONFIG as serve)"
        ),
        Ok(_) => {}
        Err(e) => tracing::warn!(error = %e, "listing the console's accounts failed"),
    }
}

/// Who may use the console `settings` describe.
///
/// Errors: `auth.mode = "off"` on an address other than loopback.
fn console_auth(settings: &Settings) -> anyhow::Result<ConsoleAuth> {
    Ok(match settings.auth.mode {
        AuthMode::Accounts => ConsoleAuth::Accounts(settings.auth.clone()),
        AuthMode::Off if settings.listen.ip().is_loopback() => ConsoleAuth::Off,
        AuthMode::Off => anyhow::bail!(
            "refusing to start: auth.mode = \"off\" serves the console without sign-in, which is allowed on a \
             loopback address only, and listen = {} is not one; use auth.mode = \"accounts\", or listen on \
             127.0.0.1",
            settings.listen
        ),
    })
}

/// The console for the engine `handle`, as `settings` configure it, mounted at its base path;
/// and the token that ends its open event streams. Warns when no account can sign in yet.
///
/// Errors: [`console_router`]'s.
async fn console(
    settings: &Settings,
    auth: ConsoleAuth,
    handle: EngineHandle,
    probes: HealthProbes,
    metrics: PrometheusHandle,
    local_addr: std::net::SocketAddr,
) -> anyhow::Result<(Router, CancellationToken)> {
    let config = ConsoleConfig {
        site_root: settings.site_root.clone(),
        base_path: settings.console.base_path.clone(),
        auth,
        read_only: settings.console.read_only,
        https: false, // `auth.secure_cookies` implies it.
        request_timeout: Duration::from_millis(settings.request_timeout_ms),
        statement_timeout: Duration::from_millis(settings.console.statement_timeout_ms),
        pool_size: settings.console.max_connections,
        max_body_bytes: settings.max_body_bytes,
        metrics: Some(metrics),
        shutdown: CancellationToken::new(),
    };
    let console_shutdown = config.shutdown.clone();
    let base = config.base();
    let pool = handle.pool().clone();
    let console = console_router(handle, probes, config).await?;
    tracing::info!("console listening on http://{local_addr}{}/", base.as_str());
    if settings.auth.mode == AuthMode::Accounts {
        warn_without_accounts(&pool).await;
    }
    Ok((mount(Router::new(), base.as_str(), console), console_shutdown))
}
