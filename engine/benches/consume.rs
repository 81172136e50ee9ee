//! Consumption throughput on one broker, topology and batch size, in one run:
//!
//! 1. raw: consume + ack (RabbitMQ) or consume + commit (Kafka) with no pipeline — the
//!    broker's ceiling for this setup. Kafka has two raw phases: a plain rdkafka poll + commit
//!    loop, and the engine's Kafka source acknowledging everything (its offset bookkeeping,
//!    queue and workers, without the pipeline);
//! 2. idempotent, three times: the full pipeline — Redis lookup, PostgreSQL claim in the
//!    business transaction (one transaction per batch, no savepoints while no handler fails),
//!    Redis marker, ack or offset commit — first with a transactional handler that changes
//!    nothing (what the pipeline itself costs over raw), then with a batch handler that writes
//!    the business rows of a run of messages in one statement (`BENCH.ROWS`, `max_batch` 500),
//!    then with one that inserts a business row per message, a round trip each (`BENCH.EVENT`,
//!    the phase the duplicates below repeat);
//! 3. duplicates caught by Redis (the same messages again);
//! 4. duplicates caught by the database (again, Redis unreachable);
//! 5. the pipeline alone: in-memory deliveries of new messages through it (handler without
//!    effect), no broker — what PostgreSQL and Redis allow on this machine, so the ceiling of
//!    any broker's idempotent phase here;
//!    Then the same with [`FINGERPRINTS`] fingerprints of deleted records kept (issue 27: each
//!    batch looks its message ids up in them), and the business-row phase again with them;
//!    the report prints their size per million beside a record's;
//! 6. naive: the scheme teams write by hand, one transaction per message — insert the dedup row
//!    (`ON CONFLICT DO NOTHING`; none inserted: a duplicate), the business row, mark the dedup row
//!    done, commit — then the ack of the batch (after every commit); new messages;
//! 7. leased: the same pipeline with a leased handler without effect (claim committed with a
//!    lease and an open attempt row, the call, then the fenced completion);
//! 8. HTTP (with `--features http`): a leased HTTP handler calling a local axum endpoint that
//!    answers 200 at once — what the gateway costs over the leased phase (issue 22 asks for at
//!    least 70 % of its rate);
//!    Beside it, the same calls alone (one pooled reqwest client, the handler's `concurrency` in
//!    flight, no broker, pipeline or database): the floor these two cores allow the HTTP phase.
//!    `BENCH_HTTP_CONCURRENCY` sets that concurrency (default the handler's, 16);
//! 9. RabbitMQ: raw again; the faster raw phase is the reference (100 %).
//!
//! With `--features mysql` (issue 25), MariaDB's side by side: the idempotent phases without
//! effect and with a business row, and the pipeline alone, each again on `MySqlStore` right
//! after PostgreSQL's, with the same message ids, workers and batch (a MariaDB database and a
//! Redis prefix of their own; the handlers write the same row in MariaDB's transaction). The
//! report prints their records/s beside PostgreSQL's and MariaDB ÷ PostgreSQL. Needs the local
//! MariaDB (`DEDUP_TEST_MYSQL_URL`, default `mysql://root@127.0.0.1:3306/test`).
//!
//! Run: `cargo bench -p dedup-engine [--features http,mysql] --bench consume [-- [kafka] [MESSAGES [WORKERS [BATCH]]]]`
//! (defaults RabbitMQ, 100000, 4, 100: a raw phase of 20 000 messages lasts only 0.3–0.4 s, too
//! short to measure; Kafka topics have 4 partitions, `max_in_flight` is the default 1000 unless
//! `KAFKA_MAX_IN_FLIGHT` says otherwise). Needs the local
//! PostgreSQL, Redis and RabbitMQ or Kafka test broker. Throughput is measured from the first
//! delivery of a phase to its last settlement. Prints a report.

use std::sync::Arc;
use std::time::Duration;

use dedup_engine::actions::cleanup::late::RetentionWatch;
use dedup_engine::fastpath::{FastPath, FastPathSettings};
use dedup_engine::handler::{Handler, HandlerRegistry};
use dedup_engine::message::{IdPolicy, TypePolicy};
use dedup_engine::pipeline::{AckReason, Pipeline, PipelineSettings};
use dedup_engine::record::{ConsumerGroup, LeaseExpiryPolicy};
use dedup_engine::retry::Backoff;
use dedup_engine::stats::Stats;
use dedup_engine::store::postgres::PgStore;
use dedup_engine::testing::kafka::TestKafka;
use dedup_engine::testing::{TestBroker, TestDatabase, amqp_url, redis_url};

#[path = "consume/broker.rs"]
mod broker;
#[path = "consume/handlers.rs"]
mod handlers;
#[cfg(feature = "http")]
#[path = "consume/http.rs"]
mod http;
#[cfg(feature = "mysql")]
#[path = "consume/mariadb.rs"]
mod mariadb;
#[path = "consume/phases.rs"]
mod phases;
#[path = "consume/report.rs"]
mod report;

use broker::{Bench, raw_kafka};
use handlers::{InsertRow, InsertRows, LeasedNoEffect, NoEffect};
#[cfg(feature = "http")]
use http::{http_calls_alone, http_concurrency, instant_endpoint};
use phases::{Work, consume, without_broker};

/// Fingerprints of deleted records kept for the late-duplicate phases.
const FINGERPRINTS: i64 = 1_000_000;

/// Keeps [`FINGERPRINTS`] fingerprints, as cleanup would have (of other message ids), and returns
/// a retention watch that knows they are kept, with their size and a record's in bytes.
async fn keep_fingerprints(db: &TestDatabase) -> (Arc<RetentionWatch>, f64, f64) {
    sqlx::query(
        "INSERT INTO dedup_fingerprints (fingerprint, first_seen_at, forget_at)
         SELECT dedup_fingerprint('bench', 'GONE.EVENT', 'GONE.EVENT.' || i || ':1'), now() - interval '40 days',
                now() + interval '300 days'
         FROM generate_series(1, $1) AS i ON CONFLICT DO NOTHING",
    )
    .bind(FINGERPRINTS)
    .execute(&db.pool)
    .await
    .unwrap();
    sqlx::query("VACUUM ANALYZE dedup_fingerprints").execute(&db.pool).await.unwrap();
    sqlx::query("VACUUM ANALYZE dedup_records").execute(&db.pool).await.unwrap();
    let (fingerprint, record): (f64, f64) = sqlx::query_as(
        "SELECT pg_total_relation_size('dedup_fingerprints')::float8 / (SELECT count(*) FROM dedup_fingerprints),
                pg_total_relation_size('dedup_records')::float8 / (SELECT count(*) FROM dedup_records)",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    let watch = Arc::new(RetentionWatch::default());
    watch.refresh(&db.pool).await.unwrap();
    assert!(watch.fingerprints_kept());
    (watch, fingerprint, record)
}

/// The body of every bench message (published or in memory).
const BODY: &[u8] = br#"{"orderNo":"1","amountCents":100}"#;

/// The pipeline's settings, on either database.
fn settings() -> PipelineSettings {
    PipelineSettings {
        group: ConsumerGroup::parse("bench").unwrap(),
        max_attempts: 5,
        lease: Duration::from_secs(30),
        backoff: Backoff::default(),
        id_policy: IdPolicy::default(),
        type_policy: TypePolicy::default(),
        keep_poison_payload_bytes: 1024,
        late_duplicates: dedup_engine::LateDuplicatePolicy::Process,
    }
}

/// The bench's pipeline; `http`: the URL of the HTTP phase's endpoint (`BENCH.HTTP`).
fn pipeline(db: &TestDatabase, fast_path: Arc<FastPath>, http: Option<&str>) -> Pipeline {
    let mut handlers = HandlerRegistry::new();
    handlers.register("BENCH.EVENT", Handler::Transactional(Arc::new(InsertRow)));
    handlers.register("BENCH.ROWS", Handler::Transactional(Arc::new(InsertRows)));
    handlers.register("BENCH.NOEFFECT", Handler::Transactional(Arc::new(NoEffect)));
    let hold = LeaseExpiryPolicy::Hold;
    handlers.register("BENCH.LEASED", Handler::Leased { handler: Arc::new(LeasedNoEffect), on_lease_expiry: hold });
    #[cfg(feature = "http")]
    if let Some(url) = http {
        let mut settings = dedup_engine::http::HttpSettings::new(url);
        settings.timeout_ms = 5_000;
        settings.concurrency = http_concurrency();
        let handler = dedup_engine::http::HttpHandler::new(&settings).unwrap();
        handlers.register("BENCH.HTTP", Handler::Leased { handler: Arc::new(handler), on_lease_expiry: hold });
    }
    #[cfg(not(feature = "http"))]
    let _ = http;
    Pipeline::new(
        PgStore::new(db.pool.clone(), &db.schema),
        fast_path,
        Arc::new(Stats::default()),
        handlers,
        settings(),
    )
}

fn main() {
    // Client warnings (librdkafka's too) on stderr; more with RUST_LOG.
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()))
        .with_writer(std::io::stderr)
        .init();
    let kafka = std::env::args().any(|a| a == "kafka");
    let args: Vec<usize> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    let total = args.first().copied().unwrap_or(100_000);
    let workers = args.get(1).copied().unwrap_or(4);
    let batch = args.get(2).copied().unwrap_or(100);
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    runtime.block_on(async move {
        let db = TestDatabase::create().await;
        sqlx::query("CREATE TABLE bench_effects (message_id TEXT NOT NULL, at TIMESTAMPTZ DEFAULT now())")
            .execute(&db.pool)
            .await
            .unwrap();
        // The hand-written scheme's dedup table: its key, a status, when it was done.
        sqlx::query(
            "CREATE TABLE naive_dedup (message_id TEXT PRIMARY KEY, status TEXT NOT NULL,
                                       seen_at TIMESTAMPTZ NOT NULL DEFAULT now(), done_at TIMESTAMPTZ)",
        )
        .execute(&db.pool)
        .await
        .unwrap();
        let bench = if kafka {
            let mut kafka = TestKafka::new(4, Backoff::default());
            if let Ok(limit) = std::env::var("KAFKA_MAX_IN_FLIGHT") {
                kafka.settings.max_in_flight = limit.parse().expect("KAFKA_MAX_IN_FLIGHT is a number");
            }
            Bench::Kafka(kafka)
        } else {
            let mut broker = TestBroker::new(&amqp_url(), Backoff::default());
            broker.settings.prefetch = u16::try_from(batch * 2).unwrap_or(u16::MAX);
            Bench::RabbitMq(broker)
        };
        let prefix = format!("bench-{}", uuid::Uuid::new_v4().simple());
        let redis =
            Arc::new(FastPath::new(&redis_url(), FastPathSettings { prefix: prefix.clone(), ..Default::default() }));
        #[cfg(feature = "mysql")]
        let mariadb = mariadb::MariaDb::create(&prefix).await;
        let no_redis =
            Arc::new(FastPath::new("redis://127.0.0.1:1", FastPathSettings { prefix, ..Default::default() }));

        let raw_ids: Vec<String> = (0..total).map(|i| format!("RAW.EVENT.{i}:1")).collect();
        let no_effect_ids: Vec<String> = (0..total).map(|i| format!("BENCH.NOEFFECT.{i}:1")).collect();
        let ids: Vec<String> = (0..total).map(|i| format!("BENCH.EVENT.{i}:1")).collect();
        let rows_ids: Vec<String> = (0..total).map(|i| format!("BENCH.ROWS.{i}:1")).collect();
        let in_memory_ids: Vec<String> = (0..total).map(|i| format!("BENCH.NOEFFECT.M{i}:1")).collect();
        let kept_memory_ids: Vec<String> = (0..total).map(|i| format!("BENCH.NOEFFECT.F{i}:1")).collect();
        let kept_ids: Vec<String> = (0..total).map(|i| format!("BENCH.EVENT.F{i}:1")).collect();
        let naive_ids: Vec<String> = (0..total).map(|i| format!("NAIVE.EVENT.{i}:1")).collect();
        let leased_ids: Vec<String> = (0..total).map(|i| format!("BENCH.LEASED.{i}:1")).collect();
        #[cfg(feature = "http")]
        let (http_url, http_ids) =
            (Some(instant_endpoint().await), (0..total).map(|i| format!("BENCH.HTTP.{i}:1")).collect::<Vec<_>>());
        #[cfg(not(feature = "http"))]
        let http_url: Option<String> = None;
        let mut phases = Vec::new();

        if let Bench::Kafka(kafka) = &bench {
            bench.publish(&raw_ids).await;
            phases.push(tokio::task::block_in_place(|| raw_kafka(kafka, total, batch)));
        }
        bench.publish(&raw_ids).await;
        let raw_name = if kafka { "engine source, ack only" } else { "raw consume + ack" };
        phases.push(consume(raw_name, bench.factory(), Work::<PgStore>::Ack, total, workers, batch).await);
        let new_messages = [
            ("idempotent, handler without effect", &no_effect_ids),
            ("idempotent, batch handler inserts rows", &rows_ids),
            ("idempotent, handler inserts a row", &ids),
        ];
        for (name, ids) in new_messages {
            bench.publish(ids).await;
            let work = Work::Pipeline(pipeline(&db, redis.clone(), None), AckReason::Processed);
            phases.push(consume(name, bench.factory(), work, total, workers, batch).await);
            // The same messages on MariaDB right after, so that the machine's noise hits both.
            #[cfg(feature = "mysql")]
            if let Some(name) = mariadb::phase_name(name) {
                bench.publish(ids).await;
                let work = Work::Pipeline(mariadb.pipeline(), AckReason::Processed);
                phases.push(mariadb.counted(consume(name, bench.factory(), work, total, workers, batch)).await);
            }
        }
        let duplicates = [
            ("duplicates, Redis hit", &redis, AckReason::DuplicateRedis),
            ("duplicates, database (Redis down)", &no_redis, AckReason::DuplicateDatabase),
        ];
        for (name, fast_path, expect) in duplicates {
            bench.publish(&ids).await;
            let work = Work::Pipeline(pipeline(&db, fast_path.clone(), None), expect);
            phases.push(consume(name, bench.factory(), work, total, workers, batch).await);
        }
        // What PostgreSQL and Redis allow on this machine with no broker at all: the ceiling of
        // any broker's idempotent phase here.
        let name = "pipeline alone, no broker, without effect";
        phases.push(without_broker(name, pipeline(&db, redis.clone(), None), &in_memory_ids, workers, batch).await);
        #[cfg(feature = "mysql")]
        if let Some(name) = mariadb::phase_name(name) {
            phases
                .push(mariadb.counted(without_broker(name, mariadb.pipeline(), &in_memory_ids, workers, batch)).await);
        }
        // The same, and the business-row phase, with fingerprints kept: each batch looks its ids up.
        let (watch, fingerprint_bytes, record_bytes) = keep_fingerprints(&db).await;
        let with_lookups = || pipeline(&db, redis.clone(), None).with_retention(watch.clone());
        let name = "pipeline alone, 1 M fingerprints kept";
        phases.push(without_broker(name, with_lookups(), &kept_memory_ids, workers, batch).await);
        bench.publish(&kept_ids).await;
        let work = Work::Pipeline(with_lookups(), AckReason::Processed);
        phases
            .push(consume("inserts a row, 1 M fingerprints kept", bench.factory(), work, total, workers, batch).await);
        bench.publish(&naive_ids).await;
        let work = Work::<PgStore>::Naive(db.pool.clone());
        phases.push(consume("naive: a transaction per message", bench.factory(), work, total, workers, batch).await);
        // Leased, then HTTP side by side: the gateway's cost over a leased handler.
        let leased = ("leased, handler without effect", &leased_ids);
        #[cfg(feature = "http")]
        let leased = [leased, ("HTTP, endpoint answering at once", &http_ids)];
        #[cfg(not(feature = "http"))]
        let leased = [leased];
        for (name, ids) in leased {
            bench.publish(ids).await;
            let work = Work::Pipeline(pipeline(&db, redis.clone(), http_url.as_deref()), AckReason::Processed);
            phases.push(consume(name, bench.factory(), work, total, workers, batch).await);
        }
        // What the endpoint and the client alone allow on these two cores: the HTTP phase's
        // floor, beside it.
        #[cfg(feature = "http")]
        if let Some(url) = &http_url {
            phases.push(http_calls_alone(url, total, http_concurrency()).await);
        }
        // The raw phase again, warm: the first one also pays for the run's first connections,
        // and its rate varies most. The faster of the two is the reference (100 %).
        if !kafka {
            bench.publish(&raw_ids).await;
            phases.push(
                consume("raw consume + ack, again", bench.factory(), Work::<PgStore>::Ack, total, workers, batch).await,
            );
        }

        let effects: i64 = sqlx::query_scalar("SELECT count(*) FROM bench_effects").fetch_one(&db.pool).await.unwrap();
        assert_eq!(effects, 4 * i64::try_from(total).unwrap(), "every message applied exactly once");
        let late: i64 = sqlx::query_scalar("SELECT count(*) FROM late_duplicates").fetch_one(&db.pool).await.unwrap();
        assert_eq!(late, 0, "no bench message matches a kept fingerprint");
        #[cfg(feature = "mysql")]
        assert_eq!(mariadb.effects().await, i64::try_from(total).unwrap(), "every message applied once on MariaDB");

        let setup = match &bench {
            Bench::Kafka(kafka) => format!("max_in_flight {}", kafka.settings.max_in_flight),
            Bench::RabbitMq(broker) => format!("prefetch {}", broker.settings.prefetch),
        };
        let heading = format!(
            "\nconsume benchmark ({}): {total} messages per phase, {workers} workers, batch {batch}, {setup}",
            bench.name()
        );
        let raw = if kafka { phases[0].rate() } else { phases[0].rate().max(phases[phases.len() - 1].rate()) };
        report::print(&heading, &phases, raw, fingerprint_bytes, record_bytes);
        #[cfg(feature = "mysql")]
        mariadb.print_counters(total);
    });
}
