//! Cleanup benchmark: seeds a database with `BENCH_RECORDS` records (default 1 000 000, over 60
//! days; `BENCH_DATABASE_URL`, default `postgres://postgres@127.0.0.1:5432/dedup_cleanup_bench`,
//! dropped and created afresh), then runs a cleanup schedule (retention 30 days, batch
//! `BENCH_BATCH`, default 5000) while a claimer keeps claiming and completing new records in
//! transactional batches of 50, as the consumer does. Prints cleanup rows/s and the claim
//! latency (p50 / p99 per batch) before and during the cleanup.
//!
//! `cargo bench -p dedup-engine --bench cleanup`. Not a test: BENCHMARKS.md records its output.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use dedup_engine::actions::cleanup::{ScheduleInput, cleanup_runs, cleanup_schedule_save, scheduler};
use dedup_engine::console::seed::{SeedDomain, SeedParams, seed_records};
use dedup_engine::db::{PoolSettings, Schema};
use dedup_engine::message::{IdSourceKind, InboundMessage};
use dedup_engine::record::{ConsumerGroup, MessageId};
use dedup_engine::store::postgres;
use dedup_engine::store::postgres::PgStore;
use dedup_engine::store::{ClaimAs, ClaimBatch, ClaimItem, ClaimOutcome, DedupStore, Lease};
use sqlx::PgPool;

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn message(id: &str) -> InboundMessage {
    dedup_engine::testing::rabbitmq_delivery(Some(id), format!("{{\"messageId\":\"{id}\"}}").into_bytes())
}

/// Claims and completes batches of 50 new records until `stop`; returns each batch's latency.
async fn claimer(pool: PgPool, tag: &'static str, stop: Arc<AtomicBool>) -> Vec<Duration> {
    let store = PgStore::new(pool.clone(), &Schema::default());
    let group = ConsumerGroup::parse("bench-claimer").unwrap();
    let mut latencies = Vec::new();
    let mut n = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let ids: Vec<MessageId> =
            (0..50).map(|i| MessageId::parse(format!("BENCH.{tag}.{n}-{i}:1")).unwrap()).collect();
        n += 1;
        let messages: Vec<InboundMessage> = ids.iter().map(|id| message(id.as_str())).collect();
        let hashes: Vec<Vec<u8>> = messages.iter().map(InboundMessage::payload_hash).collect();
        let lease = Lease::new("bench:1:0", Duration::from_secs(30));
        let items = ids
            .iter()
            .zip(&messages)
            .zip(&hashes)
            .map(|((id, m), h)| ClaimItem {
                message_id: id,
                message_type: "BENCH.CLAIM",
                payload_hash: h,
                message: m,
                id_source: IdSourceKind::Property,
                reclaim_expired: false,
                starts_at_once: true,
            })
            .collect();
        let started = Instant::now();
        let mut tx = pool.begin().await.unwrap();
        let outcomes = store
            .claim_many(
                &mut tx,
                &ClaimBatch { group: &group, max_attempts: 5, lease: &lease, claim_as: ClaimAs::Processing, items },
            )
            .await
            .unwrap();
        let claims: Vec<_> =
            outcomes.iter().filter_map(|o| if let ClaimOutcome::Claimed(c) = o { Some(c) } else { None }).collect();
        store.complete_many(&mut tx, &claims, &lease).await.unwrap();
        tx.commit().await.unwrap();
        latencies.push(started.elapsed());
    }
    latencies
}

fn quantiles(mut samples: Vec<Duration>) -> (usize, f64, f64, f64) {
    samples.sort_unstable();
    let pick = |q: f64| samples[((samples.len() as f64 * q).ceil() as usize).clamp(1, samples.len()) - 1];
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    (samples.len(), ms(pick(0.5)), ms(pick(0.99)), ms(*samples.last().unwrap()))
}

#[tokio::main]
async fn main() {
    let records: u64 = env_or("BENCH_RECORDS", 1_000_000);
    let batch: i32 = env_or("BENCH_BATCH", 5000);
    let url = std::env::var("BENCH_DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/dedup_cleanup_bench".to_owned());
    {
        let mut admin = url::Url::parse(&url).unwrap();
        let name = admin.path().trim_start_matches('/').to_owned();
        admin.set_path("/postgres");
        let pool = PgPool::connect(admin.as_str()).await.unwrap();
        sqlx::query(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)")).execute(&pool).await.unwrap();
        pool.close().await;
    }
    // The host pool (the claimer's, as the consumer's) and the engine's pool (seeding,
    // cleanup), as the engine runs them.
    let schema = Schema::default();
    let pool =
        postgres::connect(&url, &PoolSettings { statement_timeout: None, ..PoolSettings::default() }).await.unwrap();
    postgres::migrate(&pool, &schema).await.unwrap();
    let engine = postgres::engine_pool(&pool, &schema, PoolSettings::default().max_connections);
    let started = Instant::now();
    let domain = SeedDomain::new(&["group-a", "group-b", "group-c"], &["TYPE.ONE", "TYPE.TWO", "TYPE.THREE"]);
    seed_records(&engine, &SeedParams { records, days: 60, batch: 50_000 }, &domain, |_, _| {}).await.unwrap();
    sqlx::query("VACUUM ANALYZE dedup_records").execute(&engine).await.unwrap();
    eprintln!("seeded {records} records in {:.0} s", started.elapsed().as_secs_f64());

    let stop = Arc::new(AtomicBool::new(false));
    let baseline = tokio::spawn(claimer(pool.clone(), "before", stop.clone()));
    tokio::time::sleep(Duration::from_secs(10)).await;
    stop.store(true, Ordering::Relaxed);
    let before = quantiles(baseline.await.unwrap());

    let schedule = cleanup_schedule_save(
        &engine,
        "bench",
        None,
        &ScheduleInput { name: "bench".to_owned(), batch_size: batch, ..ScheduleInput::default() },
    )
    .await
    .unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let during = tokio::spawn(claimer(pool.clone(), "during", stop.clone()));
    let run_id = scheduler::cleanup_run_now(&engine.clone().into(), "bench", schedule.id).await.unwrap();
    let run = loop {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let runs = cleanup_runs(&engine, Some(schedule.id), 5).await.unwrap();
        if let Some(r) = runs.into_iter().find(|r| r.id == run_id && r.finished_at.is_some()) {
            break r;
        }
    };
    stop.store(true, Ordering::Relaxed);
    let during = quantiles(during.await.unwrap());
    let seconds = (run.finished_at.unwrap() - run.started_at).num_milliseconds() as f64 / 1000.0;
    println!(
        "cleanup of {records} seeded records, batch {batch}: {} rows deleted in {seconds:.1} s = {:.0} rows/s, {} batches",
        run.rows_deleted,
        run.rows_deleted as f64 / seconds,
        run.batches
    );
    println!("| claim batch of 50 (claim + complete, one tx) | batches | p50 ms | p99 ms | max ms |");
    println!("| before cleanup | {} | {:.2} | {:.2} | {:.2} |", before.0, before.1, before.2, before.3);
    println!("| during cleanup | {} | {:.2} | {:.2} | {:.2} |", during.0, during.1, during.2, during.3);
    engine.close().await;
    pool.close().await;
}
