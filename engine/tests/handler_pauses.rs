//! Pausing handlers (docs/DESIGN.md, "Pause and circuit breaker") against a real HTTP service
//! the test starts, the test database and RabbitMQ: the circuit breaker pauses and its probe
//! resumes, a 410 pauses until an operator resumes, operators pause and resume by hand, and
//! held deliveries wait in the broker while the group's other types keep flowing.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::service::{Reply, Service};
use common::{GROUP, Harness, eventually, message};
use dedup_engine::actions::ActionError;
use dedup_engine::actions::handlers::{HandlerBooks, HandlerControl, HandlerPause, handler_control};
use dedup_engine::consumer::{Consumer, ConsumerSettings};
use dedup_engine::handler::{Handler, HandlerRegistry};
use dedup_engine::http::{HttpHandler, HttpSettings};
use dedup_engine::message::InboundMessage;
use dedup_engine::pipeline::{AckReason, Disposition, Pipeline, PipelineSettings};
use dedup_engine::retry::Backoff;
use dedup_engine::source::SourceFactory;
use dedup_engine::source::rabbitmq::properties_for;
use dedup_engine::testing::{TestBroker, amqp_url};
use serde_json::json;
use tokio_util::sync::CancellationToken;

const PAY: &str = "ORDER.PAID";
const SHIP: &str = "ORDER.SHIPPED";

fn http_settings(service: &Service, pause_after: u32, probe_interval_ms: u64) -> HttpSettings {
    let mut s = HttpSettings::new(service.url());
    s.timeout_ms = 2_000;
    s.pause_after = pause_after;
    s.probe_interval_ms = probe_interval_ms;
    s
}

/// `PAY` calls the service; `SHIP` records its effect in the claim's transaction.
fn registry(settings: &HttpSettings) -> HandlerRegistry {
    let mut handlers = HandlerRegistry::new();
    handlers.http(PAY, HttpHandler::new(settings).unwrap());
    handlers.register(SHIP, Handler::Transactional(Arc::new(common::RecordEffect)));
    handlers
}

fn pipeline(h: &Harness, settings: &HttpSettings) -> Pipeline {
    let backoff = Backoff { initial_ms: 100, max_ms: 400 };
    h.pipeline_with(registry(settings), PipelineSettings { backoff, ..common::settings(5, Duration::from_secs(30)) })
}

fn msg(message_type: &str, key: &str) -> InboundMessage {
    message(&format!("{message_type}.{key}:1"), json!({"orderNo": key}))
}

async fn pause_row(h: &Harness, message_type: &str) -> HandlerPause {
    h.pool().handler_pauses().await.unwrap().into_iter().find(|p| p.message_type == message_type).unwrap()
}

/// How many records the messages of `message_type` have.
async fn records(h: &Harness, message_type: &str) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM dedup_records WHERE message_type = $1")
        .bind(message_type)
        .fetch_one(h.pool())
        .await
        .unwrap()
}

fn held(d: &Disposition) -> bool {
    matches!(d, Disposition::Held { .. })
}

const PROCESSED: Disposition = Disposition::Ack(AckReason::Processed);

/// The service's 200 answers per key (from the `Idempotency-Key` header).
fn successes_per_key(service: &Service, keys: &[&str]) -> Vec<usize> {
    let calls = service.calls();
    keys.iter()
        .map(|k| {
            let key = format!("\"{PAY}.{k}:1\"");
            calls
                .iter()
                .filter(|c| c.headers.get("idempotency-key").and_then(|v| v.to_str().ok()) == Some(&key))
                .count()
        })
        .collect()
}

#[tokio::test]
async fn the_breaker_pauses_after_a_run_of_503s_holds_without_dead_letters_and_a_probe_resumes_it() {
    let h = Harness::new().await;
    let service =
        Service::start([Reply::status(503), Reply::status(503), Reply::status(503), Reply::status(200)]).await;
    let p = pipeline(&h, &http_settings(&service, 3, 300));
    let keys = ["K1", "K2", "K3", "K4", "K5", "K6"];
    let m: Vec<InboundMessage> = keys.iter().map(|k| msg(PAY, k)).collect();

    // Three 503s in a row: retried (attempts counted), and the breaker pauses the handler.
    let first = p.process("host:1:0", &m[0..3]).await;
    assert!(first.iter().all(|d| matches!(d, Disposition::Retry { .. })), "{first:?}");
    let row = pause_row(&h, PAY).await;
    assert_eq!((row.state.as_str(), row.changed_by.as_deref()), ("breaker", Some("engine")));
    assert_eq!((row.error_class.as_deref(), row.http_status), (Some("HTTP_UNAVAILABLE"), Some(503)));
    assert!(row.failed_at.is_some() && row.probe_at.is_some());

    // Paused: the next deliveries are held (probe interval) — no record, no call — while
    // another type of the group keeps flowing.
    let batch = [m[3].clone(), m[4].clone(), msg(SHIP, "S1")];
    let second = p.process("host:1:0", &batch).await;
    assert!(held(&second[0]) && held(&second[1]), "{second:?}");
    assert_eq!(second[0], Disposition::Held { delay: Duration::from_millis(300) });
    assert_eq!(second[2], PROCESSED, "other types keep flowing");
    assert_eq!(records(&h, PAY).await, 3, "held deliveries write no record");
    assert_eq!(service.calls().len(), 3);

    // After the probe interval one delivery goes through as the probe; its 200 resumes.
    tokio::time::sleep(Duration::from_millis(350)).await;
    let third = p.process("host:1:0", &[m[3].clone(), m[4].clone(), m[0].clone()]).await;
    assert_eq!(third[0], PROCESSED, "{third:?}");
    assert!(held(&third[1]) && held(&third[2]), "one probe per interval: {third:?}");
    assert_eq!(pause_row(&h, PAY).await.state, "running");

    // Everything goes through once the retries are due; nothing was dead-lettered.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let rest: Vec<InboundMessage> = [0, 1, 2, 4, 5].iter().map(|i| m[*i].clone()).collect();
    let fourth = p.process("host:1:0", &rest).await;
    assert!(fourth.iter().all(|d| *d == PROCESSED), "{fourth:?}");
    let dead: i64 = sqlx::query_scalar("SELECT count(*) FROM dedup_records WHERE status <> 'succeeded'")
        .fetch_one(h.pool())
        .await
        .unwrap();
    assert_eq!(dead, 0);
    assert_eq!(successes_per_key(&service, &keys[3..]), [1, 1, 1], "each held key was called once");
    assert_eq!(service.calls().len(), 3 + 6, "three 503s, then each key once");
}

/// (records, of which dead, records at `attempts`, attempt rows) of `PAY`.
async fn tally(h: &Harness, attempts: i32) -> (i64, i64, i64, i64) {
    sqlx::query_as(
        "SELECT count(*), count(*) FILTER (WHERE status = 'dead'), count(*) FILTER (WHERE attempts = $2),
                (SELECT count(*) FROM record_attempts)
         FROM dedup_records WHERE message_type = $1",
    )
    .bind(PAY)
    .bind(attempts)
    .fetch_one(h.pool())
    .await
    .unwrap()
}

#[tokio::test]
async fn once_the_breaker_trips_no_further_call_starts_and_failed_probes_spend_no_attempt() {
    let h = Harness::new().await;
    let service = Service::start([Reply::status(503).delay(Duration::from_millis(20))]).await;
    let mut s = http_settings(&service, 3, 300);
    s.concurrency = 2;
    // Two attempts: a probe failure that counted would kill its record at the second probe.
    let backoff = Backoff { initial_ms: 100, max_ms: 400 };
    let p = h.pipeline_with(registry(&s), PipelineSettings { backoff, ..common::settings(2, Duration::from_secs(30)) });
    let keys: Vec<String> = (0..40).map(|i| format!("B{i}")).collect();
    let m: Vec<InboundMessage> = keys.iter().map(|k| msg(PAY, k)).collect();

    // One batch much larger than the concurrency: the breaker trips after 3 failures, and the
    // calls still waiting for a slot are not made — given back uncounted and held.
    let first = p.process("host:1:0", &m).await;
    let called = service.calls().len();
    assert!((3..=3 + 2).contains(&called), "at most pause_after + concurrency calls: {called}");
    let held_now = first.iter().filter(|d| **d == Disposition::Held { delay: Duration::from_millis(300) }).count();
    let retried = first.iter().filter(|d| matches!(d, Disposition::Retry { .. })).count();
    assert_eq!((retried, held_now), (called, 40 - called), "{first:?}");
    assert_eq!(pause_row(&h, PAY).await.state, "breaker");
    assert_eq!(
        tally(&h, 0).await,
        (40, 0, 40 - called as i64, called as i64),
        "held: no attempt spent, no attempt row"
    );

    // Paused: one probe per interval goes through; each fails, spends no attempt, is held for
    // the probe interval; nothing dies.
    for _ in 0..3 {
        tokio::time::sleep(Duration::from_millis(350)).await;
        let d = p.process("host:1:0", &m).await;
        assert_eq!(d[0], Disposition::Retry { delay: Duration::from_millis(300) }, "the probe: {d:?}");
        assert!(d[1..].iter().all(held), "{d:?}");
    }
    assert_eq!(service.calls().len(), called + 3, "one call per probe");
    let (attempts, status): (i32, String) =
        sqlx::query_as("SELECT attempts, status FROM dedup_records WHERE message_id = $1")
            .bind(format!("{PAY}.B0:1"))
            .fetch_one(h.pool())
            .await
            .unwrap();
    assert_eq!((attempts, status.as_str()), (1, "failed"), "three failed probes spent no attempt");
    assert_eq!(tally(&h, 0).await.1, 0, "nothing dead");
    assert_eq!(pause_row(&h, PAY).await.state, "breaker");

    // The service recovers: the next probe resumes the handler, then every key succeeds once.
    *service.inner.replies.lock().unwrap() = [Reply::status(200)].into();
    let before = service.calls().len();
    tokio::time::sleep(Duration::from_millis(350)).await;
    let d = p.process("host:1:0", &m).await;
    assert_eq!(d[0], PROCESSED, "the probe succeeds: {d:?}");
    assert_eq!(pause_row(&h, PAY).await.state, "running");
    tokio::time::sleep(Duration::from_millis(500)).await;
    let d = p.process("host:1:0", &m[1..]).await;
    assert!(d.iter().all(|d| *d == PROCESSED), "{d:?}");
    let after: Vec<_> = service.calls()[before..].to_vec();
    assert_eq!(after.len(), 40, "each key called once after the recovery");
    let keys_called: std::collections::HashSet<_> =
        after.iter().map(|c| c.headers["idempotency-key"].to_str().unwrap().to_owned()).collect();
    assert_eq!(keys_called.len(), 40);
    let succeeded: i64 = sqlx::query_scalar("SELECT count(*) FROM dedup_records WHERE status = 'succeeded'")
        .fetch_one(h.pool())
        .await
        .unwrap();
    assert_eq!(succeeded, 40);
}

#[tokio::test]
async fn an_operators_pause_holds_the_calls_of_a_running_batch_that_have_not_started() {
    let h = Harness::new().await;
    let service = Service::start([Reply::status(200).delay(Duration::from_millis(700))]).await;
    let mut s = http_settings(&service, 5, 300);
    s.concurrency = 1;
    let p = pipeline(&h, &s);
    let m: Vec<InboundMessage> = (0..4).map(|i| msg(PAY, &format!("O{i}"))).collect();
    let batch = m.clone();
    let worker = tokio::spawn({
        let p = p.clone();
        async move { p.process("host:1:0", &batch).await }
    });
    eventually(Duration::from_secs(5), || async { !service.calls().is_empty() }).await;
    handler_control(h.pool(), "user:olga", GROUP, PAY, HandlerControl::Pause, Some("drill"), None).await.unwrap();
    let done = worker.await.unwrap();
    // The process reads the pause within FRESH_FOR (1 s): the call then waiting for the slot,
    // and those after it, are not made.
    let called = service.calls().len();
    assert!((1..=3).contains(&called), "{called} calls of 4");
    let processed = done.iter().filter(|d| **d == PROCESSED).count();
    assert_eq!((processed, done.iter().filter(|d| held(d)).count()), (called, 4 - called), "{done:?}");
    let given_back: Vec<(String, i32)> =
        sqlx::query_as("SELECT status, attempts FROM dedup_records WHERE status <> 'succeeded' ORDER BY message_id")
            .fetch_all(h.pool())
            .await
            .unwrap();
    assert_eq!(given_back, vec![("failed".to_owned(), 0); 4 - called], "given back uncounted");
}

#[tokio::test]
async fn without_a_breaker_a_run_of_503s_pauses_nothing() {
    let h = Harness::new().await;
    let service = Service::start([Reply::status(503)]).await;
    let p = pipeline(&h, &http_settings(&service, 0, 300));
    let m: Vec<InboundMessage> = (0..6).map(|i| msg(PAY, &format!("N{i}"))).collect();
    let d = p.process("host:1:0", &m).await;
    assert!(d.iter().all(|d| matches!(d, Disposition::Retry { .. })), "{d:?}");
    assert_eq!(pause_row(&h, PAY).await.state, "running");
}

#[tokio::test]
async fn a_410_pauses_until_an_operator_resumes_and_burns_no_attempt() {
    let h = Harness::new().await;
    let service = Service::start([Reply::status(410).body("endpoint removed"), Reply::status(200)]).await;
    // No breaker: a 410 pauses all the same.
    let p = pipeline(&h, &http_settings(&service, 0, 200));
    let (m1, m2) = (msg(PAY, "G1"), msg(PAY, "G2"));

    let first = p.process("host:1:0", std::slice::from_ref(&m1)).await;
    assert_eq!(first, [Disposition::Retry { delay: Duration::from_millis(200) }], "waits, not dead");
    let (status, attempts): (String, i32) =
        sqlx::query_as("SELECT status, attempts FROM dedup_records").fetch_one(h.pool()).await.unwrap();
    assert_eq!((status.as_str(), attempts), ("failed", 0), "the 410 spent no attempt");
    let row = pause_row(&h, PAY).await;
    assert_eq!(
        (row.state.as_str(), row.http_status, row.error_class.as_deref()),
        ("gone", Some(410), Some("HTTP_GONE"))
    );
    assert!(row.reason.unwrap().contains("410"));

    // No probe: it stays paused past the probe interval.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let second = p.process("host:1:0", &[m1.clone(), m2.clone()]).await;
    assert!(second.iter().all(held), "{second:?}");
    assert_eq!(service.calls().len(), 1);

    let row =
        handler_control(h.pool(), "user:alice", GROUP, PAY, HandlerControl::Resume, Some("the URL is fixed"), None)
            .await
            .unwrap();
    assert_eq!((row.state.as_str(), row.changed_by.as_deref()), ("running", Some("user:alice")));
    tokio::time::sleep(dedup_engine::pause::FRESH_FOR).await;
    let third = p.process("host:1:0", &[m1, m2]).await;
    assert_eq!(third, [PROCESSED, PROCESSED]);
    let attempts: i32 = sqlx::query_scalar("SELECT attempts FROM dedup_records WHERE message_id = $1")
        .bind(format!("{PAY}.G1:1"))
        .fetch_one(h.pool())
        .await
        .unwrap();
    assert_eq!(attempts, 1, "only the successful call counted");
}

#[tokio::test]
async fn operators_pause_and_resume_by_compare_and_set_and_every_try_is_audited() {
    let h = Harness::new().await;
    let service = Service::start([Reply::status(200)]).await;
    let p = pipeline(&h, &http_settings(&service, 5, 200));
    // The first batch registers the group's handlers.
    assert_eq!(p.process("host:1:0", &[msg(PAY, "A1")]).await, [PROCESSED]);
    let rows = h.pool().handler_pauses().await.unwrap();
    let listed: Vec<(&str, &str, Option<&str>)> =
        rows.iter().map(|r| (r.message_type.as_str(), r.state.as_str(), r.kind.as_deref())).collect();
    assert_eq!(listed, [(PAY, "running", Some("http")), (SHIP, "running", Some("transactional"))]);
    let shown = rows[0].version;

    let control = |control, reason: Option<&'static str>, version| {
        handler_control(h.pool(), "user:olga", GROUP, PAY, control, reason, version)
    };
    let refused = |r: Result<HandlerPause, ActionError>| match r {
        Err(ActionError::Refused(text)) => text,
        other => panic!("expected a refusal, got {other:?}"),
    };
    assert!(matches!(control(HandlerControl::Pause, Some("  "), None).await, Err(ActionError::Invalid(_))));
    let paused = control(HandlerControl::Pause, Some("the service is being migrated"), Some(shown)).await.unwrap();
    assert_eq!((paused.state.as_str(), paused.version), ("operator", shown + 1));
    assert_eq!(paused.reason.as_deref(), Some("the service is being migrated"));
    assert!(refused(control(HandlerControl::Pause, Some("again"), None).await).contains("is operator"));
    assert!(refused(control(HandlerControl::Resume, Some("stale"), Some(shown)).await).contains("changed since"));
    let unknown =
        handler_control(h.pool(), "user:olga", GROUP, "NO.SUCH", HandlerControl::Pause, Some("x"), None).await;
    assert!(matches!(unknown, Err(ActionError::UnknownHandler { .. })), "{unknown:?}");

    // Every process follows within FRESH_FOR: held, while the other type flows.
    tokio::time::sleep(dedup_engine::pause::FRESH_FOR).await;
    let d = p.process("host:1:0", &[msg(PAY, "A2"), msg(SHIP, "B1")]).await;
    assert!(held(&d[0]) && d[1] == PROCESSED, "{d:?}");
    // An operator's pause is not probed: still held after the probe interval.
    tokio::time::sleep(Duration::from_millis(250)).await;
    assert!(held(&p.process("host:1:0", &[msg(PAY, "A2")]).await[0]));

    let resumed = control(HandlerControl::Resume, Some("migration done"), Some(shown + 1)).await.unwrap();
    assert_eq!(resumed.state, "running");
    assert!(refused(control(HandlerControl::Resume, Some("twice"), None).await).contains("is running"));

    let audit: Vec<(String, String, Option<String>, Option<String>)> = sqlx::query_as(
        "SELECT action, outcome, consumer_group, reason FROM audit_log WHERE action LIKE 'handler.%' ORDER BY id",
    )
    .fetch_all(h.pool())
    .await
    .unwrap();
    let audit: Vec<(&str, &str)> = audit.iter().map(|(a, o, _, _)| (a.as_str(), o.as_str())).collect();
    assert_eq!(
        audit,
        [
            ("handler.pause", "refused"),
            ("handler.pause", "ok"),
            ("handler.pause", "refused"),
            ("handler.resume", "refused"),
            ("handler.pause", "refused"),
            ("handler.resume", "ok"),
            ("handler.resume", "refused"),
        ]
    );
    let (group, reason): (Option<String>, Option<String>) = sqlx::query_as(
        "SELECT consumer_group, reason FROM audit_log WHERE action = 'handler.pause' AND outcome = 'ok'",
    )
    .fetch_one(h.pool())
    .await
    .unwrap();
    assert_eq!((group.as_deref(), reason.as_deref()), (Some(GROUP), Some("the service is being migrated")));
}

/// Publishes JSON messages with these ids to the broker's exchange.
async fn publish(broker: &TestBroker, ids: &[String]) {
    let publisher = broker.connector().publisher().await.unwrap();
    for id in ids {
        let body = serde_json::to_vec(&json!({ "id": id })).unwrap();
        let props = properties_for(Some(id), &Default::default(), Some("application/json"));
        publisher.publish(&broker.settings.exchange, "order.test", &body, props).await.unwrap();
    }
}

#[tokio::test]
async fn on_rabbitmq_held_deliveries_wait_in_the_delay_queues_while_other_types_flow_and_all_succeed_once_resumed() {
    let h = Harness::new().await;
    let service = Service::start([Reply::status(200)]).await;
    let broker = TestBroker::new(&amqp_url(), Backoff { initial_ms: 500, max_ms: 1000 });
    let settings = PipelineSettings { backoff: broker.backoff.clone(), ..common::settings(5, Duration::from_secs(30)) };
    let pipeline = h.pipeline_with(registry(&http_settings(&service, 5, 1000)), settings);
    let workers =
        ConsumerSettings { concurrency: 2, batch_size: 20, batch_linger_ms: 5, ..ConsumerSettings::default() };
    let consumer = Consumer::new(pipeline, broker.connector() as Arc<dyn SourceFactory>, workers);
    let token = CancellationToken::new();
    let task = tokio::spawn(consumer.run(token.clone()));

    // A first message registers the handlers; then an operator pauses PAY.
    publish(&broker, &[format!("{SHIP}.S0:1")]).await;
    eventually(Duration::from_secs(10), || async { records(&h, SHIP).await == 1 }).await;
    handler_control(h.pool(), "user:olga", GROUP, PAY, HandlerControl::Pause, Some("drill"), None).await.unwrap();
    tokio::time::sleep(dedup_engine::pause::FRESH_FOR).await;

    let pay: Vec<String> = (0..5).map(|i| format!("{PAY}.P{i}:1")).collect();
    let ship: Vec<String> = (1..=5).map(|i| format!("{SHIP}.S{i}:1")).collect();
    publish(&broker, &[pay.clone(), ship].concat()).await;
    eventually(Duration::from_secs(10), || async { records(&h, SHIP).await == 6 }).await;
    // Held for a few rounds: no record, no call, nothing dead-lettered, and not spinning on
    // the work queue: they wait in the 1 s delay queue.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_eq!(records(&h, PAY).await, 0);
    assert!(service.calls().is_empty());
    assert_eq!(broker.depth(&broker.settings.dead_letter_queue()).await, 0);
    let delay_queue = format!("{}.retry.1000", broker.settings.queue);
    let waiting = broker.depth(&delay_queue).await + broker.depth(&broker.settings.queue).await;
    assert!(waiting <= 5, "no copy multiplied: {waiting}");

    handler_control(h.pool(), "user:olga", GROUP, PAY, HandlerControl::Resume, Some("drill over"), None).await.unwrap();
    eventually(Duration::from_secs(15), || async {
        sqlx::query_scalar::<_, i64>(
            "SELECT count(*) FROM dedup_records WHERE message_type = $1 AND status = 'succeeded'",
        )
        .bind(PAY)
        .fetch_one(h.pool())
        .await
        .unwrap()
            == 5
    })
    .await;
    assert_eq!(successes_per_key(&service, &["P0", "P1", "P2", "P3", "P4"]), [1, 1, 1, 1, 1]);
    token.cancel();
    task.await.unwrap();
    assert_eq!(broker.depth(&broker.settings.queue).await, 0);
    assert_eq!(broker.depth(&delay_queue).await, 0);
}
