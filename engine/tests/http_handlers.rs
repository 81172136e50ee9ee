//! HTTP handlers against a real HTTP server the test starts (the team's service, on
//! 127.0.0.1:0): the request they send, and every row of the answer table of docs/DESIGN.md
//! ("HTTP handlers"); the 410 row, which pauses the handler, is tested in handler_pauses.rs.

mod common;

use std::slice;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use common::service::{Reply, Service};
use common::{Captured, GROUP, Harness, message, settings};
use dedup_engine::console::endpoints::EndpointReads;
use dedup_engine::console::records::{AttemptRow, record_detail};
use dedup_engine::handler::{Handler, HandlerRegistry};
use dedup_engine::http::{HttpHandler, HttpSettings, SecretSetting};
use dedup_engine::message::InboundMessage;
use dedup_engine::pipeline::{AckReason, Disposition, Pipeline};
use dedup_engine::record::LeaseExpiryPolicy;
use serde_json::json;

const TYPE: &str = "ORDER.PAID";

fn registry(settings: &HttpSettings) -> HandlerRegistry {
    let mut handlers = HandlerRegistry::new();
    let handler = HttpHandler::new(settings).unwrap();
    handlers.register(TYPE, Handler::Leased { handler: Arc::new(handler), on_lease_expiry: settings.on_lease_expiry });
    handlers
}

fn pipeline(h: &Harness, settings: &HttpSettings) -> Pipeline {
    h.pipeline(registry(settings), 5)
}

fn paid(key: &str) -> InboundMessage {
    message(&format!("{TYPE}.{key}:1"), json!({"orderNo": key, "amount": 12}))
}

/// The record's status, attempts, last error and error class, and its attempt rows.
async fn outcome(h: &Harness, msg: &InboundMessage) -> (String, i32, Option<String>, Option<String>, Vec<AttemptRow>) {
    let (id, status, attempts, last_error, error_class): (i64, String, i32, Option<String>, Option<String>) =
        sqlx::query_as(
            "SELECT id, status, attempts, last_error, error_class FROM dedup_records
             WHERE consumer_group = $1 AND message_id = $2",
        )
        .bind(GROUP)
        .bind(msg.property_message_id.as_deref().unwrap())
        .fetch_one(h.pool())
        .await
        .unwrap();
    let detail = record_detail(h.pool(), id).await.unwrap().unwrap();
    (status, attempts, last_error, error_class, detail.attempt_history)
}

/// One message through a handler whose service answers `reply`: the disposition and outcome.
async fn one(reply: Reply) -> (Disposition, String, i32, Option<String>, Option<String>, Vec<AttemptRow>) {
    let h = Harness::new().await;
    let service = Service::start([reply]).await;
    let mut s = HttpSettings::new(service.url());
    s.timeout_ms = 2_000;
    s.retry_after_max_ms = 60_000;
    let msg = paid("T1");
    let disposition = pipeline(&h, &s).process("host:1:0", slice::from_ref(&msg)).await.remove(0);
    let (status, attempts, error, class, history) = outcome(&h, &msg).await;
    (disposition, status, attempts, error, class, history)
}

fn retried(d: &Disposition) -> bool {
    matches!(d, Disposition::Retry { .. })
}

#[tokio::test]
async fn the_call_carries_the_payload_the_key_and_the_gateways_headers() {
    // SAFETY: no other thread of this test binary reads or writes this variable.
    unsafe { std::env::set_var("HTTP_TEST_TOKEN_A", "Bearer t0ken-a") };
    let h = Harness::new().await;
    let service = Service::start([Reply::status(200)]).await;
    let mut s = HttpSettings::new(service.url());
    s.headers.insert("Authorization".into(), SecretSetting::Env { env: "HTTP_TEST_TOKEN_A".into() });
    s.headers.insert("X-Team".into(), SecretSetting::value("billing"));
    s.forward_headers = vec!["x-trace-id".into()];
    s.signing_secret = Some(SecretSetting::value("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"));
    let mut msg = paid("H1");
    msg.headers.insert("X-Trace-Id".into(), json!("trace-7"));
    msg.headers.insert("x-private".into(), json!("not forwarded"));
    let done = pipeline(&h, &s).process("host:1:0", slice::from_ref(&msg)).await;
    assert_eq!(done, [Disposition::Ack(AckReason::Processed)]);

    let calls = service.calls();
    assert_eq!(calls.len(), 1);
    let call = &calls[0];
    assert_eq!(call.body, msg.payload, "the payload is the body");
    let header = |name: &str| call.headers.get(name).map(|v| v.to_str().unwrap().to_owned());
    assert_eq!(header("content-type").as_deref(), Some("application/json"));
    assert_eq!(header("idempotency-key").as_deref(), Some("\"ORDER.PAID.H1:1\""), "an sf-string");
    assert_eq!(header("dedup-consumer-group").as_deref(), Some(GROUP));
    assert_eq!(header("dedup-message-type").as_deref(), Some(TYPE));
    assert_eq!(header("dedup-attempt").as_deref(), Some("1"));
    assert_eq!(header("dedup-delivery-count").as_deref(), Some("1"));
    assert_eq!(header("dedup-previous-status"), None, "a first call has none");
    assert_eq!(header("dedup-source-exchange").as_deref(), Some("test.exchange"));
    assert_eq!(header("dedup-source-routing-key").as_deref(), Some("test.key"));
    assert_eq!(header("x-trace-id").as_deref(), Some("trace-7"), "on the allow-list");
    assert_eq!(header("x-private"), None, "not on it");
    assert_eq!(header("authorization").as_deref(), Some("Bearer t0ken-a"), "read from the environment");
    assert_eq!(header("x-team").as_deref(), Some("billing"));
    assert_eq!(header("webhook-id").as_deref(), Some("ORDER.PAID.H1:1"));
    let timestamp: i64 = header("webhook-timestamp").unwrap().parse().unwrap();
    assert!((chrono::Utc::now().timestamp() - timestamp).abs() < 60);
    let key = base64_decode("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw");
    let expected = dedup_engine::http::request::webhook_signature(&key, "ORDER.PAID.H1:1", timestamp, &call.body);
    assert_eq!(header("webhook-signature"), Some(expected));

    let (status, attempts, _, _, history) = outcome(&h, &msg).await;
    assert_eq!((status.as_str(), attempts), ("succeeded", 1));
    assert_eq!(history[0].answer_status, Some(200), "the answer is on the attempt");
    assert!(history[0].latency_ms.is_some());
}

fn base64_decode(text: &str) -> Vec<u8> {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.decode(text).unwrap()
}

#[tokio::test]
async fn a_retry_tells_the_service_its_attempt_calls_and_previous_status() {
    let h = Harness::new().await;
    let service = Service::start([Reply::status(503), Reply::status(200)]).await;
    let s = HttpSettings::new(service.url());
    let p = pipeline(&h, &s);
    let msg = paid("R1");
    assert!(retried(&p.process("host:1:0", slice::from_ref(&msg)).await[0]));
    assert_eq!(p.process("host:1:0", slice::from_ref(&msg)).await, [Disposition::Ack(AckReason::Processed)]);
    let second = &service.calls()[1];
    assert_eq!(second.headers["dedup-attempt"], "2");
    assert_eq!(second.headers["dedup-delivery-count"], "2");
    assert_eq!(second.headers["dedup-previous-status"], "503");
    assert_eq!(second.headers["idempotency-key"], service.calls()[0].headers["idempotency-key"], "the same key");
}

#[tokio::test]
async fn a_2xx_succeeds_unless_a_header_or_the_body_says_otherwise() {
    let (d, status, ..) = one(Reply::status(204)).await;
    assert_eq!((d, status.as_str()), (Disposition::Ack(AckReason::Processed), "succeeded"));
    let (d, status, ..) = one(Reply::status(200).body(r#"{"status": "SUCCESS"}"#)).await;
    assert_eq!((d, status.as_str()), (Disposition::Ack(AckReason::Processed), "succeeded"));

    let (d, status, attempts, error, ..) = one(Reply::status(200).header("dedup-outcome", "retry")).await;
    assert!(retried(&d), "{d:?}");
    assert_eq!((status.as_str(), attempts), ("failed", 1));
    assert!(error.unwrap().contains("Dedup-Outcome: retry"));
    let (d, status, _, error, class, _) =
        one(Reply::status(200).header("dedup-outcome", "dead").body("no such account")).await;
    assert!(matches!(d, Disposition::DeadLetter { .. }), "{d:?}");
    assert_eq!(status, "dead");
    assert!(error.unwrap().contains("no such account"));
    assert!(class.unwrap().starts_with("HTTP_DEAD"));

    let (d, status, ..) = one(Reply::status(200).body(r#"{"status": "RETRY"}"#)).await;
    assert!(retried(&d) && status == "failed", "{d:?} {status}");
    let (d, status, ..) = one(Reply::status(202).body(r#"{"status": "DEAD"}"#)).await;
    assert!(matches!(d, Disposition::DeadLetter { .. }) && status == "dead", "{d:?} {status}");
    let (d, status, _, error, ..) = one(Reply::status(200).header("dedup-outcome", "maybe")).await;
    assert!(retried(&d) && status == "failed", "never a silent ack: {d:?}");
    assert!(error.unwrap().contains("maybe"));
}

#[tokio::test]
async fn a_422_is_a_key_conflict_and_dead() {
    let (d, status, attempts, error, class, _) = one(Reply::status(422).body("key reused")).await;
    assert!(matches!(d, Disposition::DeadLetter { .. }), "{d:?}");
    assert_eq!((status.as_str(), attempts), ("dead", 1), "at once, with attempts left");
    assert!(class.unwrap().starts_with("HTTP_CONFLICT"));
    assert!(error.unwrap().contains("key reused"));
}

#[tokio::test]
async fn other_4xx_are_dead_with_the_status_and_the_bodys_first_2_kib() {
    for code in [400, 404, 401, 418] {
        let body = format!("refused-{code} {}", "x".repeat(5000));
        let (d, status, _, error, class, history) = one(Reply::status(code).body(body)).await;
        assert!(matches!(d, Disposition::DeadLetter { .. }), "{code}: {d:?}");
        assert_eq!(status, "dead", "{code}");
        let error = error.unwrap();
        assert!(error.starts_with(&format!("HTTP_REFUSED: HTTP {code}")), "{error}");
        assert!(error.contains(&format!("refused-{code}")));
        let excerpt = error.lines().nth(1).unwrap();
        assert_eq!(excerpt.len(), 2048, "the first 2 KiB of the body");
        assert_eq!(class.as_deref(), Some("HTTP_REFUSED"), "one dead-letter group, whatever the status");
        assert_eq!(history[0].answer_status, Some(i16::try_from(code).unwrap()));
        assert_eq!(history[0].answer.as_deref().map(str::len), Some(2048));
    }
}

#[tokio::test]
async fn a_3xx_is_not_followed_and_the_failure_names_the_location() {
    let (d, status, attempts, error, ..) =
        one(Reply::status(301).header("location", "http://elsewhere.invalid/new")).await;
    assert!(retried(&d), "{d:?}");
    assert_eq!((status.as_str(), attempts), ("failed", 1));
    assert!(error.unwrap().contains("Location: http://elsewhere.invalid/new"));
}

#[tokio::test]
async fn unavailable_answers_are_retried_with_the_groups_back_off() {
    for code in [408, 425, 429, 500, 502, 503] {
        let (d, status, attempts, _, class, _) = one(Reply::status(code)).await;
        assert_eq!(d, Disposition::Retry { delay: Duration::from_secs(1) }, "{code}: the back-off's first delay");
        assert_eq!((status.as_str(), attempts), ("failed", 1), "{code}");
        assert!(class.unwrap().starts_with("HTTP_UNAVAILABLE"), "{code}");
    }
}

#[tokio::test]
async fn retry_after_is_honoured_between_the_floor_and_the_cap() {
    let (d, ..) = one(Reply::status(429).header("retry-after", "7")).await;
    assert_eq!(d, Disposition::Retry { delay: Duration::from_secs(7) });
    let (d, ..) = one(Reply::status(503).header("retry-after", "86400")).await;
    assert_eq!(d, Disposition::Retry { delay: Duration::from_secs(60) }, "capped (retry_after_max_ms)");
    let (d, ..) = one(Reply::status(503).header("retry-after", "0")).await;
    assert_eq!(d, Disposition::Retry { delay: Duration::from_secs(1) }, "floored (retry_after_min_ms)");
    // An HTTP-date 30 s ahead, in whole seconds; the test database is created in between.
    let in_30_s = (chrono::Utc::now() + chrono::Duration::seconds(30)).to_rfc2822().replace("+0000", "GMT");
    let (d, ..) = one(Reply::status(503).header("retry-after", in_30_s)).await;
    let Disposition::Retry { delay } = d else { panic!("{d:?}") };
    assert!((15..=30).contains(&delay.as_secs()), "an HTTP-date: {delay:?}");
}

#[tokio::test]
async fn timeouts_and_connection_errors_are_retried() {
    let h = Harness::new().await;
    let service = Service::start([Reply::status(200).delay(Duration::from_secs(6))]).await;
    let mut s = HttpSettings::new(service.url());
    s.timeout_ms = 300;
    let msg = paid("TO1");
    let started = Instant::now();
    let d = pipeline(&h, &s).process("host:1:0", slice::from_ref(&msg)).await.remove(0);
    assert!(retried(&d), "{d:?}");
    assert!(started.elapsed() < Duration::from_secs(5), "the timeout ended the call, not the answer");
    let (status, attempts, error, _, history) = outcome(&h, &msg).await;
    assert_eq!((status.as_str(), attempts), ("failed", 1));
    assert!(error.unwrap().starts_with("HTTP_TIMEOUT: no answer within 300 ms"));
    assert_eq!(history[0].answer_status, None, "no answer");

    // A port nothing listens on.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let s = HttpSettings::new(format!("http://{closed}/hook"));
    let msg = paid("CE1");
    let d = pipeline(&h, &s).process("host:1:0", slice::from_ref(&msg)).await.remove(0);
    assert!(retried(&d), "{d:?}");
    let (status, _, error, ..) = outcome(&h, &msg).await;
    assert_eq!(status, "failed");
    let error = error.unwrap();
    assert!(error.starts_with("HTTP_CONNECT"), "{error}");
    assert!(!error.contains(&closed.port().to_string()) || !error.contains("http://"), "no URL: {error}");
}

#[tokio::test]
async fn a_409_storm_burns_no_attempt_until_its_wall_clock_limit() {
    let h = Harness::new().await;
    let service = Service::start([Reply::status(409).body("busy")]).await;
    let mut s = HttpSettings::new(service.url());
    s.in_progress_limit_ms = 3_000;
    let p = h.pipeline(registry(&s), 2);
    let msg = paid("S1");
    let started = Instant::now();
    let mut uncounted = 0;
    while started.elapsed() < Duration::from_millis(1_000) {
        let d = p.process("host:1:0", slice::from_ref(&msg)).await.remove(0);
        assert!(retried(&d), "{d:?}");
        let (status, attempts, ..) = outcome(&h, &msg).await;
        assert_eq!((status.as_str(), attempts), ("failed", 0), "not counted");
        uncounted += 1;
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    assert!(uncounted >= 2, "{uncounted}");
    let (.., history) = outcome(&h, &msg).await;
    assert!(history.iter().all(|a| a.outcome.as_deref() == Some("deferred") && a.attempt == 1));
    assert_eq!(service.calls().last().unwrap().headers["dedup-attempt"], "1", "the attempt number stays");
    assert_eq!(
        service.calls().last().unwrap().headers["dedup-delivery-count"],
        uncounted.to_string().as_str(),
        "the calls grow"
    );
    tokio::time::sleep(Duration::from_millis(3_500).saturating_sub(started.elapsed())).await;
    // Past the limit: each 409 counts, and the record ends dead at max_attempts (2).
    assert!(retried(&p.process("host:1:0", slice::from_ref(&msg)).await[0]));
    assert_eq!(outcome(&h, &msg).await.1, 1, "counted");
    let d = p.process("host:1:0", slice::from_ref(&msg)).await.remove(0);
    assert!(matches!(d, Disposition::DeadLetter { .. }), "{d:?}");
    let (status, attempts, _, class, _) = outcome(&h, &msg).await;
    assert_eq!((status.as_str(), attempts), ("dead", 2));
    assert!(class.unwrap().starts_with("HTTP_IN_PROGRESS"));
}

#[tokio::test]
async fn a_late_200_after_the_lease_was_lost_is_recorded_and_completes_nothing() {
    let h = Harness::new().await;
    // Worker A's call is held by the service until released; worker B's is answered at once.
    let service = Service::start([Reply::status(200).gated(), Reply::status(200)]).await;
    let mut s = HttpSettings::new(service.url());
    s.timeout_ms = 10_000;
    s.on_lease_expiry = LeaseExpiryPolicy::Reclaim;
    let lease = Duration::from_secs(1);
    // Worker A's own small pool: the test takes its connections to cut A off (a frozen worker:
    // its heartbeat stalls), as the lease-loss tests do.
    let pool_a = sqlx::postgres::PgPoolOptions::new()
        .max_connections(2)
        .acquire_timeout(Duration::from_millis(200))
        .connect(&h.db.url)
        .await
        .unwrap();
    let a = Pipeline::new(
        dedup_engine::store::postgres::PgStore::new(pool_a.clone(), &h.db.schema),
        h.fast_path.clone(),
        h.stats.clone(),
        registry(&s),
        settings(5, lease),
    );
    let b = h.pipeline_with(registry(&s), settings(5, lease));
    let msg = paid("L1");
    let batch = [msg.clone()];
    let worker_a = tokio::spawn(async move { a.process("host-a:1:0", &batch).await });
    tokio::time::timeout(Duration::from_secs(10), service.inner.arrived.notified()).await.expect("A calls");
    let cut_off = [pool_a.acquire().await.unwrap(), pool_a.acquire().await.unwrap()];
    tokio::time::sleep(lease + Duration::from_millis(500)).await;

    assert_eq!(
        b.process("host-b:2:0", slice::from_ref(&msg)).await,
        [Disposition::Ack(AckReason::Processed)],
        "B took over"
    );
    drop(cut_off);
    service.inner.release.notify_one();
    let a_done = tokio::time::timeout(Duration::from_secs(10), worker_a).await.expect("A finishes").unwrap();
    assert_eq!(a_done, [Disposition::Ack(AckReason::LeaseLost)], "A's late 200 completes nothing");
    assert_eq!(service.calls().len(), 2);
    let (status, _, _, _, history) = outcome(&h, &msg).await;
    assert_eq!(status, "succeeded", "B's completion stands");
    let first = &history[0];
    assert_eq!((first.outcome.as_deref(), first.late_effect), (Some("lease_lost"), true));
    assert_eq!(first.taken_over_by.as_deref(), Some("host-b:2:0"));
    assert_eq!(first.answer_status, Some(200), "the late answer is in the history");
    assert!(first.latency_ms.unwrap() >= 1_000, "{:?}", first.latency_ms);
    assert_eq!((history[1].outcome.as_deref(), history[1].answer_status), (Some("succeeded"), Some(200)));
}

#[tokio::test]
async fn concurrency_bounds_the_calls_in_flight_and_the_rate_spaces_them() {
    let h = Harness::new().await;
    let service = Service::start([Reply::status(200).delay(Duration::from_millis(500))]).await;
    let mut s = HttpSettings::new(service.url());
    s.concurrency = 2;
    let batch: Vec<_> = (0..6).map(|i| paid(&format!("C{i}"))).collect();
    let done = pipeline(&h, &s).process("host:1:0", &batch).await;
    assert!(done.iter().all(|d| *d == Disposition::Ack(AckReason::Processed)), "{done:?}");
    assert_eq!(service.inner.most_in_flight.load(Ordering::SeqCst), 2);

    let service = Service::start([Reply::status(200)]).await;
    let mut s = HttpSettings::new(service.url());
    s.rate_per_sec = Some(10.0);
    let batch: Vec<_> = (0..4).map(|i| paid(&format!("P{i}"))).collect();
    pipeline(&h, &s).process("host:1:0", &batch).await;
    let mut at: Vec<Instant> = service.calls().iter().map(|c| c.at).collect();
    at.sort();
    // Starts 100 ms apart: the fourth at least 300 ms after the first (arrivals jitter a little).
    let spread = at[3] - at[0];
    assert!(spread >= Duration::from_millis(250), "4 calls at 10 per second within {spread:?}");
}

#[tokio::test]
async fn settings_are_checked_and_the_lease_must_outlast_the_timeout() {
    let refused = |mut edit: Box<dyn FnMut(&mut HttpSettings)>| {
        let mut s = HttpSettings::new("http://127.0.0.1:9/x");
        edit(&mut s);
        HttpHandler::new(&s).unwrap_err().to_string()
    };
    assert!(refused(Box::new(|s| s.url = "ftp://x/y".into())).contains("http://"));
    assert!(refused(Box::new(|s| s.url = "http://u:pw@h/x".into())).contains("credentials"));
    assert!(refused(Box::new(|s| s.method = "GET".into())).contains("POST"));
    assert!(refused(Box::new(|s| s.concurrency = 0)).contains("concurrency"));
    let e = refused(Box::new(|s| {
        s.headers.insert("Idempotency-Key".into(), SecretSetting::value("x"));
    }));
    assert!(e.contains("set by the gateway"), "{e}");
    let e = refused(Box::new(|s| {
        s.headers.insert("Authorization".into(), SecretSetting::Env { env: "HTTP_TEST_UNSET_VARIABLE".into() });
    }));
    assert!(e.contains("HTTP_TEST_UNSET_VARIABLE"), "{e}");
    let e = refused(Box::new(|s| s.signing_secret = Some(SecretSetting::value("whsec_not base64!"))));
    assert!(e.contains("signing_secret") && !e.contains("not base64!"), "{e}");

    let h = Harness::new().await;
    let mut s = HttpSettings::new("http://127.0.0.1:9/x");
    s.timeout_ms = 5_000;
    let group = dedup_engine::group::Group::rabbitmq(
        "http-lease",
        dedup_engine::testing::amqp_url(),
        dedup_engine::source::rabbitmq::RabbitSettings::for_queue("x.events", "x.queue", ["#"]),
    )
    .lease(Duration::from_secs(2))
    .http(TYPE, HttpHandler::new(&s).unwrap());
    let started =
        dedup_engine::runtime::Engine::builder(h.pool().clone()).schema(h.db.schema.clone()).group(group).start().await;
    let e = started.err().expect("refused").to_string();
    assert!(e.contains("5000 ms") && e.contains("lease"), "{e}");
}

#[tokio::test]
async fn secrets_never_reach_logs_debug_output_or_the_records() {
    const TOKEN: &str = "s3cret-token-from-env";
    const LITERAL: &str = "s3cret-literal-value";
    const SIGNING: &str = "whsec_c2VjcmV0LXNpZ25pbmcta2V5LWJ5dGVzIQ==";
    // SAFETY: no other thread of this test binary reads or writes this variable.
    unsafe { std::env::set_var("HTTP_TEST_TOKEN_S", TOKEN) };
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber =
        tracing_subscriber::fmt().with_max_level(tracing::Level::TRACE).with_writer(move || writer.clone()).finish();
    let _default = tracing::subscriber::set_default(subscriber);

    let h = Harness::new().await;
    let service = Service::start([Reply::status(500).body("down"), Reply::status(200)]).await;
    let mut s = HttpSettings::new(service.url());
    s.headers.insert("Authorization".into(), SecretSetting::Env { env: "HTTP_TEST_TOKEN_S".into() });
    s.headers.insert("X-Api-Key".into(), SecretSetting::value(LITERAL));
    s.signing_secret = Some(SecretSetting::value(SIGNING));
    let handler = HttpHandler::new(&s).unwrap();
    let p = pipeline(&h, &s);
    let msg = paid("SEC1");
    assert!(retried(&p.process("host:1:0", slice::from_ref(&msg)).await[0]));
    assert_eq!(p.process("host:1:0", slice::from_ref(&msg)).await, [Disposition::Ack(AckReason::Processed)]);
    assert_eq!(service.calls()[0].headers["authorization"], TOKEN, "the secret was sent");
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let mut down = s.clone();
    down.url = format!("http://{closed}/hook");
    pipeline(&h, &down).process("host:1:0", &[paid("SEC2")]).await;

    let rows: Vec<String> = sqlx::query_scalar(
        "SELECT row_to_json(r)::text FROM dedup_records r
         UNION ALL SELECT row_to_json(a)::text FROM record_attempts a",
    )
    .fetch_all(h.pool())
    .await
    .unwrap();
    let logs = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
    assert!(!logs.is_empty(), "the logs were captured");
    let everything = format!("{logs}\n{s:?}\n{handler:?}\n{}\n{}", serde_json::to_string(&s).unwrap(), rows.join("\n"));
    for secret in [TOKEN, LITERAL, SIGNING, "c2VjcmV0LXNpZ25pbmcta2V5LWJ5dGVzIQ"] {
        assert!(!everything.contains(secret), "{secret} leaked");
    }
    assert!(rows.iter().any(|r| r.contains("HTTP_UNAVAILABLE")), "the records were read");
}

#[tokio::test]
async fn each_call_counts_on_its_endpoint_card() {
    let h = Harness::new().await;
    let service = Service::start([Reply::status(200), Reply::status(422).body("other payload")]).await;
    let p = pipeline(&h, &HttpSettings::new(service.url()));
    for key in ["E1", "E2"] {
        p.process("host:1:0", &[paid(key)]).await;
    }
    let cards = h.pool().endpoint_calls(&[(GROUP, TYPE)]).await.unwrap();
    let c = &cards[0];
    assert_eq!((c.calls, c.succeeded, c.conflict, c.success_rate()), (2, 1, 1, Some(0.5)));
    assert!(c.p95_ms.is_some_and(|ms| ms >= 0));
}

#[tokio::test]
async fn the_console_knows_each_groups_http_endpoints_without_their_secrets() {
    let h = Harness::new().await;
    let mut s = HttpSettings::new("http://127.0.0.1:9/hook?token=abc");
    s.timeout_ms = 1_000;
    s.headers.insert("Authorization".into(), SecretSetting::value("Bearer endpoint-secret"));
    let mut shipped = HttpSettings::new("http://127.0.0.1:9/ship");
    shipped.method = "PUT".into();
    let group = dedup_engine::group::Group::rabbitmq(
        "http-endpoints",
        dedup_engine::testing::amqp_url(),
        dedup_engine::source::rabbitmq::RabbitSettings::for_queue("x.events", "x.queue", ["#"]),
    )
    .http("ORDER.SHIPPED", HttpHandler::new(&shipped).unwrap())
    .http(TYPE, HttpHandler::new(&s).unwrap());
    let engine = dedup_engine::runtime::Engine::builder(h.pool().clone())
        .schema(h.db.schema.clone())
        .consume(false)
        .group(group)
        .start()
        .await
        .unwrap();
    let endpoints = engine.handle().groups()[0].http.clone();
    engine.stop().await;
    let shown: Vec<(&str, &str, &str)> =
        endpoints.iter().map(|e| (e.message_type.as_str(), e.method.as_str(), e.url.as_str())).collect();
    assert_eq!(
        shown,
        [("ORDER.PAID", "POST", "http://127.0.0.1:9/hook?…"), ("ORDER.SHIPPED", "PUT", "http://127.0.0.1:9/ship")]
    );
    assert!(!format!("{endpoints:?}").contains("endpoint-secret"));
}
