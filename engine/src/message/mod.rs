//! Broker-neutral inbound messages, how a message id is found in one (DESIGN.md, "Terms": the
//! sources of the group's [`IdPolicy`] in its order — by default the AMQP `message_id`
//! property, a header, the Kafka record key, a JSON pointer into the payload; none of them →
//! poison; `id_policy.rs`), and its type ([`TypePolicy`], `type_policy.rs`).

/// Serde for a policy's source as configuration writes it: its `Display` out, its `FromStr` in
/// (whose error is the message).
macro_rules! serde_as_text {
    ($source:ty) => {
        impl serde::Serialize for $source {
            fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.collect_str(self)
            }
        }

        impl<'de> serde::Deserialize<'de> for $source {
            fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                let text = String::deserialize(deserializer)?;
                text.parse().map_err(serde::de::Error::custom)
            }
        }
    };
}

mod id_policy;
mod type_policy;

use serde_json::Value;
use sha2::{Digest, Sha256};

pub use id_policy::{IdPolicy, IdSource, IdSourceKind, UnknownIdSource};
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

/// Why a message is poison: it can never be processed, so it is dead-lettered at once with
/// this reason and never retried.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PoisonReason {
    /// None of the group's id sources yielded an id.
    #[error("no message id (looked at {})", sources(looked_at))]
    NoMessageId {
        /// The sources consulted, in order ([`IdPolicy::from`]).
        looked_at: Vec<IdSource>,
    },
    /// An id was found but is not acceptable.
    #[error("invalid message id: {error}{}", as_sent_note(found.as_deref()))]
    InvalidMessageId {
        /// Why it is not acceptable.
        error: IdError,
        /// The value as the producer sent it, so an operator can find the producer's message:
        /// escaped (`char::escape_debug`: control and invisible characters as `\u{…}`) and cut
        /// at [`MAX_SHOWN_ID_CHARS`] characters (then `…`). `None` for bytes that are not text.
        found: Option<String>,
    },
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
            PoisonReason::InvalidMessageId { .. } => "INVALID_MESSAGE_ID",
            PoisonReason::UnparsablePayload(_) => "UNPARSABLE_PAYLOAD",
            PoisonReason::TooLarge { .. } => "PAYLOAD_TOO_LARGE",
            PoisonReason::HeadersTooDeep { .. } => "HEADERS_TOO_DEEP",
            PoisonReason::NoHandler { .. } => "NO_HANDLER",
        }
    }
}

/// The sources, as written in configuration, comma-separated.
fn sources(sources: &[IdSource]) -> String {
    sources.iter().map(IdSource::to_string).collect::<Vec<_>>().join(", ")
}

/// Most characters of an invalid id kept on its poison record ([`PoisonReason::InvalidMessageId`]).
pub const MAX_SHOWN_ID_CHARS: usize = 200;

/// An invalid id as sent, escaped and bounded (see [`PoisonReason::InvalidMessageId`]).
fn shown_id(value: &str) -> String {
    let mut shown: String = value.escape_debug().take(MAX_SHOWN_ID_CHARS).collect();
    if value.escape_debug().nth(MAX_SHOWN_ID_CHARS).is_some() {
        shown.push('…');
    }
    shown
}

/// ` (as sent: "…")` when the invalid id was text.
fn as_sent_note(found: Option<&str>) -> String {
    found.map(|f| format!(" (as sent: \"{f}\")")).unwrap_or_default()
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
    /// Which source of the policy's `from` gave it (an index into [`IdPolicy::from`]).
    pub id_source: usize,
    /// That source's kind, as the record keeps it.
    pub id_kind: IdSourceKind,
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
    /// Where its id came from when it is the message's own; `None` for a synthetic id.
    pub id_source: Option<IdSourceKind>,
}

/// True when the content type says the payload is not JSON (e.g. `application/octet-stream`).
fn is_binary(content_type: Option<&str>) -> bool {
    content_type.is_some_and(|ct| !ct.is_empty() && !ct.contains("json") && !ct.starts_with("text/"))
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
