//! The engine as a running service: the consumer, the fast path, the aggregate flusher and the
//! bulk-requeue and cleanup schedulers, started together and stopped together. The server embeds one [`Engine`]; the CLI's
//! `simulate` uses its pieces.

use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use sqlx::PgPool;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::consumer::{Consumer, ConsumerSettings, ConsumerStatus};
use crate::fastpath::{FastPath, FastPathSettings};
use crate::message::{Broker, IdPolicy};
use crate::orders::{self, OrderSettings};
use crate::pipeline::{Pipeline, PipelineSettings};
use crate::record::ConsumerGroup;
use crate::retry::Backoff;
use crate::source::SourceFactory;
use crate::source::kafka::{KafkaConnector, KafkaSettings};
use crate::source::rabbitmq::{RabbitConnector, RabbitSettings};
use crate::stats::{self, Stats};
use crate::store::postgres::PgStore;

/// The embedded consumer's settings (`[consumer]` in the configuration file).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ConsumerConfig {
    /// Run the consumer inside `serve`. Default true.
    pub enabled: bool,
    /// The consumer group its records are scoped to. Default `order-service`.
    pub group: String,
    /// Attempts before a record goes dead. Default 5.
    pub max_attempts: i32,
    /// Lease of each claim, in ms (raised to 1000). Default 30000.
    pub lease_ms: u64,
    /// Largest part of a poison payload kept on its record, in bytes. Default 65536.
    pub keep_poison_payload_bytes: usize,
    /// Workers, batching, reconnect back-off.
    pub workers: ConsumerSettings,
    /// The broker consumed from: `rabbitmq` (default) or `kafka`.
    pub source: Broker,
    /// Exchange, queues, prefetch, dead letters (when `source = "rabbitmq"`).
    pub rabbitmq: RabbitSettings,
    /// Brokers, group, topics, fetch limits, back-pressure (when `source = "kafka"`).
    pub kafka: KafkaSettings,
    /// Retry back-off.
    pub backoff: Backoff,
    /// Where message ids are found; the payload size limit.
    pub ids: IdPolicy,
}

impl Default for ConsumerConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            group: "order-service".to_owned(),
            max_attempts: 5,
            lease_ms: 30_000,
            keep_poison_payload_bytes: 64 * 1024,
            workers: ConsumerSettings::default(),
            source: Broker::RabbitMq,
            rabbitmq: RabbitSettings::default(),
            kafka: KafkaSettings::default(),
            backoff: Backoff::default(),
            ids: IdPolicy::default(),
        }
    }
}

impl ConsumerConfig {
    /// The Kafka connector of these settings (whatever `source` says): group `kafka.group_id`,
    /// else `group`; message ids published in the `ids.header` (default `x-message-id`).
    pub fn kafka_connector(&self) -> KafkaConnector {
        let id_header = self.ids.header.as_deref().unwrap_or("x-message-id");
        KafkaConnector::new(self.kafka.clone(), &self.group, self.backoff.clone(), id_header)
    }

    /// The source factory of `source`: the RabbitMQ connector at `amqp_url`, or Kafka.
    pub fn source_factory(&self, amqp_url: &str) -> Arc<dyn SourceFactory> {
        match self.source {
            Broker::RabbitMq => Arc::new(RabbitConnector::new(amqp_url, self.rabbitmq.clone(), self.backoff.clone())),
            Broker::Kafka => Arc::new(self.kafka_connector()),
        }
    }
}

/// Everything the engine needs to start.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// RabbitMQ URL.
    pub amqp_url: String,
    /// Redis URL.
    pub redis_url: String,
    /// The consumer.
    pub consumer: ConsumerConfig,
    /// The fast path.
    pub fast_path: FastPathSettings,
    /// The order domain.
    pub orders: OrderSettings,
    /// How often in-memory aggregates are written to the database.
    pub stats_flush: Duration,
    /// Demo mode: publish simulated orders in the background, make some NOTIFY sends crash.
    pub demo: bool,
}

/// A running engine.
pub struct Engine {
    /// The dedup store.
    pub store: PgStore,
    /// The Redis fast path.
    pub fast_path: Arc<FastPath>,
    /// In-memory aggregates.
    pub stats: Arc<Stats>,
    /// The RabbitMQ connection (also used to publish: requeue, drills).
    pub connector: Arc<RabbitConnector>,
    /// The source the consumer reads from (`consumer.source`): the RabbitMQ connector above, or
    /// Kafka. Its depth is the queue depth or the group's lag; it publishes requeues too.
    pub source: Arc<dyn SourceFactory>,
    consumer_status: Option<Arc<ConsumerStatus>>,
    shutdown: CancellationToken,
    tasks: Vec<JoinHandle<()>>,
}

impl Engine {
    /// Starts the engine on a migrated pool: stocks the order domain, starts the consumer
    /// (when enabled) and the aggregate flusher. Does not wait for RabbitMQ or Redis: the
    /// consumer connects (and reconnects) in the background.
    ///
    /// Errors: an invalid consumer group name, or the inventory could not be stocked.
    pub async fn start(pool: PgPool, config: EngineConfig) -> anyhow::Result<Self> {
        let store = PgStore::new(pool.clone());
        let fast_path = Arc::new(FastPath::new(&config.redis_url, config.fast_path.clone()));
        let stats = Arc::new(Stats::default());
        let c = &config.consumer;
        let connector = Arc::new(RabbitConnector::new(&config.amqp_url, c.rabbitmq.clone(), c.backoff.clone()));
        let source: Arc<dyn SourceFactory> = match c.source {
            Broker::RabbitMq => connector.clone(),
            Broker::Kafka => c.source_factory(&config.amqp_url),
        };
        let shutdown = CancellationToken::new();
        let mut tasks = Vec::new();

        tasks.push(tokio::spawn(run_stats_flusher(
            pool.clone(),
            store.clone(),
            stats.clone(),
            config.stats_flush,
            shutdown.clone(),
        )));

        let order_settings =
            if config.demo { orders::demo::demo_order_settings(&config.orders) } else { config.orders.clone() };
        if config.demo {
            tasks.push(tokio::spawn(orders::demo::run_demo_traffic(
                pool.clone(),
                source.clone(),
                c.group.clone(),
                order_settings.clone(),
                c.ids.clone(),
                shutdown.clone(),
            )));
        }
        tasks.push(tokio::spawn(crate::actions::bulk::runner::supervise(
            pool.clone(),
            source.clone(),
            shutdown.clone(),
        )));
        tasks.push(tokio::spawn(crate::actions::cleanup::scheduler::supervise(pool.clone(), shutdown.clone())));
        let mut consumer_status = None;
        if c.enabled {
            orders::stock_inventory(&pool, &order_settings).await?;
            let pipeline = Pipeline::new(
                store.clone(),
                fast_path.clone(),
                stats.clone(),
                orders::order_handlers(pool.clone(), &order_settings),
                PipelineSettings {
                    group: ConsumerGroup::parse(c.group.clone())?,
                    max_attempts: c.max_attempts.max(1),
                    lease: Duration::from_millis(c.lease_ms),
                    backoff: c.backoff.clone(),
                    id_policy: c.ids.clone(),
                    keep_poison_payload_bytes: c.keep_poison_payload_bytes,
                },
            );
            let consumer = Consumer::new(pipeline, source.clone(), c.workers.clone());
            consumer_status = Some(consumer.status());
            tasks.push(tokio::spawn(consumer.run(shutdown.clone())));
        }
        Ok(Self { store, fast_path, stats, connector, source, consumer_status, shutdown, tasks })
    }

    /// The consumer's status, when it runs.
    pub fn consumer_status(&self) -> Option<&Arc<ConsumerStatus>> {
        self.consumer_status.as_ref()
    }

    /// Stops the consumer (in-flight batches finish and are acked or committed), flushes the
    /// aggregates, closes the broker connections.
    pub async fn stop(self) {
        self.shutdown.cancel();
        for task in self.tasks {
            let _ = task.await;
        }
        self.connector.close().await;
        self.source.close().await;
    }
}

/// Flushes the in-memory aggregates and folds the record counts' delta rows every `period`,
/// samples the table size every minute, until shutdown (then flushes once more).
async fn run_stats_flusher(
    pool: PgPool,
    store: PgStore,
    stats: Arc<Stats>,
    period: Duration,
    shutdown: CancellationToken,
) {
    let mut ticker = tokio::time::interval(period.max(Duration::from_millis(10)));
    let mut last_sample: Option<tokio::time::Instant> = None;
    loop {
        let stopping = tokio::select! {
            () = shutdown.cancelled() => true,
            _ = ticker.tick() => false,
        };
        if let Err(e) = stats.flush(&pool, &store).await {
            tracing::warn!(error = %e, "flushing aggregates failed; will retry");
        }
        if let Err(e) = stats::fold_record_counts(&pool).await {
            tracing::warn!(error = %e, "folding the record counts failed; will retry");
        }
        if last_sample.is_none_or(|at| at.elapsed() >= Duration::from_secs(60)) {
            if let Err(e) = stats::sample_table(&pool).await {
                tracing::warn!(error = %e, "sampling the table size failed");
            }
            last_sample = Some(tokio::time::Instant::now());
        }
        if stopping {
            return;
        }
    }
}
