//! Wire types of the Handlers page and `/api/v1/handlers`: each handler's pause state, and the
//! operator's pause and resume.

use serde::{Deserialize, Serialize};

/// One handler (consumer group, message type) and whether it takes deliveries.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "ssr", derive(utoipa::ToSchema))]
pub struct HandlerView {
    /// The consumer group.
    pub consumer_group: String,
    /// The message type it handles.
    pub message_type: String,
    /// `http`, `leased` or `transactional`, as a running engine last registered it.
    pub kind: Option<String>,
    /// `running`; `breaker` (paused by its circuit breaker, probed every probe interval);
    /// `gone` (paused by a 410 answer until an operator resumes it); `operator` (paused by hand).
    pub state: String,
    /// When the state began, RFC 3339.
    pub since: String,
    /// Who set it: `user:<name>`, `cli:<os user>`, or `engine`.
    pub changed_by: Option<String>,
    /// Why: the operator's reason, or the failure that paused it.
    pub reason: Option<String>,
    /// The last failure that paused it or kept it paused: class, HTTP status (none: no answer)
    /// and when (RFC 3339).
    pub error_class: Option<String>,
    /// See `error_class`.
    pub http_status: Option<i16>,
    /// See `error_class`.
    pub failed_at: Option<String>,
    /// `breaker`: when the next probe is due, RFC 3339.
    pub probe_at: Option<String>,
    /// Raised by every change; send it back as `expected_version`.
    pub version: i64,
}

impl HandlerView {
    /// Whether its deliveries are held.
    pub fn paused(&self) -> bool {
        self.state != "running"
    }
}

/// Pause or resume.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[cfg_attr(feature = "ssr", derive(utoipa::ToSchema))]
pub enum HandlerControlKind {
    /// `running` or `breaker` → `operator`: its deliveries wait in the broker until resumed.
    Pause,
    /// `breaker`, `gone` or `operator` → `running`.
    Resume,
}

impl HandlerControlKind {
    /// The button's label.
    pub fn label(self) -> &'static str {
        match self {
            HandlerControlKind::Pause => "Pause",
            HandlerControlKind::Resume => "Resume",
        }
    }
}

/// The body of `POST /api/v1/handlers/{group}/{type}/pause` and `.../resume`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "ssr", derive(utoipa::ToSchema))]
#[serde(default, deny_unknown_fields)]
pub struct HandlerControlRequest {
    /// Why (required).
    pub reason: Option<String>,
    /// The version shown: refused (409) when the handler changed since.
    pub expected_version: Option<i64>,
}
