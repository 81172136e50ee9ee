//! Kafka records as the engine sees them, and the headers of the copies made of them.
//!
//! A retry or dead-letter copy keeps the record's key, payload and headers and adds where the
//! original came from (`x-dedup-source-topic`, `-partition`, `-offset`), so a copy is stored,
//! identified (`offset_fallback` ids included) and requeued as its original. Those headers count
//! only on records of the retry topics: on any other record they are a producer's, and trusting
//! them would let it redirect retry and dead-letter copies and requeues, or take another
//! record's offset id.

use rdkafka::Message;
use rdkafka::message::{BorrowedMessage, Header, Headers, OwnedHeaders};
use serde_json::{Map, Value};

use super::offsets::TopicPartition;
use crate::message::{Broker, InboundMessage, SourceRef};
use crate::source::bytes_to_json;

/// Header on copies naming the topic the original record was published to.
pub const SOURCE_TOPIC_HEADER: &str = "x-dedup-source-topic";
/// Header on copies with the original record's partition.
pub const SOURCE_PARTITION_HEADER: &str = "x-dedup-source-partition";
/// Header on copies with the original record's offset.
pub const SOURCE_OFFSET_HEADER: &str = "x-dedup-source-offset";
/// Header on retry copies: when the copy is due, in Unix milliseconds.
pub const RETRY_DUE_HEADER: &str = "x-dedup-retry-due-ms";
/// Header carrying the content type (Kafka has no such property).
pub const CONTENT_TYPE_HEADER: &str = "content-type";

/// Prefix of the headers this engine writes on copies; dropped when a copy is copied again and
/// when a record is republished.
const BOOKKEEPING_PREFIX: &str = "x-dedup-";

/// Kafka headers as they came: names and optional byte values, in order.
pub(super) type RawHeaders = Vec<(String, Option<Vec<u8>>)>;

/// What the source keeps of a record beside its [`InboundMessage`] until it is settled.
#[derive(Debug, Clone)]
pub(super) struct RecordMeta {
    /// Where this record was fetched from (a retry topic for copies).
    pub tp: TopicPartition,
    /// Its offset there.
    pub offset: i64,
    /// The assignment epoch it was fetched under.
    pub epoch: u64,
    /// The record key, as bytes.
    pub key: Option<Vec<u8>>,
    /// The headers, as bytes.
    pub headers: RawHeaders,
    /// Retry copies: when they are due, Unix ms.
    pub due_ms: Option<i64>,
}

/// A record fetched from Kafka, on its way to a worker.
#[derive(Debug, Clone)]
pub(super) struct Delivered {
    /// The broker-neutral message the pipeline judges.
    pub message: InboundMessage,
    /// Where it is, for the offset bookkeeping and its copies.
    pub meta: RecordMeta,
}

fn header_text<'a>(headers: &'a RawHeaders, name: &str) -> Option<&'a str> {
    let (_, value) = headers.iter().rev().find(|(k, _)| k == name)?;
    std::str::from_utf8(value.as_deref()?).ok()
}

impl Delivered {
    /// Converts a fetched record. `retry_topic`: it was fetched from one of the retry topics, so
    /// its due and origin headers count.
    pub fn from_record(record: &BorrowedMessage<'_>, retry_topic: bool) -> Self {
        let headers: RawHeaders = record
            .headers()
            .map(|h| h.iter().map(|h| (h.key.to_owned(), h.value.map(<[u8]>::to_vec))).collect())
            .unwrap_or_default();
        let at = (record.topic(), record.partition(), record.offset());
        let due_ms = retry_topic.then(|| header_text(&headers, RETRY_DUE_HEADER)?.parse().ok()).flatten();
        let key = record.key().map(<[u8]>::to_vec);
        let message = InboundMessage {
            payload: record.payload().unwrap_or_default().to_vec(),
            headers: headers_to_json(&headers),
            property_message_id: None,
            type_property: None,
            published_at: record.timestamp().to_millis().and_then(chrono::DateTime::from_timestamp_millis),
            content_type: header_text(&headers, CONTENT_TYPE_HEADER).map(str::to_owned),
            broker: Broker::Kafka,
            source: origin(&headers, retry_topic, at, key.as_deref()),
            redelivered: retry_topic,
            headers_too_deep: false,
        };
        let tp = TopicPartition { topic: record.topic().to_owned(), partition: record.partition() };
        Self { message, meta: RecordMeta { tp, offset: record.offset(), epoch: 0, key, headers, due_ms } }
    }
}

/// Where the record's original came from: the record itself, or for a copy in a retry topic
/// (`retry_topic`), the place its origin headers name. `at`: topic, partition, offset.
fn origin(headers: &RawHeaders, retry_topic: bool, at: (&str, i32, i64), key: Option<&[u8]>) -> SourceRef {
    let (topic, partition, offset) = at;
    let copied = |name| if retry_topic { header_text(headers, name) } else { None };
    SourceRef {
        exchange: Some(copied(SOURCE_TOPIC_HEADER).unwrap_or(topic).to_owned()),
        routing_key: key.map(|k| String::from_utf8_lossy(k).into_owned()),
        queue: Some(
            copied(SOURCE_PARTITION_HEADER).and_then(|p| p.parse::<i32>().ok()).unwrap_or(partition).to_string(),
        ),
        offset: Some(copied(SOURCE_OFFSET_HEADER).and_then(|o| o.parse().ok()).unwrap_or(offset)),
        key_not_text: key.is_some_and(|k| std::str::from_utf8(k).is_err()),
    }
}

/// Kafka headers as JSON, as stored on records: UTF-8 values as strings, other bytes as arrays
/// of numbers, absent values as `null`. A repeated name keeps its last value.
pub(super) fn headers_to_json(headers: &RawHeaders) -> Map<String, Value> {
    headers.iter().map(|(k, v)| (k.clone(), v.as_deref().map_or(Value::Null, bytes_to_json))).collect()
}

/// A stored header value back as Kafka bytes: strings as UTF-8, arrays of bytes as those bytes,
/// `null` as no value, anything else as its JSON text.
pub(super) fn header_value(value: &Value) -> Option<Vec<u8>> {
    match value {
        Value::Null => None,
        Value::String(s) => Some(s.clone().into_bytes()),
        Value::Array(items) => {
            let bytes: Option<Vec<u8>> = items.iter().map(|i| i.as_u64().and_then(|n| u8::try_from(n).ok())).collect();
            Some(bytes.unwrap_or_else(|| value.to_string().into_bytes()))
        }
        other => Some(other.to_string().into_bytes()),
    }
}

/// Whether `name` is one of the headers this engine writes on copies.
pub(super) fn is_bookkeeping(name: &str) -> bool {
    name.starts_with(BOOKKEEPING_PREFIX)
}

/// Builds Kafka headers from `(name, value)` pairs.
pub(super) fn owned_headers<'a>(headers: impl IntoIterator<Item = (&'a str, Option<&'a [u8]>)>) -> OwnedHeaders {
    headers.into_iter().fold(OwnedHeaders::new(), |acc, (key, value)| acc.insert(Header { key, value }))
}

/// Headers of a copy of `meta`'s record: its own without earlier bookkeeping, then where the
/// original came from (`source`), then `extra`.
pub(super) fn copy_headers(meta: &RecordMeta, source: &SourceRef, extra: &[(&str, String)]) -> OwnedHeaders {
    let origin = [
        (SOURCE_TOPIC_HEADER, source.exchange.clone().unwrap_or_default()),
        (SOURCE_PARTITION_HEADER, source.queue.clone().unwrap_or_default()),
        (SOURCE_OFFSET_HEADER, source.offset.map(|o| o.to_string()).unwrap_or_default()),
    ];
    let own = meta.headers.iter().filter(|(k, _)| !is_bookkeeping(k)).map(|(k, v)| (k.as_str(), v.as_deref()));
    let added = origin.iter().chain(extra).map(|(k, v)| (*k, Some(v.as_bytes())));
    owned_headers(own.chain(added))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_values_round_trip_through_json() {
        let raw: RawHeaders = vec![
            ("x-message-id".into(), Some(b"ORDER.PAY.1:2".to_vec())),
            ("bin".into(), Some(vec![0xff, 0x00])),
            ("empty".into(), None),
        ];
        let json = headers_to_json(&raw);
        assert_eq!(
            Value::Object(json.clone()),
            serde_json::json!({"x-message-id": "ORDER.PAY.1:2", "bin": [255, 0], "empty": null})
        );
        let back: RawHeaders = json.iter().map(|(k, v)| (k.clone(), header_value(v))).collect();
        for item in &raw {
            assert!(back.contains(item), "{item:?} in {back:?}");
        }
        assert_eq!(header_value(&serde_json::json!(7)), Some(b"7".to_vec()));
        assert_eq!(header_value(&serde_json::json!([1, 300])), Some(b"[1,300]".to_vec()));
    }

    #[test]
    fn origin_headers_count_only_on_retry_copies_and_a_binary_key_is_marked() {
        let headers: RawHeaders = vec![
            (SOURCE_TOPIC_HEADER.into(), Some(b"orders".to_vec())),
            (SOURCE_PARTITION_HEADER.into(), Some(b"2".to_vec())),
            (SOURCE_OFFSET_HEADER.into(), Some(b"41".to_vec())),
        ];
        let copy = origin(&headers, true, ("orders.g.retry.1000", 0, 7), Some(b"k"));
        assert_eq!(
            (copy.exchange.as_deref(), copy.queue.as_deref(), copy.offset),
            (Some("orders"), Some("2"), Some(41))
        );
        assert!(!copy.key_not_text);
        // The same headers on a record of a source topic are a producer's: ignored.
        let spoofed = origin(&headers, false, ("payments", 3, 9), Some(b"\xffk"));
        assert_eq!(
            (spoofed.exchange.as_deref(), spoofed.queue.as_deref(), spoofed.offset),
            (Some("payments"), Some("3"), Some(9))
        );
        assert!(spoofed.key_not_text);
        assert_eq!(spoofed.routing_key.as_deref(), Some("\u{fffd}k"));
    }
}
