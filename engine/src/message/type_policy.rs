//! A message's type: the key that picks its handler (DESIGN.md, "How teams adopt it"). Producers
//! carry it in different places; a consumer group's [`TypePolicy`] names where to look, in
//! order, and may map the raw values to the handler types registered.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use serde_json::Value;

use super::{Broker, InboundMessage};
use crate::record::MessageId;

/// Longest message type kept, in characters; a longer raw value is cut (it still finds no
/// handler, and the dead letter says which value it was).
pub const MAX_TYPE_CHARS: usize = 200;

/// One place a message's type may be found.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum TypeSource {
    /// The `<entity>.<event>` prefix of a message id shaped `<entity>.<event>.<key>:<version>`
    /// (`ORDER.PAY.202501281000001:2` → `ORDER.PAY`). Written `id_prefix`.
    IdPrefix,
    /// The AMQP `type` property (RabbitMQ; Kafka has none). Written `type_property`.
    TypeProperty,
    /// A header, e.g. Spring AMQP's `__TypeId__`. Written `header:<name>`.
    Header(String),
    /// The routing key a RabbitMQ message was published with (retry copies keep their
    /// original's), or a Kafka record's topic. Written `routing_key`.
    RoutingKey,
    /// A string at a JSON pointer (RFC 6901) into the payload. Written `json:<pointer>`, e.g.
    /// `json:/eventType`.
    JsonPointer(String),
}

/// A type source that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "unknown message type source {0:?}; expected id_prefix, type_property, header:<name>, routing_key \
     or json:<pointer>"
)]
pub struct UnknownTypeSource(pub String);

impl FromStr for TypeSource {
    type Err = UnknownTypeSource;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let refuse = || UnknownTypeSource(s.chars().take(80).collect());
        match s {
            "id_prefix" => Ok(TypeSource::IdPrefix),
            "type_property" => Ok(TypeSource::TypeProperty),
            "routing_key" => Ok(TypeSource::RoutingKey),
            _ => {
                if let Some(name) = s.strip_prefix("header:").filter(|n| !n.is_empty()) {
                    Ok(TypeSource::Header(name.to_owned()))
                } else if let Some(pointer) = s.strip_prefix("json:").filter(|p| p.starts_with('/')) {
                    Ok(TypeSource::JsonPointer(pointer.to_owned()))
                } else {
                    Err(refuse())
                }
            }
        }
    }
}

impl fmt::Display for TypeSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TypeSource::IdPrefix => f.write_str("id_prefix"),
            TypeSource::TypeProperty => f.write_str("type_property"),
            TypeSource::Header(name) => write!(f, "header:{name}"),
            TypeSource::RoutingKey => f.write_str("routing_key"),
            TypeSource::JsonPointer(pointer) => write!(f, "json:{pointer}"),
        }
    }
}

serde_as_text!(TypeSource);

/// Where a consumer group finds a message's type, and how raw values map to handler types
/// (`[consumer.types]`, or a group's `types`).
///
/// The first source that yields a non-empty value wins; the value is then looked up in `map`
/// (unmapped values are used as they are). A value with a control character still wins, as
/// `UNKNOWN` (its dead letter names it escaped): a later source never types a message its
/// producer typed otherwise. A message none of them types is `UNKNOWN`. Either
/// way a type without a handler makes the message a dead letter `NO_HANDLER` that names the raw
/// value; once the handler exists, requeueing those dead letters processes them.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TypePolicy {
    /// Where to look, in order. Default `["id_prefix"]`.
    pub from: Vec<TypeSource>,
    /// Raw value → handler type, e.g. `"com.example.order.OrderPayEvent" = "ORDER.PAY"`.
    pub map: BTreeMap<String, String>,
}

impl Default for TypePolicy {
    fn default() -> Self {
        Self { from: vec![TypeSource::IdPrefix], map: BTreeMap::new() }
    }
}

/// A message's type as found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MessageType {
    /// The handler type: the raw value mapped, or the raw value.
    pub name: String,
    /// The value as found (`None`: no source yielded one, and `name` is `UNKNOWN`).
    pub raw: Option<String>,
}

impl TypePolicy {
    /// Looks in `sources`, in order, with no map.
    pub fn from_sources(sources: impl IntoIterator<Item = TypeSource>) -> Self {
        Self { from: sources.into_iter().collect(), map: BTreeMap::new() }
    }

    /// Adds a mapping from a raw value to a handler type.
    pub fn map(mut self, raw: impl Into<String>, handler_type: impl Into<String>) -> Self {
        self.map.insert(raw.into(), handler_type.into());
        self
    }

    /// The type of `message`, whose id (if it has a usable one) is `id` and whose parsed
    /// payload (if it is JSON) is `json`.
    pub(crate) fn resolve(&self, message: &InboundMessage, id: Option<&MessageId>, json: Option<&Value>) -> MessageType {
        let raw = self.from.iter().find_map(|source| {
            let value = match source {
                TypeSource::IdPrefix => id.and_then(MessageId::message_type).map(str::to_owned),
                TypeSource::TypeProperty => message.type_property.clone(),
                TypeSource::Header(name) => match message.headers.get(name)? {
                    Value::String(s) => Some(s.clone()),
                    _ => None,
                },
                TypeSource::RoutingKey => match message.broker {
                    Broker::RabbitMq => message.source.routing_key.clone(),
                    Broker::Kafka => message.source.exchange.clone(),
                },
                TypeSource::JsonPointer(pointer) => json?.pointer(pointer)?.as_str().map(str::to_owned),
            }?;
            Some(value.trim().to_owned()).filter(|v| !v.is_empty())
        });
        match raw {
            None => MessageType { name: super::UNKNOWN_TYPE.to_owned(), raw: None },
            // Present but no type: it still wins (a later source must not type a message its
            // producer typed otherwise), and the dead letter names it, escaped.
            Some(raw) if raw.chars().any(char::is_control) => MessageType {
                name: super::UNKNOWN_TYPE.to_owned(),
                raw: Some(raw.escape_debug().take(MAX_TYPE_CHARS).collect()),
            },
            Some(raw) => {
                let raw: String = raw.chars().take(MAX_TYPE_CHARS).collect();
                MessageType { name: self.map.get(&raw).cloned().unwrap_or_else(|| raw.clone()), raw: Some(raw) }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::SourceRef;

    fn message() -> InboundMessage {
        InboundMessage {
            source: SourceRef { routing_key: Some("billing.invoice.paid".into()), ..SourceRef::default() },
            ..crate::message::tests::message(br#"{"eventType":"invoice.paid"}"#)
        }
    }

    #[test]
    fn sources_parse_and_print_as_written_in_configuration() {
        for text in ["id_prefix", "type_property", "header:__TypeId__", "routing_key", "json:/eventType"] {
            assert_eq!(text.parse::<TypeSource>().unwrap().to_string(), text);
        }
        for bad in ["", "header:", "json:eventType", "amqp", "Header:x"] {
            let err = bad.parse::<TypeSource>().unwrap_err();
            assert!(err.to_string().contains("id_prefix, type_property"), "{err}");
        }
    }

    #[test]
    fn the_first_source_with_a_value_wins_and_is_mapped() {
        let mut m = message();
        let json: Value = serde_json::from_slice(&m.payload).unwrap();
        let id = MessageId::parse("202501281000001:PAY:2").unwrap();
        let policy = TypePolicy::from_sources([
            TypeSource::IdPrefix,
            TypeSource::Header("__TypeId__".into()),
            TypeSource::TypeProperty,
            TypeSource::JsonPointer("/eventType".into()),
        ])
        .map("com.example.order.OrderPayEvent", "ORDER.PAY");
        let found = policy.resolve(&m, Some(&id), Some(&json));
        assert_eq!(found, MessageType { name: "invoice.paid".into(), raw: Some("invoice.paid".into()) });
        m.type_property = Some("billing.Paid".into());
        assert_eq!(policy.resolve(&m, Some(&id), Some(&json)).name, "billing.Paid");
        m.headers.insert("__TypeId__".into(), Value::String("com.example.order.OrderPayEvent".into()));
        let found = policy.resolve(&m, Some(&id), Some(&json));
        assert_eq!(found.name, "ORDER.PAY");
        assert_eq!(found.raw.as_deref(), Some("com.example.order.OrderPayEvent"));
        let dotted = MessageId::parse("ORDER.CREATE.7:1").unwrap();
        assert_eq!(policy.resolve(&m, Some(&dotted), None).name, "ORDER.CREATE", "the id's prefix comes first");
    }

    #[test]
    fn routing_key_is_the_topic_on_kafka_and_nothing_is_unknown() {
        let mut m = message();
        let policy = TypePolicy::from_sources([TypeSource::RoutingKey]);
        assert_eq!(policy.resolve(&m, None, None).name, "billing.invoice.paid");
        m.broker = Broker::Kafka;
        m.source.exchange = Some("invoices".into());
        assert_eq!(policy.resolve(&m, None, None).name, "invoices");
        let none = TypePolicy::from_sources([TypeSource::Header("absent".into())]);
        assert_eq!(none.resolve(&m, None, None), MessageType { name: "UNKNOWN".into(), raw: None });
        m.headers.insert("absent".into(), Value::String("a\nb".into()));
        assert_eq!(none.resolve(&m, None, None).name, "UNKNOWN", "a value with a control character is no type");
        assert_eq!(none.resolve(&m, None, None).raw.as_deref(), Some("a\\nb"), "named escaped");
    }

    #[test]
    fn a_value_that_is_no_type_still_wins_over_later_sources() {
        let mut m = message();
        m.headers.insert("kind".into(), Value::String("EVIL\u{1b}[31m\nX".into()));
        let policy = TypePolicy::from_sources([TypeSource::Header("kind".into()), TypeSource::RoutingKey]);
        let found = policy.resolve(&m, None, None);
        assert_eq!(found.name, "UNKNOWN", "not the routing key's type: the producer said otherwise");
        assert_eq!(found.raw.as_deref(), Some("EVIL\\u{1b}[31m\\nX"));
    }
}
