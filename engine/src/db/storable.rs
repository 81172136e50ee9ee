//! PostgreSQL refuses NUL (U+0000) in `text` and `jsonb`, and a broker hands over whatever a
//! producer put in a header, a routing key or a property. A claim binding one as it came would
//! fail on every redelivery and the message would loop, recorded nowhere. So the store binds the
//! broker's fields with U+FFFD in place of NUL (a requeue republishes them so), and the audit
//! log its texts likewise. Message ids and types never get here with one: their validation
//! refuses control characters.

use std::borrow::Cow;

use serde_json::{Map, Value};

use crate::message::InboundMessage;

/// `s` with U+FFFD in place of every NUL; borrowed when it has none.
pub(crate) fn text(s: &str) -> Cow<'_, str> {
    if s.contains('\0') { Cow::Owned(s.replace('\0', "\u{FFFD}")) } else { Cow::Borrowed(s) }
}

/// [`text`] of an optional field.
pub(crate) fn opt(s: Option<&str>) -> Option<Cow<'_, str>> {
    s.map(text)
}

fn has_nul(value: &Value) -> bool {
    match value {
        Value::String(s) => s.contains('\0'),
        Value::Array(items) => items.iter().any(has_nul),
        Value::Object(map) => map.iter().any(|(k, v)| k.contains('\0') || has_nul(v)),
        _ => false,
    }
}

fn replaced(value: &Value) -> Value {
    match value {
        Value::String(s) => Value::String(text(s).into_owned()),
        Value::Array(items) => Value::Array(items.iter().map(replaced).collect()),
        Value::Object(map) => Value::Object(map.iter().map(|(k, v)| (text(k).into_owned(), replaced(v))).collect()),
        other => other.clone(),
    }
}

/// `value` with U+FFFD in place of every NUL in its strings and keys; borrowed when it has none.
pub(crate) fn json(value: &Value) -> Cow<'_, Value> {
    if has_nul(value) { Cow::Owned(replaced(value)) } else { Cow::Borrowed(value) }
}

/// The broker's fields of a message, storable.
pub(crate) struct Storable<'a> {
    pub headers: Cow<'a, Map<String, Value>>,
    pub content_type: Option<Cow<'a, str>>,
    pub exchange: Option<Cow<'a, str>>,
    pub routing_key: Option<Cow<'a, str>>,
    pub queue: Option<Cow<'a, str>>,
    pub type_property: Option<Cow<'a, str>>,
}

impl<'a> Storable<'a> {
    pub(crate) fn of(m: &'a InboundMessage) -> Self {
        let headers = if m.headers.iter().any(|(k, v)| k.contains('\0') || has_nul(v)) {
            match replaced(&Value::Object(m.headers.clone())) {
                Value::Object(map) => Cow::Owned(map),
                _ => unreachable!("an object stays an object"),
            }
        } else {
            Cow::Borrowed(&m.headers)
        };
        Self {
            headers,
            content_type: opt(m.content_type.as_deref()),
            exchange: opt(m.source.exchange.as_deref()),
            routing_key: opt(m.source.routing_key.as_deref()),
            queue: opt(m.source.queue.as_deref()),
            type_property: opt(m.type_property.as_deref()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn nul_becomes_the_replacement_character_everywhere_and_nothing_else_changes() {
        assert!(matches!(text("plain"), Cow::Borrowed("plain")));
        assert_eq!(text("a\0b"), "a\u{FFFD}b");
        let Value::Object(headers) = json!({"note": "a\u{0}b", "k\u{0}": [1, {"x": "\u{0}"}], "n": 3}) else {
            unreachable!()
        };
        let message = InboundMessage {
            payload: b"{}".to_vec(),
            headers,
            property_message_id: None,
            type_property: Some("T\0".to_owned()),
            published_at: None,
            content_type: None,
            broker: crate::message::Broker::RabbitMq,
            source: crate::message::SourceRef { routing_key: Some("order.pay".to_owned()), ..Default::default() },
            redelivered: false,
            headers_too_deep: false,
        };
        let stored = Storable::of(&message);
        assert_eq!(stored.type_property.as_deref(), Some("T\u{FFFD}"));
        assert!(matches!(stored.routing_key, Some(Cow::Borrowed("order.pay"))));
        assert_eq!(
            Value::Object(stored.headers.into_owned()),
            json!({"note": "a\u{FFFD}b", "k\u{FFFD}": [1, {"x": "\u{FFFD}"}], "n": 3})
        );
    }
}
