//! Shared helpers of the engine's integration tests: a fresh database per test, a Redis key
//! prefix per test, messages, and small handlers whose effects can be counted.
#![allow(dead_code)] // each test binary uses a different subset

pub mod amqp;
pub mod service;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use dedup_engine::actions::Publishers;
use dedup_engine::consumer::{Consumer, ConsumerSettings};
use dedup_engine::fastpath::{FastPath, FastPathSettings};
use dedup_engine::handler::{
    Handler, HandlerError, HandlerInput, HandlerRegistry, LeaseGuard, LeasedHandler, TransactionalHandler,
};
use dedup_engine::message::{IdPolicy, InboundMessage, TypePolicy};
use dedup_engine::pipeline::{Pipeline, PipelineSettings};
use dedup_engine::record::ConsumerGroup;
use dedup_engine::retry::Backoff;
use dedup_engine::source::SourceFactory;
use dedup_engine::stats::Stats;
use dedup_engine::store::postgres::PgStore;
use dedup_engine::testing::{TestDatabase, redis_url};
use sqlx::{PgConnection, PgPool};
use tokio_util::sync::CancellationToken;

pub const GROUP: &str = "test-group";

/// A database with a `test_effects` table, and a fast path with a key prefix of its own.
pub struct Harness {
    pub db: TestDatabase,
    pub fast_path: Arc<FastPath>,
    pub stats: Arc<Stats>,
}

impl Harness {
    pub async fn new() -> Self {
        Self::with_redis(&redis_url()).await
    }

    /// With Redis at `url` (e.g. a closed port: Redis down).
    pub async fn with_redis(url: &str) -> Self {
        keep_log_callsites_enabled();
        let db = TestDatabase::create().await;
        sqlx::query(
            "CREATE TABLE test_effects (message_id TEXT NOT NULL, payload JSONB, at TIMESTAMPTZ DEFAULT now())",
        )
        .execute(&db.pool)
        .await
        .unwrap();
        let prefix = format!("test-{}", uuid::Uuid::new_v4().simple());
        let fast_path = Arc::new(FastPath::new(url, FastPathSettings { prefix, ..FastPathSettings::default() }));
        Self { db, fast_path, stats: Arc::new(Stats::default()) }
    }

    pub fn pool(&self) -> &PgPool {
        &self.db.pool
    }

    pub fn pipeline(&self, handlers: HandlerRegistry, max_attempts: i32) -> Pipeline {
        self.pipeline_with(handlers, settings(max_attempts, Duration::from_secs(30)))
    }

    pub fn pipeline_with(&self, handlers: HandlerRegistry, settings: PipelineSettings) -> Pipeline {
        Pipeline::new(
            PgStore::new(self.db.pool.clone(), &self.db.schema),
            self.fast_path.clone(),
            self.stats.clone(),
            handlers,
            settings,
        )
    }

    /// Effects recorded for `message_id`.
    pub async fn effects(&self, message_id: &str) -> i64 {
        sqlx::query_scalar("SELECT count(*) FROM test_effects WHERE message_id = $1")
            .bind(message_id)
            .fetch_one(&self.db.pool)
            .await
            .unwrap()
    }

    /// (status, attempts, duplicate_count, payload_conflicts) of a record.
    pub async fn record(&self, message_id: &str) -> Option<(String, i32, i32, i32)> {
        sqlx::query_as(
            "SELECT status, attempts, duplicate_count, payload_conflicts FROM dedup_records
             WHERE consumer_group = $1 AND message_id = $2",
        )
        .bind(GROUP)
        .bind(message_id)
        .fetch_optional(&self.db.pool)
        .await
        .unwrap()
    }
}

/// Operator actions' publishers with `source` as the test group's ([`GROUP`]).
pub fn publishers(source: Arc<dyn SourceFactory>) -> Publishers {
    let mut publishers = Publishers::default();
    publishers.add(GROUP, source);
    publishers
}

pub fn settings(max_attempts: i32, lease: Duration) -> PipelineSettings {
    PipelineSettings {
        group: ConsumerGroup::parse(GROUP).unwrap(),
        max_attempts,
        lease,
        backoff: Backoff { initial_ms: 1000, max_ms: 8000 },
        id_policy: IdPolicy::default(),
        type_policy: TypePolicy::default(),
        keep_poison_payload_bytes: 1024,
        late_duplicates: dedup_engine::LateDuplicatePolicy::Process,
    }
}

/// A JSON message with the id in the AMQP property.
pub fn message(id: &str, body: serde_json::Value) -> InboundMessage {
    raw_message(Some(id), serde_json::to_vec(&body).unwrap())
}

pub fn raw_message(id: Option<&str>, payload: Vec<u8>) -> InboundMessage {
    dedup_engine::testing::rabbitmq_delivery(id, payload)
}

/// `ORDER.PAY` → [`RecordEffect`].
pub fn recording() -> HandlerRegistry {
    let mut handlers = HandlerRegistry::new();
    handlers.register("ORDER.PAY", Handler::Transactional(Arc::new(RecordEffect)));
    handlers
}

/// Records one row in `test_effects` per run, in the claim's transaction.
pub struct RecordEffect;

#[async_trait]
impl TransactionalHandler for RecordEffect {
    async fn handle(&self, input: &HandlerInput<'_>, tx: &mut PgConnection) -> Result<(), HandlerError> {
        sqlx::query("INSERT INTO test_effects (message_id, payload) VALUES ($1, $2)")
            .bind(input.message_id.as_str())
            .bind(input.json.cloned())
            .execute(&mut *tx)
            .await?;
        Ok(())
    }
}

/// Records its message type (in the `message_id` column) and payload in `test_effects` per run,
/// in the claim's transaction: for tests where one id carries several types.
pub struct RecordTyped;

#[async_trait]
impl TransactionalHandler for RecordTyped {
    async fn handle(&self, input: &HandlerInput<'_>, tx: &mut PgConnection) -> Result<(), HandlerError> {
        sqlx::query("INSERT INTO test_effects (message_id, payload) VALUES ($1, $2)")
            .bind(input.message_type)
            .bind(input.json.cloned())
            .execute(&mut *tx)
            .await?;
        Ok(())
    }
}

/// Runs of [`RecordTyped`] for `message_type`.
pub async fn typed_effects(pool: &PgPool, message_type: &str) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM test_effects WHERE message_id = $1")
        .bind(message_type)
        .fetch_one(pool)
        .await
        .unwrap()
}

/// Fails every time (retryable), of class `DOWNSTREAM_DOWN`, with the message id in the detail.
pub struct AlwaysFails;

#[async_trait]
impl TransactionalHandler for AlwaysFails {
    async fn handle(&self, input: &HandlerInput<'_>, _: &mut PgConnection) -> Result<(), HandlerError> {
        Err(HandlerError::retryable("DOWNSTREAM_DOWN", format!("downstream 503 for {}", input.message_id)))
    }
}

/// Counts runs (an external effect), after an optional delay.
pub struct CountingEffect {
    pub runs: AtomicUsize,
    pub delay: Duration,
}

impl CountingEffect {
    pub fn new(delay: Duration) -> Arc<Self> {
        Arc::new(Self { runs: AtomicUsize::new(0), delay })
    }

    pub fn runs(&self) -> usize {
        self.runs.load(Ordering::SeqCst)
    }
}

#[async_trait]
impl LeasedHandler for CountingEffect {
    async fn handle(&self, _: &HandlerInput<'_>, _: &LeaseGuard) -> Result<(), HandlerError> {
        tokio::time::sleep(self.delay).await;
        self.runs.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
}

/// Counts log events at WARN or above (install with `tracing::subscriber::set_default` in a
/// current-thread runtime so every task of the test reports to it).
#[derive(Clone, Default)]
pub struct WarnCounter(pub Arc<AtomicUsize>);

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for WarnCounter {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        if *event.metadata().level() <= tracing::Level::WARN {
            eprintln!("unexpected {} from {}", event.metadata().level(), event.metadata().target());
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }
}

/// Polls `check` every 100 ms until it is true or `within` passes.
pub async fn eventually<F: Future<Output = bool>>(within: Duration, mut check: impl FnMut() -> F) {
    let started = Instant::now();
    while !check().await {
        assert!(started.elapsed() < within, "condition not met within {within:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Runs `pipeline`'s consumer with `concurrency` workers on `source` until the token is
/// cancelled; returns once every worker runs.
pub async fn spawn_consumer(
    pipeline: Pipeline,
    source: Arc<dyn SourceFactory>,
    concurrency: usize,
) -> (CancellationToken, tokio::task::JoinHandle<()>) {
    let settings = ConsumerSettings { concurrency, ..ConsumerSettings::default() };
    let consumer = Consumer::new(pipeline, source, settings);
    let status = consumer.status();
    let token = CancellationToken::new();
    let task = tokio::spawn(consumer.run(token.clone()));
    eventually(Duration::from_secs(10), || async { status.running_workers() == concurrency }).await;
    (token, task)
}

/// Installs, once per test binary, a global subscriber that keeps nothing but is interested in
/// every callsite. `tracing` caches a callsite's interest process-wide, computed on the thread
/// that first reaches it: without this, a sibling test without a subscriber can reach a log line
/// first and disable it for a test that captures logs with `set_default` (its event is then never
/// built). Every test that captures logs builds a [`Harness`] before its events, so this runs
/// before them; installing it rebuilds the interest of callsites registered earlier.
fn keep_log_callsites_enabled() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // Fails only if another global subscriber is set, which is then interested on its own.
        let _ = tracing::subscriber::set_global_default(tracing_subscriber::registry());
    });
}

/// Log lines, kept for the test to read (a `tracing` writer).
#[derive(Clone, Default)]
pub struct Captured(pub Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
