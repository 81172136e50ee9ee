//! Where a consumer group finds a message's id (DESIGN.md, "Terms"): the sources of its
//! [`IdPolicy`], in the order it names. The first that yields a value decides; none → poison.

use std::fmt;
use std::str::FromStr;

use serde_json::Value;

use super::{
    Broker, Identified, InboundMessage, MAX_HEADER_DEPTH, POISON_TYPE, Poison, PoisonReason, TypePolicy,
    synthetic_poison_id,
};
use crate::record::{IdError, MessageId};

/// One place a message's id may be found.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum IdSource {
    /// The AMQP `message_id` property (RabbitMQ; a Kafka record has none). Written `property`.
    /// Some client libraries stamp a fresh one on every send: such ids are not the business
    /// key, and a retry of the same message is not seen as a duplicate. Put the header or the
    /// payload field that carries the business key before it, or leave it out.
    Property,
    /// A header (a string or a number). Written `header:<name>`, e.g. `header:x-message-id`.
    Header(String),
    /// Kafka: the record key, when it is UTF-8 text. Written `key`. Leave it out when keys are
    /// entity ids (an order number shared by all of an order's events): every event after the
    /// first of an entity would be skipped as a duplicate.
    Key,
    /// A string or number at a JSON pointer (RFC 6901) into the payload. Written
    /// `json:<pointer>`, e.g. `json:/messageId`. Without one the payload is never consulted.
    JsonPointer(String),
    /// Kafka: `<topic>-<partition>-<offset>` of the original record (retry copies keep it).
    /// Written `offset`. It catches redeliveries of the same record (a crash before the offset
    /// commit, a rebalance) but not a producer's retry, which appends the message again under a
    /// new offset; such ids have no `<entity>.<event>` prefix, so their type is `UNKNOWN` unless
    /// the type policy finds it elsewhere. Only sensible last.
    Offset,
}

/// What kind of place a message id came from, as a record keeps it (`dedup_records.id_source`,
/// one byte) and the record page shows it: "id from header". The header's name or the pointer
/// is the group's `ids.from` (a conflicting copy keeps the whole source).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdSourceKind {
    /// The AMQP `message_id` property.
    Property,
    /// A header.
    Header,
    /// The Kafka record key.
    Key,
    /// A field of the payload (a JSON pointer).
    Payload,
    /// `<topic>-<partition>-<offset>` of a Kafka record.
    Offset,
}

impl IdSourceKind {
    const ALL: [IdSourceKind; 5] = [Self::Property, Self::Header, Self::Key, Self::Payload, Self::Offset];

    /// Its name: `property`, `header`, `key`, `payload` or `offset`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Property => "property",
            Self::Header => "header",
            Self::Key => "key",
            Self::Payload => "payload",
            Self::Offset => "offset",
        }
    }

    /// Its one-byte code in `dedup_records.id_source` (migration `20261204000070`): `p`
    /// property, `h` header, `k` key, `j` payload (a JSON pointer), `o` offset. Not the first
    /// letter of its name: property and payload share one.
    pub fn code(self) -> i8 {
        let code = match self {
            Self::Property => b'p',
            Self::Header => b'h',
            Self::Key => b'k',
            Self::Payload => b'j',
            Self::Offset => b'o',
        };
        code as i8
    }

    /// The kind of a stored code; `None` for an unknown one.
    pub fn from_code(code: i8) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.code() == code)
    }
}

impl IdSource {
    /// Its kind.
    pub fn kind(&self) -> IdSourceKind {
        match self {
            IdSource::Property => IdSourceKind::Property,
            IdSource::Header(_) => IdSourceKind::Header,
            IdSource::Key => IdSourceKind::Key,
            IdSource::JsonPointer(_) => IdSourceKind::Payload,
            IdSource::Offset => IdSourceKind::Offset,
        }
    }
}

/// An id source that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown message id source {0:?}; expected property, header:<name>, key, json:<pointer> or offset")]
pub struct UnknownIdSource(pub String);

impl FromStr for IdSource {
    type Err = UnknownIdSource;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "property" => Ok(IdSource::Property),
            "key" => Ok(IdSource::Key),
            "offset" => Ok(IdSource::Offset),
            _ => {
                if let Some(name) = s.strip_prefix("header:").filter(|n| !n.is_empty()) {
                    Ok(IdSource::Header(name.to_owned()))
                } else if let Some(pointer) = s.strip_prefix("json:").filter(|p| p.starts_with('/')) {
                    Ok(IdSource::JsonPointer(pointer.to_owned()))
                } else {
                    Err(UnknownIdSource(s.chars().take(80).collect()))
                }
            }
        }
    }
}

impl fmt::Display for IdSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            IdSource::Property => f.write_str("property"),
            IdSource::Header(name) => write!(f, "header:{name}"),
            IdSource::Key => f.write_str("key"),
            IdSource::JsonPointer(pointer) => write!(f, "json:{pointer}"),
            IdSource::Offset => f.write_str("offset"),
        }
    }
}

serde_as_text!(IdSource);

/// How a consumer group finds a message id, and what makes a message poison (`[consumer.ids]`,
/// or a group's `ids`).
///
/// `from` names the sources in order; the first that yields a value decides (an invalid value
/// is poison, not skipped); none → poison `NO_MESSAGE_ID`. The default,
/// `["property", "header:x-message-id", "key", "json:/messageId"]`, takes the AMQP `message_id`
/// property first. When producers stamp a fresh `message_id` on every send, put the header or
/// payload field that carries the business key first; leave `json:` out to never read the
/// payload; add `offset` last for Kafka topics whose records carry no id.
///
/// ```
/// use dedup_engine::{IdPolicy, IdSource};
/// // The business key in a header, then the payload; the property (a per-send UUID) ignored.
/// let ids = IdPolicy::from_sources([IdSource::Header("x-idempotency-key".into()), IdSource::JsonPointer("/eventId".into())]);
/// assert_eq!(ids.header(), Some("x-idempotency-key"));
/// ```
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(try_from = "IdPolicyKeys")]
pub struct IdPolicy {
    /// Where to look, in order (see [`IdPolicy`]). Not empty.
    pub from: Vec<IdSource>,
    /// Largest payload accepted, in bytes; larger ones are poison. Default 1 MiB.
    pub max_payload_bytes: usize,
}

impl Default for IdPolicy {
    fn default() -> Self {
        Self {
            from: vec![
                IdSource::Property,
                IdSource::Header("x-message-id".to_owned()),
                IdSource::Key,
                IdSource::JsonPointer("/messageId".to_owned()),
            ],
            max_payload_bytes: 1024 * 1024,
        }
    }
}

/// The configuration keys of an [`IdPolicy`], checked by its `TryFrom`; the keys of the
/// policy before `from` are known only to be refused with what replaces them.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct IdPolicyKeys {
    from: Option<Vec<IdSource>>,
    max_payload_bytes: Option<usize>,
    header: Option<serde::de::IgnoredAny>,
    key: Option<serde::de::IgnoredAny>,
    json_pointer: Option<serde::de::IgnoredAny>,
    offset_fallback: Option<serde::de::IgnoredAny>,
}

impl TryFrom<IdPolicyKeys> for IdPolicy {
    type Error = String;
    fn try_from(keys: IdPolicyKeys) -> Result<Self, String> {
        if keys.header.is_some() || keys.key.is_some() || keys.json_pointer.is_some() || keys.offset_fallback.is_some()
        {
            return Err("ids.header, ids.key, ids.json_pointer and ids.offset_fallback are replaced by ids.from, the \
                        id sources in order; the old defaults are from = [\"property\", \"header:x-message-id\", \
                        \"key\", \"json:/messageId\"]"
                .to_owned());
        }
        let default = IdPolicy::default();
        let from = keys.from.unwrap_or(default.from);
        if from.is_empty() {
            return Err("ids.from names no id source: every message would be poison".to_owned());
        }
        Ok(IdPolicy { from, max_payload_bytes: keys.max_payload_bytes.unwrap_or(default.max_payload_bytes) })
    }
}

impl IdPolicy {
    /// Looks in `sources`, in order, with the default payload limit.
    pub fn from_sources(sources: impl IntoIterator<Item = IdSource>) -> Self {
        Self { from: sources.into_iter().collect(), ..Self::default() }
    }

    /// The first header the policy reads ids from, if any: where the engine's Kafka publishers
    /// write the id of the copies they publish.
    pub fn header(&self) -> Option<&str> {
        self.from.iter().find_map(|s| match s {
            IdSource::Header(name) => Some(name.as_str()),
            _ => None,
        })
    }

    /// Finds the message id, parses the payload and finds the type with `types`. Order: size
    /// limit, header depth, payload parse, then the sources of `from`. A payload that is not JSON
    /// is poison unless its content type is binary (then it is passed through as bytes). A
    /// poison message with an id in its envelope (the sources of `from` but the payload and the
    /// offset, in its order) keeps it, typed from it; one without is typed [`POISON_TYPE`].
    pub fn identify(&self, message: &InboundMessage, types: &TypePolicy) -> Result<Identified, Poison> {
        let poison = |reason: PoisonReason, id: Option<(IdSourceKind, MessageId)>| {
            let (record_id, message_type, id_source) = match id {
                Some((kind, id)) => {
                    let t = types.resolve(message, Some(&id), None).name;
                    (id, t, Some(kind))
                }
                None => (synthetic_poison_id(&reason, message), POISON_TYPE.to_owned(), None),
            };
            Poison { record_id, message_type, reason, id_source }
        };
        let envelope_id = || {
            let (kind, found) = self.from.iter().find_map(|s| envelope(s, message).map(|found| (s.kind(), found)))?;
            found.ok().map(|id| (kind, id))
        };
        if message.payload.len() > self.max_payload_bytes {
            let reason = PoisonReason::TooLarge { bytes: message.payload.len(), max: self.max_payload_bytes };
            return Err(poison(reason, envelope_id()));
        }
        if message.headers_too_deep {
            return Err(poison(PoisonReason::HeadersTooDeep { max: MAX_HEADER_DEPTH }, envelope_id()));
        }
        let json = if super::is_binary(message.content_type.as_deref()) {
            None
        } else {
            match serde_json::from_slice::<Value>(&message.payload) {
                Ok(v) => Some(v),
                Err(e) => return Err(poison(PoisonReason::UnparsablePayload(e.to_string()), envelope_id())),
            }
        };
        let found = self.from.iter().enumerate().find_map(|(index, source)| {
            let id = match source {
                IdSource::JsonPointer(pointer) => Some(match json.as_ref()?.pointer(pointer)? {
                    Value::String(s) => parse_id(s),
                    Value::Number(n) => parse_id(&n.to_string()),
                    _ => parse_id(""),
                }),
                IdSource::Offset => offset_id(message),
                _ => envelope(source, message),
            };
            id.map(|id| (index, id))
        });
        match found {
            None => Err(poison(PoisonReason::NoMessageId { looked_at: self.from.clone() }, None)),
            Some((_, Err((error, found)))) => Err(poison(PoisonReason::InvalidMessageId { error, found }, None)),
            Some((id_source, Ok(id))) => {
                let found = types.resolve(message, Some(&id), json.as_ref());
                let id_kind = self.from[id_source].kind();
                Ok(Identified { id, id_source, id_kind, message_type: found.name, raw_type: found.raw, json })
            }
        }
    }
}

/// What an id source yielded: the id, or why it is not one with the value as sent (escaped and
/// bounded; `None` for bytes that are not text).
type Found = Result<MessageId, (IdError, Option<String>)>;

/// Parses a source's text as a message id, keeping the text when it is not one.
fn parse_id(value: &str) -> Found {
    MessageId::parse(value).map_err(|e| (e, Some(super::shown_id(value))))
}

/// The id an envelope source (property, header, Kafka key) yields, if it has one; `None` for
/// the payload and the offset.
fn envelope(source: &IdSource, message: &InboundMessage) -> Option<Found> {
    match source {
        IdSource::Property => message.property_message_id.as_deref().filter(|s| !s.is_empty()).map(parse_id),
        IdSource::Header(name) => Some(match message.headers.get(name)? {
            Value::String(s) => parse_id(s),
            Value::Number(n) => parse_id(&n.to_string()),
            // Bytes that are not UTF-8 (see `bytes_to_json`).
            Value::Array(_) => Err((IdError::NotText { what: "message id header" }, None)),
            _ => parse_id(""),
        }),
        IdSource::Key if message.broker == Broker::Kafka => {
            if message.source.key_not_text {
                return Some(Err((IdError::NotText { what: "record key" }, None)));
            }
            message.source.routing_key.as_deref().filter(|k| !k.is_empty()).map(parse_id)
        }
        IdSource::Key | IdSource::JsonPointer(_) | IdSource::Offset => None,
    }
}

/// `<topic>-<partition>-<offset>` of a Kafka record.
fn offset_id(message: &InboundMessage) -> Option<Found> {
    if message.broker != Broker::Kafka {
        return None;
    }
    let s = &message.source;
    Some(parse_id(&format!("{}-{}-{}", s.exchange.as_deref()?, s.queue.as_deref()?, s.offset?)))
}
