//! Hostile AMQP input besides deep nesting (`hostile_headers.rs`), from a hand-driven producer
//! against a real RabbitMQ, with default thread stacks: header names that are not UTF-8 (lapin
//! refuses the whole frame: the connection failed and RabbitMQ redelivered the message to the
//! next one, forever, and nothing behind it was consumed), nesting just at the bound and one
//! past it, tables and arrays mixed, a huge field name, hostile message ids, payloads that are
//! not JSON or not UTF-8, a 10 MB payload, and many of them at once. Each is settled (consumed
//! or a dead letter with its reason) and the good message after them is consumed.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use dedup_engine::retry::Backoff;
use dedup_engine::source::SourceFactory;
use dedup_engine::testing::amqp::{RawMessage, nested_table, publish_raw};
use dedup_engine::testing::{TestBroker, amqp_url};

/// `depth` levels below the `headers` table, alternating tables and arrays, as entry `m`.
fn tables_and_arrays(depth: usize) -> Vec<u8> {
    // A table level is an entry: name `m` (2), tag (1), length (4); an array level a value:
    // tag (1), length (4). The innermost: a boolean (2), in a table as entry `z` (+2).
    let mut sizes = Vec::with_capacity(depth);
    let mut inside = if depth.is_multiple_of(2) { 4 } else { 2 };
    for level in (0..depth).rev() {
        sizes.push(inside);
        inside += if level % 2 == 0 { 7 } else { 5 };
    }
    sizes.reverse();
    let mut bytes = vec![1, b'm'];
    for (level, size) in sizes.iter().enumerate() {
        bytes.push(if level % 2 == 0 { b'A' } else { b'F' });
        bytes.extend_from_slice(&u32::try_from(*size).unwrap().to_be_bytes());
        if level % 2 == 1 && level + 1 < depth {
            bytes.extend_from_slice(&[1, b'm']); // in a table, the next level is an entry
        }
    }
    if !depth.is_multiple_of(2) {
        bytes.extend_from_slice(&[b't', 1]); // in an array
    } else {
        bytes.extend_from_slice(&[1, b'z', b't', 1]); // in a table
    }
    bytes
}

#[tokio::test]
async fn hostile_messages_are_settled_with_their_reasons_and_the_consumer_keeps_consuming() {
    let h = Harness::new().await;
    let broker = TestBroker::new(&amqp_url(), Backoff { initial_ms: 200, max_ms: 200 });
    let pipeline = h.pipeline(recording(), 3);
    let (token, task) = spawn_consumer(pipeline, broker.connector() as Arc<dyn SourceFactory>, 2).await;

    let not_utf8_name = [2, 0xff, 0xfe, b't', 1];
    let mut huge_name = vec![255];
    huge_name.extend(std::iter::repeat_n(b'n', 255));
    huge_name.push(b'S');
    huge_name.extend_from_slice(&60_000u32.to_be_bytes());
    huge_name.extend(std::iter::repeat_n(b'v', 60_000));
    let at_bound = nested_table(32);
    let past_bound = nested_table(33);
    let mixed = tables_and_arrays(12_000);
    let ten_mb = format!(r#"{{"orderNo":"1","pad":"{}"}}"#, "x".repeat(10 << 20)).into_bytes();
    let long_id = format!("ORDER.PAY.{}:1", "z".repeat(240)); // a short string holds 255 bytes
    let body = br#"{"orderNo":"1"}"#.as_slice();
    let message = |message_id, headers, body| RawMessage {
        exchange: &broker.settings.exchange,
        routing_key: "order.pay",
        message_id,
        headers,
        body,
    };
    let mut messages = vec![
        message("ORDER.PAY.not-utf8-name:1", &not_utf8_name, body),
        message("ORDER.PAY.huge-name:1", &huge_name, body),
        message("ORDER.PAY.at-bound:1", &at_bound, body),
        message("ORDER.PAY.past-bound:1", &past_bound, body),
        message("ORDER.PAY.mixed:1", &mixed, body),
        message("ORDER.PAY.ten-mb:1", &[], &ten_mb),
        message("ORDER.PAY.bad-json:1", &[], b"{not json"),
        message("ORDER.PAY.not-utf8-body:1", &[], b"\xff\xfe{}"),
        message("ORDER.PAY.\x1b[31mred\n:1", &[], body),
        message("", &[], body),
        message(&long_id, &[], body),
    ];
    for _ in 0..20 {
        messages.push(message("ORDER.PAY.mixed:1", &mixed, body)); // many at once, one id
    }
    messages.push(message("ORDER.PAY.after:1", &[], body));
    publish_raw(&amqp_url(), &messages).await.expect("the broker takes the messages");

    eventually(Duration::from_secs(20), || async {
        h.record("ORDER.PAY.after:1").await.is_some_and(|r| r.0 == "succeeded")
    })
    .await;
    eventually(Duration::from_secs(10), || async { broker.depth(&broker.settings.queue).await == 0 }).await;
    let outcome = |id: &'static str| {
        let pool = h.pool().clone();
        async move {
            sqlx::query_as::<_, (String, Option<String>)>(
                "SELECT status::text, error_class FROM dedup_records WHERE message_id = $1",
            )
            .bind(id)
            .fetch_optional(&pool)
            .await
            .unwrap()
        }
    };
    let succeeded = Some(("succeeded".to_owned(), None));
    let dead = |class: &str| Some(("dead".to_owned(), Some(class.to_owned())));
    assert_eq!(outcome("ORDER.PAY.not-utf8-name:1").await, succeeded, "its name's bytes substituted");
    assert_eq!(outcome("ORDER.PAY.huge-name:1").await, succeeded);
    assert_eq!(outcome("ORDER.PAY.at-bound:1").await, succeeded, "32 levels are kept");
    assert_eq!(outcome("ORDER.PAY.past-bound:1").await, dead("HEADERS_TOO_DEEP"));
    assert_eq!(outcome("ORDER.PAY.mixed:1").await, dead("HEADERS_TOO_DEEP"));
    assert_eq!(outcome("ORDER.PAY.ten-mb:1").await, dead("PAYLOAD_TOO_LARGE"));
    assert_eq!(outcome("ORDER.PAY.bad-json:1").await, dead("UNPARSABLE_PAYLOAD"));
    assert_eq!(outcome("ORDER.PAY.not-utf8-body:1").await, dead("UNPARSABLE_PAYLOAD"));
    let long = sqlx::query_scalar::<_, String>("SELECT status::text FROM dedup_records WHERE message_id = $1")
        .bind(&long_id)
        .fetch_one(h.pool())
        .await
        .unwrap();
    assert_eq!(long, "succeeded", "a 250-byte id is within MAX_MESSAGE_ID_BYTES");
    let (duplicates,): (i32,) = sqlx::query_as("SELECT duplicate_count FROM dedup_records WHERE message_id = $1")
        .bind("ORDER.PAY.mixed:1")
        .fetch_one(h.pool())
        .await
        .unwrap();
    assert_eq!(duplicates, 20, "the copies of one dead letter are duplicates of it");
    // The control characters and the empty id: dead letters of their own, under synthetic ids.
    let classes: Vec<String> = sqlx::query_scalar(
        "SELECT error_class FROM dedup_records WHERE status = 'dead' AND error_class IN ('INVALID_MESSAGE_ID', 'NO_MESSAGE_ID') ORDER BY 1",
    )
    .fetch_all(h.pool())
    .await
    .unwrap();
    assert_eq!(classes, ["INVALID_MESSAGE_ID", "NO_MESSAGE_ID"]);
    let dead_letters = broker.settings.dead_letter_queue();
    eventually(Duration::from_secs(10), || async { broker.depth(&dead_letters).await == 7 }).await;

    token.cancel();
    tokio::time::timeout(Duration::from_secs(10), task).await.expect("the consumer stops").unwrap();
}
