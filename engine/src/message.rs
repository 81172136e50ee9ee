//! Broker-neutral inbound messages, and how a message id is found in one (DESIGN.md, "Terms":
//! the AMQP `message_id` property, else a configured header, else a JSON pointer into the
//! payload; none of them → poison).

use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::record::{IdError, MessageId};

/// Which broker a message came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Broker {
    /// RabbitMQ (AMQP 0-9-1).
    RabbitMq,
    /// Kafka.
    Kafka,
}

impl Broker {
    /// The stored name (`source_broker`).
    pub fn as_str(self) -> &'static str {
        match self {
            Broker::RabbitMq => "rabbitmq",
            Broker::Kafka => "kafka",
        }
    }
}

/// Where a message came from, kept on the record so a requeue can republish it to the same
/// place. RabbitMQ: exchange, routing key, queue. Kafka: topic (in `exchange`), key (in
/// `routing_key`), partition (in `queue`).
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub struct SourceRef {
    /// Exchange (RabbitMQ) or topic (Kafka).
    pub exchange: Option<String>,
    /// Routing key (RabbitMQ) or record key (Kafka).
    pub routing_key: Option<String>,
    /// Queue (RabbitMQ) or partition (Kafka).
    pub queue: Option<String>,
}

/// One delivered message, as the engine sees it whatever the broker.
#[derive(Debug, Clone)]
pub struct InboundMessage {
    /// The body, as delivered.
    pub payload: Vec<u8>,
    /// Broker headers converted to JSON values (AMQP field table, Kafka headers).
    pub headers: serde_json::Map<String, Value>,
    /// The broker's own message-id property (AMQP `message_id`), if set.
    pub property_message_id: Option<String>,
    /// The content type property, if set.
    pub content_type: Option<String>,
    /// Which broker.
    pub broker: Broker,
    /// Where it came from.
    pub source: SourceRef,
    /// The broker flagged this as a redelivery (informational only; attempts are counted in the
    /// dedup table, never inferred from broker counters).
    pub redelivered: bool,
}

impl InboundMessage {
    /// SHA-256 of the payload, stored as `payload_hash` to detect payload conflicts.
    pub fn payload_hash(&self) -> Vec<u8> {
        Sha256::digest(&self.payload).to_vec()
    }
}

/// How to find a message id, and what makes a message poison.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct IdPolicy {
    /// Header consulted when the message-id property is absent. Default `x-message-id`.
    pub header: Option<String>,
    /// JSON pointer (RFC 6901) into the payload consulted last. Default `/messageId`.
    pub json_pointer: Option<String>,
    /// Largest payload accepted, in bytes; larger ones are poison. Default 1 MiB.
    pub max_payload_bytes: usize,
}

impl Default for IdPolicy {
    fn default() -> Self {
        Self {
            header: Some("x-message-id".to_owned()),
            json_pointer: Some("/messageId".to_owned()),
            max_payload_bytes: 1024 * 1024,
        }
    }
}

/// Why a message is poison: it can never be processed, so it is dead-lettered at once with
/// this reason and never retried.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PoisonReason {
    /// No id in the property, the header or the payload.
    #[error("no message id (looked at the message-id property, header {header:?} and JSON pointer {pointer:?})")]
    NoMessageId {
        /// The header consulted.
        header: Option<String>,
        /// The JSON pointer consulted.
        pointer: Option<String>,
    },
    /// An id was found but is not acceptable.
    #[error("invalid message id: {0}")]
    InvalidMessageId(IdError),
    /// The payload is not valid JSON (and the message is not declared binary).
    #[error("unparsable payload: {0}")]
    UnparsablePayload(String),
    /// The payload is larger than the configured limit.
    #[error("payload of {bytes} bytes exceeds the limit of {max} bytes")]
    TooLarge {
        /// Payload size in bytes.
        bytes: usize,
        /// The limit in bytes.
        max: usize,
    },
    /// No handler is registered for the message's type in this consumer group.
    #[error("no handler for message type {message_type:?}")]
    NoHandler {
        /// The type derived from the id (or `UNKNOWN`).
        message_type: String,
    },
}

impl PoisonReason {
    /// Short stable kind, used as the error class and in synthetic ids.
    pub fn kind(&self) -> &'static str {
        match self {
            PoisonReason::NoMessageId { .. } => "NO_MESSAGE_ID",
            PoisonReason::InvalidMessageId(_) => "INVALID_MESSAGE_ID",
            PoisonReason::UnparsablePayload(_) => "UNPARSABLE_PAYLOAD",
            PoisonReason::TooLarge { .. } => "PAYLOAD_TOO_LARGE",
            PoisonReason::NoHandler { .. } => "NO_HANDLER",
        }
    }
}

/// The message type of poison messages that have no usable id.
pub const POISON_TYPE: &str = "POISON";

/// Message type when the id has no `<entity>.<event>` prefix.
pub const UNKNOWN_TYPE: &str = "UNKNOWN";

/// A message whose id was found (its payload parsed when it is JSON).
#[derive(Debug, Clone)]
pub struct Identified {
    /// The message id.
    pub id: MessageId,
    /// `<entity>.<event>` from the id, or [`UNKNOWN_TYPE`].
    pub message_type: String,
    /// The payload as JSON; `None` for binary content types.
    pub json: Option<Value>,
}

/// A poison message, with the id its dead record is stored under: its own id when it had a
/// valid one, else `POISON.<kind>.<first 32 hex digits of the payload's SHA-256>:0`, so a
/// redelivery of the same poison finds the same record.
#[derive(Debug, Clone)]
pub struct Poison {
    /// The id of the dead record.
    pub record_id: MessageId,
    /// The message type of the record.
    pub message_type: String,
    /// Why.
    pub reason: PoisonReason,
}

/// True when the content type says the payload is not JSON (e.g. `application/octet-stream`).
fn is_binary(content_type: Option<&str>) -> bool {
    content_type.is_some_and(|ct| !ct.is_empty() && !ct.contains("json") && !ct.starts_with("text/"))
}

impl IdPolicy {
    /// Finds the message id and parses the payload. Order: size limit, property, header, JSON
    /// pointer. A payload that is not JSON is poison unless its content type is binary (then it
    /// is passed through as bytes).
    pub fn identify(&self, message: &InboundMessage) -> Result<Identified, Poison> {
        let poison = |reason: PoisonReason, id: Option<MessageId>| {
            let (record_id, message_type) = match id {
                Some(id) => {
                    let t = id.message_type().unwrap_or(UNKNOWN_TYPE).to_owned();
                    (id, t)
                }
                None => (synthetic_poison_id(&reason, message), POISON_TYPE.to_owned()),
            };
            Poison { record_id, message_type, reason }
        };
        if message.payload.len() > self.max_payload_bytes {
            let id = self.id_from_envelope(message).and_then(Result::ok);
            return Err(poison(
                PoisonReason::TooLarge { bytes: message.payload.len(), max: self.max_payload_bytes },
                id,
            ));
        }
        let json = if is_binary(message.content_type.as_deref()) {
            None
        } else {
            match serde_json::from_slice::<Value>(&message.payload) {
                Ok(v) => Some(v),
                Err(e) => {
                    let id = self.id_from_envelope(message).and_then(Result::ok);
                    return Err(poison(PoisonReason::UnparsablePayload(e.to_string()), id));
                }
            }
        };
        let raw = self.id_from_envelope(message).or_else(|| {
            let pointer = self.json_pointer.as_deref()?;
            let value = json.as_ref()?.pointer(pointer)?;
            Some(match value {
                Value::String(s) => MessageId::parse(s.clone()),
                Value::Number(n) => MessageId::parse(n.to_string()),
                _ => MessageId::parse(String::new()),
            })
        });
        match raw {
            None => Err(poison(
                PoisonReason::NoMessageId { header: self.header.clone(), pointer: self.json_pointer.clone() },
                None,
            )),
            Some(Err(e)) => Err(poison(PoisonReason::InvalidMessageId(e), None)),
            Some(Ok(id)) => {
                let message_type = id.message_type().unwrap_or(UNKNOWN_TYPE).to_owned();
                Ok(Identified { id, message_type, json })
            }
        }
    }

    /// The id from the property, else the header (not the payload).
    fn id_from_envelope(&self, message: &InboundMessage) -> Option<Result<MessageId, IdError>> {
        if let Some(id) = message.property_message_id.as_deref().filter(|s| !s.is_empty()) {
            return Some(MessageId::parse(id));
        }
        let header = self.header.as_deref()?;
        match message.headers.get(header)? {
            Value::String(s) => Some(MessageId::parse(s.clone())),
            Value::Number(n) => Some(MessageId::parse(n.to_string())),
            _ => Some(MessageId::parse(String::new())),
        }
    }
}

/// `POISON.<kind>.<hash>:0` for a poison message without a usable id.
fn synthetic_poison_id(reason: &PoisonReason, message: &InboundMessage) -> MessageId {
    let hash = message.payload_hash();
    let hex: String = hash.iter().take(16).map(|b| format!("{b:02x}")).collect();
    MessageId::parse(format!("{POISON_TYPE}.{}.{hex}:0", reason.kind())).expect("synthetic id is valid")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(payload: &[u8]) -> InboundMessage {
        InboundMessage {
            payload: payload.to_vec(),
            headers: serde_json::Map::new(),
            property_message_id: None,
            content_type: None,
            broker: Broker::RabbitMq,
            source: SourceRef::default(),
            redelivered: false,
        }
    }

    #[test]
    fn property_then_header_then_json_pointer() {
        let policy = IdPolicy::default();
        let mut m = message(br#"{"messageId":"ORDER.PAY.3:2"}"#);
        assert_eq!(policy.identify(&m).unwrap().id.as_str(), "ORDER.PAY.3:2");
        m.headers.insert("x-message-id".into(), Value::String("ORDER.PAY.2:2".into()));
        assert_eq!(policy.identify(&m).unwrap().id.as_str(), "ORDER.PAY.2:2");
        m.property_message_id = Some("ORDER.PAY.1:2".into());
        let found = policy.identify(&m).unwrap();
        assert_eq!(found.id.as_str(), "ORDER.PAY.1:2");
        assert_eq!(found.message_type, "ORDER.PAY");
    }

    #[test]
    fn a_message_without_id_is_poison_with_a_stable_synthetic_id() {
        let policy = IdPolicy::default();
        let m = message(br#"{"orderNo":"1"}"#);
        let a = policy.identify(&m).unwrap_err();
        let b = policy.identify(&m).unwrap_err();
        assert!(matches!(a.reason, PoisonReason::NoMessageId { .. }));
        assert_eq!(a.record_id, b.record_id);
        assert!(a.record_id.as_str().starts_with("POISON.NO_MESSAGE_ID."), "{}", a.record_id);
        assert_eq!(a.message_type, POISON_TYPE);
    }

    #[test]
    fn bad_json_and_oversize_payloads_are_poison_keeping_their_envelope_id() {
        let policy = IdPolicy { max_payload_bytes: 16, ..IdPolicy::default() };
        let mut m = message(b"{not json");
        m.property_message_id = Some("ORDER.PAY.9:2".into());
        let p = policy.identify(&m).unwrap_err();
        assert!(matches!(p.reason, PoisonReason::UnparsablePayload(_)));
        assert_eq!(p.record_id.as_str(), "ORDER.PAY.9:2");
        assert_eq!(p.message_type, "ORDER.PAY");

        let big = message(&[b' '; 17]);
        let p = policy.identify(&big).unwrap_err();
        assert_eq!(p.reason, PoisonReason::TooLarge { bytes: 17, max: 16 });
        assert!(p.record_id.as_str().starts_with("POISON.PAYLOAD_TOO_LARGE."));
    }

    #[test]
    fn binary_payloads_pass_without_json() {
        let policy = IdPolicy::default();
        let mut m = message(&[0xff, 0x00, 0x13]);
        m.content_type = Some("application/octet-stream".into());
        m.property_message_id = Some("FILE.UPLOAD.7:1".into());
        let found = policy.identify(&m).unwrap();
        assert!(found.json.is_none());
    }

    #[test]
    fn an_invalid_id_is_poison() {
        let policy = IdPolicy::default();
        let mut m = message(b"{}");
        m.property_message_id = Some("bad\u{0}id".into());
        let p = policy.identify(&m).unwrap_err();
        assert!(matches!(p.reason, PoisonReason::InvalidMessageId(_)));
    }
}
