//! Console read benchmark, on PostgreSQL, MySQL/MariaDB or both side by side: seeds each
//! database up to N records (`BENCH_RECORDS`, default 1 000 000), then times every page's
//! server-side queries (engine calls, through the console store each database has) and every API
//! call and page (HTTP) on servers started with the consumer off, one per build: the build
//! `scripts/run` serves (profile `serve`, `BENCH_SERVED_BIN`) and the debug build
//! (`BENCH_DEBUG_BIN`), whichever of the two is built; prints p50 / p95 per item and database.
//!
//! The databases: `BENCH_DATABASE_URL` (default
//! `postgres://postgres@127.0.0.1:5432/dedup_console_bench`; a `mysql://` URL names MySQL), and
//! `BENCH_MYSQL_URL` beside it when set. On MySQL the engine's tables are in a database of their
//! own, `BENCH_MYSQL_SCHEMA` (default `dedup_console_bench_engine`); on PostgreSQL in the schema
//! `dedup` of the URL's database.
//!
//! Then, unless `BENCH_BROWSER=0`, the same pages loaded in Chromium on both builds' servers of
//! each database (`end2end/bench/page-load.mjs`, navigation to `load`).
//!
//! `cargo bench -p dedup-console --bench console` (`BENCH_ITERATIONS`, default 40). Not a test:
//! it asserts nothing but that every page answers 200; BENCHMARKS.md records its output.

use std::time::{Duration, Instant};

use dedup_engine::console::failures::retries;
use dedup_engine::console::filter::{FilterText, RecordListParams};
use dedup_engine::console::overview::{GrowthRange, live_snapshot};
use dedup_engine::console::records::{RecordRow, record_detail, records_list};
use dedup_engine::console::seed::{SeedParams, seed_records};
use dedup_engine::console::{ConsoleStore, console_store};
use dedup_engine::{EnginePool, PoolSettings, Schema};

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// Runs `f` `n` times (after 3 warm-ups); returns p50 and p95 in milliseconds.
async fn percentiles<T, E: std::fmt::Debug>(
    label: &str,
    n: usize,
    mut f: impl AsyncFnMut() -> Result<T, E>,
) -> (f64, f64) {
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

/// One database the bench times: its URL, the engine's schema (PostgreSQL) or database (MySQL)
/// and the engine's pool on it, and what its records lists read (set once it is seeded).
struct Target {
    /// `PostgreSQL` or `MySQL`.
    name: &'static str,
    url: String,
    schema: Schema,
    pool: EnginePool,
    /// The records list's cases, on this database's records.
    cases: Vec<(String, RecordListParams)>,
    /// A record three quarters down the table, for the record detail.
    some_id: i64,
}

impl Target {
    /// Connects to `url` (PostgreSQL, or MySQL for a `mysql://` or `mariadb://` URL), migrates
    /// the engine's tables and opens the engine's pool of 16.
    async fn open(url: String) -> Self {
        let settings = PoolSettings { statement_timeout: None, ..PoolSettings::default() };
        let schema = if url.starts_with("mysql:") || url.starts_with("mariadb:") {
            Schema::parse(env_or("BENCH_MYSQL_SCHEMA", "dedup_console_bench_engine".to_owned()))
                .expect("BENCH_MYSQL_SCHEMA: a plain lowercase name")
        } else {
            Schema::default()
        };
        let host = EnginePool::connect(&url, &settings).await.expect("the bench's database");
        let pool = host.open_engine_pool(&schema, 16).await.expect("the engine's tables");
        host.close().await;
        Self { name: pool.database(), url, schema, pool, cases: Vec::new(), some_id: 1 }
    }

    fn store(&self) -> &dyn ConsoleStore {
        console_store(&self.pool)
    }

    /// The records counted (`record_counts`, as the overview reads them).
    async fn total(&self) -> i64 {
        self.store().status_counts().await.expect("status counts").iter().map(|c| c.count).sum()
    }

    /// Seeds up to `records` (as `dedup-console seed` does), then refreshes the planner's
    /// statistics: `VACUUM ANALYZE` on PostgreSQL, `ANALYZE TABLE` on MySQL.
    async fn seed_to(&self, records: u64) {
        let have = self.total().await;
        let missing = records.saturating_sub(have as u64);
        if missing > 0 {
            eprintln!("{}: seeding {missing} records (have {have})…", self.name);
            let params = SeedParams { records: missing, ..SeedParams::default() };
            let domain = dedup_example_orders::seed::order_domain();
            let report = seed_records(self.store(), &params, &domain, |_, _| {}).await.expect("seed");
            eprintln!("seeded {} records in {:.1} s ({:.0}/s)", report.records, report.seconds, report.rate);
        }
        let analyzed = if let Some(pool) = self.pool.postgres() {
            sqlx::raw_sql("VACUUM ANALYZE dedup_records").execute(pool).await.map(drop)
        } else if let Some(pool) = self.pool.mysql() {
            sqlx::raw_sql("ANALYZE TABLE dedup_records").execute(pool).await.map(drop)
        } else {
            panic!("no bench on {}", self.pool.database())
        };
        analyzed.expect("ANALYZE");
    }

    /// The first record at or past id `id` (seeded ids follow one another).
    async fn record_from(&self, id: i64) -> RecordRow {
        for id in id..id + 1_000 {
            if let Some(detail) = self.store().record_fields(id).await.expect("record fields") {
                return detail.row;
            }
        }
        panic!("{}: no record in ids {id}..{}", self.name, id + 1_000);
    }

    /// Picks the records the lists and the detail read: a cursor half way down the table (for
    /// "any depth"), a record three quarters down (its message id, exact and as a prefix).
    async fn pick_cases(&mut self) {
        let (min, max) = self.store().id_bounds().await.expect("id bounds").expect("seeded records");
        let mid = self.record_from(min + (max - min) / 2).await;
        let some = self.record_from(min + (max - min) * 3 / 4).await;
        self.some_id = some.id;
        let deep = format!("t{}.{}", mid.first_seen_at.timestamp_micros(), mid.id);
        let some_message = some.message_id;
        let prefix: String = some_message.chars().take(some_message.len() - 4).collect();
        let from = (mid.first_seen_at - chrono::TimeDelta::hours(1)).to_rfc3339();
        let to = mid.first_seen_at.to_rfc3339();
        let class = "TIMEOUT: gateway did not answer within # ms";
        let list = |text: FilterText<'_>| RecordListParams::parse(&text).expect("valid filter");
        let cases = [
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
            (
                "records: group = billing-service",
                list(FilterText { group: Some("billing-service"), ..Default::default() }),
            ),
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
        self.cases = cases.into_iter().map(|(label, params)| (label.to_owned(), params)).collect();
    }
}

/// Times `f` on each target in turn, printed as one table row: p50 and p95 of each.
async fn time<T, E: std::fmt::Debug>(
    label: &str,
    n: usize,
    targets: &[Target],
    f: impl AsyncFn(&Target) -> Result<T, E>,
) {
    let mut row = format!("| {label:<44} |");
    for target in targets {
        let (p50, p95) = percentiles(&format!("{}: {label}", target.name), n, async || f(target).await).await;
        row.push_str(&format!(" {p50:>8.2} | {p95:>8.2} |"));
    }
    println!("{row}");
}

/// The header of a table whose rows give p50 and p95 per column of `columns`.
fn header(first: &str, columns: &[String]) {
    let names: String = columns.iter().map(|c| format!(" {c} p50 | {c} p95 |")).collect();
    let rule: String = columns.iter().map(|_| "---:|---:|").collect();
    println!("| {first} |{names}\n|---|{rule}");
}

async fn bench_queries(targets: &[Target], n: usize) {
    println!("\nEngine queries (server-side data of each page; ms)\n");
    header("query", &targets.iter().map(|t| t.name.to_owned()).collect::<Vec<_>>());
    time("overview: counts by status (record_counts)", n, targets, async |t| t.store().status_counts().await).await;
    time("overview: live snapshot", n, targets, async |t| live_snapshot(t.store()).await).await;
    time("overview: traffic last hour", n, targets, async |t| t.store().traffic(3600).await).await;
    time("overview: traffic last 24 h", n, targets, async |t| t.store().traffic(86_400).await).await;
    time("overview: duplicate delays 30 d", n, targets, async |t| t.store().duplicate_delays(30).await).await;
    for range in GrowthRange::ALL {
        let label = format!("overview: growth {}", range.as_str());
        time(&label, n, targets, async |t| t.store().growth(range).await).await;
    }
    time("filters: consumer groups", n, targets, async |t| t.store().consumer_groups().await).await;
    time("filters: message types (loose index scan)", n, targets, async |t| t.store().message_types().await).await;
    for (i, (label, _)) in targets[0].cases.iter().enumerate() {
        time(label, n, targets, async |t| records_list(t.store(), &t.cases[i].1).await).await;
    }
    time("record detail (with attempts)", n, targets, async |t| record_detail(t.store(), t.some_id).await).await;
    time("stuck: longest stuck 50 + total", n, targets, async |t| t.store().stuck_records(50).await).await;
    time("retries: distribution, types, most retried", n, targets, async |t| retries(t.store(), t.store(), 50).await)
        .await;
    time("dead letters: groups by error class", n, targets, async |t| t.store().dead_letter_groups(200).await).await;
}

/// A `dedup-console serve` process of one build on one database (consumer off, auth off:
/// loopback only), killed on drop.
struct Served {
    child: std::process::Child,
    base: String,
    /// `<database> <build>`, for the tables.
    name: String,
}

impl Served {
    async fn start(bin: &str, build: &str, target: &Target) -> Self {
        // A free port: the one the system hands out, released just before the server binds it.
        let port = std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("a free port").port();
        let mut child = std::process::Command::new(bin)
            .arg("serve")
            .env("DATABASE_URL", &target.url)
            .env("DEDUP_DATABASE_URL", &target.url)
            .env("DEDUP_SCHEMA", target.schema.as_str())
            .env("DEDUP_LISTEN", format!("127.0.0.1:{port}"))
            .env("DEDUP_CONSUMER__ENABLED", "false")
            .env("DEDUP_AUTH__MODE", "off")
            .env_remove("DEDUP_CONFIG")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("{bin}: {e}"));
        let base = format!("http://127.0.0.1:{port}");
        let client = reqwest::Client::new();
        for _ in 0..600 {
            if client.get(format!("{base}/healthz")).send().await.is_ok_and(|r| r.status().is_success()) {
                return Self { child, base, name: format!("{} {build}", target.name) };
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let _ = child.kill();
        let _ = child.wait();
        panic!("{bin} did not start on port {port} ({})", target.name);
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The builds to serve: the build `scripts/run` serves (profile `serve`) and the debug build,
/// those of the two whose binary exists (at least one must).
fn builds() -> Vec<(&'static str, String)> {
    let target = std::env::var("CARGO_TARGET_DIR").unwrap_or_else(|_| "target".to_owned());
    let served = std::env::var("BENCH_SERVED_BIN").unwrap_or_else(|_| format!("{target}/serve/dedup-console"));
    let debug = std::env::var("BENCH_DEBUG_BIN").unwrap_or_else(|_| format!("{target}/debug/dedup-console"));
    let builds: Vec<_> = [("served", served), ("debug", debug)]
        .into_iter()
        .filter(|(build, bin)| {
            let built = std::path::Path::new(bin).exists();
            if !built {
                eprintln!("the {build} build is not timed: no {bin} (see BENCHMARKS.md to build it)");
            }
            built
        })
        .collect();
    assert!(!builds.is_empty(), "no server build to time: build one first (see BENCHMARKS.md)");
    builds
}

/// Times every API call and page on one server per build and database, request by request side
/// by side (one client, no redirects: a page that is not 200 fails the bench).
async fn bench_http(targets: &[Target], n: usize) {
    let mut servers = Vec::new();
    let mut record_ids = Vec::new();
    for target in targets {
        for (build, bin) in builds() {
            servers.push(Served::start(&bin, build, target).await);
            record_ids.push(target.some_id);
        }
    }
    let client = reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build().unwrap();
    println!("\nHTTP (API calls and server-rendered pages, one client; ms)\n");
    header("request", &servers.iter().map(|s| s.name.clone()).collect::<Vec<_>>());
    for path in [
        "/api/v1/aggregates",
        "/api/v1/aggregates/growth?range=30d",
        "/api/v1/groups",
        "/api/v1/message-types",
        "/api/v1/records",
        "/api/v1/records?status=failed&sort=attempts",
        "/api/v1/records?prefix=ORDER.PAY.0000000",
        "/api/v1/records/{id}",
        "/api/v1/stuck",
        "/api/v1/retries",
        "/api/v1/dead-letters",
        "/",
        "/records",
        "/records/{id}",
        "/stuck",
        "/retries",
        "/dead-letters",
        "/cleanup",
        "/audit",
        "/requeue",
    ] {
        let mut row = format!("| GET {path:<40} |");
        for (server, id) in servers.iter().zip(&record_ids) {
            let url = format!("{}{}", server.base, path.replace("{id}", &id.to_string()));
            let label = format!("GET {url}");
            let (p50, p95) = percentiles(&label, n, async || {
                let response = client.get(&url).send().await.map_err(|e| e.to_string())?;
                if response.status() != reqwest::StatusCode::OK {
                    return Err(format!("status {}", response.status()));
                }
                response.bytes().await.map_err(|e| e.to_string())
            })
            .await;
            row.push_str(&format!(" {p50:>8.2} | {p95:>8.2} |"));
        }
        println!("{row}");
    }
    if std::env::var("BENCH_BROWSER").as_deref() != Ok("0") {
        let per_target = servers.len() / targets.len();
        for (target, servers) in targets.iter().zip(servers.chunks(per_target)) {
            match servers {
                [served, debug] => page_loads(&served.base, &debug.base, target.some_id),
                _ => eprintln!("{}: page loads in Chromium need both builds; not measured", target.name),
            }
        }
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
        let urls = std::iter::once(url).chain(std::env::var("BENCH_MYSQL_URL").ok());
        let records: u64 = env_or("BENCH_RECORDS", 1_000_000);
        let n: usize = env_or("BENCH_ITERATIONS", 40);
        let mut targets = Vec::new();
        for url in urls {
            let mut target = Target::open(url).await;
            target.seed_to(records).await;
            target.pick_cases().await;
            println!("console bench: {}: {} records", target.name, target.total().await);
            targets.push(target);
        }
        println!("{n} timed runs of each item (after 3 warm-ups)");
        bench_queries(&targets, n).await;
        bench_http(&targets, n).await;
    });
}
