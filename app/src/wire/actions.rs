//! Requests and results of the operator actions (server functions and the REST API alike).

use serde::{Deserialize, Serialize};

/// A single-record operator action.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[cfg_attr(feature = "ssr", derive(utoipa::ToSchema))]
pub enum RecordActionKind {
    /// `processing` (stuck) → `failed`, lease cleared, claimable.
    Release,
    /// `processing`, `failed` or `dead` → `succeeded` (the operator verified the effect).
    MarkSucceeded,
    /// `processing` or `failed` → `dead`.
    DeadLetter,
    /// `failed` or `dead`: republish the stored message, make the record claimable.
    Requeue,
}

impl RecordActionKind {
    /// The actions that apply to a record in `status`, in the order the UI shows them.
    pub fn for_status(status: &str) -> &'static [RecordActionKind] {
        use RecordActionKind::*;
        match status {
            "processing" => &[Release, MarkSucceeded, DeadLetter],
            "failed" => &[Requeue, MarkSucceeded, DeadLetter],
            "dead" => &[Requeue, MarkSucceeded],
            _ => &[],
        }
    }

    /// Button text, e.g. `Mark succeeded`.
    pub fn label(self) -> &'static str {
        match self {
            RecordActionKind::Release => "Release",
            RecordActionKind::MarkSucceeded => "Mark succeeded",
            RecordActionKind::DeadLetter => "Dead-letter",
            RecordActionKind::Requeue => "Requeue",
        }
    }

    /// What it does, for the confirmation dialog.
    pub fn consequence(self) -> &'static str {
        match self {
            RecordActionKind::Release => {
                "The record becomes failed with its lease cleared: the next delivery or a requeue claims it and \
                 runs the handler again."
            }
            RecordActionKind::MarkSucceeded => {
                "The record becomes succeeded and its stored payload is dropped: the handler never runs for it \
                 again. Only do this when you verified the effect happened."
            }
            RecordActionKind::DeadLetter => "The record becomes dead (payload kept) and waits for an operator.",
            RecordActionKind::Requeue => {
                "The stored payload, headers and message id are published again to the original exchange and \
                 routing key, and the record becomes claimable."
            }
        }
    }

    /// Whether a reason must be given.
    pub fn needs_reason(self) -> bool {
        !matches!(self, RecordActionKind::Requeue)
    }
}

/// The body of `POST /api/v1/records/{id}/<action>` and of the console's action calls: what the
/// operator was shown, and why.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "ssr", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct RecordActionRequest {
    /// The status shown (`processing`, `failed`, `dead`); refused with 409 when the record has
    /// moved on. Omitted: any status the action accepts.
    #[serde(default)]
    pub expected_status: Option<String>,
    /// The lease token shown with a `processing` record (UUID); required for one.
    #[serde(default)]
    pub lease_token: Option<String>,
    /// The record's `version` as shown (record detail); refused with 409 when the record changed
    /// since. Without it, two identical requeues of a `failed` record sent at the same moment
    /// may both publish a copy (its status does not change).
    #[serde(default)]
    pub expected_version: Option<i64>,
    /// Act although the lease has not expired (its worker may still be running).
    #[serde(default)]
    pub force: bool,
    /// Why. Required for release, mark succeeded and dead-letter.
    #[serde(default)]
    pub reason: Option<String>,
    /// Release only: publish the stored message again at once.
    #[serde(default)]
    pub requeue: bool,
}

/// A completed action.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "ssr", derive(utoipa::ToSchema))]
pub struct ActionResultView {
    /// Record id.
    pub record_id: i64,
    /// Its consumer group.
    pub consumer_group: String,
    /// Its message id.
    pub message_id: String,
    /// The status it had.
    pub from: String,
    /// The status it has now.
    pub status: String,
    /// Whether the stored message was published again.
    pub republished: bool,
    /// The audit entry's id.
    pub audit_id: i64,
}
