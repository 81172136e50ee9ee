//! Batch handlers (`TransactionalHandler::max_batch` above 1): a run of consecutive messages of
//! one handler in one `handle_batch` call in the optimistic transaction; after a failure, each
//! message alone through `handle`, in a savepoint. DESIGN.md, "Batch handlers".

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use common::*;
use dedup_engine::handler::{Handler, HandlerError, HandlerInput, HandlerRegistry, TransactionalHandler};
use dedup_engine::pipeline::{AckReason, Disposition};
use serde_json::json;
use sqlx::PgConnection;

/// Writes one `test_effects` row per message: a run in one statement, or one by one. Fails for
/// the message id `fail_for`, in either call. Remembers the ids of every batch call and counts
/// the calls of `handle`.
struct Rows {
    fail_for: Option<&'static str>,
    batches: Mutex<Vec<Vec<String>>>,
    singles: AtomicUsize,
}

impl Rows {
    fn new(fail_for: Option<&'static str>) -> Arc<Self> {
        Arc::new(Rows { fail_for, batches: Mutex::default(), singles: AtomicUsize::new(0) })
    }

    fn refuses(&self, input: &HandlerInput<'_>) -> Result<(), HandlerError> {
        match self.fail_for {
            Some(id) if input.message_id.as_str() == id => {
                Err(HandlerError::retryable("DOWNSTREAM_DOWN", format!("no stock for {id}")))
            }
            _ => Ok(()),
        }
    }

    fn batches(&self) -> Vec<Vec<String>> {
        self.batches.lock().unwrap().clone()
    }
}

#[async_trait::async_trait]
impl TransactionalHandler for Rows {
    async fn handle(&self, input: &HandlerInput<'_>, tx: &mut PgConnection) -> Result<(), HandlerError> {
        self.singles.fetch_add(1, Ordering::SeqCst);
        self.refuses(input)?;
        RecordEffect.handle(input, tx).await
    }

    fn max_batch(&self) -> usize {
        3
    }

    fn lock_key(&self, input: &HandlerInput<'_>) -> Option<String> {
        input.str_field("sku").ok().map(str::to_owned)
    }

    async fn handle_batch(&self, inputs: &[HandlerInput<'_>], tx: &mut PgConnection) -> Result<(), HandlerError> {
        let ids: Vec<String> = inputs.iter().map(|input| input.message_id.as_str().to_owned()).collect();
        self.batches.lock().unwrap().push(ids.clone());
        inputs.iter().try_for_each(|input| self.refuses(input))?;
        sqlx::query("INSERT INTO test_effects (message_id) SELECT * FROM unnest($1::text[])")
            .bind(&ids)
            .execute(tx)
            .await?;
        Ok(())
    }
}

/// Records its effect, under the same lock key as [`Rows`]: a message of another handler that
/// sorts between `Rows`' messages.
struct Create;

#[async_trait::async_trait]
impl TransactionalHandler for Create {
    async fn handle(&self, input: &HandlerInput<'_>, tx: &mut PgConnection) -> Result<(), HandlerError> {
        RecordEffect.handle(input, tx).await
    }

    fn lock_key(&self, input: &HandlerInput<'_>) -> Option<String> {
        input.str_field("sku").ok().map(str::to_owned)
    }
}

fn pay(n: u32, sku: &str) -> dedup_engine::message::InboundMessage {
    message(&format!("ORDER.PAY.{n}:1"), json!({"orderNo": n.to_string(), "sku": sku}))
}

/// Runs are consecutive messages of one handler in the batch's lock order (lock key, then
/// message id), at most `max_batch` long; a message of another handler between them ends a run,
/// a duplicate is in none, and every message's effect is applied once.
#[tokio::test]
async fn a_batch_handler_takes_runs_of_its_messages_in_one_call_each() {
    let h = Harness::new().await;
    let rows = Rows::new(None);
    let mut handlers = HandlerRegistry::new();
    handlers.register("ORDER.PAY", Handler::Transactional(rows.clone()));
    handlers.register("ORDER.CREATE", Handler::Transactional(Arc::new(Create)));
    let pipeline = h.pipeline(handlers, 5);

    assert_eq!(pipeline.process("w", &[pay(1, "a")]).await, [Disposition::Ack(AckReason::Processed)]);
    let create = message("ORDER.CREATE.1:1", json!({"orderNo": "1", "sku": "b"}));
    let batch = [pay(7, "c"), create, pay(1, "a"), pay(2, "a"), pay(3, "a"), pay(4, "a"), pay(5, "a"), pay(6, "c")];
    let outcomes = pipeline.process("w", &batch).await;

    assert_eq!(outcomes[2], Disposition::Ack(AckReason::DuplicateRedis), "{outcomes:?}");
    let processed = outcomes.iter().filter(|d| **d == Disposition::Ack(AckReason::Processed)).count();
    assert_eq!(processed, 7, "{outcomes:?}");
    let ids = |ns: &[u32]| ns.iter().map(|n| format!("ORDER.PAY.{n}:1")).collect::<Vec<_>>();
    assert_eq!(rows.batches(), [ids(&[1]), ids(&[2, 3, 4]), ids(&[5]), ids(&[6, 7])]);
    assert_eq!(rows.singles.load(Ordering::SeqCst), 0, "handle is not called while nothing fails");
    for n in 1..=7 {
        assert_eq!(h.effects(&format!("ORDER.PAY.{n}:1")).await, 1, "ORDER.PAY.{n}:1");
    }
    assert_eq!(h.effects("ORDER.CREATE.1:1").await, 1);
    let succeeded: i64 = sqlx::query_scalar("SELECT count(*) FROM dedup_records WHERE status = 'succeeded'")
        .fetch_one(h.pool())
        .await
        .unwrap();
    assert_eq!(succeeded, 8);
}

/// A failing batch call rolls the optimistic transaction back; the messages run again one by
/// one through `handle`, each in a savepoint: the failure is recorded on its own message, the
/// others commit, and nothing of the failed batch call remains.
#[tokio::test]
async fn a_failing_batch_call_is_pinned_on_its_message_by_running_each_alone() {
    let h = Harness::new().await;
    let rows = Rows::new(Some("ORDER.PAY.12:1"));
    let mut handlers = HandlerRegistry::new();
    handlers.register("ORDER.PAY", Handler::Transactional(rows.clone()));
    let pipeline = h.pipeline(handlers, 5);

    let outcomes = pipeline.process("w", &[pay(11, "a"), pay(12, "a"), pay(13, "a")]).await;

    assert_eq!(outcomes[0], Disposition::Ack(AckReason::Processed));
    assert!(matches!(outcomes[1], Disposition::Retry { .. }), "{outcomes:?}");
    assert_eq!(outcomes[2], Disposition::Ack(AckReason::Processed));
    let ids = |ns: &[u32]| ns.iter().map(|n| format!("ORDER.PAY.{n}:1")).collect::<Vec<_>>();
    assert_eq!(rows.batches(), [ids(&[11, 12, 13])], "one batch call, rolled back");
    assert_eq!(rows.singles.load(Ordering::SeqCst), 3, "then each message alone");
    let effects =
        (h.effects("ORDER.PAY.11:1").await, h.effects("ORDER.PAY.12:1").await, h.effects("ORDER.PAY.13:1").await);
    assert_eq!(effects, (1, 0, 1));
    let (status, attempts, _, _) = h.record("ORDER.PAY.12:1").await.unwrap();
    assert_eq!((status.as_str(), attempts), ("failed", 1));
}
