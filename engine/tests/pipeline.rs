//! The idempotent pipeline against real PostgreSQL and Redis (deliveries built in memory; the
//! broker side is covered by `rabbitmq.rs`).

mod common;

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use common::*;
use dedup_engine::handler::{Handler, HandlerRegistry};
use dedup_engine::pipeline::{AckReason, Disposition};
use dedup_engine::record::LeaseExpiryPolicy;
use dedup_engine::store::postgres::PgStore;
use dedup_engine::testing::redis_url;
use serde_json::json;
use tracing_subscriber::layer::SubscriberExt;

async fn db_counters(h: &Harness) -> (i64, i64) {
    sqlx::query_as("SELECT xact_rollback, deadlocks FROM pg_stat_database WHERE datname = current_database()")
        .fetch_one(h.pool())
        .await
        .unwrap()
}

#[tokio::test(flavor = "current_thread")]
async fn eight_simultaneous_deliveries_make_one_effect_and_seven_duplicates() {
    let warnings = WarnCounter::default();
    let _guard = tracing::subscriber::set_default(tracing_subscriber::registry().with(warnings.clone()));
    let h = Harness::new().await;
    let pipeline = h.pipeline(recording(), 5);
    let msg = message("ORDER.PAY.1001:2", json!({"orderNo": "1001"}));
    let before = db_counters(&h).await;

    let barrier = Arc::new(tokio::sync::Barrier::new(8));
    let tasks: Vec<_> = (0..8)
        .map(|i| {
            let (pipeline, msg, barrier) = (pipeline.clone(), msg.clone(), barrier.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                pipeline.process(&format!("worker-{i}"), &[msg]).await.remove(0)
            })
        })
        .collect();
    let mut outcomes = Vec::new();
    for t in tasks {
        outcomes.push(t.await.unwrap());
    }

    let processed = outcomes.iter().filter(|d| **d == Disposition::Ack(AckReason::Processed)).count();
    let duplicates = outcomes
        .iter()
        .filter(|d| matches!(d, Disposition::Ack(AckReason::DuplicateDatabase | AckReason::DuplicateRedis)))
        .count();
    assert_eq!((processed, duplicates), (1, 7), "{outcomes:?}");
    assert_eq!(h.effects("ORDER.PAY.1001:2").await, 1);
    let (status, attempts, _, conflicts) = h.record("ORDER.PAY.1001:2").await.unwrap();
    assert_eq!((status.as_str(), attempts, conflicts), ("succeeded", 1, 0));
    let after = db_counters(&h).await;
    assert_eq!(after, before, "no transaction rolled back, no deadlock (xact_rollback, deadlocks)");
    assert_eq!(warnings.0.load(Ordering::SeqCst), 0, "no warning or error logged");
}

#[tokio::test]
async fn a_redelivery_after_success_is_skipped_by_redis_and_by_the_database() {
    let h = Harness::new().await;
    let pipeline = h.pipeline(recording(), 5);
    let msg = message("ORDER.PAY.7:2", json!({"orderNo": "7"}));
    assert_eq!(pipeline.process("w", std::slice::from_ref(&msg)).await, [Disposition::Ack(AckReason::Processed)]);
    // The marker exists after the ack: the key is not deleted.
    let key = h.fast_path.key(GROUP, "ORDER.PAY.7:2");
    assert!(h.fast_path.marker_ttl(&key).await.unwrap().is_some_and(|ttl| ttl > 600_000));
    assert_eq!(pipeline.process("w", std::slice::from_ref(&msg)).await, [Disposition::Ack(AckReason::DuplicateRedis)]);

    // Without the marker (expired, or Redis lost it) the database still knows.
    let mut conn = redis::Client::open(redis_url()).unwrap().get_multiplexed_async_connection().await.unwrap();
    let _: () = redis::cmd("DEL").arg(&key).query_async(&mut conn).await.unwrap();
    assert_eq!(
        pipeline.process("w", std::slice::from_ref(&msg)).await,
        [Disposition::Ack(AckReason::DuplicateDatabase)]
    );
    assert_eq!(h.effects("ORDER.PAY.7:2").await, 1);
    let (_, _, duplicate_count, _) = h.record("ORDER.PAY.7:2").await.unwrap();
    assert_eq!(duplicate_count, 1, "the database-caught duplicate is counted on the record");
}

#[tokio::test]
async fn a_copy_sent_back_while_the_lease_is_live_counts_once_when_it_is_judged() {
    let h = Harness::new().await;
    let pipeline = h.pipeline(recording(), 5);
    // Another worker holds the record under a live lease.
    sqlx::query(
        "INSERT INTO dedup_records (consumer_group, message_id, message_type, status, attempts, max_attempts,
             lease_owner, lease_token, lease_expires_at, payload_hash, source_broker)
         VALUES ($1, 'ORDER.PAY.L1:1', 'ORDER.PAY', 'processing', 1, 5, 'other', gen_random_uuid(),
                 now() + interval '1 minute', '\\x00', 'rabbitmq')",
    )
    .bind(GROUP)
    .execute(h.pool())
    .await
    .unwrap();
    let copy = message("ORDER.PAY.L1:1", json!({"orderNo": "L1"}));
    for _ in 0..3 {
        let outcome = pipeline.process("w", std::slice::from_ref(&copy)).await;
        assert!(matches!(outcome[0], Disposition::Retry { .. }), "sent back to be judged later: {outcome:?}");
    }
    let (_, _, duplicate_count, _) = h.record("ORDER.PAY.L1:1").await.unwrap();
    assert_eq!(duplicate_count, 0, "not counted while sent back");
    sqlx::query("UPDATE dedup_records SET status = 'succeeded', lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL, completed_at = now()")
        .execute(h.pool())
        .await
        .unwrap();
    assert_eq!(pipeline.process("w", &[copy]).await, [Disposition::Ack(AckReason::DuplicateDatabase)]);
    let (_, _, duplicate_count, _) = h.record("ORDER.PAY.L1:1").await.unwrap();
    assert_eq!(duplicate_count, 1, "one copy, one duplicate");
}

#[tokio::test]
async fn the_marker_is_written_only_after_commit() {
    use dedup_engine::handler::{HandlerError, HandlerInput, TransactionalHandler};
    use sqlx::PgConnection;
    use std::sync::atomic::AtomicBool;

    /// Kills its own database connection the first time (the claim's transaction is lost).
    struct DropsConnectionOnce(AtomicBool);
    #[async_trait::async_trait]
    impl TransactionalHandler for DropsConnectionOnce {
        async fn handle(&self, input: &HandlerInput<'_>, tx: &mut PgConnection) -> Result<(), HandlerError> {
            if !self.0.swap(true, Ordering::SeqCst) {
                let _ = sqlx::query("SELECT pg_terminate_backend(pg_backend_pid())").execute(&mut *tx).await;
            }
            RecordEffect.handle(input, tx).await
        }
    }

    let h = Harness::new().await;
    let mut handlers = HandlerRegistry::new();
    handlers.register("ORDER.PAY", Handler::Transactional(Arc::new(DropsConnectionOnce(AtomicBool::new(false)))));
    let pipeline = h.pipeline(handlers, 5);
    let msg = message("ORDER.PAY.8:2", json!({"orderNo": "8"}));
    let key = h.fast_path.key(GROUP, "ORDER.PAY.8:2");

    assert_eq!(pipeline.process("w", std::slice::from_ref(&msg)).await, [Disposition::Redeliver]);
    assert_eq!(h.fast_path.marker_ttl(&key).await.unwrap(), None, "no marker for an uncommitted claim");
    assert!(h.record("ORDER.PAY.8:2").await.is_none(), "the claim was rolled back");

    assert_eq!(pipeline.process("w", std::slice::from_ref(&msg)).await, [Disposition::Ack(AckReason::Processed)]);
    assert_eq!(h.effects("ORDER.PAY.8:2").await, 1);
    assert!(h.fast_path.marker_ttl(&key).await.unwrap().is_some());
}

#[tokio::test]
async fn same_id_with_another_payload_is_processed_once_and_flagged() {
    let h = Harness::new().await;
    let pipeline = h.pipeline(recording(), 5);
    let first = message("ORDER.PAY.9:2", json!({"orderNo": "9", "amountCents": 100}));
    let other = message("ORDER.PAY.9:2", json!({"orderNo": "9", "amountCents": 999}));
    assert_eq!(pipeline.process("w", &[first]).await, [Disposition::Ack(AckReason::Processed)]);
    // The Redis marker has the payload hash: a different payload goes to the database.
    assert_eq!(pipeline.process("w", &[other]).await, [Disposition::Ack(AckReason::DuplicateDatabase)]);
    assert_eq!(h.effects("ORDER.PAY.9:2").await, 1);
    let (status, _, duplicates, conflicts) = h.record("ORDER.PAY.9:2").await.unwrap();
    assert_eq!((status.as_str(), duplicates, conflicts), ("succeeded", 1, 1));
}

#[tokio::test]
async fn with_redis_down_the_database_decides_and_fallbacks_are_counted() {
    let h = Harness::with_redis("redis://127.0.0.1:1").await;
    let pipeline = h.pipeline(recording(), 5);
    let msg = message("ORDER.PAY.10:2", json!({"orderNo": "10"}));
    let batch = [msg.clone(), msg.clone(), msg];
    let outcomes = pipeline.process("w", &batch).await;
    assert_eq!(outcomes[0], Disposition::Ack(AckReason::Processed), "{outcomes:?}");
    assert_eq!(&outcomes[1..], [const { Disposition::Ack(AckReason::DuplicateDatabase) }; 2]);
    assert_eq!(h.effects("ORDER.PAY.10:2").await, 1);
    h.stats.flush(h.pool().clone(), &PgStore::new(h.pool().clone(), &h.db.schema)).await.unwrap();
    let (fallbacks, db_duplicates): (i64, i64) =
        sqlx::query_as("SELECT sum(redis_fallbacks)::bigint, sum(duplicates_db)::bigint FROM stats_minute")
            .fetch_one(h.pool())
            .await
            .unwrap();
    assert_eq!((fallbacks, db_duplicates), (3, 2));
}

#[tokio::test]
async fn a_failing_handler_is_retried_with_growing_delays_then_dead() {
    let h = Harness::new().await;
    let mut handlers = HandlerRegistry::new();
    handlers.register("ORDER.PAY", Handler::Transactional(Arc::new(AlwaysFails)));
    let pipeline = h.pipeline(handlers, 3);
    let msg = message("ORDER.PAY.11:2", json!({"orderNo": "11"}));
    let mut outcomes = Vec::new();
    for _ in 0..4 {
        outcomes.extend(pipeline.process("w", std::slice::from_ref(&msg)).await);
    }
    assert_eq!(outcomes[0], Disposition::Retry { delay: Duration::from_secs(1) });
    assert_eq!(outcomes[1], Disposition::Retry { delay: Duration::from_secs(2) });
    assert!(
        matches!(&outcomes[2], Disposition::DeadLetter { reason } if reason.contains("DOWNSTREAM_DOWN")),
        "{outcomes:?}"
    );
    assert_eq!(outcomes[3], Disposition::Ack(AckReason::DuplicateDatabase), "a dead record waits for an operator");
    let (status, attempts, _, _) = h.record("ORDER.PAY.11:2").await.unwrap();
    assert_eq!((status.as_str(), attempts), ("dead", 3));
    let history: Vec<(i32, String)> = sqlx::query_as(
        "SELECT a.attempt, a.outcome FROM record_attempts a JOIN dedup_records r ON r.id = a.record_id
         WHERE r.message_id = 'ORDER.PAY.11:2' ORDER BY a.attempt",
    )
    .fetch_all(h.pool())
    .await
    .unwrap();
    assert_eq!(history, [(1, "failed".into()), (2, "failed".into()), (3, "dead".into())]);
    let (error_class, last_error, payload_kept): (String, String, bool) = sqlx::query_as(
        "SELECT error_class, last_error, payload IS NOT NULL FROM dedup_records WHERE message_id = 'ORDER.PAY.11:2'",
    )
    .fetch_one(h.pool())
    .await
    .unwrap();
    assert_eq!(error_class, "DOWNSTREAM_DOWN", "the class the handler gave");
    assert_eq!(last_error, "DOWNSTREAM_DOWN: downstream 503 for ORDER.PAY.11:2", "class and detail");
    assert!(payload_kept, "a dead record keeps its payload for requeue");

    // Another message dead of the same cause, its id in the detail too: one dead-letter group.
    let other = message("ORDER.PAY.12:2", json!({"orderNo": "12"}));
    for _ in 0..3 {
        pipeline.process("w", std::slice::from_ref(&other)).await;
    }
    let groups = dedup_engine::console::failures::FailureReads::dead_letter_groups(h.pool(), 10).await.unwrap();
    let groups: Vec<(Option<String>, i64)> = groups.into_iter().map(|g| (g.error_class, g.records)).collect();
    assert_eq!(groups, [(Some("DOWNSTREAM_DOWN".to_owned()), 2)]);
}

#[tokio::test]
async fn a_failing_handler_fails_alone_and_its_batch_is_counted_once() {
    use dedup_engine::handler::{HandlerError, HandlerInput, TransactionalHandler};
    use sqlx::PgConnection;
    use std::collections::HashMap;
    use std::sync::Mutex;

    /// Fails (retryable) for one message id and records its effect for the others; counts its runs
    /// by message id.
    struct FailsFor {
        message_id: &'static str,
        runs: Mutex<HashMap<String, usize>>,
    }

    #[async_trait::async_trait]
    impl TransactionalHandler for FailsFor {
        async fn handle(&self, input: &HandlerInput<'_>, tx: &mut PgConnection) -> Result<(), HandlerError> {
            *self.runs.lock().unwrap().entry(input.message_id.as_str().to_owned()).or_default() += 1;
            if input.message_id.as_str() == self.message_id {
                return Err(HandlerError::retryable("DOWNSTREAM_DOWN", "downstream 503"));
            }
            RecordEffect.handle(input, tx).await
        }
    }

    // Redis down: the database judges the duplicate below.
    let h = Harness::with_redis("redis://127.0.0.1:1").await;
    let handler = Arc::new(FailsFor { message_id: "ORDER.PAY.3:2", runs: Default::default() });
    let mut handlers = HandlerRegistry::new();
    handlers.register("ORDER.PAY", Handler::Transactional(handler.clone()));
    let pipeline = h.pipeline(handlers, 5);
    let pay = |n: u32| message(&format!("ORDER.PAY.{n}:2"), json!({"orderNo": n.to_string()}));
    assert_eq!(pipeline.process("w", &[pay(1)]).await, [Disposition::Ack(AckReason::Processed)]);

    // One batch: a duplicate of 1, new messages 2 to 6 of which 3 fails, and a poison message.
    let mut batch = vec![pay(1)];
    batch.extend((2..=6).map(pay));
    batch.push(raw_message(None, br#"{"orderNo":"7"}"#.to_vec()));
    let outcomes = pipeline.process("w", &batch).await;
    assert_eq!(outcomes[0], Disposition::Ack(AckReason::DuplicateDatabase));
    assert_eq!(outcomes[1], Disposition::Ack(AckReason::Processed));
    assert_eq!(outcomes[2], Disposition::Retry { delay: Duration::from_secs(1) });
    assert_eq!(&outcomes[3..6], [const { Disposition::Ack(AckReason::Processed) }; 3]);
    assert!(matches!(&outcomes[6], Disposition::DeadLetter { reason } if reason.contains("no message id")));

    // The optimistic attempt ran 2 and 3 (in message-id order) and was rolled back at 3's
    // error; the savepoint attempt ran 2 to 6 and committed everything but 3.
    let runs = handler.runs.lock().unwrap().clone();
    let runs: Vec<usize> = (1..=6).map(|n| runs.get(&format!("ORDER.PAY.{n}:2")).copied().unwrap_or(0)).collect();
    assert_eq!(runs, [1, 2, 2, 1, 1, 1], "handler runs of 1 to 6");
    for n in [1, 2, 4, 5, 6] {
        let id = format!("ORDER.PAY.{n}:2");
        assert_eq!(h.effects(&id).await, 1, "{id} applied once");
        let (status, attempts, duplicates, _) = h.record(&id).await.unwrap();
        assert_eq!((status.as_str(), attempts, duplicates), ("succeeded", 1, i32::from(n == 1)), "{id}");
    }
    assert_eq!(h.effects("ORDER.PAY.3:2").await, 0);
    let (status, attempts, _, _) = h.record("ORDER.PAY.3:2").await.unwrap();
    assert_eq!((status.as_str(), attempts), ("failed", 1));
    let history: Vec<(i32, String)> = sqlx::query_as(
        "SELECT a.attempt, a.outcome FROM record_attempts a JOIN dedup_records r ON r.id = a.record_id
         WHERE r.message_id = 'ORDER.PAY.3:2' ORDER BY a.attempt",
    )
    .fetch_all(h.pool())
    .await
    .unwrap();
    assert_eq!(history, [(1, "failed".into())]);

    // Counted once each, in both batches together: nothing from the rolled-back attempt.
    h.stats.flush(h.pool().clone(), &PgStore::new(h.pool().clone(), &h.db.schema)).await.unwrap();
    let counts: (i64, i64, i64, i64, i64, i64, i64, i64, i64) = sqlx::query_as(
        "SELECT sum(deliveries)::bigint, sum(claimed)::bigint, sum(created)::bigint, sum(succeeded)::bigint,
                sum(failed)::bigint, sum(retries)::bigint, sum(duplicates_db)::bigint, sum(poison)::bigint,
                sum(dead)::bigint
         FROM stats_minute",
    )
    .fetch_one(h.pool())
    .await
    .unwrap();
    // deliveries, claimed, created, succeeded, failed, retries, duplicates_db, poison, dead
    assert_eq!(counts, (8, 6, 6, 5, 1, 1, 1, 1, 1));
    let delays: i64 =
        sqlx::query_scalar("SELECT sum(count)::bigint FROM duplicate_delays").fetch_one(h.pool()).await.unwrap();
    assert_eq!(delays, 1, "one duplicate delay");
}

/// A transactional retry that succeeds is claimed straight into `succeeded` (optimistic
/// attempt, no completion statement): it must end exactly as a claim plus completion would.
#[tokio::test]
async fn a_retried_transactional_message_succeeds_with_its_whole_history() {
    use dedup_engine::handler::{HandlerError, HandlerInput, TransactionalHandler};
    use sqlx::PgConnection;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// Fails its first two runs (the first delivery's optimistic and savepoint attempts), then
    /// records the effect.
    struct FailsOneDelivery(AtomicUsize);

    #[async_trait::async_trait]
    impl TransactionalHandler for FailsOneDelivery {
        async fn handle(&self, input: &HandlerInput<'_>, tx: &mut PgConnection) -> Result<(), HandlerError> {
            if self.0.fetch_add(1, Ordering::SeqCst) < 2 {
                return Err(HandlerError::retryable("DOWNSTREAM_DOWN", "downstream 503"));
            }
            RecordEffect.handle(input, tx).await
        }
    }

    let h = Harness::new().await;
    let mut handlers = HandlerRegistry::new();
    handlers.register("ORDER.PAY", Handler::Transactional(Arc::new(FailsOneDelivery(AtomicUsize::new(0)))));
    let pipeline = h.pipeline(handlers, 5);
    let pay = message("ORDER.PAY.21:2", json!({"orderNo": "21"}));
    assert_eq!(
        pipeline.process("w", std::slice::from_ref(&pay)).await,
        [Disposition::Retry { delay: Duration::from_secs(1) }]
    );
    let version_after_failure: i64 =
        sqlx::query_scalar("SELECT version FROM dedup_records").fetch_one(h.pool()).await.unwrap();
    assert_eq!(pipeline.process("w", std::slice::from_ref(&pay)).await, [Disposition::Ack(AckReason::Processed)]);
    assert_eq!(h.effects("ORDER.PAY.21:2").await, 1);
    let row: (String, i32, bool, bool, bool, bool, i64) = sqlx::query_as(
        "SELECT status, attempts, lease_owner IS NULL AND lease_token IS NULL AND lease_expires_at IS NULL,
                completed_at IS NOT NULL, payload IS NULL AND headers IS NULL, next_attempt_at IS NULL, version
         FROM dedup_records",
    )
    .fetch_one(h.pool())
    .await
    .unwrap();
    assert_eq!(row, ("succeeded".into(), 2, true, true, true, true, version_after_failure + 1));
    // The failure is history now: its text stays, but the record no longer has an error class
    // (an error-class filter or a dead-letter group would find a succeeded record otherwise).
    let (class, last_error): (Option<String>, Option<String>) =
        sqlx::query_as("SELECT error_class, last_error FROM dedup_records").fetch_one(h.pool()).await.unwrap();
    assert_eq!((class, last_error.as_deref()), (None, Some("DOWNSTREAM_DOWN: downstream 503")));
    let history: Vec<(i32, String, bool)> =
        sqlx::query_as("SELECT attempt, outcome, ended_at >= started_at FROM record_attempts ORDER BY attempt")
            .fetch_all(h.pool())
            .await
            .unwrap();
    assert_eq!(history, [(1, "failed".into(), true), (2, "succeeded".into(), true)]);
    let counts: Vec<(String, i64)> =
        sqlx::query_as("SELECT status, sum(n)::bigint FROM record_counts GROUP BY 1 HAVING sum(n) <> 0 ORDER BY 1")
            .fetch_all(h.pool())
            .await
            .unwrap();
    assert_eq!(counts, [("succeeded".into(), 1)]);
    // A third delivery is a duplicate.
    assert_eq!(pipeline.process("w", &[pay]).await, [Disposition::Ack(AckReason::DuplicateRedis)]);
}

/// A batch larger than a savepoint transaction (50) commits in one optimistic transaction;
/// when one of its handlers fails, the retry with savepoints splits it into transactions of
/// 50 and only the failing message fails.
#[tokio::test]
async fn a_large_batch_commits_once_and_a_failure_in_it_fails_alone() {
    use dedup_engine::handler::{HandlerError, HandlerInput, TransactionalHandler};
    use sqlx::PgConnection;

    /// Fails (retryable) for order 77, records the effect for the others.
    struct FailsFor77;

    #[async_trait::async_trait]
    impl TransactionalHandler for FailsFor77 {
        async fn handle(&self, input: &HandlerInput<'_>, tx: &mut PgConnection) -> Result<(), HandlerError> {
            if input.message_id.as_str().starts_with("ORDER.PAY.77:") {
                return Err(HandlerError::retryable("DOWNSTREAM_DOWN", "downstream 503"));
            }
            RecordEffect.handle(input, tx).await
        }
    }

    let h = Harness::new().await;
    let mut handlers = HandlerRegistry::new();
    handlers.register("ORDER.PAY", Handler::Transactional(Arc::new(FailsFor77)));
    let pipeline = h.pipeline(handlers, 5);
    let batch = |first: u32| -> Vec<_> {
        (first..first + 120).map(|n| message(&format!("ORDER.PAY.{n}:2"), json!({"orderNo": n.to_string()}))).collect()
    };
    let outcomes = pipeline.process("w", &batch(1000)).await;
    assert!(outcomes.iter().all(|o| *o == Disposition::Ack(AckReason::Processed)), "{outcomes:?}");
    let transactions: i64 =
        sqlx::query_scalar("SELECT count(DISTINCT xmin::text) FROM dedup_records").fetch_one(h.pool()).await.unwrap();
    assert_eq!(transactions, 1, "120 records committed by one transaction");

    let outcomes = pipeline.process("w", &batch(1)).await;
    for (n, outcome) in (1..=120).zip(&outcomes) {
        let expected = if n == 77 {
            Disposition::Retry { delay: Duration::from_secs(1) }
        } else {
            Disposition::Ack(AckReason::Processed)
        };
        assert_eq!(*outcome, expected, "order {n}");
    }
    let counts: Vec<(String, i64)> =
        sqlx::query_as("SELECT status, sum(n)::bigint FROM record_counts GROUP BY 1 HAVING sum(n) <> 0 ORDER BY 1")
            .fetch_all(h.pool())
            .await
            .unwrap();
    assert_eq!(counts, [("failed".into(), 1), ("succeeded".into(), 239)]);
    let effects: i64 = sqlx::query_scalar("SELECT count(*) FROM test_effects").fetch_one(h.pool()).await.unwrap();
    assert_eq!(effects, 239, "every other message applied once");
}

#[tokio::test]
async fn leased_handlers_commit_the_claim_first_and_complete_fenced() {
    let h = Harness::new().await;
    let effect = CountingEffect::new(Duration::from_millis(300));
    let mut handlers = HandlerRegistry::new();
    handlers.register(
        "ORDER.NOTIFY",
        Handler::Leased { handler: effect.clone(), on_lease_expiry: LeaseExpiryPolicy::Hold },
    );
    let pipeline = h.pipeline_with(handlers, settings(5, Duration::from_secs(5)));
    let msg = message("ORDER.NOTIFY.16:3", json!({"orderNo": "16"}));

    let running = tokio::spawn({
        let (pipeline, msg) = (pipeline.clone(), msg.clone());
        async move { pipeline.process("a", &[msg]).await }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    // While the effect runs, the claim is visible (committed) with a live lease; a copy is sent
    // back to be judged after the lease, not dropped.
    let (status, owner, live): (String, String, bool) = sqlx::query_as(
        "SELECT status, lease_owner, lease_expires_at > now() FROM dedup_records WHERE message_id = 'ORDER.NOTIFY.16:3'",
    )
    .fetch_one(h.pool())
    .await
    .unwrap();
    assert_eq!((status.as_str(), owner.as_str(), live), ("processing", "a", true));
    let copy = pipeline.process("b", std::slice::from_ref(&msg)).await;
    assert!(matches!(copy[0], Disposition::Retry { delay } if delay >= Duration::from_secs(4)), "{copy:?}");

    assert_eq!(running.await.unwrap(), [Disposition::Ack(AckReason::Processed)]);
    assert_eq!(effect.runs(), 1);
    let (status, attempts, _, _) = h.record("ORDER.NOTIFY.16:3").await.unwrap();
    assert_eq!((status.as_str(), attempts), ("succeeded", 1));
    let attempt: (Option<String>, bool) = sqlx::query_as(
        "SELECT outcome, ended_at IS NOT NULL FROM record_attempts a JOIN dedup_records r ON r.id = a.record_id
         WHERE r.message_id = 'ORDER.NOTIFY.16:3'",
    )
    .fetch_one(h.pool())
    .await
    .unwrap();
    assert_eq!(attempt, (Some("succeeded".into()), true));
}
