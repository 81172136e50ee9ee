//! A frozen worker (DESIGN.md, "Two handler modes"): worker A holds a leased record, then cannot
//! reach the database (its heartbeat stalls, as in a SIGSTOP or a network cut) until its lease
//! runs out; worker B takes the record over (`on_lease_expiry = reclaim`) and completes it. When
//! A wakes up:
//! - if it had not run its effect yet, its lease guard says the lease is lost, and it does not;
//! - if it had, its completion is refused, and the record shows the takeover and the possible
//!   double effect.
//!
//! And the batch's leased path around it: a slow call holds back neither the calls nor the
//! completions of its batch's other messages, one heartbeat statement extends all the leases a
//! worker holds, and a takeover in the middle of a batch completes nothing of what was taken.
//! A batch's claim that fails after its claim statement (in the duplicate check) claims nothing,
//! so no record is left marked started without its call.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use common::{CountingEffect, GROUP, Harness, eventually, message, settings};
use dedup_engine::console::records::{RecordDetail, record_detail};
use dedup_engine::handler::{Handler, HandlerError, HandlerInput, HandlerRegistry, LeaseGuard, LeasedHandler};
use dedup_engine::pipeline::{AckReason, Disposition, Pipeline};
use dedup_engine::record::LeaseExpiryPolicy;
use dedup_engine::store::postgres::PgStore;
use serde_json::json;
use tokio::sync::Notify;

/// An external effect (counted) with a pause: before it (`effect_first` false) or after it.
struct Pausing {
    effects: AtomicUsize,
    effect_first: bool,
    /// Notified when the handler is inside its pause.
    paused: Notify,
    /// The pause ends when notified.
    resume: Notify,
    /// Only the first run pauses (worker A); the takeover's run (worker B) does not.
    runs: AtomicUsize,
}

impl Pausing {
    fn new(effect_first: bool) -> Arc<Self> {
        Arc::new(Self {
            effects: AtomicUsize::new(0),
            effect_first,
            paused: Notify::new(),
            resume: Notify::new(),
            runs: AtomicUsize::new(0),
        })
    }
}

#[async_trait]
impl LeasedHandler for Pausing {
    async fn handle(&self, _: &HandlerInput<'_>, lease: &LeaseGuard) -> Result<(), HandlerError> {
        let first_run = self.runs.fetch_add(1, Ordering::SeqCst) == 0;
        if first_run && self.effect_first {
            self.effects.fetch_add(1, Ordering::SeqCst);
        }
        if first_run {
            self.paused.notify_one();
            self.resume.notified().await;
        }
        if !(first_run && self.effect_first) {
            lease.check()?;
            self.effects.fetch_add(1, Ordering::SeqCst);
        }
        Ok(())
    }
}

fn registry(handler: Arc<Pausing>) -> HandlerRegistry {
    let mut handlers = HandlerRegistry::new();
    handlers.register("ORDER.NOTIFY", Handler::Leased { handler, on_lease_expiry: LeaseExpiryPolicy::Reclaim });
    handlers
}

/// Runs the frozen-worker story with `handler`; returns worker A's disposition and the record.
async fn freeze_a_then_take_over(h: &Harness, handler: Arc<Pausing>) -> (Disposition, RecordDetail) {
    let lease = Duration::from_secs(1);
    // Worker A's own small pool: the test takes all its connections to cut A off.
    let pool_a = sqlx::postgres::PgPoolOptions::new()
        .max_connections(2)
        .acquire_timeout(Duration::from_millis(200))
        .connect(&h.db.url)
        .await
        .unwrap();
    let a = Pipeline::new(
        PgStore::new(pool_a.clone(), &h.db.schema),
        h.fast_path.clone(),
        h.stats.clone(),
        registry(handler.clone()),
        settings(5, lease),
    );
    let b = h.pipeline_with(registry(handler.clone()), settings(5, lease));
    let msg = message("ORDER.NOTIFY.F1:3", json!({"orderNo": "F1"}));
    let batch = [msg.clone()];
    let worker_a = tokio::spawn(async move { a.process("host-a:1:0", &batch).await });
    tokio::time::timeout(Duration::from_secs(10), handler.paused.notified()).await.expect("A runs its handler");
    let cut_off = [pool_a.acquire().await.unwrap(), pool_a.acquire().await.unwrap()];
    tokio::time::sleep(lease + Duration::from_millis(500)).await;

    let taken = b.process("host-b:2:0", &[msg]).await;
    assert_eq!(taken, [Disposition::Ack(AckReason::Processed)], "B took the expired lease over and completed");
    drop(cut_off);
    handler.resume.notify_one();
    let mut a_done = tokio::time::timeout(Duration::from_secs(10), worker_a).await.expect("A finishes").unwrap();
    let id: i64 = sqlx::query_scalar("SELECT id FROM dedup_records WHERE consumer_group = $1")
        .bind(GROUP)
        .fetch_one(h.pool())
        .await
        .unwrap();
    (a_done.pop().expect("one disposition"), record_detail(h.pool(), id).await.unwrap().unwrap())
}

#[tokio::test]
async fn a_worker_that_lost_its_lease_before_the_effect_does_not_perform_it() {
    let h = Harness::new().await;
    let handler = Pausing::new(false);
    let (a, detail) = freeze_a_then_take_over(&h, handler.clone()).await;
    assert_eq!(a, Disposition::Ack(AckReason::LeaseLost), "A gives the record to its new holder");
    assert_eq!(handler.effects.load(Ordering::SeqCst), 1, "one effect: B's; A saw its lease lost");
    assert_eq!(detail.row.status.as_str(), "succeeded");
    let first = &detail.attempt_history[0];
    assert_eq!(first.outcome.as_deref(), Some("lease_lost"), "the superseded attempt is closed");
    assert_eq!(first.taken_over_by.as_deref(), Some("host-b:2:0"), "by whom");
    assert!(first.ended_at.is_some(), "when");
    assert!(!detail.possible_double_effect(), "no effect ran twice");
    assert_eq!(detail.takeovers(), 1);
    // The traffic figures: one takeover, and no failure, since no record failed.
    h.stats.flush(h.pool().clone(), &PgStore::new(h.pool().clone(), &h.db.schema)).await.unwrap();
    let (failed, takeovers, succeeded): (i64, i64, i64) = sqlx::query_as(
        "SELECT sum(failed)::bigint, sum(lease_takeovers)::bigint, sum(succeeded)::bigint FROM stats_minute",
    )
    .fetch_one(h.pool())
    .await
    .unwrap();
    assert_eq!((failed, takeovers, succeeded), (0, 1, 1));
}

#[tokio::test]
async fn a_worker_whose_effect_ran_before_it_saw_the_loss_flags_a_possible_double_effect() {
    let h = Harness::new().await;
    let handler = Pausing::new(true);
    let (a, detail) = freeze_a_then_take_over(&h, handler.clone()).await;
    assert_eq!(a, Disposition::Ack(AckReason::LeaseLost), "A's completion is refused");
    assert_eq!(handler.effects.load(Ordering::SeqCst), 2, "A's effect and B's: the double effect a lease cannot stop");
    assert_eq!(detail.row.status.as_str(), "succeeded", "B's completion stands");
    let first = &detail.attempt_history[0];
    assert_eq!((first.outcome.as_deref(), first.late_effect), (Some("lease_lost"), true));
    assert!(detail.possible_double_effect(), "the record says its effect may have run twice");
    let counted = dedup_engine::console::overview::OverviewReads::double_effect_count(h.pool()).await.unwrap();
    assert_eq!(counted, 1, "the overview counts it");
}

/// A leased handler whose calls for `slow` ids wait for a permit of `release`; records the
/// calls it answered, by message id (what the team's service sees).
struct SlowFor {
    slow: Vec<&'static str>,
    release: tokio::sync::Semaphore,
    answered: std::sync::Mutex<Vec<String>>,
}

impl SlowFor {
    fn new(slow: &[&'static str]) -> Arc<Self> {
        Arc::new(Self { slow: slow.to_vec(), release: tokio::sync::Semaphore::new(0), answered: Default::default() })
    }

    fn answered(&self) -> Vec<String> {
        self.answered.lock().unwrap().clone()
    }
}

#[async_trait]
impl LeasedHandler for SlowFor {
    async fn handle(&self, input: &HandlerInput<'_>, lease: &LeaseGuard) -> Result<(), HandlerError> {
        if self.slow.contains(&input.message_id.as_str()) {
            self.release.acquire().await.unwrap().forget();
        }
        lease.check()?;
        self.answered.lock().unwrap().push(input.message_id.as_str().to_owned());
        Ok(())
    }
}

fn slow_registry(handler: Arc<SlowFor>) -> HandlerRegistry {
    let mut handlers = HandlerRegistry::new();
    handlers.register("ORDER.NOTIFY", Handler::Leased { handler, on_lease_expiry: LeaseExpiryPolicy::Hold });
    handlers
}

/// The status of each record of the group, by message id.
async fn statuses(h: &Harness) -> std::collections::HashMap<String, String> {
    sqlx::query_as("SELECT message_id, status FROM dedup_records WHERE consumer_group = $1")
        .bind(GROUP)
        .fetch_all(h.pool())
        .await
        .unwrap()
        .into_iter()
        .collect()
}

fn notify_batch(ids: &[&str]) -> Vec<dedup_engine::message::InboundMessage> {
    ids.iter().map(|id| message(id, json!({"orderNo": id}))).collect()
}

#[tokio::test]
async fn a_slow_call_holds_back_neither_the_calls_nor_the_completions_of_its_batch() {
    let h = Harness::new().await;
    let handler = SlowFor::new(&["ORDER.NOTIFY.S1:1"]);
    let pipeline = h.pipeline(slow_registry(handler.clone()), 5);
    let ids = ["ORDER.NOTIFY.S1:1", "ORDER.NOTIFY.S2:1", "ORDER.NOTIFY.S3:1", "ORDER.NOTIFY.S4:1"];
    let batch = notify_batch(&ids);
    let worker = tokio::spawn(async move { pipeline.process("host-a:1:0", &batch).await });

    // While S1's call hangs, the service has answered the three others and their records are
    // completed (committed), not waiting for S1.
    eventually(Duration::from_secs(10), || async {
        let done = statuses(&h).await;
        ids[1..].iter().all(|id| done.get(*id).map(String::as_str) == Some("succeeded"))
    })
    .await;
    let mut answered = handler.answered();
    answered.sort();
    assert_eq!(answered, ids[1..], "the service saw the three others once each, S1 not yet");
    assert_eq!(statuses(&h).await["ORDER.NOTIFY.S1:1"], "processing", "S1 is still in flight");

    handler.release.add_permits(1);
    let dispositions = tokio::time::timeout(Duration::from_secs(10), worker).await.unwrap().unwrap();
    assert_eq!(dispositions, vec![Disposition::Ack(AckReason::Processed); 4], "acked after every commit");
    assert!(statuses(&h).await.values().all(|s| s == "succeeded"));
}

/// Captures the `count` field of every `extend_lease` span (the heartbeat statement).
#[derive(Clone, Default)]
struct Heartbeats(Arc<std::sync::Mutex<Vec<String>>>);

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Heartbeats {
    fn on_new_span(
        &self,
        attrs: &tracing::span::Attributes<'_>,
        _: &tracing::span::Id,
        _: tracing_subscriber::layer::Context<'_, S>,
    ) {
        struct Count(Option<String>);
        impl tracing::field::Visit for Count {
            fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
                if field.name() == "count" {
                    self.0 = Some(format!("{value:?}"));
                }
            }
        }
        if attrs.metadata().name() == "extend_lease" {
            let mut count = Count(None);
            attrs.record(&mut count);
            self.0.lock().unwrap().push(count.0.unwrap_or_else(|| "none".into()));
        }
    }
}

#[tokio::test]
async fn one_heartbeat_statement_extends_every_lease_of_the_batch() {
    use tracing_subscriber::layer::SubscriberExt;
    let heartbeats = Heartbeats::default();
    let _scope = tracing::subscriber::set_default(tracing_subscriber::registry().with(heartbeats.clone()));
    let h = Harness::new().await;
    let ids = ["ORDER.NOTIFY.H1:1", "ORDER.NOTIFY.H2:1", "ORDER.NOTIFY.H3:1", "ORDER.NOTIFY.H4:1", "ORDER.NOTIFY.H5:1"];
    let handler = SlowFor::new(&ids);
    // A lease of 1 s: a heartbeat every third of it.
    let pipeline = h.pipeline_with(slow_registry(handler.clone()), settings(5, Duration::from_secs(1)));
    let batch = notify_batch(&ids);
    let worker = tokio::spawn(async move { pipeline.process("host-a:1:0", &batch).await });
    // Hung for three lease lengths: without extensions every lease would run out.
    tokio::time::sleep(Duration::from_secs(3)).await;
    handler.release.add_permits(ids.len());
    let dispositions = tokio::time::timeout(Duration::from_secs(10), worker).await.unwrap().unwrap();
    assert_eq!(dispositions, vec![Disposition::Ack(AckReason::Processed); 5], "every lease held throughout");
    let beats = heartbeats.0.lock().unwrap().clone();
    assert!((6..=10).contains(&beats.len()), "one statement per beat (every ~333 ms for 3 s): {beats:?}");
    assert!(beats.iter().all(|count| count == "5"), "each beat covers the five leases: {beats:?}");
}

/// A record and its attempt: message id, status, lease owner, attempt outcome, late effect.
type AttemptRow = (String, String, Option<String>, Option<String>, bool);

#[tokio::test]
async fn a_takeover_in_the_middle_of_a_batch_completes_nothing_that_was_taken() {
    let h = Harness::new().await;
    let ids = ["ORDER.NOTIFY.T1:1", "ORDER.NOTIFY.T2:1", "ORDER.NOTIFY.T3:1"];
    let handler = SlowFor::new(&ids);
    let pipeline = h.pipeline(slow_registry(handler.clone()), 5);
    let batch = notify_batch(&ids);
    let worker = tokio::spawn(async move { pipeline.process("host-a:1:0", &batch).await });
    eventually(Duration::from_secs(10), || async { statuses(&h).await.len() == 3 }).await;

    // While the calls run, another worker holds T1 and T2 now (a takeover: a new lease token).
    sqlx::query(
        "UPDATE dedup_records SET lease_owner = 'host-b:2:0', lease_token = gen_random_uuid()
         WHERE consumer_group = $1 AND message_id = ANY($2)",
    )
    .bind(GROUP)
    .bind(&ids[..2])
    .execute(h.pool())
    .await
    .unwrap();
    handler.release.add_permits(ids.len());
    let dispositions = tokio::time::timeout(Duration::from_secs(10), worker).await.unwrap().unwrap();
    assert_eq!(
        dispositions,
        [
            Disposition::Ack(AckReason::LeaseLost),
            Disposition::Ack(AckReason::LeaseLost),
            Disposition::Ack(AckReason::Processed)
        ],
        "only T3, still this worker's, is completed"
    );
    let rows: Vec<AttemptRow> = sqlx::query_as(
        "SELECT r.message_id, r.status, r.lease_owner, a.outcome, a.late_effect
         FROM dedup_records r JOIN record_attempts a ON a.record_id = r.id
         WHERE r.consumer_group = $1 ORDER BY r.message_id",
    )
    .bind(GROUP)
    .fetch_all(h.pool())
    .await
    .unwrap();
    let expected = |id: &str, status: &str, owner: Option<&str>, outcome: &str, late: bool| {
        (id.to_owned(), status.to_owned(), owner.map(str::to_owned), Some(outcome.to_owned()), late)
    };
    assert_eq!(
        rows,
        [
            expected(ids[0], "processing", Some("host-b:2:0"), "lease_lost", true),
            expected(ids[1], "processing", Some("host-b:2:0"), "lease_lost", true),
            expected(ids[2], "succeeded", None, "succeeded", false),
        ],
        "the taken records stay the new holder's; the late answers are kept on their attempts"
    );
}

#[tokio::test]
async fn a_leased_claim_that_fails_in_its_duplicate_check_claims_nothing() {
    // Redis down: the database judges the duplicate (a marker would skip it before the claim).
    let h = Harness::with_redis("redis://127.0.0.1:1").await;
    let handler = CountingEffect::new(Duration::ZERO);
    let mut handlers = HandlerRegistry::new();
    handlers.register(
        "ORDER.NOTIFY",
        Handler::Leased { handler: handler.clone(), on_lease_expiry: LeaseExpiryPolicy::Hold },
    );
    let pipeline = h.pipeline(handlers, 5);
    let (old, new) = ("ORDER.NOTIFY.OLD:1", "ORDER.NOTIFY.NEW:1");
    assert_eq!(
        pipeline.process("host-a:1:0", &notify_batch(&[old])).await,
        vec![Disposition::Ack(AckReason::Processed)]
    );

    // A real error from PostgreSQL in the duplicate check's update of the old record, after
    // the claim statement has claimed the new one.
    sqlx::raw_sql(
        "CREATE FUNCTION refuse_duplicate() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN RAISE EXCEPTION 'duplicate check refused (test)'; END $$;
         CREATE TRIGGER refuse_duplicate BEFORE UPDATE OF duplicate_count ON dedup_records
         FOR EACH ROW WHEN (NEW.duplicate_count > OLD.duplicate_count) EXECUTE FUNCTION refuse_duplicate();",
    )
    .execute(h.pool())
    .await
    .unwrap();
    let batch = notify_batch(&[new, old]);
    assert_eq!(pipeline.process("host-a:1:0", &batch).await, vec![Disposition::Redeliver; 2]);
    let state: Option<(String, Option<bool>)> =
        sqlx::query_as("SELECT status, effect_started FROM dedup_records WHERE message_id = $1")
            .bind(new)
            .fetch_optional(h.pool())
            .await
            .unwrap();
    assert_eq!(state, None, "the new record is not left claimed (and marked started) without its call");
    assert_eq!(handler.runs(), 1, "no call was made");

    // Redelivered once the database takes the check again: called once, the old one a duplicate.
    sqlx::query("DROP TRIGGER refuse_duplicate ON dedup_records").execute(h.pool()).await.unwrap();
    let dispositions = pipeline.process("host-a:1:0", &batch).await;
    assert_eq!(dispositions, [Disposition::Ack(AckReason::Processed), Disposition::Ack(AckReason::DuplicateDatabase)]);
    assert_eq!(handler.runs(), 2);
    assert!(statuses(&h).await.values().all(|s| s == "succeeded"));
}

/// A leased handler whose service answers 503 (retryable) every time.
struct Unavailable;

#[async_trait]
impl LeasedHandler for Unavailable {
    async fn handle(&self, _: &HandlerInput<'_>, _: &LeaseGuard) -> Result<(), HandlerError> {
        Err(HandlerError::retryable("DOWNSTREAM_DOWN", "503 (test)"))
    }
}

#[tokio::test]
async fn a_failure_the_database_refuses_once_is_recorded_on_the_next_try() {
    let h = Harness::new().await;
    let mut handlers = HandlerRegistry::new();
    handlers.register(
        "ORDER.NOTIFY",
        Handler::Leased { handler: Arc::new(Unavailable), on_lease_expiry: LeaseExpiryPolicy::Hold },
    );
    let pipeline = h.pipeline(handlers, 5);
    // PostgreSQL refuses the first statement that records a failure, as a database that
    // restarts would.
    sqlx::raw_sql(
        "CREATE SEQUENCE refused_failures;
         CREATE FUNCTION refuse_first_failure() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN IF nextval('refused_failures') = 1 THEN RAISE EXCEPTION 'failure refused (test)'; END IF;
         RETURN NEW; END $$;
         CREATE TRIGGER refuse_first_failure BEFORE UPDATE OF status ON dedup_records
         FOR EACH ROW WHEN (NEW.status = 'failed') EXECUTE FUNCTION refuse_first_failure();",
    )
    .execute(h.pool())
    .await
    .unwrap();
    let id = "ORDER.NOTIFY.REFUSED:1";
    let dispositions = pipeline.process("host-a:1:0", &notify_batch(&[id])).await;
    assert_eq!(dispositions, vec![Disposition::Retry { delay: Duration::from_secs(1) }], "retried by the backoff");
    let refused: i64 = sqlx::query_scalar("SELECT last_value FROM refused_failures").fetch_one(h.pool()).await.unwrap();
    assert_eq!(refused, 2, "refused once, recorded on the second try");
    let state: (String, Option<bool>) =
        sqlx::query_as("SELECT status, effect_started FROM dedup_records WHERE message_id = $1")
            .bind(id)
            .fetch_one(h.pool())
            .await
            .unwrap();
    assert_eq!(state.0, "failed", "not left processing, to be parked at its redelivery though the call failed");
}

#[tokio::test]
async fn a_leased_claim_that_loses_a_deadlock_is_claimed_again() {
    let before = dedup_engine::testing::deadlock_reruns();
    // Redis down: the database judges the duplicates (a marker would skip them before the claim).
    let h = Harness::with_redis("redis://127.0.0.1:1").await;
    let mut handlers = HandlerRegistry::new();
    handlers.register(
        "ORDER.NOTIFY",
        Handler::Leased { handler: CountingEffect::new(Duration::ZERO), on_lease_expiry: LeaseExpiryPolicy::Hold },
    );
    let pipeline = h.pipeline(handlers, 5);
    let batch = notify_batch(&["ORDER.NOTIFY.DEADLOCK:1", "ORDER.NOTIFY.DEADLOCK:2"]);
    assert_eq!(pipeline.process("host-a:1:0", &batch).await, vec![Disposition::Ack(AckReason::Processed); 2]);

    // Another transaction holds the second record; the claim takes the first (it locks in
    // message-id order) and waits for the second; the other one then asks for the first. The
    // claim, waiting longer, is the deadlock's victim (its check runs after 1 s, the other's
    // after 10 s).
    let mut other = h.pool().begin().await.unwrap();
    sqlx::query("SET LOCAL deadlock_timeout = '10s'").execute(&mut *other).await.unwrap();
    let lock = "SELECT id FROM dedup_records WHERE message_id = $1 FOR UPDATE";
    sqlx::query(lock).bind("ORDER.NOTIFY.DEADLOCK:2").execute(&mut *other).await.unwrap();
    let redelivery = tokio::spawn({
        let (pipeline, batch) = (pipeline.clone(), batch.clone());
        async move { pipeline.process("host-b:1:0", &batch).await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    sqlx::query(lock).bind("ORDER.NOTIFY.DEADLOCK:1").execute(&mut *other).await.unwrap();
    other.commit().await.unwrap();

    let dispositions = redelivery.await.unwrap();
    assert_eq!(dispositions, vec![Disposition::Ack(AckReason::DuplicateDatabase); 2], "judged, not redelivered");
    assert_eq!(dedup_engine::testing::deadlock_reruns() - before, 1, "one rerun, counted");
}
