//! Records list and record detail wire types, and the records filter as it travels in URLs.

use serde::{Deserialize, Serialize};

/// The records filter as text: the query string of `/records` and `/api/v1/records`. Empty or
/// absent values do not filter; the server validates the rest (unknown status, malformed time,
/// search over 512 bytes: a 400 with the reason).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "ssr", derive(utoipa::IntoParams, utoipa::ToSchema))]
#[cfg_attr(feature = "ssr", into_params(parameter_in = Query))]
#[serde(default, deny_unknown_fields)]
pub struct RecordsQuery {
    /// Consumer group, exact.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    /// `processing`, `succeeded`, `failed` or `dead`.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "ssr", param(pattern = "^(|processing|succeeded|failed|dead)$"))]
    pub status: Option<String>,
    /// Message type (`ORDER.PAY`), exact.
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    pub message_type: Option<String>,
    /// Error class, exact (a dead-letter group).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error_class: Option<String>,
    /// First seen at or after (RFC 3339 or `YYYY-MM-DDTHH:MM`, UTC).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub from: Option<String>,
    /// First seen before.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub to: Option<String>,
    /// Attempts at least.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "ssr", param(pattern = "^[0-9]{0,9}$"))]
    pub min_attempts: Option<String>,
    /// Message id, exact.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// Message id prefix.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prefix: Option<String>,
    /// A mark to check: `double_effect` (an attempt's effect ran after its lease was lost, so
    /// the effect may have run twice; the overview's "possible double effects").
    #[serde(skip_serializing_if = "Option::is_none")]
    /// `late_duplicate` (a copy that came back after cleanup deleted its record: the Cleanup
    /// page's late duplicates).
    /// `conflict` (a reused id or a payload conflict with a kept copy not requeued yet).
    #[cfg_attr(feature = "ssr", param(pattern = "^(|double_effect|late_duplicate|conflict)$"))]
    pub flag: Option<String>,
    /// `time` (default; `message_id` with `prefix`), `attempts` or `message_id`.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "ssr", param(pattern = "^(|time|attempts|message_id)$"))]
    pub sort: Option<String>,
    /// `desc` (default) or `asc`.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "ssr", param(pattern = "^(|desc|asc)$"))]
    pub order: Option<String>,
    /// Next page: the `next` cursor of the current page.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub after: Option<String>,
    /// Previous page: the `prev` cursor of the current page.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub before: Option<String>,
    /// Rows per page (1–500, default 50).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "ssr", param(pattern = "^(|[1-9]|[1-9][0-9]|[1-4][0-9]{2}|500)$"))]
    pub limit: Option<String>,
}

impl RecordsQuery {
    /// The URL keys, in the order [`RecordsQuery::pairs`] yields them.
    pub const KEYS: [&'static str; 15] = [
        "group",
        "status",
        "type",
        "error_class",
        "from",
        "to",
        "min_attempts",
        "id",
        "prefix",
        "flag",
        "sort",
        "order",
        "after",
        "before",
        "limit",
    ];

    fn fields(&self) -> [&Option<String>; 15] {
        [
            &self.group,
            &self.status,
            &self.message_type,
            &self.error_class,
            &self.from,
            &self.to,
            &self.min_attempts,
            &self.id,
            &self.prefix,
            &self.flag,
            &self.sort,
            &self.order,
            &self.after,
            &self.before,
            &self.limit,
        ]
    }

    /// Builds a query from a lookup of URL keys (blank values are dropped).
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Self {
        let mut v = Self::KEYS.map(|k| get(k).filter(|s| !s.trim().is_empty()));
        let mut take = |i: usize| v[i].take();
        RecordsQuery {
            group: take(0),
            status: take(1),
            message_type: take(2),
            error_class: take(3),
            from: take(4),
            to: take(5),
            min_attempts: take(6),
            id: take(7),
            prefix: take(8),
            flag: take(9),
            sort: take(10),
            order: take(11),
            after: take(12),
            before: take(13),
            limit: take(14),
        }
    }

    /// The non-empty (key, value) pairs.
    pub fn pairs(&self) -> impl Iterator<Item = (&'static str, &str)> {
        Self::KEYS.into_iter().zip(self.fields()).filter_map(|(k, v)| v.as_deref().map(|v| (k, v)))
    }

    /// `/records?…` for this query (percent-encoded).
    pub fn href(&self) -> String {
        let query: Vec<String> = self.pairs().map(|(k, v)| format!("{k}={}", encode_component(v))).collect();
        if query.is_empty() { "/records".to_owned() } else { format!("/records?{}", query.join("&")) }
    }

    /// The same filter and order at another page: `after` or `before` the cursor.
    pub fn at_page(&self, after: Option<String>, before: Option<String>) -> Self {
        RecordsQuery { after, before, ..self.clone() }
    }
}

/// Percent-encodes a URL query component (everything but unreserved characters).
pub fn encode_component(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for b in value.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The choices the records filter offers.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "ssr", derive(utoipa::ToSchema))]
pub struct RecordFilterOptions {
    /// Consumer groups with records.
    pub groups: Vec<String>,
    /// Known message types.
    pub message_types: Vec<String>,
}

/// One row of the records list.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "ssr", derive(utoipa::ToSchema))]
pub struct RecordSummary {
    /// Record id.
    pub id: i64,
    /// Consumer group.
    pub consumer_group: String,
    /// Message id.
    pub message_id: String,
    /// `<entity>.<event>` or `POISON`.
    pub message_type: String,
    /// `processing`, `succeeded`, `failed` or `dead`.
    pub status: String,
    /// `transactional` or `leased`; `None` for poison.
    pub handler_mode: Option<String>,
    /// Attempts so far.
    pub attempts: i32,
    /// Attempts allowed.
    pub max_attempts: i32,
    /// First delivery, RFC 3339.
    pub first_seen_at: String,
    /// Last change, RFC 3339.
    pub updated_at: String,
    /// When the retry copy is due (failed records), RFC 3339.
    pub next_attempt_at: Option<String>,
    /// Error kind + first line of the last failure.
    pub error_class: Option<String>,
    /// Duplicate deliveries seen.
    pub duplicate_count: i32,
}

/// One page of records.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "ssr", derive(utoipa::ToSchema))]
pub struct RecordPageView {
    /// The rows.
    pub rows: Vec<RecordSummary>,
    /// Pass as `after` for the next page; `None` on the last page.
    pub next: Option<String>,
    /// Pass as `before` for the previous page; `None` on the first page.
    pub prev: Option<String>,
    /// Set when the filter has no index to narrow it in the list's order (a group, message type
    /// or error class over the succeeded records; in message-id order a type, class or time
    /// range): the page searched a bounded stretch of records past its cursor (20 000 in time
    /// order, 2 000 in attempts and message-id order) and stopped at this record id with fewer
    /// matches than a page; `next` (`prev` going back) continues the search from there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub searched_to: Option<i64>,
}

/// A payload made safe to show: pretty JSON, UTF-8 text, or a hex dump. Always shown as text
/// (escaped), never as markup.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "ssr", derive(utoipa::ToSchema))]
pub struct PayloadView {
    /// `json`, `text` or `hex`.
    pub format: String,
    /// Stored size in bytes.
    pub bytes: usize,
    /// The rendering.
    pub text: String,
}

/// One handler attempt.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "ssr", derive(utoipa::ToSchema))]
pub struct AttemptView {
    /// 1 for the first.
    pub attempt: i32,
    /// The worker that ran it.
    pub worker: String,
    /// Start, RFC 3339.
    pub started_at: String,
    /// End, RFC 3339; `None` while running or after its worker died.
    pub ended_at: Option<String>,
    /// `succeeded`, `failed`, `dead`, `lease_lost`, `released`, `deferred` (an HTTP 409 not
    /// counted as an attempt); `None` while open.
    pub outcome: Option<String>,
    /// The error of a failed attempt.
    pub error: Option<String>,
    /// For an attempt whose lease another worker took over: that worker.
    pub taken_over_by: Option<String>,
    /// The attempt's effect ran after its lease was lost: it may have run twice.
    pub late_effect: bool,
    /// The status the far side answered (HTTP handlers); `None` without an answer (timeout,
    /// connection error) or for a handler that reports none.
    pub answer_status: Option<i16>,
    /// The call's latency, ms (HTTP handlers; with a transport error too).
    pub latency_ms: Option<i32>,
    /// The answer class: the kind of the attempt's error (`HTTP_CONFLICT`, `HTTP_TIMEOUT`, …,
    /// the answer table of docs/DESIGN.md); `None` for a success.
    pub answer_class: Option<String>,
    /// The answer's body excerpt (at most 2 048 characters) or the transport error: text, shown
    /// escaped.
    pub answer: Option<String>,
}

/// The Redis fast-path marker of a record.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "ssr", derive(utoipa::ToSchema))]
pub struct MarkerView {
    /// `present`, `absent` or `unknown` (Redis did not answer).
    pub state: String,
    /// Seconds left when present (`None`: no expiry).
    pub ttl_secs: Option<i64>,
    /// Why the state is unknown.
    pub error: Option<String>,
}

/// Where the message came from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "ssr", derive(utoipa::ToSchema))]
pub struct SourceView {
    /// `rabbitmq` or `kafka`.
    pub broker: String,
    /// Exchange (topic).
    pub exchange: Option<String>,
    /// Routing key (record key).
    pub routing_key: Option<String>,
    /// Queue (partition).
    pub queue: Option<String>,
    /// Where the message id came from: `property`, `header`, `key`, `payload` or `offset` (the
    /// kind of the group's `ids.from` source that gave it); `None` when not kept (records from
    /// before it was, poison messages).
    #[serde(default)]
    pub id_from: Option<String>,
}

/// Every field of one record, its history and its marker.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "ssr", derive(utoipa::ToSchema))]
pub struct RecordDetailView {
    /// The list fields.
    pub record: RecordSummary,
    /// Re-entries into processing after an expired lease.
    pub reentries: i32,
    /// Lease holder (processing).
    pub lease_owner: Option<String>,
    /// Lease token (processing): operator actions present it (UUID).
    pub lease_token: Option<String>,
    /// Lease expiry, RFC 3339.
    pub lease_expires_at: Option<String>,
    /// Whether the lease has expired (stuck).
    pub lease_expired: bool,
    /// The record's version (0 and up, raised by every state transition: claim, completion,
    /// failure, operator action; not by duplicates): give it back as `expected_version` in an
    /// action, which is then refused (409) if the record changed since.
    pub version: i64,
    /// When it succeeded, RFC 3339.
    pub completed_at: Option<String>,
    /// Full text of the last error.
    pub last_error: Option<String>,
    /// SHA-256 of the payload, hex.
    pub payload_hash: String,
    /// The stored payload (kept while not succeeded).
    pub payload: Option<PayloadView>,
    /// Only the payload's start was kept.
    pub payload_truncated: bool,
    /// Broker headers, pretty JSON.
    pub headers: Option<String>,
    /// Content type.
    pub content_type: Option<String>,
    /// Where it came from.
    pub source: SourceView,
    /// Latest duplicate arrival, RFC 3339.
    pub last_duplicate_at: Option<String>,
    /// That duplicate's delay after first seen, ms.
    pub last_duplicate_delay_ms: Option<i64>,
    /// Deliveries with this id and another payload.
    pub payload_conflicts: i32,
    /// When a redelivery was parked on it, RFC 3339.
    pub parked_at: Option<String>,
    /// Attempt history, oldest first.
    pub attempts: Vec<AttemptView>,
    /// Attempts whose lease another worker took over.
    pub takeovers: usize,
    /// Calls of the far side (HTTP handlers): attempts with an answer or a transport error.
    /// The record's `duplicate_count` are the broker redeliveries absorbed without a call.
    pub calls: usize,
    /// An attempt's effect ran after its lease was lost, so the effect may have run twice: an
    /// operator should check it.
    pub possible_double_effect: bool,
    /// Set when the record was created by a late duplicate: a copy that came back after cleanup
    /// deleted the record of the same message id.
    pub late_duplicate: Option<LateDuplicateNote>,
    /// Copies of deliveries that carried this record's message id with another message type (a
    /// reused id, dead-lettered) or another payload, oldest first.
    pub conflicts: Vec<ConflictView>,
    /// The Redis key of the marker.
    pub marker_key: String,
    /// The marker's state.
    pub marker: MarkerView,
}

/// A kept copy of a conflicting delivery.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "ssr", derive(utoipa::ToSchema))]
pub struct ConflictView {
    /// Conflict id (`POST /api/v1/conflicts/{id}/requeue`).
    pub id: i64,
    /// `type`: another message type, a reused id (dead-lettered); `payload`: the same type,
    /// another payload (judged a duplicate).
    pub kind: String,
    /// The copy's message type.
    pub message_type: String,
    /// Where its message id came from (the group's `ids.from` source: `key`, `header:<name>`,
    /// `property`, `json:<pointer>`, `offset`).
    pub id_source: String,
    /// Up to 2 KB of its payload, as text.
    pub payload_excerpt: String,
    /// Its payload's size, bytes.
    pub payload_bytes: i32,
    /// Exchange or topic it came from.
    pub source_exchange: Option<String>,
    /// Its routing key or Kafka record key.
    pub source_routing_key: Option<String>,
    /// Copies that came.
    pub copies: i32,
    /// First arrival, RFC 3339.
    pub first_seen_at: String,
    /// Last arrival, RFC 3339.
    pub last_seen_at: String,
    /// The message id it was requeued under, once it was.
    pub requeued_as: Option<String>,
    /// When it was requeued or dismissed, RFC 3339; `None` while open.
    pub settled_at: Option<String>,
    /// Who settled it.
    pub settled_by: Option<String>,
}

/// The body of `POST /api/v1/conflicts/{id}/dismiss`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "ssr", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct DismissConflictRequest {
    /// Why its event needs no run of its own (required; written to the audit log).
    pub reason: String,
}

/// What a conflict's requeue did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "ssr", derive(utoipa::ToSchema))]
pub struct ConflictRequeuedView {
    /// The conflict.
    pub conflict_id: i64,
    /// The new message id its copy was published under.
    pub requeued_as: String,
}

/// What makes a record a late duplicate.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "ssr", derive(utoipa::ToSchema))]
pub struct LateDuplicateNote {
    /// When the deleted record of the same message id was first seen, RFC 3339.
    pub first_seen_at: String,
    /// This copy's delay after that, ms.
    pub delay_ms: i64,
    /// Held for an operator (`late_duplicates = "hold"`) rather than processed.
    pub held: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queries_round_trip_through_hrefs() {
        let q =
            RecordsQuery { status: Some("dead".into()), prefix: Some("ORDER.PAY 1&x".into()), ..Default::default() };
        assert_eq!(q.href(), "/records?status=dead&prefix=ORDER.PAY%201%26x");
        let back = RecordsQuery::from_lookup(|k| q.pairs().find(|(key, _)| *key == k).map(|(_, v)| v.to_owned()));
        assert_eq!(back, q);
        assert_eq!(RecordsQuery::default().href(), "/records");
    }
}
