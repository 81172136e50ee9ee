//! Tests of id and type identification and of poison ids.

use super::*;

/// A RabbitMQ message with `payload` and nothing else set (for the message module's tests).
pub(super) fn message(payload: &[u8]) -> InboundMessage {
    InboundMessage {
        payload: payload.to_vec(),
        headers: serde_json::Map::new(),
        property_message_id: None,
        type_property: None,
        published_at: None,
        content_type: None,
        broker: Broker::RabbitMq,
        source: SourceRef::default(),
        redelivered: false,
        headers_too_deep: false,
    }
}

#[test]
fn property_then_header_then_json_pointer() {
    let policy = IdPolicy::default();
    let mut m = message(br#"{"messageId":"ORDER.PAY.3:2"}"#);
    assert_eq!(policy.identify(&m, &TypePolicy::default()).unwrap().id.as_str(), "ORDER.PAY.3:2");
    m.headers.insert("x-message-id".into(), Value::String("ORDER.PAY.2:2".into()));
    assert_eq!(policy.identify(&m, &TypePolicy::default()).unwrap().id.as_str(), "ORDER.PAY.2:2");
    m.property_message_id = Some("ORDER.PAY.1:2".into());
    let found = policy.identify(&m, &TypePolicy::default()).unwrap();
    assert_eq!(found.id.as_str(), "ORDER.PAY.1:2");
    assert_eq!(found.message_type, "ORDER.PAY");
}

#[test]
fn poison_messages_never_share_a_record_but_a_kafka_redelivery_does() {
    let policy = IdPolicy::default();
    let types = TypePolicy::default();
    let m = message(br#"{"x":1}"#);
    let a = policy.identify(&m, &types).unwrap_err();
    let b = policy.identify(&m, &types).unwrap_err();
    assert!(matches!(a.reason, PoisonReason::NoMessageId { .. }));
    assert_ne!(a.record_id, b.record_id, "two deliveries of one payload: two records");
    assert!(a.record_id.as_str().starts_with("POISON.NO_MESSAGE_ID."), "{}", a.record_id);
    assert_eq!(a.message_type, POISON_TYPE);
    let mut newline = message(br#"{"x":1}"#);
    newline.property_message_id = Some("a\nb".into());
    let mut long = newline.clone();
    long.property_message_id = Some("x".repeat(10_000));
    let (n, l) = (policy.identify(&newline, &types).unwrap_err(), policy.identify(&long, &types).unwrap_err());
    assert_ne!(n.record_id, l.record_id, "invalid in different ways: a record each");
    assert_ne!(n.reason, l.reason, "each with its own reason");

    let mut kafka = message(br#"{"x":1}"#);
    kafka.broker = Broker::Kafka;
    kafka.source = SourceRef {
        exchange: Some("orders".into()),
        queue: Some("3".into()),
        offset: Some(17),
        ..SourceRef::default()
    };
    let first = policy.identify(&kafka, &types).unwrap_err();
    assert_eq!(first.record_id, policy.identify(&kafka, &types).unwrap_err().record_id, "the same Kafka record");
    assert!(first.record_id.as_str().ends_with(".orders-3-17:0"), "{}", first.record_id);
}

#[test]
fn bad_json_and_oversize_payloads_are_poison_keeping_their_envelope_id() {
    let policy = IdPolicy { max_payload_bytes: 16, ..IdPolicy::default() };
    let mut m = message(b"{not json");
    m.property_message_id = Some("ORDER.PAY.9:2".into());
    let p = policy.identify(&m, &TypePolicy::default()).unwrap_err();
    assert!(matches!(p.reason, PoisonReason::UnparsablePayload(_)));
    assert_eq!(p.record_id.as_str(), "ORDER.PAY.9:2");
    assert_eq!(p.message_type, "ORDER.PAY");

    let big = message(&[b' '; 17]);
    let p = policy.identify(&big, &TypePolicy::default()).unwrap_err();
    assert_eq!(p.reason, PoisonReason::TooLarge { bytes: 17, max: 16 });
    assert!(p.record_id.as_str().starts_with("POISON.PAYLOAD_TOO_LARGE."));
}

#[test]
fn binary_payloads_pass_without_json() {
    let policy = IdPolicy::default();
    let mut m = message(&[0xff, 0x00, 0x13]);
    m.content_type = Some("application/octet-stream".into());
    m.property_message_id = Some("FILE.UPLOAD.7:1".into());
    let found = policy.identify(&m, &TypePolicy::default()).unwrap();
    assert!(found.json.is_none());
}

#[test]
fn kafka_header_then_key_then_json_pointer_then_offset() {
    let mut policy = IdPolicy::default();
    let mut m = message(br#"{"orderNo":"7"}"#);
    m.broker = Broker::Kafka;
    m.source = SourceRef {
        exchange: Some("orders".into()),
        queue: Some("2".into()),
        offset: Some(41),
        ..SourceRef::default()
    };
    assert!(matches!(
        policy.identify(&m, &TypePolicy::default()).unwrap_err().reason,
        PoisonReason::NoMessageId { .. }
    ));
    policy.from.push(IdSource::Offset);
    assert_eq!(policy.identify(&m, &TypePolicy::default()).unwrap().id.as_str(), "orders-2-41");
    m.payload = br#"{"messageId":"ORDER.PAY.7:2"}"#.to_vec();
    assert_eq!(policy.identify(&m, &TypePolicy::default()).unwrap().id.as_str(), "ORDER.PAY.7:2");
    m.source.routing_key = Some("ORDER.PAY.8:2".into());
    assert_eq!(policy.identify(&m, &TypePolicy::default()).unwrap().id.as_str(), "ORDER.PAY.8:2");
    m.headers.insert("x-message-id".into(), Value::String("ORDER.PAY.9:2".into()));
    assert_eq!(policy.identify(&m, &TypePolicy::default()).unwrap().id.as_str(), "ORDER.PAY.9:2");
    m.headers.clear();
    policy.from.retain(|s| *s != IdSource::Key);
    assert_eq!(
        policy.identify(&m, &TypePolicy::default()).unwrap().id.as_str(),
        "ORDER.PAY.7:2",
        "key ignored when turned off"
    );
}

#[test]
fn a_kafka_key_or_id_header_that_is_not_utf8_is_an_invalid_id_never_a_lossy_one() {
    let policy = IdPolicy::default();
    let mut m = message(br#"{"orderNo":"7"}"#);
    m.broker = Broker::Kafka;
    // Keys b"A\xff" and b"A\xfe" both read "A\u{fffd}": as ids they would collide.
    m.source.routing_key = Some("ORDER.CREATE.A\u{fffd}:1".into());
    m.source.key_not_text = true;
    let p = policy.identify(&m, &TypePolicy::default()).unwrap_err();
    assert_eq!(p.reason, PoisonReason::InvalidMessageId { error: IdError::NotText { what: "record key" }, found: None });
    assert_eq!(p.reason.to_string(), "invalid message id: record key is not UTF-8 text");
    assert!(p.record_id.as_str().starts_with("POISON.INVALID_MESSAGE_ID."), "{}", p.record_id);

    m.headers.insert("x-message-id".into(), serde_json::json!([255, 254, 0]));
    let p = policy.identify(&m, &TypePolicy::default()).unwrap_err();
    let not_text = IdError::NotText { what: "message id header" };
    assert_eq!(p.reason, PoisonReason::InvalidMessageId { error: not_text, found: None });
    m.headers.insert("x-message-id".into(), Value::String("ORDER.CREATE.7:1".into()));
    assert_eq!(
        policy.identify(&m, &TypePolicy::default()).unwrap().id.as_str(),
        "ORDER.CREATE.7:1",
        "a text header still wins"
    );
}

#[test]
fn a_rabbitmq_routing_key_is_never_an_id() {
    let mut m = message(br#"{"orderNo":"7"}"#);
    m.source.routing_key = Some("order.pay".into());
    let mut policy = IdPolicy::default();
    policy.from.push(IdSource::Offset);
    assert!(matches!(
        policy.identify(&m, &TypePolicy::default()).unwrap_err().reason,
        PoisonReason::NoMessageId { .. }
    ));
}

#[test]
fn an_invalid_id_is_poison() {
    let policy = IdPolicy::default();
    let mut m = message(b"{}");
    m.property_message_id = Some("bad\u{0}id".into());
    let p = policy.identify(&m, &TypePolicy::default()).unwrap_err();
    assert!(matches!(p.reason, PoisonReason::InvalidMessageId { .. }));
}

#[test]
fn an_invalid_id_is_kept_on_its_poison_record_escaped_and_bounded() {
    let policy = IdPolicy::default();
    let mut m = message(b"{}");
    // What the producer sent, so an operator can find its message: escaped, never raw.
    m.property_message_id = Some("ORDER.PAY.7\n<b>\u{202e}:1".into());
    let p = policy.identify(&m, &TypePolicy::default()).unwrap_err();
    assert_eq!(
        p.reason.to_string(),
        "invalid message id: message id contains a control or invisible formatting character \
         (as sent: \"ORDER.PAY.7\\n<b>\\u{202e}:1\")"
    );
    m.property_message_id = Some("x".repeat(600));
    let p = policy.identify(&m, &TypePolicy::default()).unwrap_err();
    let PoisonReason::InvalidMessageId { found: Some(found), .. } = &p.reason else { panic!("{:?}", p.reason) };
    assert_eq!(found.chars().count(), MAX_SHOWN_ID_CHARS + 1, "cut, with an ellipsis");
    assert!(found.ends_with("x…"));
}

#[test]
fn the_order_of_the_sources_decides_and_the_payload_can_be_left_out() {
    let mut m = message(br#"{"messageId":"ORDER.PAY.3:2"}"#);
    m.headers.insert("x-message-id".into(), Value::String("ORDER.PAY.2:2".into()));
    m.property_message_id = Some("5f0c6b1e-per-send".into());
    let types = TypePolicy::default();
    assert_eq!(IdPolicy::default().identify(&m, &types).unwrap().id.as_str(), "5f0c6b1e-per-send");
    let header_first = IdPolicy::from_sources([
        IdSource::Header("x-message-id".into()),
        IdSource::Property,
        IdSource::JsonPointer("/messageId".into()),
    ]);
    assert_eq!(header_first.identify(&m, &types).unwrap().id.as_str(), "ORDER.PAY.2:2");
    let payload_first = IdPolicy::from_sources([IdSource::JsonPointer("/messageId".into()), IdSource::Property]);
    assert_eq!(payload_first.identify(&m, &types).unwrap().id.as_str(), "ORDER.PAY.3:2");

    let no_payload = IdPolicy::from_sources([IdSource::Header("x-message-id".into())]);
    m.headers.clear();
    let p = no_payload.identify(&m, &types).unwrap_err();
    assert_eq!(p.reason, PoisonReason::NoMessageId { looked_at: no_payload.from.clone() });
    assert_eq!(p.reason.to_string(), "no message id (looked at header:x-message-id)");
}

#[test]
fn an_envelope_id_in_the_policys_order_names_a_poison_record() {
    let mut m = message(b"{not json");
    m.property_message_id = Some("per-send-1".into());
    m.headers.insert("x-message-id".into(), Value::String("ORDER.PAY.4:2".into()));
    let header_first = IdPolicy::from_sources([IdSource::Header("x-message-id".into()), IdSource::Property]);
    let p = header_first.identify(&m, &TypePolicy::default()).unwrap_err();
    assert!(matches!(p.reason, PoisonReason::UnparsablePayload(_)));
    assert_eq!(p.record_id.as_str(), "ORDER.PAY.4:2");
}

#[test]
fn id_sources_parse_and_print_as_written_and_old_keys_are_refused_with_the_new_one() {
    for text in ["property", "header:x-message-id", "key", "json:/messageId", "offset"] {
        assert_eq!(text.parse::<IdSource>().unwrap().to_string(), text);
    }
    for bad in ["", "header:", "json:messageId", "message_id", "Property"] {
        assert!(bad.parse::<IdSource>().unwrap_err().to_string().contains("property, header:<name>"), "{bad}");
    }
    let parsed: IdPolicy = serde_json::from_value(serde_json::json!({"from": ["header:x-id", "property"]})).unwrap();
    assert_eq!(parsed.from, [IdSource::Header("x-id".into()), IdSource::Property]);
    assert_eq!(parsed.max_payload_bytes, IdPolicy::default().max_payload_bytes);
    let round_trip: IdPolicy = serde_json::from_value(serde_json::to_value(&parsed).unwrap()).unwrap();
    assert_eq!(round_trip, parsed);
    assert_eq!(serde_json::from_value::<IdPolicy>(serde_json::json!({})).unwrap(), IdPolicy::default());
    let old = serde_json::from_value::<IdPolicy>(serde_json::json!({"header": "x-id"})).unwrap_err();
    assert!(old.to_string().contains("replaced by ids.from"), "{old}");
    let empty = serde_json::from_value::<IdPolicy>(serde_json::json!({"from": []})).unwrap_err();
    assert!(empty.to_string().contains("names no id source"), "{empty}");
    assert!(serde_json::from_value::<IdPolicy>(serde_json::json!({"form": []})).is_err(), "unknown keys");
}
