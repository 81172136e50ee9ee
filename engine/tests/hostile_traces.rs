//! A host's own `fmt` subscriber at `dedup_engine=trace` (set for the test's thread only) while
//! the consumer takes hostile message ids and types: ANSI escapes, newlines, 10 KB. Nothing
//! breaks, no hostile byte reaches the log raw (no forged line, no terminal escape), and the
//! spans carry the fields DESIGN.md ("Tracing") lists.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use dedup_engine::message::{TypePolicy, TypeSource};
use dedup_engine::retry::Backoff;
use dedup_engine::source::SourceFactory;
use dedup_engine::testing::amqp::{RawMessage, publish_raw};
use dedup_engine::testing::{TestBroker, amqp_url};
use tracing_subscriber::fmt::format::FmtSpan;

#[tokio::test]
async fn hostile_ids_and_types_reach_a_host_subscriber_escaped_and_the_spans_carry_their_fields() {
    let log = Captured::default();
    let writer = log.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_env_filter("dedup_engine=trace")
        .with_ansi(false)
        .with_span_events(FmtSpan::CLOSE)
        .with_writer(move || writer.clone())
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);

    let h = Harness::new().await;
    let broker = TestBroker::new(&amqp_url(), Backoff { initial_ms: 200, max_ms: 200 });
    let mut settings = settings(3, Duration::from_secs(30));
    settings.type_policy =
        TypePolicy::from_sources([TypeSource::JsonPointer("/type".to_owned()), TypeSource::IdPrefix]);
    let pipeline = h.pipeline_with(recording(), settings);
    let (token, task) = spawn_consumer(pipeline, broker.connector() as Arc<dyn SourceFactory>, 1).await;

    let long_id =
        serde_json::to_vec(&serde_json::json!({"messageId": format!("ORDER.PAY.{}:1", "x".repeat(10_240))})).unwrap();
    let escaped_id = serde_json::to_vec(&serde_json::json!({"messageId": "ORDER.PAY.\u{1b}[2J\nFORGED-ID:1"})).unwrap();
    let evil_type =
        serde_json::to_vec(&serde_json::json!({"type": "EVIL\u{1b}[31m\nFORGED-TYPE", "orderNo": "1"})).unwrap();
    let long_type = serde_json::to_vec(&serde_json::json!({"type": "T".repeat(10_240), "orderNo": "1"})).unwrap();
    let body = br#"{"orderNo":"1"}"#.as_slice();
    let message = |message_id, body| RawMessage {
        exchange: &broker.settings.exchange,
        routing_key: "order.pay",
        message_id,
        headers: &[],
        body,
    };
    publish_raw(
        &amqp_url(),
        &[
            message("ORDER.PAY.\u{1b}[31mred\nFORGED-PROPERTY:1", body),
            message("", &long_id),
            message("", &escaped_id),
            message("ORDER.PAY.evil-type:1", &evil_type),
            message("ORDER.PAY.long-type:1", &long_type),
            message("ORDER.PAY.after:1", body),
        ],
    )
    .await
    .expect("the broker takes the messages");
    eventually(Duration::from_secs(15), || async {
        h.record("ORDER.PAY.after:1").await.is_some_and(|r| r.0 == "succeeded")
    })
    .await;
    eventually(Duration::from_secs(10), || async { broker.depth(&broker.settings.queue).await == 0 }).await;
    token.cancel();
    tokio::time::timeout(Duration::from_secs(10), task).await.expect("the consumer stops").unwrap();

    let dead: Vec<(String, String)> = sqlx::query_as(
        "SELECT message_type, error_class FROM dedup_records WHERE status = 'dead' ORDER BY error_class",
    )
    .fetch_all(h.pool())
    .await
    .unwrap();
    assert_eq!(dead.len(), 5, "each hostile message is a dead letter: {dead:.300?}");
    let (evil_type, evil_class): (String, String) = sqlx::query_as(
        "SELECT message_type, error_class FROM dedup_records WHERE message_id = 'ORDER.PAY.evil-type:1'",
    )
    .fetch_one(h.pool())
    .await
    .unwrap();
    assert_eq!(evil_type, "UNKNOWN", "a type with control characters is no type, and not the id prefix's either");
    assert!(evil_class.starts_with("NO_HANDLER"), "{evil_class}");
    assert_eq!(h.effects("ORDER.PAY.evil-type:1").await, 0, "the ORDER.PAY handler never ran on it");
    let (long_type,): (i32,) =
        sqlx::query_as("SELECT length(message_type) FROM dedup_records WHERE message_id = 'ORDER.PAY.long-type:1'")
            .fetch_one(h.pool())
            .await
            .unwrap();
    assert_eq!(long_type, 200, "a 10 KB type is cut to MAX_TYPE_CHARS");

    let text = String::from_utf8(log.0.lock().unwrap().clone()).unwrap();
    assert!(!text.contains('\u{1b}'), "no raw escape reaches the log");
    for line in text.lines() {
        assert!(line.starts_with("20"), "every line is one of the subscriber's own (a timestamp first): {line:.200}");
    }
    let handler = text
        .lines()
        .find(|l| l.contains("handler{") && l.contains("ORDER.PAY.after:1") && l.contains("close"))
        .unwrap_or_else(|| panic!("the handler span of the good message closes:\n{text:.4000}"));
    for field in ["message_id=ORDER.PAY.after:1", "message_type=ORDER.PAY", "attempt=1", "mode=\"transactional\""] {
        assert!(handler.contains(field), "{field} in {handler}");
    }
    // The batch spans' outcome counts, summed over the batches (INFO, closed).
    let count = |line: &str, field: &str| -> u32 {
        let at = line.find(&format!(" {field}=")).unwrap_or_else(|| panic!("{field} in {line}")) + field.len() + 2;
        line[at..].split(|c: char| !c.is_ascii_digit()).next().unwrap().parse().unwrap()
    };
    let batches: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("dedup_engine::pipeline::spans: close") && !l.contains("handler{"))
        .collect();
    let sum = |field| batches.iter().map(|l| count(l, field)).sum::<u32>();
    assert_eq!((sum("size"), sum("succeeded"), sum("poison") + sum("dead")), (6, 1, 5), "{batches:#?}");
    let longest = text.lines().map(str::len).max().unwrap_or(0);
    assert!(longest < 2_000, "no 10 KB value is logged whole: {longest} bytes");
}
