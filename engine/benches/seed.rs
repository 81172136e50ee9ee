//! Seeding benchmark (issue 4: `seed` at ≥ 100 k records/s): seeds `BENCH_RECORDS` records
//! (default 1 000 000, over 60 days) into a fresh database (`BENCH_DATABASE_URL`, default
//! `postgres://postgres@127.0.0.1:5432/dedup_seed_bench`, dropped and created afresh; dropped
//! again at the end unless `BENCH_KEEP=1`), `BENCH_RUNS` times (default 1). Prints each run's
//! rate and, through the log, the time of each phase (rows copied, indexes built, aggregates
//! written, analyzed).
//!
//! `cargo bench -p dedup-engine --bench seed`. Not a test: BENCHMARKS.md records its output.

use dedup_engine::console::seed::{SeedParams, seed_records};
use dedup_engine::db::{self, PoolSettings};
use sqlx::PgPool;

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

#[tokio::main]
async fn main() {
    tracing_subscriber::fmt().with_env_filter("dedup_engine::console::seed=info").init();
    let records: u64 = env_or("BENCH_RECORDS", 1_000_000);
    let runs: u32 = env_or("BENCH_RUNS", 1);
    let url = std::env::var("BENCH_DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/dedup_seed_bench".to_owned());
    for run in 1..=runs {
        reset(&url, true).await;
        let pool = db::connect(&url, &PoolSettings::default()).await.unwrap();
        db::migrate(&pool).await.unwrap();
        let report = seed_records(&pool, &SeedParams { records, days: 60, batch: 50_000 }, |_, _| {}).await.unwrap();
        println!("run {run}: {records} records in {:.1} s = {:.0} records/s", report.seconds, report.rate);
        pool.close().await;
    }
    if std::env::var("BENCH_KEEP").as_deref() != Ok("1") {
        reset(&url, false).await;
    }
}
