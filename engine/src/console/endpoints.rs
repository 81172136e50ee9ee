//! HTTP handlers as the console shows them (DESIGN.md, "What the console shows"): each
//! endpoint's recent calls by answer class with its success rate and latency (the overview's
//! endpoint cards), the answer class of one attempt (the record page) and of a dead letter (the
//! dead letters page).
//!
//! An endpoint is one HTTP handler: a consumer group and a message type
//! ([`crate::console::HttpEndpoint`]). A **call** is an attempt row with an answer or a
//! transport error: its `latency_ms` is set (the handler reported the call, see
//! [`crate::handler::EffectAnswer`]). Read by one [`EndpointReads`] per database
//! (`store/postgres/endpoints.rs`, `store/mysql/endpoints.rs`).

use async_trait::async_trait;
use chrono::{DateTime, Utc};

use super::QueryError;

/// The window of an endpoint card, in seconds: calls started in the last 15 minutes.
pub const WINDOW_SECS: i64 = 15 * 60;

/// Most calls an endpoint card reads: its newest this many in the window, which bounds the
/// query however busy the endpoint.
pub const SAMPLE_CALLS: i64 = 5_000;

/// One endpoint's calls of the window (at most its newest [`SAMPLE_CALLS`]), by answer class.
/// The classes follow the answer table of DESIGN.md ("HTTP handlers") and add up to `calls`.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct EndpointCalls {
    /// Consumer group.
    pub consumer_group: String,
    /// Message type.
    pub message_type: String,
    /// Calls read.
    pub calls: i64,
    /// A 2xx the gateway took as success (succeeded, or a late answer after the lease was lost).
    pub succeeded: i64,
    /// 409: the service was still working on the key.
    pub in_progress: i64,
    /// 422: the key was used before with another payload, or the payload failed validation.
    pub conflict: i64,
    /// Any other 4xx but 408, 425 and 429 (410 included), and a 2xx answering `dead`.
    pub refused: i64,
    /// 408, 425, 429 and 5xx: retried.
    pub unavailable: i64,
    /// No answer: a timeout, a refused or reset connection, TLS or DNS.
    pub transport: i64,
    /// Anything else: a redirect, a 2xx asking for a retry or naming an unknown outcome, a
    /// status outside 200–599.
    pub other: i64,
    /// Median latency of the calls read, ms; `None` without calls.
    pub p50_ms: Option<i32>,
    /// 95th percentile latency, ms; `None` without calls.
    pub p95_ms: Option<i32>,
    /// When the oldest call read started: the window's real start when the sample was cut.
    pub oldest_at: Option<DateTime<Utc>>,
}

impl EndpointCalls {
    /// Succeeded calls over calls, 0–1; `None` without calls.
    pub fn success_rate(&self) -> Option<f64> {
        (self.calls > 0).then(|| self.succeeded as f64 / self.calls as f64)
    }

    /// Whether the endpoint had more calls in the window than were read ([`SAMPLE_CALLS`]).
    pub fn sampled(&self) -> bool {
        self.calls >= SAMPLE_CALLS
    }
}

/// The endpoint cards' reads on one database. Errors: [`QueryError::Database`].
#[async_trait]
pub trait EndpointReads: Send + Sync {
    /// The calls of each endpoint `(consumer group, message type)` over the last
    /// [`WINDOW_SECS`] (database clock), at most its newest [`SAMPLE_CALLS`]; one row per
    /// endpoint, in the order given, with zero calls when it had none.
    async fn endpoint_calls(&self, endpoints: &[(&str, &str)]) -> Result<Vec<EndpointCalls>, QueryError>;
}

/// One call as read: its answer's status (`None`: no answer), latency, the attempt's outcome,
/// and when it started.
#[cfg(feature = "mysql")]
pub(crate) struct Call {
    pub(crate) status: Option<i16>,
    pub(crate) latency_ms: i32,
    pub(crate) outcome: Option<String>,
    pub(crate) started_at: DateTime<Utc>,
}

/// The calls of one endpoint summed by the answer table (DESIGN.md, "HTTP handlers"), with the
/// latencies' 50th and 95th percentiles as PostgreSQL's `percentile_disc` takes them (the
/// smallest latency with at least that share of the calls at or below it). PostgreSQL sums in
/// its statement; the conformance suite holds both to the same counts.
#[cfg(feature = "mysql")]
pub(crate) fn tally(consumer_group: &str, message_type: &str, calls: &[Call]) -> EndpointCalls {
    let mut c = EndpointCalls {
        consumer_group: consumer_group.to_owned(),
        message_type: message_type.to_owned(),
        calls: calls.len() as i64,
        succeeded: 0,
        in_progress: 0,
        conflict: 0,
        refused: 0,
        unavailable: 0,
        transport: 0,
        other: 0,
        p50_ms: None,
        p95_ms: None,
        oldest_at: calls.iter().map(|c| c.started_at).min(),
    };
    for call in calls {
        let outcome = call.outcome.as_deref();
        let Some(status) = call.status else {
            c.transport += 1;
            continue;
        };
        let ok = (200..=299).contains(&status);
        let counter = match status {
            _ if ok && outcome == Some("dead") => &mut c.refused,
            _ if ok && outcome == Some("failed") => &mut c.other,
            _ if ok => &mut c.succeeded,
            409 => &mut c.in_progress,
            422 => &mut c.conflict,
            408 | 425 | 429 | 500..=599 => &mut c.unavailable,
            400..=499 => &mut c.refused,
            _ => &mut c.other,
        };
        *counter += 1;
    }
    let mut latencies: Vec<i32> = calls.iter().map(|c| c.latency_ms).collect();
    latencies.sort_unstable();
    let percentile = |p: f64| {
        let rank = ((p * latencies.len() as f64).ceil() as usize).max(1);
        latencies.get(rank - 1).copied()
    };
    (c.p50_ms, c.p95_ms) = (percentile(0.5), percentile(0.95));
    c
}

/// The error kind of an error text: its leading code before the `:` (`HTTP_CONFLICT` of
/// `HTTP_CONFLICT: HTTP 422 …`, as [`crate::handler::HandlerError`] writes `<class>:
/// <detail>`); `None` when the text does not start with one. For an HTTP handler's attempt it
/// is the answer class the answer table names.
pub fn error_kind(text: &str) -> Option<&str> {
    let (kind, _) = text.split_once(':')?;
    let code = !kind.is_empty() && kind.bytes().all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_');
    code.then_some(kind)
}

/// How an HTTP handler's dead letter came to be, from its error class (DESIGN.md, "HTTP
/// handlers"): the dead letters page groups them so, beside the error classes of Rust handlers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeadLetterClass {
    /// 422: the key was used before with another payload, or the payload failed validation
    /// (`HTTP_CONFLICT`).
    Conflict,
    /// Refused: another 4xx (`HTTP_REFUSED`, dead at once; `HTTP_GONE`, a 410, which pauses
    /// the handler and is not counted, should one still end dead) or a 2xx answering `dead`
    /// (`HTTP_DEAD`).
    Refused,
    /// Retried answers (5xx, 408, 425, 429, 409 past its limit, redirects, 2xx asking for a
    /// retry) until the attempts ran out: a retryable failure is dead only at `max_attempts`.
    Exhausted,
    /// Calls without an answer (timeouts, connection errors) until the attempts ran out.
    Transport,
}

/// The error classes an HTTP handler writes (`engine/src/http/answer.rs`; each is the kind
/// alone) and the dead-letter class of each.
const HTTP_ERROR_CLASSES: [(&str, DeadLetterClass); 14] = [
    ("HTTP_CONFLICT", DeadLetterClass::Conflict),
    ("HTTP_REFUSED", DeadLetterClass::Refused),
    ("HTTP_GONE", DeadLetterClass::Refused),
    ("HTTP_DEAD", DeadLetterClass::Refused),
    ("HTTP_UNAVAILABLE", DeadLetterClass::Exhausted),
    ("HTTP_IN_PROGRESS", DeadLetterClass::Exhausted),
    ("HTTP_RETRY", DeadLetterClass::Exhausted),
    ("HTTP_UNKNOWN_OUTCOME", DeadLetterClass::Exhausted),
    ("HTTP_REDIRECT", DeadLetterClass::Exhausted),
    ("HTTP_UNEXPECTED", DeadLetterClass::Exhausted),
    ("HTTP_CLOSED", DeadLetterClass::Exhausted),
    ("HTTP_TIMEOUT", DeadLetterClass::Transport),
    ("HTTP_CONNECT", DeadLetterClass::Transport),
    ("HTTP_TRANSPORT", DeadLetterClass::Transport),
];

impl DeadLetterClass {
    /// The class of a dead letter's error class; `None` for one no HTTP handler writes.
    pub fn of(error_class: &str) -> Option<Self> {
        HTTP_ERROR_CLASSES.iter().find(|(c, _)| *c == error_class).map(|(_, class)| *class)
    }

    /// `conflict`, `refused`, `exhausted` or `transport`.
    pub fn as_str(self) -> &'static str {
        match self {
            DeadLetterClass::Conflict => "conflict",
            DeadLetterClass::Refused => "refused",
            DeadLetterClass::Exhausted => "exhausted",
            DeadLetterClass::Transport => "transport",
        }
    }

    /// The error classes HTTP handlers write (what [`DeadLetterClass::of`] knows).
    pub(crate) fn http_error_classes() -> Vec<&'static str> {
        HTTP_ERROR_CLASSES.iter().map(|(c, _)| *c).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_kinds_are_leading_codes() {
        assert_eq!(error_kind("HTTP_CONFLICT: HTTP 422 Unprocessable Entity: x"), Some("HTTP_CONFLICT"));
        assert_eq!(error_kind("LOYALTY_API: status # from #"), Some("LOYALTY_API"));
        assert_eq!(error_kind("the lease expired; taken over by h:1:0"), None);
        assert_eq!(error_kind("Error: lower case"), None);
        assert_eq!(error_kind(": nothing"), None);
    }

    #[test]
    fn http_error_classes_map_to_dead_letter_classes() {
        assert_eq!(DeadLetterClass::of("HTTP_CONFLICT"), Some(DeadLetterClass::Conflict));
        assert_eq!(DeadLetterClass::of("HTTP_GONE"), Some(DeadLetterClass::Refused));
        assert_eq!(DeadLetterClass::of("HTTP_UNAVAILABLE"), Some(DeadLetterClass::Exhausted));
        assert_eq!(DeadLetterClass::of("HTTP_TIMEOUT"), Some(DeadLetterClass::Transport));
        assert_eq!(DeadLetterClass::of("MEMBER_NOT_FOUND"), None);
        assert_eq!(DeadLetterClass::of("HTTP_CONFLICT: with a detail"), None, "HTTP classes are the kind alone");
    }
}
