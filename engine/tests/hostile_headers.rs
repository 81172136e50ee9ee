//! Hostile AMQP header tables against a real RabbitMQ, with default thread stacks: a table
//! nested as deep as a frame holds, an array nested as deep, and a table of ten thousand
//! entries. The consumer survives each, dead-letters the deep ones as poison with their reason
//! and keeps consuming.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use dedup_engine::consumer::{Consumer, ConsumerSettings};
use dedup_engine::retry::Backoff;
use dedup_engine::source::SourceFactory;
use dedup_engine::source::rabbitmq::DEAD_LETTER_REASON_HEADER;
use dedup_engine::source::rabbitmq::amqp_values::table_to_json;
use dedup_engine::testing::amqp::{RawMessage, nested_table, publish_raw, wide_table};
use dedup_engine::testing::{TestBroker, amqp_url};
use lapin::options::BasicGetOptions;
use tokio_util::sync::CancellationToken;

/// A `headers` entry `a` holding arrays nested `depth` levels (5 bytes a level).
fn nested_arrays(depth: usize) -> Vec<u8> {
    let mut table = vec![1, b'a'];
    for level in 0..depth {
        table.push(b'A');
        table.extend_from_slice(&u32::try_from(5 * (depth - level - 1)).unwrap().to_be_bytes());
    }
    table
}

#[tokio::test]
async fn deeply_nested_headers_are_dead_letters_and_the_consumer_keeps_consuming() {
    assert!(
        std::env::var_os("RUST_MIN_STACK").is_none(),
        "this test proves the engine needs no large stacks: run it without RUST_MIN_STACK"
    );
    let h = Harness::new().await;
    let broker = TestBroker::new(&amqp_url(), Backoff { initial_ms: 1000, max_ms: 1000 });
    let pipeline = h.pipeline(recording(), 3);
    let settings = ConsumerSettings { concurrency: 2, ..ConsumerSettings::default() };
    let consumer = Consumer::new(pipeline, broker.connector() as Arc<dyn SourceFactory>, settings);
    let status = consumer.status();
    let token = CancellationToken::new();
    let task = tokio::spawn(consumer.run(token.clone()));
    eventually(Duration::from_secs(10), || async { status.running_workers() == 2 }).await;

    // About 18 000 levels of tables (126 KB), 26 000 of arrays, in RabbitMQ's 128 KiB frames.
    let deep_tables = nested_table(18_000);
    let deep_arrays = nested_arrays(26_000);
    let wide = wide_table(10_000);
    let body = br#"{"orderNo":"1"}"#;
    let message = |id, headers| RawMessage {
        exchange: &broker.settings.exchange,
        routing_key: "order.pay",
        message_id: id,
        headers,
        body,
    };
    publish_raw(
        &amqp_url(),
        &[
            message("ORDER.PAY.deep-tables:1", &deep_tables),
            message("ORDER.PAY.wide:1", &wide),
            message("ORDER.PAY.deep-arrays:1", &deep_arrays),
            message("ORDER.PAY.after:1", &[]),
        ],
    )
    .await
    .expect("the broker takes the hostile messages");

    eventually(Duration::from_secs(20), || async {
        h.record("ORDER.PAY.after:1").await.is_some_and(|r| r.0 == "succeeded")
    })
    .await;
    for id in ["ORDER.PAY.deep-tables:1", "ORDER.PAY.deep-arrays:1"] {
        let (status, poison, class, error, headers): (String, bool, String, String, serde_json::Value) = sqlx::query_as(
            "SELECT status::text, poison, error_class, last_error, headers FROM dedup_records WHERE message_id = $1",
        )
        .bind(id)
        .fetch_one(h.pool())
        .await
        .unwrap();
        assert_eq!((status.as_str(), poison, class.as_str()), ("dead", true, "HEADERS_TOO_DEEP"), "{id}");
        assert!(error.contains("nested deeper than 32 levels"), "{id}: {error}");
        assert!(headers.to_string().contains("not kept"), "{id}: the kept headers mark the cut: {headers}");
    }
    assert_eq!(h.record("ORDER.PAY.wide:1").await.unwrap().0, "succeeded", "ten thousand headers are fine");
    assert_eq!(h.effects("ORDER.PAY.wide:1").await, 1);
    assert_eq!(h.effects("ORDER.PAY.deep-tables:1").await, 0, "a dead letter's handler never runs");

    // Each deep one's dead-letter copy carries the reason; its headers are bounded as received.
    let dead = broker.settings.dead_letter_queue();
    eventually(Duration::from_secs(10), || async { broker.depth(&dead).await == 2 }).await;
    let channel = broker.channel().await;
    for _ in 0..2 {
        let copy = channel.basic_get(dead.as_str().into(), BasicGetOptions { no_ack: true }).await.unwrap().unwrap();
        let headers = table_to_json(copy.properties.headers().as_ref().unwrap());
        let reason = headers[DEAD_LETTER_REASON_HEADER].as_str().unwrap();
        assert!(reason.contains("nested deeper than 32 levels"), "{headers:?}");
    }

    token.cancel();
    task.await.unwrap();
    assert_eq!(broker.depth(&broker.settings.queue).await, 0, "every message was settled");
}
