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

/// What a [`Flaky`] batch call does after writing its rows.
#[derive(Clone, Copy, PartialEq)]
enum Fault {
    None,
    /// A permanent handler error.
    Permanent,
    /// A deadlock PostgreSQL raises (SQLSTATE 40P01): a transient `DATABASE` error.
    Deadlock,
}

/// A batch handler of any `max_batch` that writes its rows and then fails as `fault` says.
/// `handle` fails (retryable) while an id is in `refuse`. Remembers every batch call's (id,
/// type, attempt) and the ids `handle` ran for.
struct Flaky {
    max: usize,
    fault: Fault,
    refuse: Mutex<Vec<String>>,
    calls: Mutex<Vec<Vec<(String, String, i32)>>>,
    singles: Mutex<Vec<String>>,
}

impl Flaky {
    fn new(max: usize, fault: Fault) -> Arc<Self> {
        Arc::new(Flaky { max, fault, refuse: Mutex::default(), calls: Mutex::default(), singles: Mutex::default() })
    }

    fn refuses(&self, input: &HandlerInput<'_>) -> Result<(), HandlerError> {
        match self.refuse.lock().unwrap().iter().any(|id| id == input.message_id.as_str()) {
            true => Err(HandlerError::retryable("DOWNSTREAM_DOWN", "refused")),
            false => Ok(()),
        }
    }

    fn calls(&self) -> Vec<Vec<(String, String, i32)>> {
        self.calls.lock().unwrap().clone()
    }
}

#[async_trait::async_trait]
impl TransactionalHandler for Flaky {
    async fn handle(&self, input: &HandlerInput<'_>, tx: &mut PgConnection) -> Result<(), HandlerError> {
        self.singles.lock().unwrap().push(input.message_id.as_str().to_owned());
        self.refuses(input)?;
        RecordEffect.handle(input, tx).await
    }

    fn max_batch(&self) -> usize {
        self.max
    }

    async fn handle_batch(&self, inputs: &[HandlerInput<'_>], tx: &mut PgConnection) -> Result<(), HandlerError> {
        let call = inputs.iter().map(|i| (i.message_id.as_str().to_owned(), i.message_type.to_owned(), i.attempt));
        self.calls.lock().unwrap().push(call.collect());
        let ids: Vec<&str> = inputs.iter().map(|input| input.message_id.as_str()).collect();
        sqlx::query("INSERT INTO test_effects (message_id) SELECT * FROM unnest($1::text[])")
            .bind(&ids)
            .execute(&mut *tx)
            .await?;
        inputs.iter().try_for_each(|input| self.refuses(input))?;
        match self.fault {
            Fault::None => Ok(()),
            Fault::Permanent => Err(HandlerError::permanent("BAD_BATCH", "the batch call refuses")),
            Fault::Deadlock => {
                sqlx::query("DO $$ BEGIN RAISE EXCEPTION 'victim' USING ERRCODE = '40P01'; END $$")
                    .execute(&mut *tx)
                    .await?;
                Ok(())
            }
        }
    }
}

/// `record_counts` agree with the records, status by status.
async fn counts_agree(h: &Harness) -> Vec<(String, i64)> {
    let sql = "SELECT status::text, sum(n)::bigint FROM record_counts GROUP BY 1 HAVING sum(n) <> 0 ORDER BY 1";
    let kept: Vec<(String, i64)> = sqlx::query_as(sql).fetch_all(h.pool()).await.unwrap();
    let sql = "SELECT status::text, count(*) FROM dedup_records GROUP BY 1 ORDER BY 1";
    let real: Vec<(String, i64)> = sqlx::query_as(sql).fetch_all(h.pool()).await.unwrap();
    assert_eq!(kept, real, "record_counts against the rows");
    real
}

fn status(pairs: &[(&str, i64)]) -> Vec<(String, i64)> {
    pairs.iter().map(|(s, n)| ((*s).to_owned(), *n)).collect()
}

/// A batch call that wrote its rows and then failed — permanently, or as a deadlock's victim —
/// leaves none of them: each message runs alone through `handle` and applies its effect once,
/// beside a leased handler's message and a poison message of the same delivery batch.
#[tokio::test]
async fn a_batch_call_that_wrote_and_failed_leaves_nothing_and_each_message_runs_once() {
    for fault in [Fault::Permanent, Fault::Deadlock] {
        let h = Harness::new().await;
        let flaky = Flaky::new(10, fault);
        let leased = CountingEffect::new(std::time::Duration::ZERO);
        let mut handlers = HandlerRegistry::new();
        handlers.register("ORDER.PAY", Handler::Transactional(flaky.clone()));
        let on_lease_expiry = dedup_engine::record::LeaseExpiryPolicy::Hold;
        handlers.register("ORDER.NOTIFY", Handler::Leased { handler: leased.clone(), on_lease_expiry });
        let pipeline = h.pipeline(handlers, 5);
        let notify = message("ORDER.NOTIFY.1:1", json!({"orderNo": "1"}));
        let no_id = raw_message(None, br#"{"orderNo":"9"}"#.to_vec());
        let batch = [pay(1, "a"), notify, pay(2, "a"), no_id, pay(3, "a")];

        let outcomes = pipeline.process("w", &batch).await;

        let processed = Disposition::Ack(AckReason::Processed);
        assert_eq!([&outcomes[0], &outcomes[1], &outcomes[2], &outcomes[4]], [&processed; 4], "{outcomes:?}");
        assert!(matches!(outcomes[3], Disposition::DeadLetter { .. }), "{outcomes:?}");
        assert_eq!(flaky.calls().len(), 1, "one batch call, rolled back");
        assert_eq!(flaky.singles.lock().unwrap().len(), 3, "then each message alone");
        for n in 1..=3 {
            assert_eq!(h.effects(&format!("ORDER.PAY.{n}:1")).await, 1, "ORDER.PAY.{n}:1");
        }
        assert_eq!(leased.runs(), 1);
        assert_eq!(counts_agree(&h).await, status(&[("dead", 1), ("succeeded", 4)]));
    }
}

/// A failed record claimed again in a run carries its attempt (2) into `handle_batch`; a
/// message id twice in one delivery batch is in one run only (its copy is a duplicate).
#[tokio::test]
async fn a_retried_message_in_a_run_carries_its_attempt_and_a_copy_is_in_no_run() {
    let h = Harness::new().await;
    let flaky = Flaky::new(10, Fault::None);
    let mut handlers = HandlerRegistry::new();
    handlers.register("ORDER.PAY", Handler::Transactional(flaky.clone()));
    let pipeline = h.pipeline(handlers, 5);
    flaky.refuse.lock().unwrap().push("ORDER.PAY.2:1".to_owned());
    let outcomes = pipeline.process("w", &[pay(1, "a"), pay(2, "a")]).await;
    assert!(matches!(outcomes[1], Disposition::Retry { .. }), "{outcomes:?}");
    flaky.refuse.lock().unwrap().clear();
    flaky.calls.lock().unwrap().clear();

    let outcomes = pipeline.process("w", &[pay(3, "a"), pay(2, "a"), pay(3, "a"), pay(4, "a")]).await;

    let processed = Disposition::Ack(AckReason::Processed);
    assert_eq!([&outcomes[0], &outcomes[1], &outcomes[3]], [&processed; 3], "{outcomes:?}");
    assert!(matches!(outcomes[2], Disposition::Ack(AckReason::DuplicateDatabase)), "{outcomes:?}");
    let call = |n: u32, attempt: i32| (format!("ORDER.PAY.{n}:1"), "ORDER.PAY".to_owned(), attempt);
    assert_eq!(flaky.calls(), [vec![call(2, 2), call(3, 1), call(4, 1)]]);
    for n in 1..=4 {
        assert_eq!(h.effects(&format!("ORDER.PAY.{n}:1")).await, 1, "ORDER.PAY.{n}:1");
    }
    let (status_2, attempts, _, _) = h.record("ORDER.PAY.2:1").await.unwrap();
    assert_eq!((status_2.as_str(), attempts), ("succeeded", 2));
    assert_eq!(counts_agree(&h).await, status(&[("succeeded", 4)]));
}

/// `max_batch` 0 is `handle` per message; `usize::MAX` takes at most a transaction's messages
/// (MAX_PER_OPTIMISTIC_TRANSACTION, 500) in a call.
#[tokio::test]
async fn max_batch_zero_calls_handle_and_usize_max_is_cut_at_the_transaction() {
    for (max, calls, singles) in [(0, vec![], 600), (usize::MAX, vec![500, 100], 0)] {
        let h = Harness::new().await;
        let flaky = Flaky::new(max, Fault::None);
        let mut handlers = HandlerRegistry::new();
        handlers.register("ORDER.PAY", Handler::Transactional(flaky.clone()));
        let pipeline = h.pipeline(handlers, 5);
        let batch: Vec<_> = (1..=600).map(|n| pay(n, "a")).collect();

        let outcomes = pipeline.process("w", &batch).await;

        assert!(outcomes.iter().all(|d| *d == Disposition::Ack(AckReason::Processed)), "max_batch {max}");
        assert_eq!(flaky.calls().iter().map(Vec::len).collect::<Vec<_>>(), calls, "max_batch {max}");
        assert_eq!(flaky.singles.lock().unwrap().len(), singles, "max_batch {max}");
        let effects: i64 = sqlx::query_scalar("SELECT count(DISTINCT message_id) FROM test_effects")
            .fetch_one(h.pool())
            .await
            .unwrap();
        assert_eq!(effects, 600);
        assert_eq!(counts_agree(&h).await, status(&[("succeeded", 600)]));
    }
}

/// One handler instance registered for two types: each call takes messages of one type (the
/// `handler_batch` span and the duration histogram are labelled with one type).
#[tokio::test]
async fn one_instance_for_two_types_gets_calls_of_one_type_each() {
    let h = Harness::new().await;
    let flaky = Flaky::new(10, Fault::None);
    let mut handlers = HandlerRegistry::new();
    handlers.register("ORDER.PAY", Handler::Transactional(flaky.clone()));
    handlers.register("ORDER.REFUND", Handler::Transactional(flaky.clone()));
    let pipeline = h.pipeline(handlers, 5);
    let refund = |n: u32| message(&format!("ORDER.REFUND.{n}:1"), json!({"orderNo": n.to_string()}));
    let batch = [pay(1, "a"), refund(1), pay(2, "a"), refund(2)];

    let outcomes = pipeline.process("w", &batch).await;

    assert!(outcomes.iter().all(|d| *d == Disposition::Ack(AckReason::Processed)), "{outcomes:?}");
    for call in flaky.calls() {
        assert!(call.iter().all(|(_, t, _)| *t == call[0].1), "one type per call: {call:?}");
    }
    assert_eq!(flaky.calls().iter().map(Vec::len).sum::<usize>(), 4);
    assert_eq!(counts_agree(&h).await, status(&[("succeeded", 4)]));
}

/// The `handler_batch` span carries the fields DESIGN.md ("Tracing") lists: `ok` for a call
/// that committed, `error` for one that failed (then a `handler` span per message).
#[tokio::test]
async fn the_handler_batch_span_carries_its_fields() {
    let h = Harness::new().await;
    let log = Captured::default();
    let writer = log.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_env_filter("dedup_engine::pipeline::spans=info")
        .with_ansi(false)
        .with_span_events(tracing_subscriber::fmt::format::FmtSpan::CLOSE)
        .with_writer(move || writer.clone())
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);
    let flaky = Flaky::new(10, Fault::None);
    let mut handlers = HandlerRegistry::new();
    handlers.register("ORDER.PAY", Handler::Transactional(flaky.clone()));
    let pipeline = h.pipeline(handlers, 5);
    pipeline.process("w", &[pay(3, "a"), pay(1, "a"), pay(2, "a")]).await;
    flaky.refuse.lock().unwrap().push("ORDER.PAY.5:1".to_owned());
    pipeline.process("w", &[pay(4, "a"), pay(5, "a")]).await;

    let text = String::from_utf8(log.0.lock().unwrap().clone()).unwrap();
    let spans: Vec<&str> = text.lines().filter(|l| l.contains("handler_batch{")).collect();
    assert_eq!(spans.len(), 2, "{text}");
    let fields = |line: &str, want: &[&str]| want.iter().all(|w| line.contains(w));
    let ok = ["message_type=ORDER.PAY", "messages=3", "first_message_id=ORDER.PAY.1:1"];
    assert!(
        fields(spans[0], &ok) && fields(spans[0], &["last_message_id=ORDER.PAY.3:1", "outcome=\"ok\""]),
        "{}",
        spans[0]
    );
    assert!(fields(spans[0], &["duration_ms="]), "{}", spans[0]);
    assert!(fields(spans[1], &["messages=2", "last_message_id=ORDER.PAY.5:1", "outcome=\"error\""]), "{}", spans[1]);
    assert_eq!(text.lines().filter(|l| l.contains("handler{message_id=ORDER.PAY.")).count(), 2, "{text}");
}
