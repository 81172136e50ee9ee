//! An HTTP handler's settings as a team writes them (`[groups.http."<TYPE>"]` of the
//! `dedup-console` binary; serde names are the keys), and how they are checked.

use std::collections::BTreeMap;

use secrecy::{ExposeSecret, SecretString};
use serde::{Deserialize, Serialize, Serializer};

use crate::record::LeaseExpiryPolicy;

/// One HTTP handler: where it calls, how long it waits, what it adds, how much it sends at once.
/// Every key but `url` has a default. [`crate::http::HttpHandler::new`] checks them.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpSettings {
    /// The service's endpoint, `http://` or `https://`, without credentials (put them in
    /// `headers`: a URL is printed).
    pub url: String,
    /// `POST` (default), `PUT` or `PATCH`.
    #[serde(default = "defaults::method")]
    pub method: String,
    /// Longest wait for the whole answer, body included, in ms (default 10000). The group's
    /// lease must be longer: the engine refuses to start otherwise.
    #[serde(default = "defaults::timeout_ms")]
    pub timeout_ms: u64,
    /// Extra request headers (`Authorization`, …): each a value, or `{ env = "VARIABLE" }` to
    /// read it from the environment at start. Values are secret: never printed or logged.
    #[serde(default)]
    pub headers: BTreeMap<String, SecretSetting>,
    /// Broker headers of the message passed on as request headers of the same name (matched
    /// without regard to case); no others are. Strings as they are, other values as JSON.
    #[serde(default)]
    pub forward_headers: Vec<String>,
    /// Most calls in flight at once, over all the group's workers in this process (default 16).
    #[serde(default = "defaults::concurrency")]
    pub concurrency: usize,
    /// Most calls started per second (evenly spaced), if limited. Default: unlimited.
    #[serde(default)]
    pub rate_per_sec: Option<f64>,
    /// Standard Webhooks signing secret (`whsec_` and base64, or `{ env = "VARIABLE" }`): when
    /// set, each call carries `webhook-id`, `webhook-timestamp` and `webhook-signature`.
    #[serde(default)]
    pub signing_secret: Option<SecretSetting>,
    /// How long a record's unbroken run of 409 answers ("still working on this key") is retried
    /// without counting attempts, in ms (default 300000); after it each 409 counts.
    #[serde(default = "defaults::in_progress_limit_ms")]
    pub in_progress_limit_ms: u64,
    /// Shortest delay a `Retry-After` answer is honoured with, in ms (default 1000).
    #[serde(default = "defaults::retry_after_min_ms")]
    pub retry_after_min_ms: u64,
    /// Longest delay a `Retry-After` answer is honoured with, in ms (default 300000).
    #[serde(default = "defaults::retry_after_max_ms")]
    pub retry_after_max_ms: u64,
    /// What a redelivery of a record whose call was cut off (its worker died) may do: `hold`
    /// (default: an operator decides whether to call again) or `reclaim`.
    #[serde(default)]
    pub on_lease_expiry: LeaseExpiryPolicy,
    /// Circuit breaker: consecutive transport failures (timeouts, connection errors) or 5xx
    /// answers, counted in this process, after which the handler pauses for the whole group
    /// (default 5; 0: never). Its deliveries then wait in the broker (docs/DESIGN.md, "Pause and
    /// circuit breaker").
    #[serde(default = "defaults::pause_after")]
    pub pause_after: u32,
    /// How often a paused handler lets one delivery through as a probe (its success resumes the
    /// handler), and how long held deliveries wait before they are judged again, in ms (default
    /// 30000, at least 100).
    #[serde(default = "defaults::probe_interval_ms")]
    pub probe_interval_ms: u64,
}

mod defaults {
    pub fn method() -> String {
        "POST".to_owned()
    }
    pub fn timeout_ms() -> u64 {
        10_000
    }
    pub fn concurrency() -> usize {
        16
    }
    pub fn in_progress_limit_ms() -> u64 {
        300_000
    }
    pub fn retry_after_min_ms() -> u64 {
        1_000
    }
    pub fn retry_after_max_ms() -> u64 {
        300_000
    }
    pub fn pause_after() -> u32 {
        5
    }
    pub fn probe_interval_ms() -> u64 {
        30_000
    }
}

impl HttpSettings {
    /// Settings calling `url`, every other key at its default.
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            method: defaults::method(),
            timeout_ms: defaults::timeout_ms(),
            headers: BTreeMap::new(),
            forward_headers: Vec::new(),
            concurrency: defaults::concurrency(),
            rate_per_sec: None,
            signing_secret: None,
            in_progress_limit_ms: defaults::in_progress_limit_ms(),
            retry_after_min_ms: defaults::retry_after_min_ms(),
            retry_after_max_ms: defaults::retry_after_max_ms(),
            on_lease_expiry: LeaseExpiryPolicy::default(),
            pause_after: defaults::pause_after(),
            probe_interval_ms: defaults::probe_interval_ms(),
        }
    }
}

/// A secret setting: the value itself, or the name of the environment variable holding it
/// (`{ env = "ORDERS_TOKEN" }`), read when the handler is built. Printed, logged and serialised
/// as `[redacted]` (a variable's name is shown: it is no secret).
#[derive(Clone, Deserialize)]
#[serde(untagged, expecting = "a string, or { env = \"VARIABLE\" } naming an environment variable")]
pub enum SecretSetting {
    /// Read from this environment variable.
    Env {
        /// The variable's name.
        env: String,
    },
    /// The value.
    Value(SecretString),
}

impl SecretSetting {
    /// A literal value.
    pub fn value(value: impl Into<String>) -> Self {
        Self::Value(SecretString::from(value.into()))
    }

    /// The value, read from the environment when named there.
    ///
    /// Errors: the variable is not set (or not Unicode); the message names it, not its value.
    pub(crate) fn resolve(&self) -> Result<SecretString, String> {
        match self {
            Self::Value(v) => Ok(v.clone()),
            Self::Env { env } => std::env::var(env)
                .map(SecretString::from)
                .map_err(|e| format!("the environment variable {env:?} is not usable: {e}")),
        }
    }
}

impl std::fmt::Debug for SecretSetting {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Env { env } => write!(f, "{{ env = {env:?} }}"),
            Self::Value(_) => f.write_str("[redacted]"),
        }
    }
}

impl Serialize for SecretSetting {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            Self::Env { env } => {
                use serde::ser::SerializeMap;
                let mut map = serializer.serialize_map(Some(1))?;
                map.serialize_entry("env", env)?;
                map.end()
            }
            Self::Value(_) => serializer.serialize_str("[redacted]"),
        }
    }
}

/// Why settings were refused: which key, and what is wrong with it (never a secret's value).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("HTTP handler: {0}")]
pub struct HttpSettingsError(pub(crate) String);

/// `value` exposed, for building the handler.
pub(crate) fn expose(value: &SecretString) -> &str {
    value.expose_secret()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secret_values_never_print_and_variables_are_named() {
        let s: HttpSettings = serde_json::from_value(serde_json::json!({
            "url": "http://127.0.0.1:1/x",
            "headers": {"Authorization": "Bearer hunter2", "X-Key": {"env": "SOME_VARIABLE"}},
            "signing_secret": "whsec_c2VjcmV0c2VjcmV0c2VjcmV0",
        }))
        .unwrap();
        let printed = format!("{s:?} {}", serde_json::to_string(&s).unwrap());
        assert!(!printed.contains("hunter2") && !printed.contains("c2VjcmV0"), "{printed}");
        assert!(printed.contains("SOME_VARIABLE") && printed.contains("[redacted]"), "{printed}");
        assert_eq!(s.timeout_ms, 10_000, "defaults fill the rest");
        let bad = serde_json::from_value::<HttpSettings>(serde_json::json!({"url": "x", "headers": {"A": 3}}));
        assert!(bad.unwrap_err().to_string().contains("environment variable"));
    }
}
