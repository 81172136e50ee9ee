//! Configuration: defaults, then an optional TOML file, then environment variables (last wins).
//!
//! Environment variables: `DATABASE_URL`, `REDIS_URL`, `AMQP_URL` (the conventional names), and
//! `DEDUP_<KEY>` for every key of [`Settings`] (e.g. `DEDUP_LISTEN=0.0.0.0:3000`). The TOML file is
//! given with `--config <path>` or `DEDUP_CONFIG`. The table of keys is in README.md.

mod env;
mod groups;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use dedup_engine::{FastPathSettings, Schema};
use dedup_example_orders::OrderSettings;
use figment::Figment;
use figment::providers::{Env, Format, Toml};

use self::env::DedupEnv;
use secrecy::{ExposeSecret, SecretString};
use serde::{Deserialize, Serialize, Serializer};

pub use self::groups::{GroupConfig, GroupEntries, publishers};
use dedup_app::ssr::mount::AuthSettings;

/// A URL that may carry a password. Printed and serialised with the password redacted;
/// [`SecretUrl::expose`] gives the real value to the code that connects.
#[derive(Clone, Deserialize)]
#[serde(transparent)]
pub struct SecretUrl(SecretString);

impl SecretUrl {
    /// The URL with its password, for connecting.
    pub fn expose(&self) -> &str {
        self.0.expose_secret()
    }

    /// The URL with its password replaced by `***`.
    pub fn redacted(&self) -> String {
        dedup_engine::console::redact_url(self.expose())
    }
}

impl From<&str> for SecretUrl {
    fn from(value: &str) -> Self {
        SecretUrl(SecretString::from(value.to_owned()))
    }
}

impl std::fmt::Debug for SecretUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.redacted())
    }
}

impl Serialize for SecretUrl {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.redacted())
    }
}

/// The server's settings. Every field has a default that works against the local services.
///
/// Missing keys take their defaults from [`Default`] (`#[serde(default)]`), not from a
/// serialised copy of the defaults: serialising redacts the URLs' passwords.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Settings {
    /// Address the console and API listen on. Default `127.0.0.1:3000`; port 0 picks a free port.
    pub listen: SocketAddr,
    /// Database URL (dedup store and business tables): `postgres://…`, or `mysql://…` for MySQL 8
    /// or MariaDB 10.11. Env: `DATABASE_URL`.
    pub database_url: SecretUrl,
    /// Redis URL (fast-path markers). Env: `REDIS_URL`.
    pub redis_url: SecretUrl,
    /// RabbitMQ URL. Env: `AMQP_URL`.
    pub amqp_url: SecretUrl,
    /// Directory with the built site (`pkg/` with wasm, js, css; assets). Default `target/site`,
    /// where cargo-leptos writes it, relative to the working directory.
    pub site_root: PathBuf,
    /// Most connections of the server's PostgreSQL pool (the consumers' transactions and the
    /// example's tables); the engine's own pool (console, actions, aggregates) gets half as
    /// many, at least 4.
    pub db_max_connections: u32,
    /// PostgreSQL's `statement_timeout` on the server's connections (the consumers' batches,
    /// lease heartbeats, operator actions, cleanup, the commands), in milliseconds; 0 for none.
    /// It overrides one set in the URL's `options` or by `ALTER ROLE … SET`. The console's own
    /// pool has `[console] statement_timeout_ms` instead; migrations and `seed` have none.
    /// Default 30 000.
    pub db_statement_timeout_ms: u64,
    /// The PostgreSQL schema of the engine's tables (default `dedup`), next to the business
    /// tables of the same database.
    pub schema: Schema,
    /// Longest time a request may take before the server answers 503, in milliseconds.
    pub request_timeout_ms: u64,
    /// Bound on each dependency probe of `/readyz` and the overview, in milliseconds.
    pub probe_timeout_ms: u64,
    /// Longest a stop may take from SIGTERM (or Ctrl-C) to the exit, in milliseconds: requests
    /// in flight, then the engine (in-flight batches commit and are acked, or are cut and left to
    /// the broker's redelivery), then the pools. Default 10 000.
    pub shutdown_timeout_ms: u64,
    /// Log format: `text` or `json`.
    pub log_format: LogFormat,
    /// How often the engine writes its in-memory aggregates, in milliseconds.
    pub stats_flush_ms: u64,
    /// The embedded consumer (`[consumer]`, `[consumer.workers]`, `[consumer.rabbitmq]`,
    /// `[consumer.backoff]`, `[consumer.ids]`, `[consumer.types]`): the one consumer group, or
    /// what every `[[groups]]` entry starts from.
    pub consumer: GroupConfig,
    /// Consumer groups (`[[groups]]`), each laid over `[consumer]`; none: `[consumer]` alone.
    /// See [`Settings::consumer_groups`].
    pub groups: GroupEntries,
    /// The Redis fast path (`[fast_path]`).
    pub fast_path: FastPathSettings,
    /// The order domain (`[orders]`).
    pub orders: OrderSettings,
    /// Who signs in, sessions and sign-in throttling (`[auth]`).
    pub auth: AuthSettings,
    /// How the console is served (`[console]`).
    pub console: ConsoleSettings,
    /// Largest request body accepted, in bytes (larger: 413). Default 1 MiB.
    pub max_body_bytes: usize,
}

/// `[console]`: how the console is served.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ConsoleSettings {
    /// The prefix the console is served under, for a reverse proxy that keeps it (`/x/y`: the
    /// console at `http://host/x/y/`). Default `""`: the root.
    pub base_path: String,
    /// Refuse every change (403) whatever the role, and show no action button. Default false.
    pub read_only: bool,
    /// PostgreSQL's `statement_timeout` for the console's queries and actions, lock waits
    /// included, in milliseconds: past it a request answers 503 and its query is cancelled.
    /// Shorter than `request_timeout_ms`. Default 10 000.
    pub statement_timeout_ms: u64,
    /// Most connections of the console's own pool, apart from the consumers' and the engine's.
    /// Default 6.
    pub max_connections: u32,
}

impl Default for ConsoleSettings {
    fn default() -> Self {
        Self { base_path: String::new(), read_only: false, statement_timeout_ms: 10_000, max_connections: 6 }
    }
}

/// How log lines are written.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// The keys of [`Settings`]: the only `DEDUP_*` variables read.
const TOP_LEVEL_KEYS: [&str; 20] = [
    "listen",
    "database_url",
    "redis_url",
    "amqp_url",
    "site_root",
    "db_max_connections",
    "db_statement_timeout_ms",
    "schema",
    "request_timeout_ms",
    "probe_timeout_ms",
    "shutdown_timeout_ms",
    "log_format",
    "stats_flush_ms",
    "consumer",
    "groups",
    "fast_path",
    "orders",
    "auth",
    "console",
    "max_body_bytes",
];

impl Default for Settings {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 3000)),
            database_url: "postgres://postgres@127.0.0.1:5432/dedup_console".into(),
            redis_url: "redis://127.0.0.1:6379".into(),
            amqp_url: "amqp://guest:guest@127.0.0.1:5672/%2f".into(),
            site_root: PathBuf::from("target/site"),
            db_max_connections: 16,
            db_statement_timeout_ms: 30_000,
            schema: Schema::default(),
            request_timeout_ms: 30_000,
            probe_timeout_ms: 2_000,
            shutdown_timeout_ms: 10_000,
            log_format: LogFormat::Text,
            stats_flush_ms: 1000,
            consumer: GroupConfig::default(),
            groups: GroupEntries::default(),
            fast_path: FastPathSettings::default(),
            orders: OrderSettings::default(),
            auth: AuthSettings::default(),
            console: ConsoleSettings::default(),
            max_body_bytes: 1024 * 1024,
        }
    }
}

impl Settings {
    /// Loads the settings: defaults, then `file` (TOML) if given, then the environment.
    ///
    /// Errors: a missing or malformed file, an unknown key, a value of the wrong type, or
    /// `db_max_connections = 0`; the message names the key (and where it came from).
    pub fn load(file: Option<&Path>) -> Result<Self, Box<figment::Error>> {
        let mut figment = Figment::new();
        if let Some(path) = file {
            if !path.exists() {
                return Err(Box::new(figment::Error::from(format!(
                    "configuration file {} does not exist",
                    path.display()
                ))));
            }
            figment = figment.merge(Toml::file(path));
        }
        figment
            .merge(
                Env::raw().only(&["DATABASE_URL", "REDIS_URL", "AMQP_URL"]).map(|k| k.as_str().to_lowercase().into()),
            )
            // Other tools use DEDUP_ variables too (DEDUP_BIN, DEDUP_CACHE_DIR): only keys of
            // these settings are read from the environment. Keys inside a section are strict.
            .merge(DedupEnv { top_level: &TOP_LEVEL_KEYS })
            .extract::<Self>()
            .map_err(Box::new)
            .and_then(|settings| match settings.db_max_connections {
                0 => Err(Box::new(figment::Error::from(
                    "db_max_connections = 0: the server's pool needs at least one connection".to_owned(),
                ))),
                _ => Ok(settings),
            })
    }

    /// The consumer groups to run: each `[[groups]]` entry laid over `[consumer]`, or
    /// `[consumer]` alone when there is none.
    ///
    /// Errors: an unknown key, an entry that is not a valid group, two groups with one name,
    /// queue or Kafka group; the message names the entry and the key.
    pub fn consumer_groups(&self) -> anyhow::Result<Vec<GroupConfig>> {
        groups::resolve(&self.consumer, &self.groups.0)
    }

    /// Connections of the engine's own pool: half of [`Settings::db_max_connections`], at
    /// least 4.
    pub fn engine_pool_size(&self) -> u32 {
        (self.db_max_connections / 2).max(4)
    }

    /// The effective settings as JSON, secrets redacted, for the start-up log.
    pub fn redacted_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_else(|e| format!("<unprintable settings: {e}>"))
    }
}

#[cfg(test)]
// figment's Jail API returns its large error type from the closures; nothing to box there.
#[allow(clippy::result_large_err)]
mod tests {
    use dedup_engine::Broker;

    use super::*;

    #[test]
    fn file_then_env_override_defaults_and_secrets_are_redacted() {
        figment::Jail::expect_with(|jail| {
            jail.create_file("dc.toml", "listen = \"127.0.0.1:4000\"\nprobe_timeout_ms = 500\n")?;
            jail.set_env("AMQP_URL", "amqp://user:hunter2@broker:5672/%2f");
            jail.set_env("DEDUP_PROBE_TIMEOUT_MS", "750");
            jail.set_env("DEDUP_CONSUMER__WORKERS__CONCURRENCY", "9");
            let s = Settings::load(Some(Path::new("dc.toml"))).map_err(|e| e.to_string())?;
            assert_eq!(s.listen.port(), 4000);
            assert_eq!(s.probe_timeout_ms, 750, "env wins over the file");
            assert_eq!(s.consumer.settings.workers.concurrency, 9, "nested keys through __");
            assert_eq!(s.amqp_url.expose(), "amqp://user:hunter2@broker:5672/%2f");
            assert_eq!(s.redis_url.expose(), "redis://127.0.0.1:6379", "defaults fill missing keys");
            let printed = s.redacted_json();
            assert!(!printed.contains("hunter2"), "{printed}");
            assert!(printed.contains("amqp://user:***@broker:5672/%2f"), "{printed}");
            assert!(!format!("{s:?}").contains("hunter2"));
            Ok(())
        });
    }

    #[test]
    fn http_handlers_are_read_per_group_and_their_secrets_never_printed() {
        figment::Jail::expect_with(|jail| {
            let toml = r#"
[consumer.http."ORDER.PAID"]
url = "http://127.0.0.1:8080/consumer"
headers = { Authorization = "Bearer consumer-s3cret" }

[[groups]]
group = "billing"
rabbitmq.queue = "q.billing"
[groups.http."ORDER.PAID"]
url = "http://127.0.0.1:8080/charge"
timeout_ms = 5000
headers = { Authorization = "Bearer group-s3cret", X-Key = { env = "BILLING_KEY" } }
signing_secret = "whsec_c2VjcmV0LXNpZ25pbmc="
"#;
            jail.create_file("http.toml", toml)?;
            let s = Settings::load(Some(Path::new("http.toml"))).map_err(|e| e.to_string())?;
            let printed = format!("{} {s:?}", s.redacted_json());
            for secret in ["consumer-s3cret", "group-s3cret", "c2VjcmV0LXNpZ25pbmc"] {
                assert!(!printed.contains(secret), "{secret}: {printed}");
            }
            assert!(printed.contains("BILLING_KEY"), "a variable's name is shown: {printed}");
            let groups = s.consumer_groups().map_err(|e| e.to_string())?;
            let billing = &groups[0].http["ORDER.PAID"];
            assert_eq!((billing.url.as_str(), billing.timeout_ms), ("http://127.0.0.1:8080/charge", 5000));
            assert_eq!(groups[0].http.len(), 1, "not [consumer]'s");
            assert!(!groups[0].uses_example(), "a group of HTTP handlers runs none of the example's");
            jail.create_file("typo.toml", "[consumer.http.\"ORDER.PAID\"]\nurl = \"http://x/\"\ntimout_ms = 5\n")?;
            let err = Settings::load(Some(Path::new("typo.toml"))).unwrap_err().to_string();
            assert!(err.contains("timout_ms"), "{err}");
            Ok(())
        });
    }

    #[test]
    fn unknown_keys_and_bad_values_are_named() {
        figment::Jail::expect_with(|jail| {
            jail.create_file("bad.toml", "lisen = \"x\"\n")?;
            let err = Settings::load(Some(Path::new("bad.toml"))).unwrap_err().to_string();
            assert!(err.contains("lisen"), "{err}");
            jail.set_env("DEDUP_REQUEST_TIMEOUT_MS", "soon");
            let err = Settings::load(None).unwrap_err().to_string();
            assert!(err.to_lowercase().contains("request_timeout_ms"), "{err}");
            jail.set_env("DEDUP_REQUEST_TIMEOUT_MS", "1000");
            jail.set_env("DEDUP_DB_MAX_CONNECTIONS", "0");
            let err = Settings::load(None).unwrap_err().to_string();
            assert!(err.contains("db_max_connections = 0"), "{err}");
            Ok(())
        });
    }

    #[test]
    fn the_environment_key_list_matches_the_settings() {
        let json = serde_json::to_value(Settings::default()).unwrap();
        let mut keys: Vec<&str> = json.as_object().unwrap().keys().map(String::as_str).collect();
        keys.sort_unstable();
        let mut listed = TOP_LEVEL_KEYS.to_vec();
        listed.sort_unstable();
        assert_eq!(keys, listed);
    }

    #[test]
    fn foreign_dedup_variables_are_ignored_but_nested_typos_are_not() {
        figment::Jail::expect_with(|jail| {
            jail.set_env("DEDUP_BIN", "/usr/bin/x");
            assert!(Settings::load(None).is_ok());
            jail.set_env("DEDUP_CONSUMER__WORKRS__CONCURRENCY", "2");
            let err = match Settings::load(None) {
                Err(e) => e.to_string(),
                Ok(s) => s.consumer_groups().unwrap_err().to_string(),
            };
            assert!(err.contains("workrs"), "{err}");
            Ok(())
        });
    }

    #[test]
    fn the_kafka_source_is_configured_from_the_environment() {
        figment::Jail::expect_with(|jail| {
            assert_eq!(Settings::load(None).map_err(|e| e.to_string())?.consumer.source, Broker::RabbitMq);
            jail.set_env("DEDUP_CONSUMER__SOURCE", "kafka");
            jail.set_env("DEDUP_CONSUMER__KAFKA__TOPICS", r#"["t-1.orders","t-2"]"#);
            jail.set_env("DEDUP_CONSUMER__KAFKA__SESSION_TIMEOUT_MS", "6000");
            jail.set_env("DEDUP_CONSUMER__LATE_DUPLICATES", "hold");
            let s = Settings::load(None).map_err(|e| e.to_string())?;
            assert_eq!(s.consumer.settings.late_duplicates, dedup_engine::LateDuplicatePolicy::Hold);
            assert_eq!(s.consumer.source, Broker::Kafka);
            assert_eq!(s.consumer.kafka.topics, ["t-1.orders", "t-2"]);
            assert_eq!(s.consumer.kafka.session_timeout_ms, 6000);
            assert_eq!(s.consumer.kafka.brokers, "127.0.0.1:9092");
            Ok(())
        });
    }

    #[test]
    fn map_valued_keys_have_an_environment_form_that_keeps_keys_as_written() {
        figment::Jail::expect_with(|jail| {
            // A whole map as JSON, and single entries by name; dotted, mixed-case keys kept.
            jail.set_env("DEDUP_CONSUMER__TYPES__MAP", r#"{"com.acme.OrderPaid": "ORDER.PAY"}"#);
            jail.set_env("DEDUP_CONSUMER__TYPES__MAP__com.acme.OrderCreated", "ORDER.CREATE");
            jail.set_env("DEDUP_CONSUMER__HTTP__ORDER.PAID__URL", "http://127.0.0.1:8080/charge");
            jail.set_env("DEDUP_CONSUMER__HTTP__ORDER.PAID__TIMEOUT_MS", "5000");
            jail.set_env("DEDUP_CONSUMER__HTTP__ORDER.PAID__HEADERS__X-Api-Key", r#"{"env": "BILLING_KEY"}"#);
            let s = Settings::load(None).map_err(|e| e.to_string())?;
            let map = &s.consumer.settings.types.map;
            assert_eq!(map.get("com.acme.OrderPaid").map(String::as_str), Some("ORDER.PAY"), "{map:?}");
            assert_eq!(map.get("com.acme.OrderCreated").map(String::as_str), Some("ORDER.CREATE"), "{map:?}");
            let groups = s.consumer_groups().map_err(|e| e.to_string())?;
            let paid = &groups[0].http["ORDER.PAID"];
            assert_eq!((paid.url.as_str(), paid.timeout_ms), ("http://127.0.0.1:8080/charge", 5000));
            assert!(format!("{paid:?}").contains("X-Api-Key"), "{paid:?}");
            // A typo in a setting name inside a map entry is still refused, by name.
            jail.set_env("DEDUP_CONSUMER__HTTP__ORDER.PAID__TIMOUT_MS", "5");
            let err = Settings::load(None).map(|_| ()).unwrap_err().to_string();
            assert!(err.contains("timout_ms"), "{err}");
            jail.clear_env();
            // A list of tables as JSON: [[groups]], with its own map keys as written.
            let groups = r#"[{"group": "billing", "rabbitmq": {"queue": "q.billing"},
                              "types": {"map": {"com.acme.Charge": "CHARGE"}}}]"#;
            jail.set_env("DEDUP_GROUPS", groups);
            let groups =
                Settings::load(None).map_err(|e| e.to_string())?.consumer_groups().map_err(|e| e.to_string())?;
            assert_eq!(groups.len(), 1);
            assert_eq!(groups[0].group, "billing");
            assert_eq!(groups[0].settings.types.map.get("com.acme.Charge").map(String::as_str), Some("CHARGE"));
            Ok(())
        });
    }

    #[test]
    fn default_urls_keep_their_passwords() {
        figment::Jail::expect_with(|_| {
            let s = Settings::load(None).map_err(|e| e.to_string())?;
            assert_eq!(s.amqp_url.expose(), "amqp://guest:guest@127.0.0.1:5672/%2f");
            Ok(())
        });
    }

    #[test]
    fn a_missing_file_is_an_error() {
        let err = Settings::load(Some(Path::new("/nonexistent/dc.toml"))).unwrap_err().to_string();
        assert!(err.contains("/nonexistent/dc.toml"), "{err}");
    }
}
