//! The engine's tables live in a schema of their own, so a team's database may hold tables of
//! the same names (`users`, `audit_log`, `drills`, even `dedup_records`) and the engine still
//! runs on the team's own pool, whose `search_path` (`public`) cannot see the engine's tables.
//!
//! Every statement of the claim path names the engine's schema. Were one not to, it would hit
//! the team's table of that name (other columns: the statement fails; the same columns: the
//! team's table gets a row) or find no table at all — and this test fails either way: a failed
//! statement leaves a delivery unsettled, or (a claim the pipeline retries with savepoints) is
//! logged with its error.

mod common;

use std::sync::Arc;
use std::sync::Mutex;
use std::time::Duration;

use async_trait::async_trait;
use common::*;
use dedup_engine::handler::{
    Handler, HandlerError, HandlerInput, HandlerRegistry, LeaseGuard, LeasedHandler, TransactionalHandler,
};
use dedup_engine::message::{Broker, SourceRef};
use dedup_engine::pipeline::{AckReason, Disposition, Pipeline};
use dedup_engine::record::{ConsumerGroup, HandlerMode, LeaseExpiryPolicy, MessageId};
use dedup_engine::store::postgres;
use dedup_engine::store::postgres::PgStore;
use dedup_engine::store::{ClaimOutcome, ClaimRequest, DedupStore, Lease};
use serde_json::json;
use sqlx::postgres::PgPoolOptions;
use sqlx::{PgConnection, PgPool};
use tracing_subscriber::layer::SubscriberExt;

/// The team's tables in `public`: named like the engine's, with other columns, and one
/// business table.
const TEAM_TABLES: &[&str] = &[
    "CREATE TABLE users (user_id BIGINT PRIMARY KEY, email TEXT NOT NULL)",
    "CREATE TABLE audit_log (entry TEXT NOT NULL, written_at TIMESTAMPTZ NOT NULL DEFAULT now())",
    "CREATE TABLE drills (fire_drill TEXT NOT NULL)",
    "CREATE TABLE dedup_records (order_no TEXT PRIMARY KEY, note TEXT NOT NULL)",
    "CREATE TABLE record_attempts (what TEXT NOT NULL)",
    "CREATE TABLE payments (message_id TEXT NOT NULL, order_no TEXT NOT NULL, amount_cents BIGINT NOT NULL)",
];

/// The tables of `public` named like the engine's, which must stay empty.
const LOOKALIKES: &[&str] = &["users", "audit_log", "drills", "dedup_records", "record_attempts"];

/// Writes a payment in the claim's transaction, naming its table as the team's code does
/// (resolved through the team's `search_path`).
struct Pay;

#[async_trait]
impl TransactionalHandler for Pay {
    async fn handle(&self, input: &HandlerInput<'_>, tx: &mut PgConnection) -> Result<(), HandlerError> {
        let json = input.json.cloned().unwrap_or_default();
        sqlx::query("INSERT INTO payments (message_id, order_no, amount_cents) VALUES ($1, $2, $3)")
            .bind(input.message_id.as_str())
            .bind(json["orderNo"].as_str().unwrap_or_default())
            .bind(json["amountCents"].as_i64().unwrap_or_default())
            .execute(&mut *tx)
            .await?;
        Ok(())
    }
}

/// Sends an SMS (an external effect): runs longer than its lease, so only the heartbeat's
/// extensions keep the lease ([`LeaseGuard::check`] right before the effect); fails when the
/// payload says so.
struct Sms {
    sent: Mutex<Vec<String>>,
    delay: Duration,
}

#[async_trait]
impl LeasedHandler for Sms {
    async fn handle(&self, input: &HandlerInput<'_>, lease: &LeaseGuard) -> Result<(), HandlerError> {
        tokio::time::sleep(self.delay).await;
        lease.check()?;
        if input.json.is_some_and(|j| j["fail"] == true) {
            return Err(HandlerError::retryable("SMS_GATEWAY_DOWN", "gateway 503"));
        }
        self.sent.lock().unwrap().push(input.message_id.as_str().to_owned());
        Ok(())
    }
}

/// Every engine log event that carries an `error` field (a failed statement among them), as
/// `message: error`.
#[derive(Clone, Default)]
struct ErrorEvents(Arc<Mutex<Vec<String>>>);

impl ErrorEvents {
    fn take(&self) -> Vec<String> {
        std::mem::take(&mut *self.0.lock().unwrap())
    }
}

#[derive(Default)]
struct Fields {
    message: String,
    error: Option<String>,
}

impl tracing::field::Visit for Fields {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        match field.name() {
            "message" => self.message = format!("{value:?}"),
            "error" => self.error = Some(format!("{value:?}")),
            _ => {}
        }
    }
}

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for ErrorEvents {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        if !event.metadata().target().starts_with("dedup_engine") {
            return;
        }
        let mut fields = Fields::default();
        event.record(&mut fields);
        if let Some(error) = fields.error {
            self.0.lock().unwrap().push(format!("{}: {error}", fields.message));
        }
    }
}

/// (message id — `POISON` for a poison record, whose id is made up —, status, attempts, poison,
/// error class, duplicates, payload conflicts) of the records in the engine's schema.
type Row = (String, String, i32, bool, Option<String>, i32, i32);

async fn records(pool: &PgPool) -> Vec<Row> {
    sqlx::query_as(
        "SELECT * FROM (
             SELECT CASE WHEN message_type = 'POISON' THEN 'POISON' ELSE message_id END AS id, status, attempts,
                    poison, error_class, duplicate_count, payload_conflicts
             FROM dedup.dedup_records) r
         ORDER BY id COLLATE \"C\"",
    )
    .fetch_all(pool)
    .await
    .unwrap()
}

// One thread, so that every task of the test reports to the subscriber set here.
#[tokio::test(flavor = "current_thread")]
async fn the_claim_path_names_its_schema_and_runs_beside_tables_of_the_same_names() {
    let errors = ErrorEvents::default();
    let _guard = tracing::subscriber::set_default(tracing_subscriber::registry().with(errors.clone()));
    let h = Harness::new().await;
    // The team's pool: default search_path, which cannot see the engine's schema.
    let plain = PgPoolOptions::new().connect(&h.db.url).await.unwrap();
    let schemas: Vec<String> =
        sqlx::query_scalar("SELECT unnest(current_schemas(false))::text").fetch_all(&plain).await.unwrap();
    assert_eq!(schemas, ["public"], "the team's pool sees public only");
    for ddl in TEAM_TABLES {
        sqlx::query(ddl).execute(&plain).await.unwrap();
    }
    let resolved: String =
        sqlx::query_scalar("SELECT to_regclass('dedup_records')::text").fetch_one(&plain).await.unwrap();
    assert_eq!(resolved, "dedup_records", "on the team's pool the name is the team's table (public)");

    let store = PgStore::new(plain.clone(), &h.db.schema);
    let sms = Arc::new(Sms { sent: Mutex::new(Vec::new()), delay: Duration::from_millis(1600) });
    let mut handlers = HandlerRegistry::new();
    handlers.register("ORDER.PAY", Handler::Transactional(Arc::new(Pay)));
    handlers.register("ORDER.REFUND", Handler::Transactional(Arc::new(AlwaysFails)));
    handlers.register("SMS.SEND", Handler::Leased { handler: sms.clone(), on_lease_expiry: LeaseExpiryPolicy::Hold });
    // A lease of 1.2 s: the SMS handler outlives it, and succeeds only if it was extended.
    let pipeline = Pipeline::new(
        store.clone(),
        h.fast_path.clone(),
        h.stats.clone(),
        handlers,
        settings(5, Duration::from_millis(1200)),
    );

    let pay1 = message("ORDER.PAY.1:1", json!({"orderNo": "1", "amountCents": 100}));
    let pay2 = message("ORDER.PAY.2:1", json!({"orderNo": "2", "amountCents": 200}));
    let pay3 = message("ORDER.PAY.3:1", json!({"orderNo": "3", "amountCents": 300}));
    let refund = message("ORDER.REFUND.4:1", json!({"orderNo": "4"}));
    let sms_ok = message("SMS.SEND.5:1", json!({"to": "+105"}));
    let sms_down = message("SMS.SEND.6:1", json!({"to": "+106", "fail": true}));
    // A Kafka record without an id: its redelivery (same position) finds its dead record.
    let mut no_id = raw_message(None, br#"{"orderNo":"7"}"#.to_vec());
    no_id.broker = Broker::Kafka;
    no_id.source =
        SourceRef { exchange: Some("orders".into()), queue: Some("0".into()), offset: Some(7), ..SourceRef::default() };
    let no_handler = message("SHIPMENT.SENT.7:1", json!({}));

    // New messages that all succeed: the transactional ones claimed straight into succeeded
    // in one transaction with the poison records; the leased one claimed, its lease extended,
    // completed.
    let first = pipeline.process("w1", &[pay1.clone(), pay2.clone(), sms_ok.clone(), no_id.clone(), no_handler]).await;
    assert_eq!(first[..3], [const { Disposition::Ack(AckReason::Processed) }; 3], "{first:?}");
    assert!(matches!(&first[3], Disposition::DeadLetter { reason } if reason.contains("no message id")), "{first:?}");
    assert!(matches!(&first[4], Disposition::DeadLetter { reason } if reason.contains("no handler")), "{first:?}");
    assert_eq!(errors.take(), Vec::<String>::new(), "no statement failed");

    // A failing transactional handler makes the batch run again with savepoints: the claims
    // as processing, the failure, the completion of the other; a failing leased handler.
    let second = pipeline.process("w2", &[pay3, refund, sms_down]).await;
    assert_eq!(second[0], Disposition::Ack(AckReason::Processed), "{second:?}");
    assert!(matches!(second[1], Disposition::Retry { .. }), "{second:?}");
    assert!(matches!(second[2], Disposition::Retry { .. }), "{second:?}");
    let logged = errors.take();
    assert!(logged.iter().all(|e| e.contains("handler failed")), "only the handlers failed: {logged:?}");

    // Duplicates: the same payload (Redis), another payload (the database), a poison copy.
    let pay2_other = message("ORDER.PAY.2:1", json!({"orderNo": "2", "amountCents": 999}));
    let third = pipeline.process("w3", &[pay1, pay2_other, no_id, sms_ok]).await;
    assert_eq!(
        third,
        [
            Disposition::Ack(AckReason::DuplicateRedis),
            Disposition::Ack(AckReason::DuplicateDatabase),
            Disposition::Ack(AckReason::DuplicateDatabase),
            Disposition::Ack(AckReason::DuplicateRedis),
        ]
    );
    assert_eq!(errors.take(), Vec::<String>::new(), "no statement failed");

    // The store's single claim and completion, in a team transaction with a business write.
    let group = ConsumerGroup::parse(GROUP).unwrap();
    let id = MessageId::parse("ORDER.PAY.8:1").unwrap();
    let pay8 = message(id.as_str(), json!({"orderNo": "8", "amountCents": 800}));
    let hash = pay8.payload_hash();
    let lease = Lease::new("w4", Duration::from_secs(30));
    let mut tx = plain.begin().await.unwrap();
    let request = ClaimRequest {
        group: &group,
        message_id: &id,
        message_type: "ORDER.PAY",
        mode: HandlerMode::Transactional,
        max_attempts: 5,
        reclaim_expired: false,
        lease: &lease,
        message: &pay8,
        payload_hash: &hash,
    };
    let ClaimOutcome::Claimed(claim) = store.claim(&mut tx, &request).await.unwrap() else { panic!("not claimed") };
    sqlx::query("INSERT INTO payments (message_id, order_no, amount_cents) VALUES ($1, '8', 800)")
        .bind(id.as_str())
        .execute(&mut *tx)
        .await
        .unwrap();
    assert!(store.complete(&mut tx, &claim, &lease, HandlerMode::Transactional, None).await.unwrap());
    tx.commit().await.unwrap();

    // The fast path's duplicate counts reach the records through the store; the aggregates
    // are written on the engine's pool, as the engine does.
    let engine = postgres::engine_pool(&plain, &h.db.schema, 2);
    h.stats.flush(engine.clone(), &store).await.unwrap();

    assert_eq!(errors.take(), Vec::<String>::new(), "no statement failed");

    assert_eq!(
        records(&plain).await,
        [
            ("ORDER.PAY.1:1".into(), "succeeded".into(), 1, false, None, 1, 0),
            ("ORDER.PAY.2:1".into(), "succeeded".into(), 1, false, None, 1, 1),
            ("ORDER.PAY.3:1".into(), "succeeded".into(), 1, false, None, 0, 0),
            ("ORDER.PAY.8:1".into(), "succeeded".into(), 1, false, None, 0, 0),
            ("ORDER.REFUND.4:1".into(), "failed".into(), 1, false, Some("DOWNSTREAM_DOWN".into()), 0, 0),
            ("POISON".into(), "dead".into(), 0, true, Some("NO_MESSAGE_ID".into()), 1, 0),
            ("SHIPMENT.SENT.7:1".into(), "dead".into(), 0, false, Some("NO_HANDLER: SHIPMENT.SENT".into()), 0, 0),
            ("SMS.SEND.5:1".into(), "succeeded".into(), 1, false, None, 1, 0),
            ("SMS.SEND.6:1".into(), "failed".into(), 1, false, Some("SMS_GATEWAY_DOWN".into()), 0, 0),
        ]
    );
    let attempts: Vec<(String, String)> = sqlx::query_as(
        "SELECT r.message_id, a.outcome FROM dedup.record_attempts a JOIN dedup.dedup_records r ON r.id = a.record_id
         ORDER BY r.message_id COLLATE \"C\"",
    )
    .fetch_all(&plain)
    .await
    .unwrap();
    // Transactional first-try successes (ORDER.PAY) have no attempt row: the record says it.
    assert_eq!(
        attempts,
        [
            ("ORDER.REFUND.4:1".into(), "failed".into()),
            ("SMS.SEND.5:1".into(), "succeeded".into()),
            ("SMS.SEND.6:1".into(), "failed".into()),
        ]
    );

    // The business effects happened exactly once.
    let payments: Vec<(String, i64)> =
        sqlx::query_as("SELECT message_id, count(*) FROM public.payments GROUP BY 1 ORDER BY message_id COLLATE \"C\"")
            .fetch_all(&plain)
            .await
            .unwrap();
    assert_eq!(
        payments,
        [
            ("ORDER.PAY.1:1".into(), 1),
            ("ORDER.PAY.2:1".into(), 1),
            ("ORDER.PAY.3:1".into(), 1),
            ("ORDER.PAY.8:1".into(), 1)
        ]
    );
    assert_eq!(*sms.sent.lock().unwrap(), ["SMS.SEND.5:1"]);

    // The team's tables of the same names were never touched.
    for table in LOOKALIKES {
        let rows: i64 =
            sqlx::query_scalar(&format!("SELECT count(*) FROM public.{table}")).fetch_one(&plain).await.unwrap();
        assert_eq!(rows, 0, "public.{table} was written");
    }
    engine.close().await;
    plain.close().await;
}
