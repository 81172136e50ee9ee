//! `serve` and the commands on PostgreSQL: the server's two pools ([`Databases`]), the engine
//! with the order example's PostgreSQL handlers, and the demo (`serve --demo`, PostgreSQL only so
//! far).

use std::sync::Arc;
use std::time::Duration;

use dedup_engine::{Broker, Engine, EnginePool, PoolSettings};
use dedup_example_orders as orders;
use metrics_exporter_prometheus::PrometheusHandle;
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

use super::{Application, Demo, bind, console, console_auth, engine_builder, probes, warn_of_dependencies};
use crate::config::{GroupConfig, Settings};

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
    let engine = dedup_engine::console::engine_pool(&host, &settings.schema, settings.engine_pool_size());
    Ok(Databases { host, engine })
}

/// The engine's pool of [`open_database`], for the commands that touch only the engine's tables
/// ([`super::open_engine_database`]).
///
/// Errors: those of [`open_database`].
pub(crate) async fn open_engine_database(settings: &Settings) -> anyhow::Result<EnginePool> {
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

impl Application {
    /// [`Application::build`] on PostgreSQL: the order example's tables (when a group uses its
    /// handlers, or in demo mode), the engine, the console, and the demo when asked for.
    ///
    /// Errors: the database, the listener.
    pub(super) async fn build_on_postgres(
        settings: Settings,
        groups: Vec<GroupConfig>,
        demo: bool,
        metrics: PrometheusHandle,
    ) -> anyhow::Result<Self> {
        let auth = console_auth(&settings)?;
        let pool = connect(&settings).await?;
        // Groups with HTTP handlers alone need none of the order example's tables, nor does a
        // console whose consumer is off.
        let consume = settings.consumer.enabled;
        let example_used = demo || (consume && groups.iter().any(GroupConfig::uses_example));
        if example_used {
            orders::migrate(&pool).await?;
        }
        let order_settings =
            if demo { orders::demo::demo_order_settings(&settings.orders) } else { settings.orders.clone() };
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
