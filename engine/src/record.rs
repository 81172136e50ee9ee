//! The dedup record's vocabulary: statuses, handler modes, lease policy, and the validated
//! identifiers (message id, consumer group).
//!
//! Lifecycle (DESIGN.md, "Record lifecycle"):
//!
//! ```text
//!             claim                  commit
//!   (none) ─────────► processing ──────────► succeeded ──(retention)──► deleted by cleanup
//!                        │  ▲
//!              handler   │  │ next delivery / requeue (attempts < max)
//!              error     ▼  │
//!                       failed ──(attempts = max)──► dead ──(operator requeue)──► failed
//!                        ▲
//!   processing, lease expired (stuck) ──(operator release, or auto-reclaim)──┘
//! ```

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// A dedup record's status. Stored as text (`dedup_records_status_check`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RecordStatus {
    /// Claimed by a worker that holds a lease (`lease_owner`, `lease_token`, `lease_expires_at`).
    /// With the lease expired (database clock) the record is *stuck*.
    Processing,
    /// The effect happened and was committed. Further deliveries are acked and skipped.
    Succeeded,
    /// The last attempt failed; claimable again while `attempts < max_attempts`.
    Failed,
    /// Attempts exhausted, or a poison message. Waits for an operator.
    Dead,
}

impl RecordStatus {
    /// All statuses, in lifecycle order.
    pub const ALL: [RecordStatus; 4] =
        [RecordStatus::Processing, RecordStatus::Succeeded, RecordStatus::Failed, RecordStatus::Dead];

    /// The stored (and wire) name.
    pub fn as_str(self) -> &'static str {
        match self {
            RecordStatus::Processing => "processing",
            RecordStatus::Succeeded => "succeeded",
            RecordStatus::Failed => "failed",
            RecordStatus::Dead => "dead",
        }
    }
}

impl fmt::Display for RecordStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An unknown status name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown status {0:?}; expected one of processing, succeeded, failed, dead")]
pub struct UnknownStatus(pub String);

impl FromStr for RecordStatus {
    type Err = UnknownStatus;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        RecordStatus::ALL
            .into_iter()
            .find(|st| st.as_str() == s)
            .ok_or_else(|| UnknownStatus(s.chars().take(40).collect()))
    }
}

impl TryFrom<String> for RecordStatus {
    type Error = UnknownStatus;
    fn try_from(value: String) -> Result<Self, Self::Error> {
        value.parse()
    }
}

/// How a handler's effect relates to the database (DESIGN.md, "Two handler modes").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum HandlerMode {
    /// Claim, business changes and `succeeded` in one transaction; ack after commit. A crash
    /// rolls everything back, so such records are never stuck.
    Transactional,
    /// Claim committed first (with a lease), then the external effect, then a completion fenced
    /// by the lease token. A crash leaves the record stuck.
    Leased,
}

impl HandlerMode {
    /// The stored name.
    pub fn as_str(self) -> &'static str {
        match self {
            HandlerMode::Transactional => "transactional",
            HandlerMode::Leased => "leased",
        }
    }
}

/// What a redelivery of a stuck record (leased mode, lease expired) may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LeaseExpiryPolicy {
    /// Leave it to an operator: the redelivery is parked (acked, payload kept in the record)
    /// until someone releases it, marks it succeeded or dead-letters it. The default, because
    /// re-running an external effect (an SMS) is the operator's call.
    #[default]
    Hold,
    /// Claim it again automatically once the lease has expired (a lease takeover).
    Reclaim,
}

/// What a late duplicate may do: a delivery that creates a new record although cleanup kept
/// the fingerprint of an earlier record of the same message id (DESIGN.md, "Late duplicates").
/// Either way it is counted with its delay and noted on the record it creates.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LateDuplicatePolicy {
    /// Run its handler as for any new message, relying on the business change's own guard
    /// (an order already paid). The default: behaviour as before fingerprints.
    #[default]
    Process,
    /// Hold it for an operator: its record is stored `processing` and parked with its whole
    /// message and the reason, no handler runs, and the delivery is acknowledged. A release
    /// runs it again, a mark-succeeded settles it.
    Hold,
}

/// Longest message id accepted, in bytes. Longer ids make the message poison.
pub const MAX_MESSAGE_ID_BYTES: usize = 512;

/// A business idempotency key, e.g. `ORDER.PAY.202501281000001:1`
/// (`<entity>.<event>.<business key>:<event version>`). Never a per-send UUID: a producer retry
/// must carry the same id.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct MessageId(String);

/// Why a string is not a valid message id or consumer group.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdError {
    /// Empty or only whitespace.
    #[error("{what} is empty")]
    Empty {
        /// `message id` or `consumer group`.
        what: &'static str,
    },
    /// Longer than allowed.
    #[error("{what} is {len} bytes long; the limit is {max}")]
    TooLong {
        /// `message id` or `consumer group`.
        what: &'static str,
        /// Its length in bytes.
        len: usize,
        /// The limit in bytes.
        max: usize,
    },
    /// Contains a control character (newline, NUL, ...) or an invisible formatting one
    /// (bidirectional overrides and isolates, zero-width spaces and joiners, BOM): two ids that
    /// look the same must be the same id.
    #[error("{what} contains a control or invisible formatting character")]
    ControlCharacter {
        /// `message id` or `consumer group`.
        what: &'static str,
    },
    /// Bytes that are not UTF-8 where an id was looked for (a Kafka key or header).
    #[error("{what} is not UTF-8 text")]
    NotText {
        /// Where the id was looked for: `record key`, `message id header`.
        what: &'static str,
    },
}

fn validate(what: &'static str, value: &str, max: usize) -> Result<(), IdError> {
    if value.trim().is_empty() {
        return Err(IdError::Empty { what });
    }
    if value.len() > max {
        return Err(IdError::TooLong { what, len: value.len(), max });
    }
    if value.chars().any(|c| c.is_control() || is_invisible_format(c)) {
        return Err(IdError::ControlCharacter { what });
    }
    Ok(())
}

/// Unicode format characters that change how text shows without showing themselves: Arabic
/// letter mark, zero-width space/joiners and marks, bidirectional embeddings, overrides and
/// isolates, word joiner and invisible operators, byte-order mark.
fn is_invisible_format(c: char) -> bool {
    matches!(c, '\u{061C}' | '\u{200B}'..='\u{200F}' | '\u{202A}'..='\u{202E}' | '\u{2060}'..='\u{2064}'
        | '\u{2066}'..='\u{2069}' | '\u{FEFF}')
}

impl MessageId {
    /// Validates a message id: non-empty, at most [`MAX_MESSAGE_ID_BYTES`], no control characters.
    pub fn parse(value: impl Into<String>) -> Result<Self, IdError> {
        let value = value.into();
        validate("message id", &value, MAX_MESSAGE_ID_BYTES)?;
        Ok(MessageId(value))
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The message type: the `<entity>.<event>` part of an id shaped like
    /// `<entity>.<event>.<business key>:<version>` (e.g. `ORDER.PAY`); `None` when the id has
    /// fewer than three dot-separated parts before the version.
    pub(crate) fn message_type(&self) -> Option<&str> {
        let key = self.0.split(':').next().unwrap_or_default();
        let mut dots = key.match_indices('.');
        let _entity_end = dots.next()?;
        let (event_end, _) = dots.next()?;
        Some(&key[..event_end])
    }
}

impl TryFrom<String> for MessageId {
    type Error = IdError;
    fn try_from(value: String) -> Result<Self, Self::Error> {
        MessageId::parse(value)
    }
}

impl From<MessageId> for String {
    fn from(value: MessageId) -> Self {
        value.0
    }
}

impl fmt::Display for MessageId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The name of one logical handler; dedup is scoped per `(consumer_group, message_id)`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct ConsumerGroup(String);

impl ConsumerGroup {
    /// Validates a group name: non-empty, at most 128 bytes, no control characters.
    pub fn parse(value: impl Into<String>) -> Result<Self, IdError> {
        let value = value.into();
        validate("consumer group", &value, 128)?;
        Ok(ConsumerGroup(value))
    }

    /// The group name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for ConsumerGroup {
    type Error = IdError;
    fn try_from(value: String) -> Result<Self, Self::Error> {
        ConsumerGroup::parse(value)
    }
}

impl From<ConsumerGroup> for String {
    fn from(value: ConsumerGroup) -> Self {
        value.0
    }
}

impl fmt::Display for ConsumerGroup {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn message_type_is_entity_and_event() {
        let id = MessageId::parse("ORDER.PAY.202501281000001:1").unwrap();
        assert_eq!(id.message_type(), Some("ORDER.PAY"));
        assert_eq!(MessageId::parse("A.B.C.D:2").unwrap().message_type(), Some("A.B"));
        assert_eq!(MessageId::parse("ORDER.PAY:1").unwrap().message_type(), None);
        assert_eq!(MessageId::parse("plain-id").unwrap().message_type(), None);
    }

    #[test]
    fn bad_ids_are_refused_with_a_reason() {
        assert_eq!(MessageId::parse("  "), Err(IdError::Empty { what: "message id" }));
        for lookalike in ["ORDER.NOTIFY.ZW\u{200B}:1", "ORDER.NOTIFY.\u{202E}1:1YAP\u{202C}:1", "\u{FEFF}ORDER.PAY.1:1"]
        {
            assert_eq!(
                MessageId::parse(lookalike),
                Err(IdError::ControlCharacter { what: "message id" }),
                "{lookalike}"
            );
        }
        assert!(matches!(MessageId::parse("x".repeat(513)), Err(IdError::TooLong { len: 513, .. })));
        assert_eq!(MessageId::parse("a\nb"), Err(IdError::ControlCharacter { what: "message id" }));
        assert!(MessageId::parse("x".repeat(512)).is_ok());
        assert!(ConsumerGroup::parse("").is_err());
    }

    #[test]
    fn statuses_round_trip_and_unknown_is_named() {
        for s in RecordStatus::ALL {
            assert_eq!(s.as_str().parse::<RecordStatus>(), Ok(s));
        }
        let err = "done".parse::<RecordStatus>().unwrap_err();
        assert!(err.to_string().contains("\"done\""));
    }
}
