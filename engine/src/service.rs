//! The external services the engine depends on, named the way an operator knows them, with the
//! command that starts each one locally. Used in start-up errors and health reports.

use std::fmt;

/// One external dependency of the product.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Service {
    /// The dedup store and the business tables. Required: the server refuses to start without it.
    PostgreSql,
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
    pub fn key(self) -> &'static str {
        match self {
            Service::PostgreSql => "database",
            Service::Redis => "redis",
            Service::RabbitMq | Service::Kafka => "broker",
        }
    }

    /// How to start the service on a Debian machine like the development one
    /// (from `shared/SERVICES.md`).
    pub fn start_hint(self) -> &'static str {
        match self {
            Service::PostgreSql => {
                "check with `pg_isready -h 127.0.0.1`; start with \
                 `pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start`"
            }
            Service::Redis => {
                "check with `redis-cli -h 127.0.0.1 ping`; start with \
                 `redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save \"\" --appendonly no`"
            }
            Service::RabbitMq => "check with `rabbitmq-diagnostics -q ping`; start with `rabbitmq-server -detached`",
            Service::Kafka => {
                "check with `scripts/kafka-broker status`; start the local test broker with `scripts/kafka-broker`"
            }
        }
    }
}

impl fmt::Display for Service {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Service::PostgreSql => "PostgreSQL",
            Service::Redis => "Redis",
            Service::RabbitMq => "RabbitMQ",
            Service::Kafka => "Kafka",
        })
    }
}

/// Returns `url` with its password (if any) replaced by `***`, for logs and error messages.
///
/// A string that does not parse as a URL is returned as `<unparsable URL>` rather than echoed,
/// since it may still contain a secret.
pub fn redact_url(url: &str) -> String {
    match url::Url::parse(url) {
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

/// A dependency could not be reached. Its `Display` names the service, the redacted URL, the
/// cause and how to start the service.
#[derive(Debug, thiserror::Error)]
#[error("{service} is unreachable at {url}: {cause}. {hint}", hint = service.start_hint())]
pub struct Unreachable {
    /// Which dependency.
    pub service: Service,
    /// The URL tried, password redacted.
    pub url: String,
    /// The underlying error, flattened to text (with its source chain).
    pub cause: String,
}

impl Unreachable {
    /// Builds the error from a raw URL (redacted here) and any error (its chain is kept).
    pub fn new(service: Service, raw_url: &str, cause: impl Into<anyhow::Error>) -> Self {
        Self { service, url: redact_url(raw_url), cause: format!("{:#}", cause.into()) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redact_hides_password_and_keeps_the_rest() {
        assert_eq!(redact_url("amqp://guest:s3cret@127.0.0.1:5672/%2f"), "amqp://guest:***@127.0.0.1:5672/%2f");
        assert_eq!(redact_url("redis://127.0.0.1:6379"), "redis://127.0.0.1:6379");
        assert_eq!(redact_url("not a url s3cret"), "<unparsable URL>");
    }

    #[test]
    fn unreachable_names_service_url_and_hint() {
        let err = Unreachable::new(Service::Redis, "redis://:pw@127.0.0.1:6390", anyhow::anyhow!("connection refused"));
        let text = err.to_string();
        assert!(text.starts_with("Redis is unreachable at redis://:***@127.0.0.1:6390"), "{text}");
        assert!(text.contains("connection refused"), "{text}");
        assert!(text.contains("redis-server"), "{text}");
        assert!(!text.contains("pw@"), "{text}");
    }
}
