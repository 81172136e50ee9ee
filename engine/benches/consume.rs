//! Consumption throughput on the same broker, queue settings and prefetch, in one run:
//!
//! 1. raw: consume + ack with an empty handler (the broker's ceiling for this setup);
//! 2. idempotent: the full pipeline — Redis lookup, PostgreSQL claim in the business
//!    transaction (one transaction per batch, a savepoint per message), Redis marker, ack;
//! 3. duplicates caught by Redis (the same messages again);
//! 4. duplicates caught by the database (again, Redis unreachable).
//!
//! Run: `cargo bench -p dedup-engine --bench consume [-- MESSAGES [WORKERS [BATCH]]]`
//! (defaults 20000, 4, 100). Needs the local PostgreSQL, Redis and RabbitMQ. Prints a report.

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use dedup_engine::fastpath::{FastPath, FastPathSettings};
use dedup_engine::handler::{Handler, HandlerError, HandlerInput, HandlerRegistry, TransactionalHandler};
use dedup_engine::message::IdPolicy;
use dedup_engine::pipeline::{AckReason, Disposition, Pipeline, PipelineSettings};
use dedup_engine::record::ConsumerGroup;
use dedup_engine::retry::Backoff;
use dedup_engine::source::SourceFactory;
use dedup_engine::source::rabbitmq::properties_for;
use dedup_engine::stats::Stats;
use dedup_engine::store::postgres::PgStore;
use dedup_engine::testing::{TestBroker, TestDatabase, amqp_url, redis_url};
use futures::StreamExt;
use futures::stream::FuturesUnordered;
use sqlx::PgConnection;

/// The business change of the idempotent phase: one row per message.
struct InsertRow;

#[async_trait]
impl TransactionalHandler for InsertRow {
    async fn handle(&self, input: &HandlerInput<'_>, tx: &mut PgConnection) -> Result<(), HandlerError> {
        sqlx::query("INSERT INTO bench_effects (message_id) VALUES ($1)").bind(input.message_id.as_str()).execute(tx).await?;
        Ok(())
    }
}

struct Phase {
    name: &'static str,
    messages: usize,
    elapsed: Duration,
    /// Time spent inside `Pipeline::process` (summed over workers).
    pipeline: Duration,
}

impl Phase {
    fn rate(&self) -> f64 {
        self.messages as f64 / self.elapsed.as_secs_f64()
    }
    fn pipeline_us_per_message(&self) -> f64 {
        self.pipeline.as_secs_f64() * 1e6 / self.messages as f64
    }
}

async fn publish(broker: &TestBroker, ids: &[String]) {
    let publisher = broker.connector().publisher().await.unwrap();
    let body = br#"{"orderNo":"1","amountCents":100}"#;
    let mut in_flight = FuturesUnordered::new();
    for id in ids {
        let props = properties_for(Some(id), &serde_json::Map::new(), Some("application/json"));
        in_flight.push(publisher.publish(&broker.settings.exchange, "bench", body, props));
        if in_flight.len() >= 512 {
            in_flight.next().await.unwrap().unwrap();
        }
    }
    while let Some(r) = in_flight.next().await {
        r.unwrap();
    }
}

/// Consumes `total` deliveries with `workers` sources; each batch goes through `pipeline`
/// (or is acked as is when `None`).
async fn consume(
    name: &'static str,
    broker: &TestBroker,
    pipeline: Option<Pipeline>,
    total: usize,
    workers: usize,
    batch: usize,
    expect: Option<AckReason>,
) -> Phase {
    let connector = broker.connector();
    let done = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let started = Instant::now();
    let tasks: Vec<_> = (0..workers)
        .map(|n| {
            let (connector, pipeline, done) = (connector.clone(), pipeline.clone(), done.clone());
            tokio::spawn(async move {
                let mut source = connector.open(n).await.unwrap();
                let mut in_pipeline = Duration::ZERO;
                while done.load(std::sync::atomic::Ordering::SeqCst) < total {
                    let next = tokio::time::timeout(Duration::from_millis(500), source.next_batch(batch, Duration::from_millis(2))).await;
                    let Ok(next) = next else { continue };
                    let deliveries = next.unwrap().unwrap();
                    let dispositions = match &pipeline {
                        Some(p) => {
                            let t = Instant::now();
                            let d = p.process(&format!("bench-{n}"), deliveries).await;
                            in_pipeline += t.elapsed();
                            if let Some(reason) = expect {
                                assert!(d.iter().all(|x| *x == Disposition::Ack(reason)), "{name}: {d:?}");
                            }
                            d
                        }
                        None => vec![Disposition::Ack(AckReason::Processed); deliveries.len()],
                    };
                    done.fetch_add(dispositions.len(), std::sync::atomic::Ordering::SeqCst);
                    source.settle(&dispositions).await.unwrap();
                }
                source.stop().await;
                in_pipeline
            })
        })
        .collect();
    let mut pipeline_time = Duration::ZERO;
    for t in tasks {
        pipeline_time += t.await.unwrap();
    }
    let elapsed = started.elapsed();
    connector.close().await;
    Phase { name, messages: total, elapsed, pipeline: pipeline_time }
}

fn pipeline(db: &TestDatabase, fast_path: Arc<FastPath>) -> Pipeline {
    let mut handlers = HandlerRegistry::new();
    handlers.register("BENCH.EVENT", Handler::Transactional(Arc::new(InsertRow)));
    Pipeline::new(
        PgStore::new(db.pool.clone()),
        fast_path,
        Arc::new(Stats::default()),
        handlers,
        PipelineSettings {
            group: ConsumerGroup::parse("bench").unwrap(),
            max_attempts: 5,
            lease: Duration::from_secs(30),
            backoff: Backoff::default(),
            id_policy: IdPolicy::default(),
            keep_poison_payload_bytes: 1024,
        },
    )
}

fn main() {
    let args: Vec<usize> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    let total = args.first().copied().unwrap_or(20_000);
    let workers = args.get(1).copied().unwrap_or(4);
    let batch = args.get(2).copied().unwrap_or(100);
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    runtime.block_on(async move {
        let db = TestDatabase::create().await;
        sqlx::query("CREATE TABLE bench_effects (message_id TEXT NOT NULL, at TIMESTAMPTZ DEFAULT now())")
            .execute(&db.pool)
            .await
            .unwrap();
        let mut broker = TestBroker::new(&amqp_url(), Backoff::default());
        broker.settings.prefetch = u16::try_from(batch * 2).unwrap_or(u16::MAX);
        let prefix = format!("bench-{}", uuid::Uuid::new_v4().simple());
        let redis = Arc::new(FastPath::new(&redis_url(), FastPathSettings { prefix: prefix.clone(), ..Default::default() }));
        let no_redis = Arc::new(FastPath::new("redis://127.0.0.1:1", FastPathSettings { prefix, ..Default::default() }));
        // Declare the topology before publishing.
        broker.connector().publisher().await.unwrap();

        let raw_ids: Vec<String> = (0..total).map(|i| format!("RAW.EVENT.{i}:1")).collect();
        let ids: Vec<String> = (0..total).map(|i| format!("BENCH.EVENT.{i}:1")).collect();
        let mut phases = Vec::new();

        publish(&broker, &raw_ids).await;
        phases.push(consume("raw consume + ack", &broker, None, total, workers, batch, None).await);
        publish(&broker, &ids).await;
        phases.push(
            consume("idempotent (claim + handler + marker)", &broker, Some(pipeline(&db, redis.clone())), total, workers, batch, Some(AckReason::Processed))
                .await,
        );
        publish(&broker, &ids).await;
        phases.push(
            consume("duplicates, Redis hit", &broker, Some(pipeline(&db, redis)), total, workers, batch, Some(AckReason::DuplicateRedis))
                .await,
        );
        publish(&broker, &ids).await;
        phases.push(
            consume(
                "duplicates, database (Redis down)",
                &broker,
                Some(pipeline(&db, no_redis)),
                total,
                workers,
                batch,
                Some(AckReason::DuplicateDatabase),
            )
            .await,
        );

        let effects: i64 = sqlx::query_scalar("SELECT count(*) FROM bench_effects").fetch_one(&db.pool).await.unwrap();
        assert_eq!(effects, i64::try_from(total).unwrap(), "every message applied exactly once");

        println!("\nconsume benchmark: {total} messages per phase, {workers} workers, batch {batch}, prefetch {}", batch * 2);
        println!("{:<42} {:>10} {:>12} {:>20}", "phase", "msg/s", "% of raw", "pipeline µs/msg");
        let raw = phases[0].rate();
        for p in &phases {
            let pipeline = if p.pipeline.is_zero() { "-".to_owned() } else { format!("{:.1}", p.pipeline_us_per_message()) };
            println!("{:<42} {:>10.0} {:>11.1}% {:>20}", p.name, p.rate(), 100.0 * p.rate() / raw, pipeline);
        }
        println!(
            "Redis-hit duplicate vs database claim, pipeline time per message: {:.1}× faster",
            phases[1].pipeline_us_per_message() / phases[2].pipeline_us_per_message()
        );
    });
}
