//! A late duplicate held for an operator, as every store writes it (DESIGN.md, "Late
//! duplicates"): a delivery whose fingerprint cleanup kept, parked under the group's `hold`
//! policy instead of a handler call.

use chrono::{DateTime, Utc};

use crate::message::{IdSourceKind, InboundMessage};
use crate::record::{ConsumerGroup, HandlerMode, MessageId};

/// The error class of a held late duplicate.
pub const LATE_DUPLICATE_CLASS: &str = "LATE_DUPLICATE";

/// A delivery to hold as a late duplicate.
pub(crate) struct HeldDelivery<'a> {
    pub group: &'a ConsumerGroup,
    pub message_id: &'a MessageId,
    pub message_type: &'a str,
    pub handler_mode: HandlerMode,
    pub max_attempts: i32,
    pub payload_hash: &'a [u8],
    pub message: &'a InboundMessage,
    /// Where its message id came from.
    pub id_source: IdSourceKind,
    /// When the deleted record of the same message id was first seen.
    pub first_seen_at: DateTime<Utc>,
}

impl HeldDelivery<'_> {
    /// The held record's `last_error`: what it is, and what an operator does with it.
    pub(crate) fn reason(&self) -> String {
        format!(
            "late duplicate: a copy of a message first seen at {}, whose record cleanup deleted; held for an operator \
             (late_duplicates = \"hold\"): release it to run it again, or mark it succeeded",
            self.first_seen_at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
        )
    }
}
