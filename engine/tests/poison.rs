//! Poison and hostile messages in the pipeline (DESIGN.md, "Retries and dead letters"): poison
//! is dead at once, never retried, never a duplicate of another, an oversize payload is kept
//! truncated; a NUL in a header or property (which PostgreSQL cannot store) does not stop a
//! message from being recorded.

mod common;

use common::*;
use dedup_engine::pipeline::Disposition;
use dedup_engine::store::postgres::PgStore;
use serde_json::json;

#[tokio::test]
async fn poison_messages_are_dead_lettered_once_and_never_retried() {
    let log = Captured::default();
    let writer = log.clone();
    let subscriber = tracing_subscriber::fmt().with_ansi(false).with_writer(move || writer.clone()).finish();
    let _default = tracing::subscriber::set_default(subscriber);
    let h = Harness::new().await;
    let pipeline = h.pipeline(recording(), 5);
    let no_id = raw_message(None, br#"{"orderNo":"12"}"#.to_vec());
    let bad_json = raw_message(Some("ORDER.PAY.13:2"), b"{oops".to_vec());
    let unknown_type = message("SHIPMENT.SENT.14:1", json!({}));
    let outcomes = pipeline.process("w", &[no_id.clone(), bad_json, unknown_type]).await;
    for (o, why) in outcomes.iter().zip(["no message id", "unparsable payload", "no handler"]) {
        assert!(matches!(o, Disposition::DeadLetter { reason } if reason.contains(why)), "{o:?} should say {why}");
    }
    // A type without a handler is dead but not poison: a requeue processes it once the handler
    // exists; its error class names the type.
    let dead: Vec<(String, String, bool, bool)> = sqlx::query_as(
        "SELECT message_type, error_class, payload IS NOT NULL, poison FROM dedup_records WHERE status = 'dead'
         ORDER BY id",
    )
    .fetch_all(h.pool())
    .await
    .unwrap();
    assert_eq!(
        dead,
        [
            ("POISON".into(), "NO_MESSAGE_ID".into(), true, true),
            ("ORDER.PAY".into(), "UNPARSABLE_PAYLOAD".into(), true, true),
            ("SHIPMENT.SENT".into(), "NO_HANDLER: SHIPMENT.SENT".into(), true, false)
        ]
    );
    // The log says so too: only the poison ones are logged as poison.
    let log = String::from_utf8(log.0.lock().unwrap().clone()).unwrap();
    let line = |needle: &str| log.lines().find(|l| l.contains(needle)).unwrap_or_default().to_owned();
    assert!(line("message_id=\"ORDER.PAY.13:2\"").contains("poison message dead-lettered"), "{log}");
    let no_handler = line("message_id=\"SHIPMENT.SENT.14:1\"");
    assert!(no_handler.contains("no handler for the message's type") && !no_handler.contains("poison"), "{log}");
}

#[tokio::test]
async fn poison_messages_with_one_payload_get_a_record_each_with_its_own_reason() {
    let h = Harness::new().await;
    let pipeline = h.pipeline(recording(), 5);
    let payload = br#"{"x":1}"#.to_vec();
    let newline = raw_message(Some("ORDER.PAY.1\n:1"), payload.clone());
    let long = raw_message(Some(&"x".repeat(10_000)), payload.clone());
    let none = raw_message(None, payload.clone());
    let outcomes = pipeline.process("w", &[newline, long, none.clone(), none]).await;
    assert!(outcomes.iter().all(|o| matches!(o, Disposition::DeadLetter { .. })), "{outcomes:?}");
    let dead: Vec<(String, Option<String>, i32)> = sqlx::query_as(
        "SELECT message_id, last_error, duplicate_count FROM dedup_records WHERE status = 'dead' ORDER BY id",
    )
    .fetch_all(h.pool())
    .await
    .unwrap();
    assert_eq!(dead.len(), 4, "four poison messages, four records: {dead:?}");
    assert!(dead.iter().all(|(_, _, duplicates)| *duplicates == 0), "none counted as a duplicate: {dead:?}");
    let reasons: std::collections::HashSet<Option<&str>> =
        dead.iter().map(|(_, reason, _)| reason.as_deref()).collect();
    assert_eq!(reasons.len(), 3, "the newline, the length and the missing id each keep their reason: {dead:?}");
    h.stats.flush(h.pool().clone(), &PgStore::new(h.pool().clone(), &h.db.schema)).await.unwrap();
    let duplicates: Option<i64> =
        sqlx::query_scalar("SELECT sum(duplicates_db + duplicates_redis)::bigint FROM stats_minute")
            .fetch_one(h.pool())
            .await
            .unwrap();
    assert_eq!(duplicates.unwrap_or(0), 0, "the overview counts no duplicate");
}

#[tokio::test]
async fn an_oversize_payload_is_poison_and_kept_truncated() {
    let h = Harness::new().await;
    let pipeline = h.pipeline(recording(), 5);
    let big = raw_message(Some("ORDER.PAY.15:2"), vec![b'x'; 10 * 1024 * 1024]);
    let outcomes = pipeline.process("w", &[big]).await;
    assert!(matches!(&outcomes[0], Disposition::DeadLetter { reason } if reason.contains("exceeds the limit")));
    let (kept, truncated): (i32, bool) = sqlx::query_as(
        "SELECT length(payload), payload_truncated FROM dedup_records WHERE message_id = 'ORDER.PAY.15:2'",
    )
    .fetch_one(h.pool())
    .await
    .unwrap();
    assert_eq!((kept, truncated), (1024, true));
}

#[tokio::test]
async fn a_nul_in_headers_and_properties_is_stored_replaced_instead_of_looping() {
    let h = Harness::new().await;
    let mut handlers = dedup_engine::handler::HandlerRegistry::new();
    handlers.register("ORDER.PAY", dedup_engine::handler::Handler::Transactional(std::sync::Arc::new(AlwaysFails)));
    let pipeline = h.pipeline(handlers, 5);
    let mut hostile = message("ORDER.PAY.N1:1", json!({"orderNo": "N1"}));
    hostile.headers.insert("note".into(), json!("a\u{0}b"));
    hostile.type_property = Some("T\u{0}".into());
    hostile.source.routing_key = Some("order.\u{0}pay".into());
    let outcome = pipeline.process("w", &[hostile]).await;
    assert!(matches!(outcome[0], Disposition::Retry { .. }), "the handler's failure, not the store's: {outcome:?}");
    let stored: (String, serde_json::Value, Option<String>, Option<String>) = sqlx::query_as(
        "SELECT status, headers, type_property, source_routing_key FROM dedup_records WHERE message_id = 'ORDER.PAY.N1:1'",
    )
    .fetch_one(h.pool())
    .await
    .unwrap();
    assert_eq!(stored.0, "failed");
    assert_eq!(stored.1["note"], "a\u{FFFD}b");
    assert_eq!((stored.2.as_deref(), stored.3.as_deref()), (Some("T\u{FFFD}"), Some("order.\u{FFFD}pay")));
}
