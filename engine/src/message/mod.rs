//! Broker-neutral inbound messages, how a message id is found in one (DESIGN.md, "Terms":
//! the AMQP `message_id` property, else a configured header, else — Kafka — the record key, else
//! a JSON pointer into the payload, else — Kafka, when enabled — `<topic>-<partition>-<offset>`;
//! none of them → poison), and its type ([`TypePolicy`], `type_policy.rs`).

mod type_policy;

use serde_json::Value;
use sha2::{Digest, Sha256};

pub use type_policy::{TypePolicy, TypeSource, UnknownTypeSource};

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
/// `routing_key`), partition (in `queue`), offset. Retry copies carry their original's.
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub struct SourceRef {
    /// Exchange (RabbitMQ) or topic (Kafka).
    pub exchange: Option<String>,
    /// Routing key (RabbitMQ) or record key (Kafka, as UTF-8 text).
    pub routing_key: Option<String>,
    /// Queue (RabbitMQ) or partition (Kafka).
    pub queue: Option<String>,
    /// Kafka: the record's offset in its partition (not stored on records). `None` for RabbitMQ.
    #[serde(default)]
    pub offset: Option<i64>,
    /// Kafka: the record key is not UTF-8. `routing_key` then shows it with U+FFFD in place of
    /// the bytes that are not, for people only: such a key is never taken as a message id (two
    /// different keys could read the same).
    #[serde(skip)]
    pub key_not_text: bool,
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
    /// The AMQP `type` property, if set (some producers carry the message type there).
    pub type_property: Option<String>,
    /// When the producer sent it, by the message's own timestamp (AMQP `timestamp` property,
    /// seconds; Kafka record time), if it has one. A first delivery older than the retention
    /// is counted as a late delivery (the console's retention advice).
    pub published_at: Option<chrono::DateTime<chrono::Utc>>,
    /// The content type property, if set.
    pub content_type: Option<String>,
    /// Which broker.
    pub broker: Broker,
    /// Where it came from.
    pub source: SourceRef,
    /// The broker flagged this as a redelivery (informational only; attempts are counted in the
    /// dedup table, never inferred from broker counters).
    pub redelivered: bool,
    /// The broker's headers nest deeper than [`MAX_HEADER_DEPTH`] levels (AMQP tables and arrays;
    /// Kafka headers are flat): the message is poison, and `headers` keeps what is not deeper.
    pub headers_too_deep: bool,
}

/// Deepest nesting of header tables and arrays a message may have (the headers table itself is
/// level 1); a message nested deeper is poison, `HEADERS_TOO_DEEP`. Real producers nest two or
/// three levels (RabbitMQ's own `x-death` is an array of tables); a hostile one can nest
/// thousands, which every recursive parser, converter and `Drop` pays for in stack.
pub const MAX_HEADER_DEPTH: usize = 32;

impl InboundMessage {
    /// SHA-256 of the payload, stored as `payload_hash` to detect payload conflicts.
    pub fn payload_hash(&self) -> Vec<u8> {
        Sha256::digest(&self.payload).to_vec()
    }
}

/// How to find a message id, and what makes a message poison.
///
/// Order: the AMQP `message_id` property; the `header`; the Kafka record key (when `key`); the
/// `json_pointer`; `<topic>-<partition>-<offset>` (Kafka, when `offset_fallback`).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct IdPolicy {
    /// Header consulted when the message-id property is absent (the only envelope field Kafka
    /// has for it; the Kafka publisher writes ids here). Default `x-message-id`.
    pub header: Option<String>,
    /// Kafka: take the record key as the message id when the header is absent. Default true.
    /// Turn it off when keys are entity ids (an order number shared by all of an order's
    /// events) and the id lives in the payload: otherwise every event after the first of an
    /// entity would be skipped as a duplicate.
    pub key: bool,
    /// JSON pointer (RFC 6901) into the payload, consulted after the envelope. Default `/messageId`.
    pub json_pointer: Option<String>,
    /// Kafka: when nothing else yields an id, use `<topic>-<partition>-<offset>` of the original
    /// record (retry copies keep it). Default false. It catches redeliveries of the same record
    /// (crash before the offset commit, rebalance) but not a producer's retry, which appends the
    /// message again under a new offset — a business id in a header, the key or the payload
    /// catches both. Such ids have no `<entity>.<event>` prefix: their type is `UNKNOWN`.
    pub offset_fallback: bool,
    /// Largest payload accepted, in bytes; larger ones are poison. Default 1 MiB.
    pub max_payload_bytes: usize,
}

impl Default for IdPolicy {
    fn default() -> Self {
        Self {
            header: Some("x-message-id".to_owned()),
            key: true,
            json_pointer: Some("/messageId".to_owned()),
            offset_fallback: false,
            max_payload_bytes: 1024 * 1024,
        }
    }
}

/// Why a message is poison: it can never be processed, so it is dead-lettered at once with
/// this reason and never retried.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PoisonReason {
    /// No id in the property, the header, the Kafka key or the payload.
    #[error(
        "no message id (looked at the message-id property, header {header:?}, the Kafka key and JSON pointer {pointer:?})"
    )]
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
    /// The headers nest deeper than [`MAX_HEADER_DEPTH`] levels.
    #[error("headers nested deeper than {max} levels (the deeper values are not kept)")]
    HeadersTooDeep {
        /// The limit, [`MAX_HEADER_DEPTH`].
        max: usize,
    },
    /// No handler is registered for the message's type in this consumer group. Not poison: a
    /// requeue processes it once the handler exists.
    #[error("no handler for message type {message_type:?}{}", raw_note(message_type, raw.as_deref()))]
    NoHandler {
        /// The type as the group's type policy found and mapped it (`UNKNOWN`: none found).
        message_type: String,
        /// The value as found, before the policy's map.
        raw: Option<String>,
    },
}

impl PoisonReason {
    /// True for poison: the message can never be processed and is never requeued. A message
    /// without a handler is not poison.
    pub(crate) fn is_poison(&self) -> bool {
        !matches!(self, PoisonReason::NoHandler { .. })
    }

    /// The dead-letter grouping key: the kind, and for a message without a handler its type
    /// (so one type's dead letters can be requeued together once its handler exists).
    pub(crate) fn error_class(&self) -> String {
        match self {
            PoisonReason::NoHandler { message_type, .. } => format!("{}: {message_type}", self.kind()),
            _ => self.kind().to_owned(),
        }
    }

    /// Short stable kind, used as the error class and in synthetic ids.
    pub(crate) fn kind(&self) -> &'static str {
        match self {
            PoisonReason::NoMessageId { .. } => "NO_MESSAGE_ID",
            PoisonReason::InvalidMessageId(_) => "INVALID_MESSAGE_ID",
            PoisonReason::UnparsablePayload(_) => "UNPARSABLE_PAYLOAD",
            PoisonReason::TooLarge { .. } => "PAYLOAD_TOO_LARGE",
            PoisonReason::HeadersTooDeep { .. } => "HEADERS_TOO_DEEP",
            PoisonReason::NoHandler { .. } => "NO_HANDLER",
        }
    }
}

/// `(raw value "…")` when the raw type differs from the mapped one.
fn raw_note(message_type: &str, raw: Option<&str>) -> String {
    raw.filter(|r| *r != message_type).map(|r| format!(" (raw value {r:?})")).unwrap_or_default()
}

/// The message type of poison messages that have no usable id.
pub const POISON_TYPE: &str = "POISON";

/// Message type when the group's type policy finds none.
pub const UNKNOWN_TYPE: &str = "UNKNOWN";

/// A message whose id was found (its payload parsed when it is JSON), with its type.
#[derive(Debug, Clone)]
pub struct Identified {
    /// The message id.
    pub id: MessageId,
    /// The handler type the group's [`TypePolicy`] found (or [`UNKNOWN_TYPE`]).
    pub message_type: String,
    /// The type's value as found, before the policy's map.
    pub raw_type: Option<String>,
    /// The payload as JSON; `None` for binary content types.
    pub json: Option<Value>,
}

/// A poison message, with the id its dead record is stored under: its own id when it had a
/// valid one, else `POISON.<kind>.<first 16 hex digits of the payload's SHA-256>.<delivery>:0`,
/// where `<delivery>` is the Kafka record's `<topic>-<partition>-<offset>` (a redelivery of that
/// record finds the same dead record) or, from RabbitMQ, a random id. A poison message is never
/// a duplicate of another: two poison messages with one payload (and ids invalid in different
/// ways, or none) get a record each, with their own reasons.
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
    /// Finds the message id, parses the payload and finds the type with `types`. Order: size
    /// limit, header depth, property, header, Kafka key, JSON pointer, Kafka offset. A payload that is not JSON
    /// is poison unless its content type is binary (then it is passed through as bytes). A
    /// poison message with a usable id keeps it, typed from its envelope; one without is typed
    /// [`POISON_TYPE`].
    pub fn identify(&self, message: &InboundMessage, types: &TypePolicy) -> Result<Identified, Poison> {
        let poison = |reason: PoisonReason, id: Option<MessageId>| {
            let (record_id, message_type) = match id {
                Some(id) => {
                    let t = types.resolve(message, Some(&id), None).name;
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
        if message.headers_too_deep {
            let id = self.id_from_envelope(message).and_then(Result::ok);
            return Err(poison(PoisonReason::HeadersTooDeep { max: MAX_HEADER_DEPTH }, id));
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
        let raw = self
            .id_from_envelope(message)
            .or_else(|| {
                let pointer = self.json_pointer.as_deref()?;
                let value = json.as_ref()?.pointer(pointer)?;
                Some(match value {
                    Value::String(s) => MessageId::parse(s.clone()),
                    Value::Number(n) => MessageId::parse(n.to_string()),
                    _ => MessageId::parse(String::new()),
                })
            })
            .or_else(|| self.offset_id(message));
        match raw {
            None => Err(poison(
                PoisonReason::NoMessageId { header: self.header.clone(), pointer: self.json_pointer.clone() },
                None,
            )),
            Some(Err(e)) => Err(poison(PoisonReason::InvalidMessageId(e), None)),
            Some(Ok(id)) => {
                let found = types.resolve(message, Some(&id), json.as_ref());
                Ok(Identified { id, message_type: found.name, raw_type: found.raw, json })
            }
        }
    }

    /// The id from the property, else the header, else the Kafka key (not the payload).
    fn id_from_envelope(&self, message: &InboundMessage) -> Option<Result<MessageId, IdError>> {
        if let Some(id) = message.property_message_id.as_deref().filter(|s| !s.is_empty()) {
            return Some(MessageId::parse(id));
        }
        let from_header = self.header.as_deref().and_then(|header| {
            Some(match message.headers.get(header)? {
                Value::String(s) => MessageId::parse(s.clone()),
                Value::Number(n) => MessageId::parse(n.to_string()),
                // Bytes that are not UTF-8 (see `bytes_to_json`).
                Value::Array(_) => Err(IdError::NotText { what: "message id header" }),
                _ => MessageId::parse(String::new()),
            })
        });
        from_header.or_else(|| {
            if !self.key || message.broker != Broker::Kafka {
                return None;
            }
            if message.source.key_not_text {
                return Some(Err(IdError::NotText { what: "record key" }));
            }
            message.source.routing_key.as_deref().filter(|k| !k.is_empty()).map(MessageId::parse)
        })
    }

    /// `<topic>-<partition>-<offset>` of a Kafka record, when enabled.
    fn offset_id(&self, message: &InboundMessage) -> Option<Result<MessageId, IdError>> {
        if !self.offset_fallback || message.broker != Broker::Kafka {
            return None;
        }
        let s = &message.source;
        Some(MessageId::parse(format!("{}-{}-{}", s.exchange.as_deref()?, s.queue.as_deref()?, s.offset?)))
    }
}

/// `POISON.<kind>.<hash>:0` for a poison message without a usable id.
fn synthetic_poison_id(reason: &PoisonReason, message: &InboundMessage) -> MessageId {
    let hash = message.payload_hash();
    let hex: String = hash.iter().take(8).map(|b| format!("{b:02x}")).collect();
    let s = &message.source;
    let delivery = match (message.broker, s.exchange.as_deref(), s.queue.as_deref(), s.offset) {
        (Broker::Kafka, Some(topic), Some(partition), Some(offset)) => {
            // Topic names are ASCII letters, digits, `.`, `_`, `-`: nothing to escape.
            format!("{topic}-{partition}-{offset}")
        }
        _ => uuid::Uuid::new_v4().simple().to_string(),
    };
    MessageId::parse(format!("{POISON_TYPE}.{}.{hex}.{delivery}:0", reason.kind())).expect("synthetic id is valid")
}

#[cfg(test)]
mod tests;
