//! HTTP handlers as the console shows them (DESIGN.md, "What the console shows"): each
//! endpoint's recent calls by answer class with its success rate and latency (the overview's
//! endpoint cards), the answer class of one attempt (the record page) and of a dead letter (the
//! dead letters page).
//!
//! An endpoint is one HTTP handler: a consumer group and a message type
//! ([`crate::console::HttpEndpoint`]). A **call** is an attempt row with an answer or a
//! transport error: its `latency_ms` is set (the handler reported the call, see
//! [`crate::handler::EffectAnswer`]).

use chrono::{DateTime, Utc};
use sqlx::PgExecutor;

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

/// Per endpoint, its newest calls of the window, classified and summed in the database. One
/// statement for all endpoints; each endpoint is one backward range of the partial index
/// `record_attempts_endpoint_calls_idx` (group, type, started_at DESC) INCLUDE (answer_status,
/// latency_ms, outcome), read index-only and cut at [`SAMPLE_CALLS`], and summed inside its
/// lateral subquery (an aggregate without `GROUP BY`: one row, zeros without calls), which
/// halved the time against one `GROUP BY` over all endpoints' rows (BENCHMARKS.md).
const ENDPOINT_CALLS_SQL: &str = r#"
SELECT e.consumer_group, e.message_type, s.*
FROM unnest($1::text[], $2::text[]) WITH ORDINALITY AS e(consumer_group, message_type, n)
CROSS JOIN LATERAL (
    SELECT count(*) AS calls,
           count(*) FILTER (WHERE c.answer_status BETWEEN 200 AND 299
                                  AND c.outcome IS DISTINCT FROM 'failed' AND c.outcome IS DISTINCT FROM 'dead') AS succeeded,
           count(*) FILTER (WHERE c.answer_status = 409) AS in_progress,
           count(*) FILTER (WHERE c.answer_status = 422) AS conflict,
           count(*) FILTER (WHERE (c.answer_status BETWEEN 400 AND 499
                                   AND c.answer_status NOT IN (408, 409, 422, 425, 429))
                                  OR (c.answer_status BETWEEN 200 AND 299 AND c.outcome = 'dead')) AS refused,
           count(*) FILTER (WHERE c.answer_status IN (408, 425, 429) OR c.answer_status BETWEEN 500 AND 599) AS unavailable,
           count(*) FILTER (WHERE c.answer_status IS NULL) AS transport,
           count(*) FILTER (WHERE c.answer_status NOT BETWEEN 200 AND 599
                                  OR c.answer_status BETWEEN 300 AND 399
                                  OR (c.answer_status BETWEEN 200 AND 299 AND c.outcome = 'failed')) AS other,
           percentile_disc(0.5) WITHIN GROUP (ORDER BY c.latency_ms) AS p50_ms,
           percentile_disc(0.95) WITHIN GROUP (ORDER BY c.latency_ms) AS p95_ms,
           min(c.started_at) AS oldest_at
    FROM (
        SELECT a.answer_status, a.latency_ms, a.outcome, a.started_at FROM record_attempts a
        WHERE a.consumer_group = e.consumer_group AND a.message_type = e.message_type
          AND a.latency_ms IS NOT NULL AND a.started_at > now() - $3 * interval '1 second'
        ORDER BY a.started_at DESC
        LIMIT $4
    ) c
) s
ORDER BY e.n
"#;

/// The calls of each endpoint `(consumer group, message type)` over the last [`WINDOW_SECS`]
/// (database clock), at most its newest [`SAMPLE_CALLS`]; one row per endpoint, in the order
/// given, with zero calls when it had none.
///
/// Errors: [`QueryError::Database`].
pub async fn endpoint_calls<'e>(
    db: impl PgExecutor<'e>,
    endpoints: &[(&str, &str)],
) -> Result<Vec<EndpointCalls>, QueryError> {
    if endpoints.is_empty() {
        return Ok(Vec::new());
    }
    let (groups, types): (Vec<&str>, Vec<&str>) = endpoints.iter().copied().unzip();
    Ok(sqlx::query_as(ENDPOINT_CALLS_SQL)
        .bind(groups)
        .bind(types)
        .bind(WINDOW_SECS)
        .bind(SAMPLE_CALLS)
        .fetch_all(db)
        .await?)
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
