//! Seeding benchmark (issue 4: `seed` at ≥ 100 k records/s): seeds `BENCH_RECORDS` records
//! (default 1 000 000, over 60 days) into a fresh database (`BENCH_DATABASE_URL`, default
//! `postgres://postgres@127.0.0.1:5432/dedup_seed_bench`, dropped and created afresh; dropped
//! again at the end unless `BENCH_KEEP=1`), `BENCH_RUNS` times (default 1). Prints each run's
//! rate and, through the log, the time of each phase (rows copied, indexes built, aggregates
//! written, analyzed).
//!
//! Then PostgreSQL's own floor on this machine: the seeded rows, read back as binary COPY data,
//! COPYed into a table with the same columns and no index, constraint or trigger. No seed of
//! rows like these can beat that rate, even before it builds a single index.
//!
//! `cargo bench -p dedup-engine --bench seed`. Not a test: BENCHMARKS.md records its output.

use dedup_engine::console::seed::{SeedDomain, SeedParams, seed_records};
use dedup_engine::db::{PoolSettings, Schema};
use dedup_engine::store::postgres;
use futures::StreamExt;
use sqlx::PgPool;
use std::time::Instant;

/// Three groups, five message types (the shape of the console's demo data, without its domain).
fn bench_domain() -> SeedDomain {
    SeedDomain::new(
        &["group-a", "group-b", "group-c"],
        &["TYPE.ONE", "TYPE.TWO", "TYPE.THREE", "TYPE.FOUR", "TYPE.FIVE"],
    )
}

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// Drops the database of `url` (and creates it again when `create`).
async fn reset(url: &str, create: bool) {
    let mut admin = url::Url::parse(url).unwrap();
    let name = admin.path().trim_start_matches('/').to_owned();
    admin.set_path("/postgres");
    let pool = PgPool::connect(admin.as_str()).await.unwrap();
    sqlx::query(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)")).execute(&pool).await.unwrap();
    if create {
        sqlx::query(&format!("CREATE DATABASE {name}")).execute(&pool).await.unwrap();
    }
    pool.close().await;
}

/// Seconds PostgreSQL takes to COPY the rows of `dedup_records` (binary, as the seed sends
/// them) into a bare table of the same columns, in one transaction that is rolled back. The
/// data is read into memory first (about 370 bytes per record), so only the COPY in is timed.
async fn bare_copy(pool: &PgPool) -> f64 {
    let mut conn = pool.acquire().await.unwrap();
    let mut data = Vec::new();
    let mut out = conn.copy_out_raw("COPY dedup_records TO STDOUT (FORMAT binary)").await.unwrap();
    while let Some(chunk) = out.next().await {
        data.extend_from_slice(&chunk.unwrap());
    }
    drop(out);
    let mut tx = pool.begin().await.unwrap();
    sqlx::query("CREATE TABLE bare_records (LIKE dedup_records)").execute(&mut *tx).await.unwrap();
    let started = Instant::now();
    let mut copy = tx.copy_in_raw("COPY bare_records FROM STDIN (FORMAT binary)").await.unwrap();
    for chunk in data.chunks(1 << 20) {
        copy.send(chunk).await.unwrap();
    }
    copy.finish().await.unwrap();
    let seconds = started.elapsed().as_secs_f64();
    tx.rollback().await.unwrap();
    seconds
}

#[tokio::main]
async fn main() {
    tracing_subscriber::fmt().with_env_filter("dedup_engine::console::seed=info").init();
    let records: u64 = env_or("BENCH_RECORDS", 1_000_000);
    let runs: u32 = env_or("BENCH_RUNS", 1);
    let url = std::env::var("BENCH_DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/dedup_seed_bench".to_owned());
    for run in 1..=runs {
        reset(&url, true).await;
        let schema = Schema::default();
        let host = postgres::connect(&url, &PoolSettings { statement_timeout: None, ..PoolSettings::default() })
            .await
            .unwrap();
        postgres::migrate(&host, &schema).await.unwrap();
        // The engine's pool: seeding runs there, as in the engine.
        let pool = postgres::engine_pool(&host, &schema, PoolSettings::default().max_connections);
        let params = SeedParams { records, days: 60, batch: 50_000 };
        let report = seed_records(&pool, &params, &bench_domain(), |_, _| {}).await.unwrap();
        println!("run {run}: {records} records in {:.1} s = {:.0} records/s", report.seconds, report.rate);
        if run == runs {
            let seconds = bare_copy(&pool).await;
            println!(
                "floor: the same rows COPYed into a table without index, constraint or trigger in {seconds:.1} s = {:.0} rows/s",
                records as f64 / seconds
            );
        }
        pool.close().await;
        host.close().await;
    }
    if std::env::var("BENCH_KEEP").as_deref() != Ok("1") {
        reset(&url, false).await;
    }
}
