//! Operator actions against PostgreSQL and RabbitMQ: every guard (unknown record, wrong status,
//! stale lease token, live lease, missing payload, poison, missing reason), nothing changed on
//! refusal, an audit entry for every outcome, and two operators racing on one record (a stuck one,
//! and a failed one both requeue).

use dedup_engine::actions::RecordActionKind::{DeadLetter, MarkSucceeded, Release, Requeue};
use dedup_engine::actions::{self, ActionError, Publishers, RecordAction, record_action};
use dedup_engine::audit::{AuditFilter, AuditLog};
use dedup_engine::record::RecordStatus;
use dedup_engine::retry::Backoff;
use dedup_engine::testing::{TestBroker, TestDatabase, amqp_url};
use futures::StreamExt;
use lapin::options::{BasicConsumeOptions, BasicGetOptions};
use sqlx::PgPool;
use uuid::Uuid;

/// No broker: for the actions that publish nothing.
static NONE: std::sync::LazyLock<Publishers> = std::sync::LazyLock::new(Publishers::default);

/// A record inserted as the engine would have left it.
struct Rec {
    id: i64,
    token: Option<Uuid>,
}

/// Inserts a record in `status`; processing ones get a lease expiring in `lease_secs` (negative:
/// expired, stuck) and an open attempt row.
async fn insert(pool: &PgPool, message_id: &str, status: &str, lease_secs: i64, exchange: &str) -> Rec {
    let processing = status == "processing";
    let token = processing.then(Uuid::new_v4);
    let id: i64 = sqlx::query_scalar(
        "INSERT INTO dedup_records (consumer_group, message_id, message_type, status, handler_mode, attempts,
             max_attempts, lease_owner, lease_token, lease_expires_at, payload_hash, payload, headers, content_type,
             source_broker, source_exchange, source_routing_key, source_queue, last_error, error_class)
         VALUES ('g', $1, 'ORDER.PAY', $2, 'leased', 3, 3, CASE WHEN $3 THEN 'host:1:0' END, $4,
                 CASE WHEN $3 THEN now() + $5 * interval '1 second' END, '\\x00',
                 CASE WHEN $2 <> 'succeeded' THEN convert_to('{\"n\":1}', 'UTF8') END,
                 '{\"x-trace\": \"abc\"}', 'application/json', 'rabbitmq', $6, 'order.pay', 'q',
                 CASE WHEN $2 IN ('failed', 'dead') THEN 'boom' END, CASE WHEN $2 IN ('failed', 'dead') THEN 'E: boom' END)
         RETURNING id",
    )
    .bind(message_id)
    .bind(status)
    .bind(processing)
    .bind(token)
    .bind(lease_secs)
    .bind(exchange)
    .fetch_one(pool)
    .await
    .unwrap();
    if processing {
        sqlx::query(
            "INSERT INTO record_attempts (record_id, attempt, worker, started_at) VALUES ($1, 3, 'host:1:0', now())",
        )
        .bind(id)
        .execute(pool)
        .await
        .unwrap();
    }
    Rec { id, token }
}

/// Every column an action may change, to compare before and after a refusal.
async fn snapshot(pool: &PgPool, id: i64) -> String {
    sqlx::query_scalar("SELECT row_to_json(r)::text FROM dedup_records r WHERE id = $1")
        .bind(id)
        .fetch_one(pool)
        .await
        .unwrap()
}

async fn status(pool: &PgPool, id: i64) -> String {
    sqlx::query_scalar("SELECT status FROM dedup_records WHERE id = $1").bind(id).fetch_one(pool).await.unwrap()
}

/// (action, outcome) of every audit entry, oldest first.
async fn audit_trail(pool: &PgPool) -> Vec<(String, String)> {
    let mut entries = pool.list(&AuditFilter::default()).await.unwrap();
    entries.reverse();
    entries.into_iter().map(|e| (e.action, e.outcome)).collect()
}

fn params(rec: &Rec, reason: Option<&'static str>) -> RecordAction<'static> {
    RecordAction { record_id: rec.id, lease_token: rec.token, reason, ..RecordAction::default() }
}

#[tokio::test]
async fn release_refuses_bad_requests_and_changes_nothing() {
    let db = TestDatabase::create().await;
    let pool = &db.pool;
    let stuck = insert(pool, "ORDER.PAY.1:1", "processing", -5, "x").await;
    let before = snapshot(pool, stuck.id).await;

    let err = record_action(pool, "cli:test", Release, &params(&stuck, None), &NONE).await.unwrap_err();
    assert!(matches!(err, ActionError::Invalid(ref m) if m.contains("reason")), "{err}");
    let err = record_action(
        pool,
        "cli:test",
        Release,
        &RecordAction { record_id: 999_999, reason: Some("x"), ..Default::default() },
        &NONE,
    )
    .await
    .unwrap_err();
    assert!(matches!(err, ActionError::UnknownRecord(999_999)), "{err}");
    let no_token = RecordAction { lease_token: None, ..params(&stuck, Some("worker died")) };
    let err = record_action(pool, "cli:test", Release, &no_token, &NONE).await.unwrap_err();
    assert!(matches!(err, ActionError::Invalid(ref m) if m.contains("lease token")), "{err}");
    let stale = RecordAction { lease_token: Some(Uuid::new_v4()), ..params(&stuck, Some("worker died")) };
    let err = record_action(pool, "cli:test", Release, &stale, &NONE).await.unwrap_err();
    assert!(matches!(err, ActionError::StaleLease { .. }), "{err}");
    let expected = RecordAction { expected_status: Some(RecordStatus::Failed), ..params(&stuck, Some("x")) };
    let err = record_action(pool, "cli:test", Release, &expected, &NONE).await.unwrap_err();
    assert!(matches!(err, ActionError::WrongStatus { actual: RecordStatus::Processing, .. }), "{err}");

    let failed = insert(pool, "ORDER.PAY.2:1", "failed", 0, "x").await;
    let err = record_action(pool, "cli:test", Release, &params(&failed, Some("x")), &NONE).await.unwrap_err();
    assert!(matches!(err, ActionError::WrongStatus { actual: RecordStatus::Failed, .. }), "{err}");
    assert_eq!(err.to_string(), format!("record {} is failed; release applies to processing records", failed.id));

    assert_eq!(snapshot(pool, stuck.id).await, before, "a refused action changes nothing");
    let trail = audit_trail(pool).await;
    assert_eq!(trail.len(), 6);
    assert!(trail.iter().all(|(a, o)| a == "record.release" && o == "refused"), "{trail:?}");
}

#[tokio::test]
async fn release_of_a_live_lease_needs_force_and_makes_the_record_claimable() {
    let db = TestDatabase::create().await;
    let pool = &db.pool;
    let live = insert(pool, "ORDER.PAY.1:1", "processing", 60, "x").await;
    let err = record_action(pool, "user:ann", Release, &params(&live, Some("looks hung")), &NONE).await.unwrap_err();
    assert!(matches!(err, ActionError::LiveLease { ref owner, .. } if owner == "host:1:0"), "{err}");
    assert_eq!(status(pool, live.id).await, "processing");

    let forced = RecordAction { force: true, ..params(&live, Some("worker host:1 is gone")) };
    let done = record_action(pool, "user:ann", Release, &forced, &NONE).await.unwrap();
    assert_eq!((done.from, done.status, done.republished), (RecordStatus::Processing, RecordStatus::Failed, false));
    let (lease, attempts, max, outcome): (Option<Uuid>, i32, i32, Option<String>) = sqlx::query_as(
        "SELECT r.lease_token, r.attempts, r.max_attempts, a.outcome FROM dedup_records r
         JOIN record_attempts a ON a.record_id = r.id WHERE r.id = $1",
    )
    .bind(live.id)
    .fetch_one(pool)
    .await
    .unwrap();
    assert_eq!(lease, None);
    assert!(attempts < max, "claimable: attempts {attempts} < max {max} (one more attempt granted)");
    assert_eq!(outcome.as_deref(), Some("released"));

    let entries = pool.for_message("g", "ORDER.PAY.1:1").await.unwrap();
    assert_eq!(entries.len(), 2);
    assert_eq!((entries[0].outcome.as_str(), entries[0].actor.as_str()), ("ok", "user:ann"));
    assert_eq!(entries[0].reason.as_deref(), Some("worker host:1 is gone"));
    assert_eq!(entries[0].detail["to"], "failed");
}

#[tokio::test]
async fn two_operators_racing_on_one_stuck_record_exactly_one_wins() {
    let db = TestDatabase::create().await;
    let pool = &db.pool;
    for round in 0..5 {
        let stuck = insert(pool, &format!("ORDER.PAY.{round}:1"), "processing", -1, "x").await;
        let p = params(&stuck, Some("race"));
        let (a, b) = tokio::join!(
            record_action(pool, "user:a", Release, &p, &NONE),
            record_action(pool, "user:b", MarkSucceeded, &p, &NONE),
        );
        assert!(a.is_ok() != b.is_ok(), "exactly one wins: {a:?} / {b:?}");
        let loser = a.err().or(b.err()).unwrap();
        assert!(matches!(loser, ActionError::WrongStatus { .. } | ActionError::StaleLease { .. }), "{loser}");
    }
    let ok = audit_trail(pool).await.iter().filter(|(_, o)| o == "ok").count();
    assert_eq!(ok, 5);
}

#[tokio::test]
async fn mark_succeeded_and_dead_letter_follow_their_status_rules() {
    let db = TestDatabase::create().await;
    let pool = &db.pool;
    let stuck = insert(pool, "ORDER.PAY.1:1", "processing", -1, "x").await;
    let done =
        record_action(pool, "cli:op", MarkSucceeded, &params(&stuck, Some("SMS gateway log shows it sent")), &NONE)
            .await
            .unwrap();
    assert_eq!(done.status, RecordStatus::Succeeded);
    let (payload, completed): (Option<Vec<u8>>, bool) =
        sqlx::query_as("SELECT payload, completed_at IS NOT NULL FROM dedup_records WHERE id = $1")
            .bind(stuck.id)
            .fetch_one(pool)
            .await
            .unwrap();
    assert_eq!((payload, completed), (None, true));
    let again = RecordAction { lease_token: None, ..params(&stuck, Some("again")) };
    let err = record_action(pool, "cli:op", MarkSucceeded, &again, &NONE).await.unwrap_err();
    assert!(matches!(err, ActionError::WrongStatus { actual: RecordStatus::Succeeded, .. }), "{err}");
    let err = record_action(pool, "cli:op", DeadLetter, &again, &NONE).await.unwrap_err();
    assert!(matches!(err, ActionError::WrongStatus { actual: RecordStatus::Succeeded, .. }), "{err}");

    let failed = insert(pool, "ORDER.PAY.2:1", "failed", 0, "x").await;
    let done =
        record_action(pool, "cli:op", DeadLetter, &params(&failed, Some("customer cancelled")), &NONE).await.unwrap();
    assert_eq!((done.from, done.status), (RecordStatus::Failed, RecordStatus::Dead));
    let (class, error): (String, String) =
        sqlx::query_as("SELECT error_class, last_error FROM dedup_records WHERE id = $1")
            .bind(failed.id)
            .fetch_one(pool)
            .await
            .unwrap();
    assert_eq!(class, actions::HAND_DEAD_LETTER_CLASS);
    assert_eq!(error, "dead-lettered by cli:op: customer cancelled");
    let err = record_action(pool, "cli:op", DeadLetter, &params(&failed, Some("x")), &NONE).await.unwrap_err();
    assert!(matches!(err, ActionError::WrongStatus { actual: RecordStatus::Dead, .. }), "{err}");
    // Marked succeeded after all (the effect was found): the record has no current error class
    // any more, and its last error stays as history.
    record_action(pool, "cli:op", MarkSucceeded, &params(&failed, Some("found in the ledger")), &NONE).await.unwrap();
    let (class, error): (Option<String>, String) =
        sqlx::query_as("SELECT error_class, last_error FROM dedup_records WHERE id = $1")
            .bind(failed.id)
            .fetch_one(pool)
            .await
            .unwrap();
    assert_eq!((class, error.as_str()), (None, "dead-lettered by cli:op: customer cancelled"));
}

/// Publishers whose group `g` (the records' group) reads from a test broker whose work queue
/// receives everything published to its exchange.
async fn broker() -> (TestBroker, Publishers) {
    let broker = TestBroker::new(&amqp_url(), Backoff { initial_ms: 1000, max_ms: 1000 });
    let connector = broker.connector();
    connector.publisher().await.expect("RabbitMQ at AMQP_URL");
    let mut publishers = Publishers::default();
    publishers.add("g", connector);
    (broker, publishers)
}

#[tokio::test]
async fn requeue_republishes_the_stored_message_and_makes_the_record_claimable() {
    let db = TestDatabase::create().await;
    let pool = &db.pool;
    let (broker, publisher) = broker().await;
    let dead = insert(pool, "ORDER.PAY.7:1", "dead", 0, &broker.settings.exchange).await;

    let p = RecordAction { expected_status: Some(RecordStatus::Dead), ..params(&dead, None) };
    let done = record_action(pool, "user:ann", Requeue, &p, &publisher).await.unwrap();
    assert_eq!((done.from, done.status, done.republished), (RecordStatus::Dead, RecordStatus::Failed, true));
    let (attempts, max): (i32, i32) = sqlx::query_as("SELECT attempts, max_attempts FROM dedup_records WHERE id = $1")
        .bind(dead.id)
        .fetch_one(pool)
        .await
        .unwrap();
    assert_eq!((attempts, max), (3, 4), "one more attempt granted");

    let channel = broker.channel().await;
    let got = channel
        .basic_get(broker.settings.queue.as_str().into(), BasicGetOptions { no_ack: true })
        .await
        .unwrap()
        .expect("the copy is in the work queue");
    assert_eq!(got.delivery.data, br#"{"n":1}"#);
    assert_eq!(got.delivery.routing_key.as_str(), "order.pay");
    assert_eq!(got.delivery.properties.message_id().as_ref().map(|s| s.as_str()), Some("ORDER.PAY.7:1"));
    let headers = got.delivery.properties.headers().clone().unwrap_or_default();
    assert!(headers.inner().contains_key("x-trace"), "stored headers are sent again: {headers:?}");

    // The same request again: the record is failed now, not dead as shown.
    let err = record_action(pool, "user:bob", Requeue, &p, &publisher).await.unwrap_err();
    assert!(matches!(err, ActionError::WrongStatus { actual: RecordStatus::Failed, .. }), "{err}");
    assert_eq!(broker.depth(&broker.settings.queue).await, 0, "no second copy");
}

async fn version(pool: &PgPool, id: i64) -> i64 {
    sqlx::query_scalar("SELECT version FROM dedup_records WHERE id = $1").bind(id).fetch_one(pool).await.unwrap()
}

/// A `failed` record stays `failed` when requeued, so the status cannot tell a second operator
/// that the first one was faster: the version does.
#[tokio::test]
async fn two_operators_requeueing_one_failed_record_at_once_publish_one_copy() {
    let db = TestDatabase::create().await;
    let pool = &db.pool;
    let (broker, publisher) = broker().await;
    const ROUNDS: u32 = 5;
    for round in 0..ROUNDS {
        let failed = insert(pool, &format!("ORDER.PAY.{round}:1"), "failed", 0, &broker.settings.exchange).await;
        let shown = RecordAction {
            expected_status: Some(RecordStatus::Failed),
            expected_version: Some(version(pool, failed.id).await),
            ..params(&failed, None)
        };
        let (a, b) = tokio::join!(
            record_action(pool, "user:a", Requeue, &shown, &publisher),
            record_action(pool, "user:b", Requeue, &shown, &publisher)
        );
        assert!(a.is_ok() != b.is_ok(), "exactly one wins: {a:?} / {b:?}");
        let loser = a.err().or(b.err()).unwrap();
        assert!(matches!(loser, ActionError::Changed { id, .. } if id == failed.id), "{loser}");
        assert!(loser.to_string().contains("changed since it was shown"), "{loser}");
    }
    assert_eq!(broker.depth(&broker.settings.queue).await, ROUNDS, "one copy per record");
    let trail = audit_trail(pool).await;
    assert_eq!(trail.iter().filter(|(_, o)| o == "ok").count(), ROUNDS as usize);
    assert_eq!(trail.iter().filter(|(_, o)| o == "refused").count(), ROUNDS as usize);
}

#[tokio::test]
async fn requeue_never_touches_succeeded_poison_or_payloadless_records() {
    let db = TestDatabase::create().await;
    let pool = &db.pool;
    let (broker, publisher) = broker().await;
    let exchange = broker.settings.exchange.clone();
    let succeeded = insert(pool, "ORDER.PAY.1:1", "succeeded", 0, &exchange).await;
    let err = record_action(pool, "cli:op", Requeue, &params(&succeeded, None), &publisher).await.unwrap_err();
    assert!(matches!(err, ActionError::WrongStatus { actual: RecordStatus::Succeeded, .. }), "{err}");

    let poison = insert(pool, "POISON.1", "dead", 0, &exchange).await;
    sqlx::query("UPDATE dedup_records SET handler_mode = NULL, poison = true WHERE id = $1")
        .bind(poison.id)
        .execute(pool)
        .await
        .unwrap();
    let err = record_action(pool, "cli:op", Requeue, &params(&poison, None), &publisher).await.unwrap_err();
    assert!(matches!(err, ActionError::Poison(_)), "{err}");

    let bare = insert(pool, "ORDER.PAY.3:1", "dead", 0, &exchange).await;
    sqlx::query("UPDATE dedup_records SET payload = NULL WHERE id = $1").bind(bare.id).execute(pool).await.unwrap();
    let before = snapshot(pool, bare.id).await;
    let err = record_action(pool, "cli:op", Requeue, &params(&bare, None), &publisher).await.unwrap_err();
    assert!(matches!(err, ActionError::MissingPayload { .. }), "{err}");
    assert_eq!(snapshot(pool, bare.id).await, before);
    assert_eq!(broker.depth(&broker.settings.queue).await, 0);
}

/// The copy goes through a source of the record's broker: its group's own, else another
/// group's; a record from a broker no group reads from is refused. A dead letter whose type had
/// no handler is not poison: it is requeued.
#[tokio::test]
async fn requeue_publishes_through_a_source_of_the_records_broker_and_takes_records_without_a_handler() {
    let db = TestDatabase::create().await;
    let pool = &db.pool;
    let (broker, publishers) = broker().await;
    let exchange = broker.settings.exchange.clone();
    let no_handler = insert(pool, "ORDER.REFUND.1:1", "dead", 0, &exchange).await;
    sqlx::query(
        "UPDATE dedup_records SET handler_mode = NULL, poison = false, error_class = 'NO_HANDLER: ORDER.REFUND'
         WHERE id = $1",
    )
    .bind(no_handler.id)
    .execute(pool)
    .await
    .unwrap();
    let done = record_action(pool, "cli:op", Requeue, &params(&no_handler, None), &publishers).await.unwrap();
    assert_eq!((done.status, done.republished), (RecordStatus::Failed, true));
    assert_eq!(broker.depth(&broker.settings.queue).await, 1);

    let other_group = insert(pool, "ORDER.PAY.2:1", "dead", 0, &exchange).await;
    sqlx::query("UPDATE dedup_records SET consumer_group = 'billing' WHERE id = $1")
        .bind(other_group.id)
        .execute(pool)
        .await
        .unwrap();
    let done = record_action(pool, "cli:op", Requeue, &params(&other_group, None), &publishers).await.unwrap();
    assert!(done.republished, "through group g's RabbitMQ connection");
    assert_eq!(broker.depth(&broker.settings.queue).await, 2);

    let from_kafka = insert(pool, "ORDER.PAY.3:1", "dead", 0, &exchange).await;
    sqlx::query("UPDATE dedup_records SET source_broker = 'kafka' WHERE id = $1")
        .bind(from_kafka.id)
        .execute(pool)
        .await
        .unwrap();
    let before = snapshot(pool, from_kafka.id).await;
    let err = record_action(pool, "cli:op", Requeue, &params(&from_kafka, None), &publishers).await.unwrap_err();
    assert!(
        matches!(err, ActionError::NoPublisher { id, ref broker } if id == from_kafka.id && broker == "kafka"),
        "{err}"
    );
    assert_eq!(snapshot(pool, from_kafka.id).await, before, "a refused action changes nothing");
    assert_eq!(broker.depth(&broker.settings.queue).await, 2, "no copy");
    let outcomes: Vec<String> = audit_trail(pool).await.into_iter().map(|(_, o)| o).collect();
    assert_eq!(outcomes, ["ok", "ok", "refused"]);
}

#[tokio::test]
async fn a_copy_the_broker_does_not_take_rolls_the_requeue_back_and_is_audited_as_failed() {
    let db = TestDatabase::create().await;
    let pool = &db.pool;
    let (_broker, publisher) = broker().await;
    // The default exchange with a routing key no queue has: unroutable (published mandatory).
    let dead = insert(pool, "ORDER.PAY.1:1", "dead", 0, "").await;
    sqlx::query("UPDATE dedup_records SET source_routing_key = $2 WHERE id = $1")
        .bind(dead.id)
        .bind(format!("no-such-queue-{}", Uuid::new_v4()))
        .execute(pool)
        .await
        .unwrap();
    let before = snapshot(pool, dead.id).await;
    let err = record_action(pool, "cli:op", Requeue, &params(&dead, None), &publisher).await.unwrap_err();
    assert!(matches!(err, ActionError::Publish(ref m) if m.contains("unroutable")), "{err}");
    assert_eq!(snapshot(pool, dead.id).await, before);
    assert_eq!(audit_trail(pool).await, vec![("record.requeue".to_owned(), "failed".to_owned())]);
}

#[tokio::test]
async fn releasing_a_record_whose_redelivery_was_parked_requeues_it_since_no_delivery_is_left() {
    let db = TestDatabase::create().await;
    let pool = &db.pool;
    let (broker, publisher) = broker().await;
    let stuck = insert(pool, "ORDER.PAY.10:1", "processing", -1, &broker.settings.exchange).await;
    let not_parked = insert(pool, "ORDER.PAY.11:1", "processing", -1, &broker.settings.exchange).await;
    sqlx::query("UPDATE dedup_records SET parked_at = now() WHERE id = $1").bind(stuck.id).execute(pool).await.unwrap();
    let publisher = &publisher;
    let release = |record| async move {
        record_action(pool, "user:ann", Release, &params(record, Some("worker died")), publisher).await.unwrap()
    };
    assert!(!release(&not_parked).await.republished, "its delivery is still in the broker: nothing republished");
    assert!(release(&stuck).await.republished, "the parked delivery was acked: the release requeues it");
    let channel = broker.channel().await;
    let mut consumer = channel
        .basic_consume(
            broker.settings.queue.as_str().into(),
            "t".into(),
            BasicConsumeOptions { no_ack: true, ..Default::default() },
            Default::default(),
        )
        .await
        .unwrap();
    let delivery =
        tokio::time::timeout(std::time::Duration::from_secs(5), consumer.next()).await.unwrap().unwrap().unwrap();
    assert_eq!(delivery.properties.message_id().as_ref().map(|s| s.as_str()), Some("ORDER.PAY.10:1"));
    let claimable: Option<bool> =
        sqlx::query_scalar("SELECT next_attempt_at IS NOT NULL AND parked_at IS NULL FROM dedup_records WHERE id = $1")
            .bind(stuck.id)
            .fetch_one(pool)
            .await
            .unwrap();
    assert_eq!((status(pool, stuck.id).await, claimable), ("failed".to_owned(), Some(true)));
}

#[tokio::test]
async fn release_with_requeue_publishes_the_parked_payload_and_a_consumer_gets_it() {
    let db = TestDatabase::create().await;
    let pool = &db.pool;
    let (broker, publisher) = broker().await;
    let stuck = insert(pool, "ORDER.PAY.9:1", "processing", -1, &broker.settings.exchange).await;
    let done = record_action(
        pool,
        "user:ann",
        Release,
        &RecordAction { requeue: true, ..params(&stuck, Some("worker died")) },
        &publisher,
    )
    .await
    .unwrap();
    assert!(done.republished);
    let channel = broker.channel().await;
    let mut consumer = channel
        .basic_consume(
            broker.settings.queue.as_str().into(),
            "t".into(),
            BasicConsumeOptions { no_ack: true, ..Default::default() },
            Default::default(),
        )
        .await
        .unwrap();
    let delivery =
        tokio::time::timeout(std::time::Duration::from_secs(5), consumer.next()).await.unwrap().unwrap().unwrap();
    assert_eq!(delivery.properties.message_id().as_ref().map(|s| s.as_str()), Some("ORDER.PAY.9:1"));
    assert_eq!(status(pool, stuck.id).await, "failed");
}
