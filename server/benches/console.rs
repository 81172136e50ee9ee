//! Console read benchmark: seeds a database up to N records (`BENCH_RECORDS`, default 1 000 000;
//! `BENCH_DATABASE_URL`, default `postgres://postgres@127.0.0.1:5432/dedup_console_bench`), then
//! times every page's server-side queries (engine calls) and every API call and page (HTTP) on
//! two servers started with the consumer off, side by side: the build `scripts/run` serves
//! (profile `serve`, `BENCH_SERVED_BIN`) and the debug build (`BENCH_DEBUG_BIN`); prints p50 /
//! p95 per item.
//!
//! Then, unless `BENCH_BROWSER=0`, the same pages loaded in Chromium on both servers
//! (`end2end/bench/page-load.mjs`, navigation to `load`).
//!
//! `cargo bench -p dedup-console --bench console` (`BENCH_ITERATIONS`, default 40). Not a test:
//! it asserts nothing but that every page answers 200; BENCHMARKS.md records its output.

use std::future::Future;
use std::time::{Duration, Instant};

use dedup_engine::console::engine_pool;
use dedup_engine::console::failures::{FailureReads, retries};
use dedup_engine::console::filter::{FilterText, RecordListParams};
use dedup_engine::console::overview::{GrowthRange, OverviewReads, live_snapshot};
use dedup_engine::console::records::{record_detail, records_list};
use dedup_engine::console::seed::{SeedParams, seed_records};
use dedup_engine::{PoolSettings, Schema, connect, migrate};
use sqlx::PgPool;

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// Runs `f` `n` times (after 3 warm-ups); returns p50 and p95 in milliseconds.
async fn percentiles<F, Fut, T, E>(label: &str, n: usize, mut f: F) -> (f64, f64)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
    E: std::fmt::Debug,
{
    for _ in 0..3 {
        f().await.unwrap_or_else(|e| panic!("{label}: {e:?}"));
    }
    let mut samples: Vec<Duration> = Vec::with_capacity(n);
    for _ in 0..n {
        let started = Instant::now();
        f().await.unwrap_or_else(|e| panic!("{label}: {e:?}"));
        samples.push(started.elapsed());
    }
    samples.sort_unstable();
    let pick = |q: f64| samples[((samples.len() as f64 * q).ceil() as usize).clamp(1, samples.len()) - 1];
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    (ms(pick(0.50)), ms(pick(0.95)))
}

/// [`percentiles`], printed as a table row.
async fn time<F, Fut, T, E>(label: &str, n: usize, f: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
    E: std::fmt::Debug,
{
    let (p50, p95) = percentiles(label, n, f).await;
    println!("| {label:<44} | {p50:>8.2} | {p95:>8.2} |");
}

fn list(text: FilterText<'_>) -> RecordListParams {
    RecordListParams::parse(&text).expect("valid filter")
}

async fn seed_to(pool: &PgPool, records: u64) {
    let have: i64 =
        sqlx::query_scalar("SELECT COALESCE(sum(n), 0)::bigint FROM record_counts").fetch_one(pool).await.unwrap();
    let missing = records.saturating_sub(have as u64);
    if missing > 0 {
        eprintln!("seeding {missing} records (have {have})…");
        let params = SeedParams { records: missing, ..SeedParams::default() };
        let report =
            seed_records(pool, &params, &dedup_example_orders::seed::order_domain(), |_, _| {}).await.expect("seed");
        eprintln!("seeded {} records in {:.1} s ({:.0}/s)", report.records, report.seconds, report.rate);
    }
    sqlx::query("VACUUM ANALYZE dedup_records").execute(pool).await.unwrap();
}

async fn bench_queries(pool: &PgPool, n: usize) {
    println!("\nEngine queries (server-side data of each page)\n");
    println!("| query | p50 ms | p95 ms |\n|---|---:|---:|");
    time("overview: counts by status (record_counts)", n, || pool.status_counts()).await;
    time("overview: live snapshot", n, || live_snapshot(pool)).await;
    time("overview: traffic last hour", n, || pool.traffic(3600)).await;
    time("overview: traffic last 24 h", n, || pool.traffic(86_400)).await;
    time("overview: duplicate delays 30 d", n, || pool.duplicate_delays(30)).await;
    for range in GrowthRange::ALL {
        time(&format!("overview: growth {}", range.as_str()), n, || pool.growth(range)).await;
    }
    time("filters: consumer groups", n, || pool.consumer_groups()).await;
    time("filters: message types (loose index scan)", n, || pool.message_types()).await;

    // A cursor half way down the table, for "any depth".
    let (mid_at, mid_id): (chrono::DateTime<chrono::Utc>, i64) = sqlx::query_as(
        "SELECT first_seen_at, id FROM dedup_records WHERE id >= (SELECT (min(id) + max(id)) / 2 FROM dedup_records)
         ORDER BY id LIMIT 1",
    )
    .fetch_one(pool)
    .await
    .unwrap();
    let deep = format!("t{}.{mid_id}", mid_at.timestamp_micros());
    let (some_id, some_message): (i64, String) = sqlx::query_as(
        "SELECT id, message_id FROM dedup_records WHERE id >= (SELECT max(id) * 3 / 4 FROM dedup_records) ORDER BY id LIMIT 1",
    )
    .fetch_one(pool)
    .await
    .unwrap();
    let prefix: String = some_message.chars().take(some_message.len() - 4).collect();
    let from = (mid_at - chrono::TimeDelta::hours(1)).to_rfc3339();
    let to = mid_at.to_rfc3339();
    let class = "TIMEOUT: gateway did not answer within # ms";
    let cases: Vec<(&str, RecordListParams)> = vec![
        ("records: first page, newest first", list(FilterText::default())),
        ("records: page at half depth (keyset)", list(FilterText { after: Some(&deep), ..Default::default() })),
        ("records: previous page at half depth", list(FilterText { before: Some(&deep), ..Default::default() })),
        ("records: oldest first", list(FilterText { order: Some("asc"), ..Default::default() })),
        ("records: status = dead", list(FilterText { status: Some("dead"), ..Default::default() })),
        ("records: status = processing", list(FilterText { status: Some("processing"), ..Default::default() })),
        (
            "records: status = failed, by attempts",
            list(FilterText { status: Some("failed"), sort: Some("attempts"), ..Default::default() }),
        ),
        ("records: sorted by attempts", list(FilterText { sort: Some("attempts"), ..Default::default() })),
        ("records: group = billing-service", list(FilterText { group: Some("billing-service"), ..Default::default() })),
        ("records: type = ORDER.PAY", list(FilterText { message_type: Some("ORDER.PAY"), ..Default::default() })),
        ("records: type = POISON (rare)", list(FilterText { message_type: Some("POISON"), ..Default::default() })),
        ("records: attempts >= 3", list(FilterText { min_attempts: Some("3"), ..Default::default() })),
        (
            "records: one hour at half depth",
            list(FilterText { from: Some(&from), to: Some(&to), ..Default::default() }),
        ),
        ("records: message id exact", list(FilterText { message_id: Some(&some_message), ..Default::default() })),
        ("records: message id prefix", list(FilterText { id_prefix: Some(&prefix), ..Default::default() })),
        (
            "records: dead-letter group drill-down",
            list(FilterText { status: Some("dead"), error_class: Some(class), ..Default::default() }),
        ),
    ];
    for (label, params) in &cases {
        time(label, n, || records_list(pool, params)).await;
    }
    time("record detail (with attempts)", n, || record_detail(pool, some_id)).await;
    time("stuck: longest stuck 50 + total", n, || pool.stuck_records(50)).await;
    time("retries: distribution, types, most retried", n, || retries(pool, pool, 50)).await;
    time("dead letters: groups by error class", n, || pool.dead_letter_groups(200)).await;
}

/// A `dedup-console serve` process of one build (consumer off, auth off: loopback only), killed
/// on drop.
struct Served {
    child: std::process::Child,
    base: String,
}

impl Served {
    async fn start(bin: &str, url: &str, port: u16) -> Self {
        let mut child = std::process::Command::new(bin)
            .arg("serve")
            .env("DEDUP_DATABASE_URL", url)
            .env("DEDUP_LISTEN", format!("127.0.0.1:{port}"))
            .env("DEDUP_CONSUMER__ENABLED", "false")
            .env("DEDUP_AUTH__MODE", "off")
            .env_remove("DEDUP_CONFIG")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("{bin}: {e} (build it first: see BENCHMARKS.md)"));
        let base = format!("http://127.0.0.1:{port}");
        let client = reqwest::Client::new();
        for _ in 0..600 {
            if client.get(format!("{base}/healthz")).send().await.is_ok_and(|r| r.status().is_success()) {
                return Self { child, base };
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let _ = child.kill();
        let _ = child.wait();
        panic!("{bin} did not start on port {port}");
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Times every API call and page on the build `scripts/run` serves (profile `serve`) and on the
/// debug build, request by request side by side (one client, no redirects: a page that is not
/// 200 fails the bench).
async fn bench_http(url: &str, n: usize) {
    let target = std::env::var("CARGO_TARGET_DIR").unwrap_or_else(|_| "target".to_owned());
    let served_bin = std::env::var("BENCH_SERVED_BIN").unwrap_or_else(|_| format!("{target}/serve/dedup-console"));
    let debug_bin = std::env::var("BENCH_DEBUG_BIN").unwrap_or_else(|_| format!("{target}/debug/dedup-console"));
    let served = Served::start(&served_bin, url, 3701).await;
    let debug = Served::start(&debug_bin, url, 3702).await;
    let client = reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build().unwrap();
    let record: serde_json::Value =
        client.get(format!("{}/api/v1/records?limit=1", served.base)).send().await.unwrap().json().await.unwrap();
    let id = record["rows"][0]["id"].as_i64().unwrap_or(1);
    println!("\nHTTP (API calls and server-rendered pages, one client; ms)\n");
    println!("| request | served p50 | served p95 | debug p50 | debug p95 |\n|---|---:|---:|---:|---:|");
    for path in [
        "/api/v1/aggregates".to_owned(),
        "/api/v1/aggregates/growth?range=30d".to_owned(),
        "/api/v1/groups".to_owned(),
        "/api/v1/message-types".to_owned(),
        "/api/v1/records".to_owned(),
        "/api/v1/records?status=failed&sort=attempts".to_owned(),
        "/api/v1/records?prefix=ORDER.PAY.0000000".to_owned(),
        format!("/api/v1/records/{id}"),
        "/api/v1/stuck".to_owned(),
        "/api/v1/retries".to_owned(),
        "/api/v1/dead-letters".to_owned(),
        "/".to_owned(),
        "/records".to_owned(),
        format!("/records/{id}"),
        "/stuck".to_owned(),
        "/retries".to_owned(),
        "/dead-letters".to_owned(),
        "/cleanup".to_owned(),
        "/audit".to_owned(),
        "/requeue".to_owned(),
    ] {
        let mut row = Vec::new();
        for server in [&served, &debug] {
            let client = client.clone();
            let url = format!("{}{path}", server.base);
            let label = format!("GET {url}");
            row.push(
                percentiles(&label, n, move || {
                    let request = client.get(url.clone()).send();
                    async move {
                        let response = request.await.map_err(|e| e.to_string())?;
                        if response.status() != reqwest::StatusCode::OK {
                            return Err(format!("status {}", response.status()));
                        }
                        response.bytes().await.map_err(|e| e.to_string())
                    }
                })
                .await,
            );
        }
        let [(sp50, sp95), (dp50, dp95)] = [row[0], row[1]];
        println!("| GET {path:<40} | {sp50:>8.2} | {sp95:>8.2} | {dp50:>8.2} | {dp95:>8.2} |");
    }
    if std::env::var("BENCH_BROWSER").as_deref() != Ok("0") {
        page_loads(&served.base, &debug.base, id);
    }
}

/// The same pages loaded in Chromium (`end2end/bench/page-load.mjs`), while both servers run.
fn page_loads(served: &str, debug: &str, record_id: i64) {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../end2end/bench/page-load.mjs");
    let status = std::process::Command::new("node").arg(script).args([served, debug, &record_id.to_string()]).status();
    match status {
        Ok(s) if s.success() => {}
        other => eprintln!("page loads in Chromium not measured ({other:?}); BENCH_BROWSER=0 skips them"),
    }
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    runtime.block_on(async {
        let url = std::env::var("BENCH_DATABASE_URL")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/dedup_console_bench".to_owned());
        let records: u64 = env_or("BENCH_RECORDS", 1_000_000);
        let n: usize = env_or("BENCH_ITERATIONS", 40);
        let host = connect(&url, &PoolSettings { statement_timeout: None, ..PoolSettings::default() })
            .await
            .expect("PostgreSQL for the bench");
        let schema = Schema::default();
        migrate(&host, &schema).await.expect("migrate");
        let pool = engine_pool(&host, &schema, 16);
        seed_to(&pool, records).await;
        let total: i64 = sqlx::query_scalar("SELECT sum(n)::bigint FROM record_counts").fetch_one(&pool).await.unwrap();
        println!("console bench: {total} records, {n} timed runs each (after 3 warm-ups)");
        bench_queries(&pool, n).await;
        bench_http(&url, n).await;
    });
}
