//! Health probes of the three dependencies (PostgreSQL, Redis, and the broker the consumer
//! reads from — RabbitMQ, or Kafka when it is the source), shared by `/readyz` and the console's
//! overview.

use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};

use crate::consumer::FailedBatches;
use crate::runtime::EnginePool;
use crate::service::{Service, redact_url};
#[cfg(feature = "kafka")]
use crate::source::kafka::KafkaProbe;

/// The state of one dependency at one moment.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct DependencyHealth {
    /// `"database"`, `"redis"` or `"broker"`.
    pub service: &'static str,
    /// Human name: `PostgreSQL`, `MySQL`, `Redis`, `RabbitMQ` or `Kafka`.
    pub name: String,
    /// The URL probed, password redacted.
    pub url: String,
    /// Whether the probe succeeded within the timeout.
    pub up: bool,
    /// Wall time of the probe in milliseconds (up to the timeout when it failed).
    pub latency_ms: f64,
    /// Why the probe failed (and how to start the service, when the host gave
    /// [`HealthProbes::with_start_hints`]); `None` when up.
    pub error: Option<String>,
}

/// The health of all three dependencies, probed concurrently.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct HealthReport {
    /// When the probes started.
    pub checked_at: DateTime<Utc>,
    /// The database (PostgreSQL or MySQL).
    pub database: DependencyHealth,
    /// Redis.
    pub redis: DependencyHealth,
    /// The consumer's broker: RabbitMQ, or Kafka.
    pub broker: DependencyHealth,
}

impl HealthReport {
    /// True when every dependency answered.
    pub fn all_up(&self) -> bool {
        self.database.up && self.redis.up && self.broker.up
    }

    /// The dependencies in display order.
    pub fn dependencies(&self) -> [&DependencyHealth; 3] {
        [&self.database, &self.redis, &self.broker]
    }
}

/// Whether a running consumer group can consume ([`crate::runtime::EngineHandle::groups_health`]):
/// not when its broker refuses its topology, nor while every batch it takes is given back
/// unjudged (database trouble). `/readyz` is not ready while any group is not.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct GroupHealth {
    /// The consumer group.
    pub group: String,
    /// False while the broker refuses the group's topology or its batches fail.
    pub ready: bool,
    /// Why not, e.g. `the broker refused the consumer group's topology: declaring the Topic
    /// exchange "billing.events": … PRECONDITION_FAILED - inequivalent arg 'type' …`, or
    /// `3 batches given back to the broker unjudged since 2026-12-04T03:10:02Z (the database
    /// did not take them; the log says why)`.
    pub error: Option<String>,
    /// Batches given back unjudged since the engine started (0 for a group that does not
    /// consume).
    pub failed_batches: u64,
    /// The run of failed batches in progress, if any.
    pub failing: Option<FailedBatches>,
    /// The last run of failed batches that ended: when it began, how many, when the group
    /// resumed.
    pub last_recovery: Option<FailedBatches>,
}

/// Probes the dependencies. Cheap to clone.
///
/// Each probe is a real round trip: `SELECT 1` on a pooled database connection, `PING` on a
/// new Redis connection, and for the broker ([`HealthProbes::with_rabbitmq`][with-rabbitmq] or
/// [`HealthProbes::with_kafka`][with-kafka]) an AMQP handshake with RabbitMQ (closed right after) or a
/// metadata request to Kafka. Each is bounded by `timeout`.
#[doc = ""]
#[cfg_attr(feature = "kafka", doc = "[with-kafka]: HealthProbes::with_kafka")]
#[cfg_attr(not(feature = "kafka"), doc = "[with-kafka]: crate#features")]
#[cfg_attr(feature = "rabbitmq", doc = "[with-rabbitmq]: HealthProbes::with_rabbitmq")]
#[cfg_attr(not(feature = "rabbitmq"), doc = "[with-rabbitmq]: crate#features")]
#[derive(Clone)]
pub struct HealthProbes {
    pool: EnginePool,
    database_url: String,
    redis_url: String,
    broker: BrokerProbe,
    timeout: Duration,
    start_hints: Option<fn(Service) -> Option<&'static str>>,
    /// The newest report, shared by clones ([`HealthProbes::recent`]).
    last: Arc<std::sync::Mutex<Option<KeptReport>>>,
    /// Held by the one [`HealthProbes::recent`] caller that probes; the others wait on it.
    /// [`HealthProbes::check`] never takes it, so a readiness check never waits behind a page.
    refreshing: Arc<tokio::sync::Mutex<()>>,
}

/// A report [`HealthProbes`] keeps for [`HealthProbes::recent`]: the newest is the one whose
/// probes started last; its age counts from when they finished.
struct KeptReport {
    started: Instant,
    finished: Instant,
    report: HealthReport,
}

/// Which broker the broker probe asks.
#[derive(Clone)]
enum BrokerProbe {
    /// None configured: reported down, saying so.
    None,
    #[cfg(feature = "rabbitmq")]
    RabbitMq(String),
    #[cfg(feature = "kafka")]
    Kafka(Arc<KafkaProbe>),
}

impl HealthProbes {
    /// Creates probes of the database (on `pool`, named by `database_url`) and Redis; `timeout`
    /// bounds each probe. Add the broker with [`HealthProbes::with_rabbitmq`][with-rabbitmq] or
    /// [`HealthProbes::with_kafka`][with-kafka].
    #[doc = ""]
    #[cfg_attr(feature = "kafka", doc = "[with-kafka]: HealthProbes::with_kafka")]
    #[cfg_attr(not(feature = "kafka"), doc = "[with-kafka]: crate#features")]
    #[cfg_attr(feature = "rabbitmq", doc = "[with-rabbitmq]: HealthProbes::with_rabbitmq")]
    #[cfg_attr(not(feature = "rabbitmq"), doc = "[with-rabbitmq]: crate#features")]
    pub fn new(pool: impl Into<EnginePool>, database_url: &str, redis_url: &str, timeout: Duration) -> Self {
        Self {
            pool: pool.into(),
            database_url: database_url.to_owned(),
            redis_url: redis_url.to_owned(),
            broker: BrokerProbe::None,
            timeout,
            start_hints: None,
            last: Arc::default(),
            refreshing: Arc::default(),
        }
    }

    /// Adds `hints(service)` to the error of a dependency that is down: how to start it on the
    /// host's machines (e.g. `dedup-console`'s `pg_ctlcluster …`). The engine knows none.
    pub fn with_start_hints(mut self, hints: fn(Service) -> Option<&'static str>) -> Self {
        self.start_hints = Some(hints);
        self
    }

    /// Probes RabbitMQ at `amqp_url` as the broker.
    #[cfg(feature = "rabbitmq")]
    pub fn with_rabbitmq(mut self, amqp_url: &str) -> Self {
        self.broker = BrokerProbe::RabbitMq(amqp_url.to_owned());
        self
    }

    /// Probes the Kafka cluster at `brokers` as the broker.
    ///
    /// Errors: an invalid Kafka client configuration.
    #[cfg(feature = "kafka")]
    pub fn with_kafka(mut self, brokers: &str) -> anyhow::Result<Self> {
        self.broker = BrokerProbe::Kafka(Arc::new(KafkaProbe::new(brokers)?));
        Ok(self)
    }

    /// Runs the three probes concurrently.
    pub async fn check(&self) -> HealthReport {
        self.probe_and_keep().await
    }

    /// The last report when it is younger than `max_age`, else a new one ([`HealthProbes::check`]);
    /// callers that arrive while one is made wait for it rather than probe again. For a page
    /// that shows the report with its `checked_at` (the console's overview): a page view need
    /// not pay for an AMQP handshake when another made one a moment ago. Readiness checks call
    /// [`HealthProbes::check`], which never waits for a probe made here.
    pub async fn recent(&self, max_age: Duration) -> HealthReport {
        let asked = Instant::now();
        if let Some(report) = self.kept(|finished| finished.elapsed() < max_age) {
            return report;
        }
        let _refreshing = self.refreshing.lock().await;
        // One finished while this caller waited (by the caller it waited for, or a readiness
        // check) is as new as it can ask for, however long its probes took.
        if let Some(report) = self.kept(|finished| finished >= asked || finished.elapsed() < max_age) {
            return report;
        }
        self.probe_and_keep().await
    }

    /// The kept report, when `fresh(finished)` (when its probes finished) says it will do.
    fn kept(&self, fresh: impl Fn(Instant) -> bool) -> Option<HealthReport> {
        let last = self.last.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        last.as_ref().filter(|kept| fresh(kept.finished)).map(|kept| kept.report.clone())
    }

    /// Probes, and keeps the report unless a newer one (its probes started later) was kept
    /// meanwhile.
    async fn probe_and_keep(&self) -> HealthReport {
        let started = Instant::now();
        let report = self.probe().await;
        let mut last = self.last.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if last.as_ref().is_none_or(|kept| kept.started <= started) {
            *last = Some(KeptReport { started, finished: Instant::now(), report: report.clone() });
        }
        report
    }

    /// The three probes, concurrently.
    async fn probe(&self) -> HealthReport {
        let checked_at = Utc::now();
        let (database, redis, broker) = tokio::join!(self.check_database(), self.check_redis(), self.check_broker());
        HealthReport { checked_at, database, redis, broker }
    }

    /// `SELECT 1` on a pooled connection.
    pub(crate) async fn check_database(&self) -> DependencyHealth {
        self.timed(self.pool.service(), &self.database_url, async { Ok(self.pool.ping().await?) }).await
    }

    /// `PING` on a fresh connection.
    pub async fn check_redis(&self) -> DependencyHealth {
        self.timed(Service::Redis, &self.redis_url, async {
            let client = redis::Client::open(self.redis_url.as_str())?;
            let config = redis::AsyncConnectionConfig::new()
                .set_connection_timeout(Some(self.timeout))
                .set_response_timeout(Some(self.timeout));
            let mut conn = client.get_multiplexed_async_connection_with_config(&config).await?;
            let pong: String = redis::cmd("PING").query_async(&mut conn).await?;
            anyhow::ensure!(pong == "PONG", "unexpected PING reply {pong:?}");
            Ok(())
        })
        .await
    }

    /// An AMQP connection handshake, then a clean close; or a Kafka metadata request.
    pub async fn check_broker(&self) -> DependencyHealth {
        match &self.broker {
            BrokerProbe::None => {
                self.timed(Service::RabbitMq, "", async { anyhow::bail!("no broker is configured to probe") }).await
            }
            #[cfg(feature = "kafka")]
            BrokerProbe::Kafka(kafka) => {
                let mut health = self.timed(Service::Kafka, "", kafka.check(self.timeout)).await;
                // Bootstrap brokers are `host:port` lists, not URLs, and carry no password.
                health.url = kafka.brokers().to_owned();
                health
            }
            #[cfg(feature = "rabbitmq")]
            BrokerProbe::RabbitMq(url) => {
                self.timed(Service::RabbitMq, url, async {
                    let conn = crate::source::rabbitmq::connect(url, lapin::ConnectionProperties::default()).await?;
                    conn.close(200, "health probe".into()).await?;
                    Ok(())
                })
                .await
            }
        }
    }

    async fn timed(
        &self,
        service: Service,
        url: &str,
        probe: impl Future<Output = anyhow::Result<()>>,
    ) -> DependencyHealth {
        let started = Instant::now();
        let outcome = match tokio::time::timeout(self.timeout, probe).await {
            Ok(Ok(())) => None,
            Ok(Err(e)) => Some(format!("{e:#}")),
            Err(_) => Some(format!("no answer within {} ms", self.timeout.as_millis())),
        };
        DependencyHealth {
            service: service.key(),
            name: service.to_string(),
            url: redact_url(url),
            up: outcome.is_none(),
            latency_ms: started.elapsed().as_secs_f64() * 1000.0,
            error: outcome.map(|cause| {
                let hint = self.start_hints.and_then(|hints| hints(service));
                format!("{service} is down: {cause}{}", hint.map(|h| format!(". {h}")).unwrap_or_default())
            }),
        }
    }
}

#[cfg(all(test, feature = "rabbitmq", feature = "testing"))]
mod tests {
    use super::*;

    /// A "broker" that accepts connections and never answers: its probe takes the whole timeout.
    async fn silent_broker() -> (tokio::task::JoinHandle<()>, String) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("amqp://guest:guest@{}/%2f", listener.local_addr().unwrap());
        let held = tokio::spawn(async move {
            let mut open = Vec::new();
            while let Ok((socket, _)) = listener.accept().await {
                open.push(socket);
            }
        });
        (held, url)
    }

    #[tokio::test]
    async fn a_readiness_check_never_waits_for_a_page_probe_and_a_page_reuses_the_newest_report() {
        let (_broker, amqp_url) = silent_broker().await;
        let pool = crate::connect(&crate::testing::admin_url(), &crate::PoolSettings::default()).await.unwrap();
        let probes = HealthProbes::new(pool, &crate::testing::admin_url(), &crate::testing::redis_url(), Duration::from_millis(800))
            .with_rabbitmq(&amqp_url);

        // A readiness check starts; a page's probe starts 400 ms later, while it runs. The check's
        // own probe ends at 800 ms, the page's at 1 200 ms: the check must not wait for the page.
        let order = std::sync::Mutex::new(Vec::new());
        let readiness = async {
            let report = probes.check().await;
            order.lock().unwrap().push("readiness");
            report
        };
        let page = async {
            tokio::time::sleep(Duration::from_millis(400)).await;
            let report = probes.recent(Duration::ZERO).await;
            order.lock().unwrap().push("page");
            report
        };
        let (readiness, page) = tokio::join!(readiness, page);
        assert_eq!(*order.lock().unwrap(), ["readiness", "page"]);
        assert!(!readiness.broker.up && !page.broker.up, "the silent broker is reported down");
        assert!(page.checked_at > readiness.checked_at);

        // The page's report is the newest: a page within max_age gets it, not the check's.
        let again = probes.recent(Duration::from_secs(60)).await;
        assert_eq!(again.checked_at, page.checked_at);
    }

    #[tokio::test]
    async fn pages_that_wait_for_a_probe_take_its_report_even_when_it_took_longer_than_max_age() {
        let (_broker, amqp_url) = silent_broker().await;
        let pool = crate::connect(&crate::testing::admin_url(), &crate::PoolSettings::default()).await.unwrap();
        let probes = HealthProbes::new(pool, &crate::testing::admin_url(), &crate::testing::redis_url(), Duration::from_millis(800))
            .with_rabbitmq(&amqp_url);
        // Each probe takes 800 ms (the silent broker), longer than the 300 ms a page accepts.
        let max_age = Duration::from_millis(300);
        let (a, b, c) = tokio::join!(probes.recent(max_age), probes.recent(max_age), probes.recent(max_age));
        assert_eq!((a.checked_at, b.checked_at), (c.checked_at, c.checked_at), "one probe for the three");
    }
}
