//! What `serve --demo` runs besides the server, on PostgreSQL or MySQL alike: the order
//! example's simulated traffic and its crashing worker, on the server's [`ShopPool`].

use std::sync::Arc;

use dedup_engine::{Broker, Engine};
use dedup_example_orders as orders;
use orders::ShopPool;
use tokio_util::sync::CancellationToken;

use crate::config::{GroupConfig, Settings};

/// The running demo: the simulated traffic and the crashing worker.
pub(super) struct Demo {
    stop: CancellationToken,
    traffic: tokio::task::JoinHandle<()>,
    crashing_worker: Option<std::thread::JoinHandle<()>>,
}

impl Demo {
    /// Starts the demo: simulated orders published through the first group's broker to its
    /// destination, reaching the groups there, each run recorded in `shop`, and, when the
    /// engine consumes, the order example's crashing worker ([`start_crashing_worker`]), until
    /// [`Demo::stop`].
    pub(super) fn start(
        settings: &Settings,
        shop: &ShopPool,
        engine: &Engine,
        groups: &[GroupConfig],
        order_settings: orders::OrderSettings,
    ) -> Self {
        let stop = CancellationToken::new();
        let crashing_worker = settings
            .consumer
            .enabled
            .then(|| start_crashing_worker(settings, shop, groups, &order_settings, stop.clone()))
            .flatten();
        let first = engine.handle().groups().first().map(|g| g.source.clone());
        let destination = groups.first().map(GroupConfig::destination).unwrap_or_default();
        let reached = groups.iter().filter_map(|g| g.simulated(&destination)).collect();
        let ids = groups.first().map(|g| g.settings.ids.clone()).unwrap_or_default();
        let traffic = match first {
            Some(source) => tokio::spawn(orders::demo::run_demo_traffic(
                shop.clone(),
                source,
                reached,
                order_settings,
                ids,
                stop.clone(),
            )),
            None => tokio::spawn(async {}),
        };
        Self { stop, traffic, crashing_worker }
    }

    /// Stops the traffic and kills the crashing worker.
    pub(super) async fn stop(self) {
        self.stop.cancel();
        let _ = self.traffic.await;
        if let Some(thread) = self.crashing_worker {
            let _ = tokio::task::spawn_blocking(move || thread.join()).await;
        }
    }
}

/// The order example's crashing worker ([`orders::crashing_worker`]): one more worker in each
/// RabbitMQ group that handles `ORDER.NOTIFY`, on a pool of its own made as `shop`'s, killed
/// mid-SMS now and then. `None` when no group does (or its thread could not start).
fn start_crashing_worker(
    settings: &Settings,
    shop: &ShopPool,
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
    match orders::crashing_worker::spawn_crashing_worker(shop.clone(), order_settings.clone(), start, stop) {
        Ok(thread) => Some(thread),
        Err(e) => {
            tracing::warn!(error = %e, "demo: the crashing worker did not start");
            None
        }
    }
}
