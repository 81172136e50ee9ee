//! Stuck, retries and dead-letter wire types.

use serde::{Deserialize, Serialize};

use super::records::RecordSummary;

/// A processing record whose lease expired (database clock).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "ssr", derive(utoipa::ToSchema))]
pub struct StuckRecordView {
    /// Record id.
    pub id: i64,
    /// Consumer group.
    pub consumer_group: String,
    /// Message id.
    pub message_id: String,
    /// Message type.
    pub message_type: String,
    /// `transactional` or `leased`.
    pub handler_mode: Option<String>,
    /// The worker that held the lease.
    pub lease_owner: Option<String>,
    /// The lease token an action on this record must present (UUID).
    pub lease_token: String,
    /// When the lease expired, RFC 3339.
    pub lease_expires_at: String,
    /// Seconds since then.
    pub stuck_secs: i64,
    /// Attempts so far.
    pub attempts: i32,
    /// Attempts allowed.
    pub max_attempts: i32,
    /// Re-entries into processing after an expired lease.
    pub reentries: i32,
    /// The record keeps re-entering processing (crash loop).
    pub crash_loop: bool,
    /// When a redelivery was parked on it, RFC 3339.
    pub parked_at: Option<String>,
}

/// Stuck records, longest stuck first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "ssr", derive(utoipa::ToSchema))]
pub struct StuckView {
    /// How many records are stuck.
    pub total: i64,
    /// The longest stuck of them.
    pub rows: Vec<StuckRecordView>,
}

/// Failed records that have made `attempts` attempts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "ssr", derive(utoipa::ToSchema))]
pub struct AttemptsBucketView {
    /// Attempts made.
    pub attempts: i32,
    /// Failed records with that many.
    pub records: i64,
}

/// Retries of one message type among failed records.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "ssr", derive(utoipa::ToSchema))]
pub struct TypeRetriesView {
    /// Message type.
    pub message_type: String,
    /// Failed records.
    pub records: i64,
    /// Their attempts, summed.
    pub attempts: i64,
    /// Most attempts of one record.
    pub max_attempts: i32,
}

/// The retries page.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "ssr", derive(utoipa::ToSchema))]
pub struct RetriesView {
    /// Failed records by attempts made.
    pub distribution: Vec<AttemptsBucketView>,
    /// The most retried message types.
    pub top_types: Vec<TypeRetriesView>,
    /// The soonest due retry, RFC 3339.
    pub next_retry_at: Option<String>,
    /// Failed records with the most attempts.
    pub most_retried: Vec<RecordSummary>,
}

/// Dead letters sharing an error class.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "ssr", derive(utoipa::ToSchema))]
pub struct DeadLetterGroupView {
    /// Error kind + first line (numbers masked); `None` when the records have none.
    pub error_class: Option<String>,
    /// Dead records in the group.
    pub records: i64,
    /// Earliest first seen, RFC 3339.
    pub first_seen_at: String,
    /// Latest change, RFC 3339.
    pub last_seen_at: String,
    /// Their message types.
    pub message_types: Vec<String>,
    /// For the error classes of HTTP handlers, how the dead letters came to be: `conflict`
    /// (422), `refused` (another 4xx, or a 2xx answering `dead`), `exhausted` (retried answers
    /// until `max_attempts`), `transport` (timeouts, connection errors until `max_attempts`);
    /// `None` for the error classes of other handlers.
    pub answer_class: Option<String>,
}
