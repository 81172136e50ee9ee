//! A frozen worker (DESIGN.md, "Two handler modes"): worker A holds a leased record, then cannot
//! reach the database (its heartbeat stalls, as in a SIGSTOP or a network cut) until its lease
//! runs out; worker B takes the record over (`on_lease_expiry = reclaim`) and completes it. When
//! A wakes up:
//! - if it had not run its effect yet, its lease guard says the lease is lost, and it does not;
//! - if it had, its completion is refused, and the record shows the takeover and the possible
//!   double effect.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use common::{GROUP, Harness, message, settings};
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
    let counted = dedup_engine::console::overview::double_effect_count(h.pool()).await.unwrap();
    assert_eq!(counted, 1, "the overview counts it");
}
