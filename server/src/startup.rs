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
use dedup_engine::console::{console_store, engine_pool};
use dedup_engine::{
    Broker, Engine, EngineBuilder, EngineHandle, EnginePool, HandlerRegistry, HealthProbes, PoolSettings,
};
use dedup_example_orders as orders;
use metrics_exporter_prometheus::PrometheusHandle;
use sqlx::PgPool;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::config::{GroupConfig, Settings};

pub(crate) mod mysql;
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

/// The server's two pools (see [`dedup_engine::Schema`]): the host pool (the consumers'
/// transactions, the order example's tables) and the engine's (its schema alone).
pub struct Databases {
    /// The host pool.
    pub host: PgPool,
    /// The engine's pool.
    pub engine: PgPool,
}

impl Databases {
    /// Closes both pools.
    pub async fn close(self) {
        self.engine.close().await;
        self.host.close().await;
    }
}

/// Connects to PostgreSQL (creating the database if needed) with the server's pool.
///
/// Errors: PostgreSQL unreachable (names the service, the redacted URL and how to start it).
async fn connect(settings: &Settings) -> anyhow::Result<PgPool> {
    let statement_timeout = Some(Duration::from_millis(settings.db_statement_timeout_ms)).filter(|t| !t.is_zero());
    let pool =
        PoolSettings { max_connections: settings.db_max_connections, statement_timeout, ..PoolSettings::default() };
    let url = settings.database_url.expose();
    dedup_engine::connect(url, &pool).await.map_err(crate::hints::with_hint)
}

/// Connects, applies the engine's migrations (in `schema`), verifies the dedup key, and opens
/// the engine's pool: what the operator and account commands need. They leave a team's database
/// without the order example's tables.
///
/// Errors: PostgreSQL unreachable, a failed migration, or a missing dedup UNIQUE constraint.
pub async fn open_database(settings: &Settings) -> anyhow::Result<Databases> {
    let host = connect(settings).await?;
    dedup_engine::migrate(&host, &settings.schema).await?;
    let engine = engine_pool(&host, &settings.schema, settings.engine_pool_size());
    Ok(Databases { host, engine })
}

/// The engine's database alone, migrated, for the commands that touch only the engine's tables
/// (`user`): on PostgreSQL the engine pool of [`open_database`]; on MySQL a pool on the database
/// named by `schema` (created if missing).
///
/// Errors: the database unreachable, a MySQL session not `READ COMMITTED` in UTC, a failed
/// migration.
pub async fn open_engine_database(settings: &Settings) -> anyhow::Result<EnginePool> {
    if settings.on_mysql() {
        let host = mysql::connect(settings).await?;
        let engine = dedup_engine::console::mysql_engine_pool(&host, &settings.schema, 2).await;
        host.close().await;
        return Ok(engine?.into());
    }
    let Databases { host, engine } = open_database(settings).await?;
    host.close().await;
    Ok(engine.into())
}

/// [`open_database`], plus the order example's migrations: what `migrate`, `simulate` and
/// `verify` need.
///
/// Errors: those of [`open_database`], or a failed migration of the example.
pub async fn open_database_with_example(settings: &Settings) -> anyhow::Result<Databases> {
    let databases = open_database(settings).await?;
    orders::migrate(&databases.host).await?;
    Ok(databases)
}

/// The engine of `settings` on the host pool `pool`, with `groups` bound to `example`'s handlers
/// (or their HTTP handlers).
///
/// Errors: a group whose handlers are not in `example`.
fn engine_builder(
    settings: &Settings,
    pool: impl Into<EnginePool>,
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
    /// Opens the database (the order example's migrations; the engine applies its own), checks
    /// Redis and the broker in the background without waiting for them (a warning, not a
    /// failure: the console serves at once, `/readyz` reports them down and the consumers keep
    /// reconnecting), starts the engine with the
    /// configured consumer groups bound to the order example's handlers, builds the router and
    /// binds the listener. `demo` turns on demo mode (see `serve --demo`).
    ///
    /// Errors: the configuration's groups, the database, the listener.
    pub async fn build(settings: Settings, demo: bool) -> anyhow::Result<Self> {
        let metrics = crate::telemetry::metrics_handle().clone();
        let groups = settings.consumer_groups().context("invalid consumer groups")?;
        if settings.on_mysql() {
            return Self::build_on_mysql(settings, groups, demo, metrics).await;
        }
        let auth = console_auth(&settings)?;
        let pool = connect(&settings).await?;
        // Groups with HTTP handlers alone need none of the order example's tables.
        let example_used = demo || groups.iter().any(GroupConfig::uses_example);
        if example_used {
            orders::migrate(&pool).await?;
        }
        let order_settings =
            if demo { orders::demo::demo_order_settings(&settings.orders) } else { settings.orders.clone() };
        let consume = settings.consumer.enabled;
        if consume && example_used {
            orders::stock_inventory(&pool, &order_settings).await?;
        }
        let example = orders::handlers(pool.clone(), &order_settings);
        let builder = engine_builder(&settings, pool.clone(), &groups, &example)?;

        let listener = bind(&settings).await?;
        let local_addr = listener.local_addr()?;
        let engine = builder.start().await?;
        let handle = engine.handle().clone();
        let probes = probes(&settings, handle.pool().clone(), &groups)?;
        warn_of_dependencies(&probes);
        let demo = demo.then(|| start_demo(&settings, &pool, &engine, &groups, order_settings));
        let (router, console_shutdown) = console(&settings, auth, handle, probes, metrics, local_addr).await?;
        let shutdown_timeout = Duration::from_millis(settings.shutdown_timeout_ms);
        Ok(Self { listener, router, pool: pool.into(), engine, demo, console_shutdown, shutdown_timeout })
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

/// What `serve --demo` runs besides the server: the simulated traffic and the crashing worker.
struct Demo {
    stop: CancellationToken,
    traffic: tokio::task::JoinHandle<()>,
    crashing_worker: Option<std::thread::JoinHandle<()>>,
}

impl Demo {
    /// Stops the traffic and kills the crashing worker.
    async fn stop(self) {
        self.stop.cancel();
        let _ = self.traffic.await;
        if let Some(thread) = self.crashing_worker {
            let _ = tokio::task::spawn_blocking(move || thread.join()).await;
        }
    }
}

/// Starts the demo: simulated orders published through the first group's broker to its
/// destination, reaching the groups there, and, when the engine consumes, the order example's
/// crashing worker ([`start_crashing_worker`]), until [`Demo::stop`].
fn start_demo(
    settings: &Settings,
    pool: &PgPool,
    engine: &Engine,
    groups: &[GroupConfig],
    order_settings: orders::OrderSettings,
) -> Demo {
    let stop = CancellationToken::new();
    let crashing_worker = settings
        .consumer
        .enabled
        .then(|| start_crashing_worker(settings, pool, groups, &order_settings, stop.clone()))
        .flatten();
    let first = engine.handle().groups().first().map(|g| g.source.clone());
    let destination = groups.first().map(GroupConfig::destination).unwrap_or_default();
    let reached = groups.iter().filter_map(|g| g.simulated(&destination)).collect();
    let ids = groups.first().map(|g| g.settings.ids.clone()).unwrap_or_default();
    let traffic = match first {
        Some(source) => tokio::spawn(orders::demo::run_demo_traffic(
            pool.clone(),
            source,
            reached,
            order_settings,
            ids,
            stop.clone(),
        )),
        None => tokio::spawn(async {}),
    };
    Demo { stop, traffic, crashing_worker }
}

/// The order example's crashing worker ([`orders::crashing_worker`]): one more worker in each
/// RabbitMQ group that handles `ORDER.NOTIFY`, killed mid-SMS now and then. `None` when no group
/// does (or its thread could not start).
fn start_crashing_worker(
    settings: &Settings,
    pool: &PgPool,
    groups: &[GroupConfig],
    order_settings: &orders::OrderSettings,
    stop: CancellationToken,
) -> Option<std::thread::JoinHandle<()>> {
    let notify: Vec<GroupConfig> = groups
        .iter()
        .filter(|g| {
            g.source == Broker::RabbitMq
                && g.handlers.as_ref().is_none_or(|types| types.iter().any(|t| t == "ORDER.NOTIFY"))
        })
        .map(|g| {
            let mut one = g.clone();
            one.settings.workers.concurrency = 1;
            one
        })
        .collect();
    if notify.is_empty() {
        return None;
    }
    let (schema, redis, fast_path) =
        (settings.schema.clone(), settings.redis_url.expose().to_owned(), settings.fast_path.clone());
    let amqp = settings.amqp_url.expose().to_owned();
    let start: orders::crashing_worker::StartEngine = Arc::new(move |pool, handlers| {
        let (groups, schema, redis, fast_path, amqp) =
            (notify.clone(), schema.clone(), redis.clone(), fast_path.clone(), amqp.clone());
        Box::pin(async move {
            let mut builder = Engine::builder(pool).schema(schema).redis(redis).fast_path(fast_path).pool_size(2);
            for group in &groups {
                builder = builder.group(group.engine_group(&amqp, &handlers)?);
            }
            Ok(builder.start().await?)
        })
    });
    let options = (*pool.connect_options()).clone();
    match orders::crashing_worker::spawn_crashing_worker(options, order_settings.clone(), start, stop) {
        Ok(thread) => Some(thread),
        Err(e) => {
            tracing::warn!(error = %e, "demo: the crashing worker did not start");
            None
        }
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
