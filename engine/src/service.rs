//! The external services the engine depends on, named the way an operator knows them. Used in
//! start-up errors and health reports. How to start a service is the host's to say (it knows
//! its machines): [`crate::health::HealthProbes::with_start_hints`].

use std::fmt;

/// One external dependency of the product.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Service {
    /// The dedup store and the business tables. Required: the server refuses to start without it.
    PostgreSql,
    /// The dedup store and the business tables on MySQL 8 or MariaDB (the engine's feature
    /// `mysql`). Required, as PostgreSQL.
    MySql,
    /// The fast-path duplicate markers. Optional at run time: a Redis outage makes every lookup
    /// fall through to the database.
    Redis,
    /// The message broker the embedded consumer reads from (the default source).
    RabbitMq,
    /// The Kafka cluster the embedded consumer reads from when `consumer.source = "kafka"`.
    Kafka,
}

impl Service {
    /// Stable lowercase key, used in JSON (`/readyz`) and metric labels.
    pub(crate) fn key(self) -> &'static str {
        match self {
            Service::PostgreSql | Service::MySql => "database",
            Service::Redis => "redis",
            Service::RabbitMq | Service::Kafka => "broker",
        }
    }
}

impl fmt::Display for Service {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Service::PostgreSql => "PostgreSQL",
            Service::MySql => "MySQL",
            Service::Redis => "Redis",
            Service::RabbitMq => "RabbitMQ",
            Service::Kafka => "Kafka",
        })
    }
}

/// Returns `url` with its password (if any) replaced by `***`, for logs and error messages.
///
/// A string that does not parse as a URL is returned as `<unparsable URL>` rather than echoed,
/// since it may still contain a secret; so is one without a host that holds an `@`
/// (`mysql:root:secret@host/db` parses as a path, whose password the URL parser does not see).
pub fn redact_url(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(parsed) if parsed.host().is_none() && url.contains('@') => "<unparsable URL>".to_owned(),
        Ok(mut parsed) => {
            if parsed.password().is_some() {
                // Cannot fail: a URL with a password has a host.
                let _ = parsed.set_password(Some("***"));
            }
            parsed.to_string()
        }
        Err(_) => "<unparsable URL>".to_owned(),
    }
}

/// A dependency could not be reached. Its `Display` names the service, the redacted URL and the
/// cause.
#[derive(Debug, thiserror::Error)]
#[error("{service} is unreachable at {url}: {cause}")]
pub struct Unreachable {
    /// Which dependency.
    pub service: Service,
    /// The URL tried, password redacted.
    pub url: String,
    /// The underlying error, flattened to text (with its source chain).
    pub cause: String,
}

impl Unreachable {
    /// Builds the error from a raw URL (redacted here) and any error (its chain is kept, each
    /// cause once: [`error_chain`]).
    pub fn new(service: Service, raw_url: &str, cause: impl Into<anyhow::Error>) -> Self {
        Self { service, url: redact_url(raw_url), cause: error_chain(&cause.into()) }
    }
}

/// `error` and its causes joined by `": "` (as `{:#}` prints them), leaving out a cause whose
/// text the ones before it already hold: sqlx's errors print their source themselves (`error
/// returned from database: 1045 (28000): Access denied …` has the source `1045 (28000): Access
/// denied …`), so the plain chain says each database refusal twice. For a command line's or a
/// log's last word on an error.
pub fn error_chain(error: &anyhow::Error) -> String {
    let mut text = String::new();
    for cause in error.chain().map(ToString::to_string) {
        if text.contains(&cause) {
            continue;
        }
        if !text.is_empty() {
            text.push_str(": ");
        }
        text.push_str(&cause);
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redact_hides_password_and_keeps_the_rest() {
        assert_eq!(redact_url("amqp://guest:s3cret@127.0.0.1:5672/%2f"), "amqp://guest:***@127.0.0.1:5672/%2f");
        assert_eq!(redact_url("redis://127.0.0.1:6379"), "redis://127.0.0.1:6379");
        assert_eq!(redact_url("not a url s3cret"), "<unparsable URL>");
        assert_eq!(redact_url("mysql:root:s3cret@127.0.0.1:3306/db"), "<unparsable URL>");
        assert_eq!(redact_url("mysql:/db"), "mysql:/db");
    }

    #[test]
    fn a_cause_the_error_already_says_is_not_repeated() {
        #[derive(Debug, thiserror::Error)]
        #[error("error returned from database: {0}")]
        struct Outer(#[source] Inner);
        #[derive(Debug, thiserror::Error)]
        #[error("1045 (28000): Access denied for user 'x'")]
        struct Inner;
        let error = Unreachable::new(Service::MySql, "mysql://x@h/db", Outer(Inner));
        assert_eq!(error.cause, "error returned from database: 1045 (28000): Access denied for user 'x'");
        let wrapped = anyhow::Error::new(Inner).context("connecting");
        assert_eq!(
            Unreachable::new(Service::MySql, "mysql://x@h/db", wrapped).cause,
            "connecting: 1045 (28000): Access denied for user 'x'"
        );
    }

    #[test]
    fn unreachable_names_service_and_url_and_hides_the_password() {
        let err = Unreachable::new(Service::Redis, "redis://:pw@127.0.0.1:6390", anyhow::anyhow!("connection refused"));
        let text = err.to_string();
        assert!(text.starts_with("Redis is unreachable at redis://:***@127.0.0.1:6390"), "{text}");
        assert!(text.contains("connection refused"), "{text}");
        assert!(!text.contains("pw@"), "{text}");
    }
}
