//! What the service's answer decides (docs/DESIGN.md, "HTTP handlers", the answer table): the
//! status, the `Dedup-Outcome` header or JSON `status` of a 2xx, `Retry-After`, `Location`.
//! Every verdict is a [`HandlerError`] of the engine's own kinds (retryable, permanent, in
//! progress, retry after): the pipeline's retry, back-off and dead-letter machinery does the rest.

use std::time::{Duration, SystemTime};

use reqwest::StatusCode;
use reqwest::header::{HeaderMap, LOCATION, RETRY_AFTER};

use crate::handler::HandlerError;

/// Response header by which a service overrides the success of a 2xx: `retry` or `dead`.
pub const DEDUP_OUTCOME: &str = "dedup-outcome";

/// The part of a response body kept as its excerpt (attempt history, dead-letter reason), in
/// bytes.
pub const EXCERPT_BYTES: usize = 2048;

/// Longest body read: enough for a `{"status": ...}` verdict; a longer one is not read further
/// (the connection is then closed, not reused) and its verdict is its status alone.
pub(crate) const MAX_BODY_BYTES: usize = 64 * 1024;

/// The settings the verdicts depend on.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    /// How long a run of 409 answers is not counted.
    pub in_progress_within: Duration,
    /// `Retry-After` is clamped to `[retry_after_min, retry_after_max]`.
    pub retry_after_min: Duration,
    /// See `retry_after_min`.
    pub retry_after_max: Duration,
    /// How long a delivery answered 410 waits before it is judged again (the probe interval;
    /// the handler is paused meanwhile).
    pub paused_for: Duration,
}

/// How long an unbroken run of 410 answers on one record is not counted: in practice always
/// (each one pauses the handler, and only an operator resumes it).
const GONE_UNCOUNTED: Duration = Duration::from_secs(366 * 24 * 3600);

/// A response as far as it was read.
pub(crate) struct Answer<'a> {
    pub status: StatusCode,
    pub headers: &'a HeaderMap,
    pub body: &'a [u8],
    /// The body was longer than [`MAX_BODY_BYTES`]: `body` is its start.
    pub body_cut: bool,
}

/// The first [`EXCERPT_BYTES`] of `body` as text (invalid UTF-8 replaced, cut on a character).
pub(crate) fn excerpt(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(&body[..body.len().min(EXCERPT_BYTES)]).into_owned();
    if body.len() > EXCERPT_BYTES {
        // A multi-byte character cut in two reads as U+FFFD at the end: drop it.
        text.trim_end_matches('\u{FFFD}').to_owned()
    } else {
        text
    }
}

/// `HTTP 503 Service Unavailable`.
fn status_line(status: StatusCode) -> String {
    match status.canonical_reason() {
        Some(reason) => format!("HTTP {} {reason}", status.as_u16()),
        None => format!("HTTP {}", status.as_u16()),
    }
}

/// The verdict on an answer: `Ok` for success, else the failure the pipeline records.
pub(crate) fn judge(answer: &Answer<'_>, limits: &Limits) -> Result<(), HandlerError> {
    let status = answer.status;
    let line = status_line(status);
    // The body excerpt goes on a second line of the detail, after what happened; dead letters
    // are grouped by the class alone.
    let with_body = |text: String| {
        let body = excerpt(answer.body);
        if body.is_empty() { text } else { format!("{text}\n{body}") }
    };
    let retry_after = || retry_after(answer.headers, SystemTime::now()).map(|d| clamp(d, limits));
    let retryable = |kind: &'static str, text: String| {
        let error = HandlerError::retryable(kind, text);
        match retry_after() {
            Some(delay) => error.retry_after(delay),
            None => error,
        }
    };
    match status.as_u16() {
        200..=299 => match override_of(answer) {
            None => Ok(()),
            Some(Override::Retry(how)) => {
                Err(retryable("HTTP_RETRY", format!("{line} with {how}: the service asks for a retry")))
            }
            Some(Override::Dead(how)) => Err(HandlerError::permanent(
                "HTTP_DEAD",
                with_body(format!("{line} with {how}: the service refuses it")),
            )),
            Some(Override::Unknown(how)) => Err(retryable(
                "HTTP_UNKNOWN_OUTCOME",
                format!("{line} with {how}: not an outcome the gateway knows (retry, dead); retried"),
            )),
        },
        409 => {
            let error = HandlerError::in_progress(
                "HTTP_IN_PROGRESS",
                format!("{line}: the service is still working on this key; retried without counting the attempt"),
                limits.in_progress_within,
            );
            Err(match retry_after() {
                Some(delay) => error.retry_after(delay),
                None => error,
            })
        }
        422 => Err(HandlerError::permanent(
            "HTTP_CONFLICT",
            with_body(format!(
                "{line}: unprocessable: the key was used before with another payload, or the service's validation refused the payload; a retry cannot change it"
            )),
        )),
        // Standard Webhooks: the endpoint is gone. The handler pauses (the pipeline's pause
        // states) and the delivery is not burned: its attempt is not counted, and it waits
        // with the other held ones until an operator resumes the handler.
        410 => Err(HandlerError::in_progress(
            "HTTP_GONE",
            with_body(format!(
                "{line}: the endpoint is gone; the handler is paused until an operator resumes it, and this delivery waits (not counted)"
            )),
            GONE_UNCOUNTED,
        )
        .retry_after(limits.paused_for)),
        408 | 425 | 429 | 500..=599 => Err(retryable("HTTP_UNAVAILABLE", with_body(line))),
        400..=499 => Err(HandlerError::permanent("HTTP_REFUSED", with_body(line))),
        300..=399 => {
            let location = answer
                .headers
                .get(LOCATION)
                .map(|l| String::from_utf8_lossy(l.as_bytes()).chars().take(500).collect::<String>());
            let text = match location {
                Some(l) => format!("{line}: redirects are not followed; Location: {l}"),
                None => format!("{line}: redirects are not followed; no Location"),
            };
            Err(retryable("HTTP_REDIRECT", text))
        }
        _ => Err(retryable("HTTP_UNEXPECTED", with_body(format!("{line}: not a final status the gateway knows")))),
    }
}

/// How a 2xx overrides its success.
enum Override {
    Retry(String),
    Dead(String),
    Unknown(String),
}

/// The `Dedup-Outcome` header, else a JSON body's `status` (`RETRY`, `DEAD`; `SUCCESS` or none
/// is success), both without regard to case. A body cut short is not parsed.
fn override_of(answer: &Answer<'_>) -> Option<Override> {
    if let Some(value) = answer.headers.get(DEDUP_OUTCOME) {
        let value = String::from_utf8_lossy(value.as_bytes()).trim().to_owned();
        let how = format!("Dedup-Outcome: {value}");
        return match value.to_ascii_lowercase().as_str() {
            "retry" => Some(Override::Retry(how)),
            "dead" => Some(Override::Dead(how)),
            "success" | "succeeded" => None,
            _ => Some(Override::Unknown(how)),
        };
    }
    if answer.body_cut || answer.body.is_empty() {
        return None;
    }
    let json: serde_json::Value = serde_json::from_slice(answer.body).ok()?;
    let status = json.get("status")?.as_str()?;
    let how = format!("{{\"status\": {status:?}}}");
    match status.to_ascii_uppercase().as_str() {
        "RETRY" => Some(Override::Retry(how)),
        "DEAD" => Some(Override::Dead(how)),
        "SUCCESS" | "SUCCEEDED" | "OK" => None,
        _ => Some(Override::Unknown(how)),
    }
}

/// `Retry-After` (RFC 9110 §10.2.3): delay-seconds, or an HTTP-date from `now` (a past date is
/// no delay). `None` when absent or unreadable.
pub(crate) fn retry_after(headers: &HeaderMap, now: SystemTime) -> Option<Duration> {
    let value = headers.get(RETRY_AFTER)?.to_str().ok()?.trim();
    if let Ok(seconds) = value.parse::<u64>() {
        return Some(Duration::from_secs(seconds));
    }
    let at = chrono::DateTime::parse_from_rfc2822(value).ok()?;
    let at = SystemTime::UNIX_EPOCH + Duration::from_secs(u64::try_from(at.timestamp()).ok()?);
    Some(at.duration_since(now).unwrap_or_default())
}

fn clamp(delay: Duration, limits: &Limits) -> Duration {
    delay.clamp(limits.retry_after_min, limits.retry_after_max.max(limits.retry_after_min))
}

/// The verdict on a call that got no answer: retried, like a 503.
pub(crate) fn transport(error: reqwest::Error, timeout: Duration) -> HandlerError {
    if error.is_timeout() {
        return HandlerError::retryable("HTTP_TIMEOUT", format!("no answer within {} ms", timeout.as_millis()));
    }
    // Without the URL: it may carry a query string the team considers private.
    let error = error.without_url();
    let mut text = error.to_string();
    let mut source = std::error::Error::source(&error);
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    let kind = if error.is_connect() { "HTTP_CONNECT" } else { "HTTP_TRANSPORT" };
    HandlerError::retryable(kind, text)
}

#[cfg(test)]
mod tests {
    use super::*;
    use reqwest::header::HeaderValue;

    #[test]
    fn retry_after_reads_seconds_and_dates() {
        let mut h = HeaderMap::new();
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000_000);
        h.insert(RETRY_AFTER, HeaderValue::from_static("120"));
        assert_eq!(retry_after(&h, now), Some(Duration::from_secs(120)));
        // 2001-09-09T01:46:40Z is 1e9 s; ten seconds later:
        h.insert(RETRY_AFTER, HeaderValue::from_static("Sun, 09 Sep 2001 01:46:50 GMT"));
        assert_eq!(retry_after(&h, now), Some(Duration::from_secs(10)));
        h.insert(RETRY_AFTER, HeaderValue::from_static("soon"));
        assert_eq!(retry_after(&h, now), None);
    }

    #[test]
    fn every_failure_has_a_dead_letter_class() {
        use crate::console::endpoints::DeadLetterClass::{self, *};
        let limits = Limits {
            in_progress_within: Duration::from_secs(1),
            retry_after_min: Duration::from_secs(1),
            retry_after_max: Duration::from_secs(2),
            paused_for: Duration::from_secs(1),
        };
        let class = |status: u16, header: Option<&'static str>| {
            let mut headers = HeaderMap::new();
            if let Some(value) = header {
                headers.insert(DEDUP_OUTCOME, HeaderValue::from_static(value));
            }
            let status = StatusCode::from_u16(status).unwrap();
            let error = judge(&Answer { status, headers: &headers, body: b"", body_cut: false }, &limits).unwrap_err();
            DeadLetterClass::of(error.class())
        };
        let expected = [
            (200, Some("retry"), Exhausted),
            (200, Some("dead"), Refused),
            (200, Some("maybe"), Exhausted),
            (302, None, Exhausted),
            (400, None, Refused),
            (404, None, Refused),
            (408, None, Exhausted),
            (409, None, Exhausted),
            (410, None, Refused),
            (422, None, Conflict),
            (429, None, Exhausted),
            (503, None, Exhausted),
            (999, None, Exhausted),
        ];
        for (status, header, dead_letter) in expected {
            assert_eq!(class(status, header), Some(dead_letter), "{status} {header:?}");
        }
        let timeout = HandlerError::retryable("HTTP_TIMEOUT", "");
        assert_eq!(DeadLetterClass::of(timeout.class()), Some(Transport));
    }

    #[test]
    fn excerpts_keep_two_kib_on_a_character() {
        assert_eq!(excerpt(b"short"), "short");
        let long = "é".repeat(2000);
        let cut = excerpt(long.as_bytes());
        assert!(cut.len() <= EXCERPT_BYTES && cut.chars().all(|c| c == 'é'), "{}", cut.len());
    }
}
