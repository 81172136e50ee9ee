//! A phase and how it runs: through a broker's sources (raw, the pipeline, or the hand-written
//! scheme), or the pipeline alone on in-memory deliveries.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use dedup_engine::message::InboundMessage;
use dedup_engine::pipeline::{AckReason, Disposition, Pipeline};
use dedup_engine::source::SourceFactory;
use dedup_engine::store::PipelineStore;
use dedup_engine::store::postgres::PgStore;

use crate::BODY;

/// What a phase measured: its messages, from the first delivery to the last settlement.
pub struct Phase {
    pub name: &'static str,
    pub messages: usize,
    pub elapsed: Duration,
    /// Time spent inside `Pipeline::process` (summed over workers).
    pub pipeline: Duration,
}

impl Phase {
    pub fn rate(&self) -> f64 {
        self.messages as f64 / self.elapsed.as_secs_f64()
    }
    pub fn pipeline_us_per_message(&self) -> f64 {
        self.pipeline.as_secs_f64() * 1e6 / self.messages as f64
    }
}

/// What a phase does with each batch of deliveries; `S`: the pipeline's store.
#[derive(Clone)]
pub enum Work<S = PgStore> {
    /// Acknowledge them as they are (raw).
    Ack,
    /// The engine's pipeline; every message must end as the given reason.
    Pipeline(Pipeline<S>, AckReason),
    /// The hand-written scheme (phase 6), on its own tables `naive_dedup` and `bench_effects`.
    Naive(sqlx::PgPool),
}

/// One message the hand-written way: its own transaction, committed before the batch is acked.
async fn naive_one(pool: &sqlx::PgPool, message: &InboundMessage) -> Result<(), sqlx::Error> {
    let id = message.property_message_id.as_deref().unwrap_or_default();
    let mut tx = pool.begin().await?;
    let new =
        sqlx::query("INSERT INTO naive_dedup (message_id, status) VALUES ($1, 'processing') ON CONFLICT DO NOTHING")
            .bind(id)
            .execute(&mut *tx)
            .await?
            .rows_affected()
            == 1;
    if new {
        sqlx::query("INSERT INTO bench_effects (message_id) VALUES ($1)").bind(id).execute(&mut *tx).await?;
        sqlx::query("UPDATE naive_dedup SET status = 'done', done_at = now() WHERE message_id = $1")
            .bind(id)
            .execute(&mut *tx)
            .await?;
    }
    tx.commit().await
}

/// Consumes `total` deliveries with `workers` sources; each batch goes through `work`.
pub async fn consume<S: PipelineStore>(
    name: &'static str,
    factory: Arc<dyn SourceFactory>,
    work: Work<S>,
    total: usize,
    workers: usize,
    batch: usize,
) -> Phase {
    let (done, fallbacks) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let (first, last) = (Arc::new(OnceLock::new()), Arc::new(OnceLock::new()));
    let tasks: Vec<_> = (0..workers)
        .map(|n| {
            let (factory, work, done, fallbacks) = (factory.clone(), work.clone(), done.clone(), fallbacks.clone());
            let (first, last) = (first.clone(), last.clone());
            tokio::spawn(async move {
                let mut source = factory.open(n).await.unwrap();
                let mut in_pipeline = Duration::ZERO;
                while done.load(Ordering::SeqCst) < total {
                    let next = tokio::time::timeout(
                        Duration::from_millis(500),
                        source.next_batch(batch, Duration::from_millis(2)),
                    )
                    .await;
                    let Ok(next) = next else { continue };
                    let deliveries = next.unwrap().unwrap();
                    first.get_or_init(Instant::now);
                    let dispositions = match &work {
                        Work::Pipeline(p, reason) => {
                            let reason = *reason;
                            let t = Instant::now();
                            let d = p.process(&format!("bench-{n}"), deliveries).await;
                            in_pipeline += t.elapsed();
                            // A marker whose write timed out (Redis is a hint) leaves its
                            // duplicate to the database: allowed, and counted.
                            let caught_later = |x: &Disposition| {
                                reason == AckReason::DuplicateRedis
                                    && *x == Disposition::Ack(AckReason::DuplicateDatabase)
                            };
                            assert!(
                                d.iter().all(|x| *x == Disposition::Ack(reason) || caught_later(x)),
                                "{name}: {d:?}"
                            );
                            fallbacks.fetch_add(d.iter().filter(|x| caught_later(x)).count(), Ordering::SeqCst);
                            d
                        }
                        Work::Naive(pool) => {
                            let t = Instant::now();
                            for message in deliveries.iter() {
                                naive_one(pool, message).await.unwrap();
                            }
                            in_pipeline += t.elapsed();
                            vec![Disposition::Ack(AckReason::Processed); deliveries.len()]
                        }
                        Work::Ack => vec![Disposition::Ack(AckReason::Processed); deliveries.len()],
                    };
                    source.settle(&dispositions).await.unwrap();
                    if done.fetch_add(dispositions.len(), Ordering::SeqCst) + dispositions.len() >= total {
                        last.get_or_init(Instant::now);
                    }
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
    // The last settlement, not the workers' exit: idle workers notice the end only after their
    // 500 ms wait for a next batch, and stopping a source is not consumption.
    let elapsed = *last.get().unwrap() - *first.get().unwrap();
    factory.close().await;
    let fallbacks = fallbacks.load(Ordering::SeqCst);
    // More than 1 % would make the Redis-hit phase measure the database.
    assert!(fallbacks * 100 <= total, "{name}: {fallbacks} of {total} duplicates without their Redis marker");
    match fallbacks {
        0 => eprintln!("{name}: {total} in {elapsed:.1?}"),
        n => eprintln!("{name}: {total} in {elapsed:.1?} ({n} duplicates without their Redis marker)"),
    }
    Phase { name, messages: total, elapsed, pipeline: pipeline_time }
}

/// The pipeline without a broker: `workers` tasks put in-memory deliveries of `ids` through
/// it, `batch` at a time; its ceiling on this machine for the same database and Redis.
pub async fn without_broker<S: PipelineStore>(
    name: &'static str,
    pipeline: Pipeline<S>,
    ids: &[String],
    workers: usize,
    batch: usize,
) -> Phase {
    let batches: Vec<Vec<InboundMessage>> = ids
        .chunks(batch)
        .map(|chunk| chunk.iter().map(|id| dedup_engine::testing::rabbitmq_delivery(Some(id), BODY.to_vec())).collect())
        .collect();
    let queue = Arc::new(std::sync::Mutex::new(batches));
    let started = Instant::now();
    let tasks: Vec<_> = (0..workers)
        .map(|n| {
            let (pipeline, queue) = (pipeline.clone(), queue.clone());
            tokio::spawn(async move {
                let mut in_pipeline = Duration::ZERO;
                loop {
                    let Some(deliveries) = queue.lock().unwrap().pop() else { break };
                    let t = Instant::now();
                    let d = pipeline.process(&format!("bench-{n}"), &deliveries).await;
                    in_pipeline += t.elapsed();
                    assert!(d.iter().all(|x| *x == Disposition::Ack(AckReason::Processed)), "{name}: {d:?}");
                }
                in_pipeline
            })
        })
        .collect();
    let mut pipeline_time = Duration::ZERO;
    for t in tasks {
        pipeline_time += t.await.unwrap();
    }
    let elapsed = started.elapsed();
    eprintln!("{name}: {} in {elapsed:.1?}", ids.len());
    Phase { name, messages: ids.len(), elapsed, pipeline: pipeline_time }
}
