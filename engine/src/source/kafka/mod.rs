//! The Kafka source (rdkafka): a consumer group member whose offsets are committed only after
//! the records before them are committed in the database, retry topics with back-off, a
//! dead-letter topic, and back-pressure.
//!
//! - **Offsets.** Auto-commit is off. Each process is one group member ([`member`]); its
//!   records are processed by several workers and finish in any order; per partition, the
//!   commit goes up to the lowest unfinished record and never past it ([`offsets`]). A crash
//!   redelivers from the last commit; the dedup table skips what had finished.
//! - **Rebalances.** On revocation the member stops taking records of the revoked partitions,
//!   waits up to `revoke_grace_ms` for the ones in progress, commits what is done and abandons
//!   the rest to the next owner (see [`member`]).
//! - **Retries** do not block the partition: a retry copy goes to
//!   `<topic>.<group id>.retry.<delay ms>`, one topic per back-off level, so each is in due
//!   order. The same member consumes the retry topics and holds a copy (pausing that retry
//!   partition) until its `x-dedup-retry-due-ms` header says it is due.
//! - **Dead letters** go to `<topic>.DLT`, with the reason in `x-dedup-dead-letter-reason`;
//!   publishing them is tried `dead_letter_publish_attempts` times, and the record is `dead` in
//!   the database either way.
//! - **Back-pressure.** At `max_in_flight` records fetched and not settled, the member pauses
//!   its partitions until half have settled; librdkafka's own prefetch is bounded by the fetch
//!   limits.
//! - **Message ids**: the group's id sources in order ([`IdPolicy`](crate::message::IdPolicy));
//!   by default the id header, else the record key, else the JSON pointer; `offset` adds
//!   `<topic>-<partition>-<offset>`.
//!
//! Records of one partition may be processed out of order (as with several RabbitMQ workers,
//! and as any retry does); handlers must not rely on it.

mod admin;
mod delivery;
mod member;
mod membership;
mod offsets;
mod publish;
mod source;

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use rdkafka::ClientConfig;
use rdkafka::consumer::BaseConsumer;
use serde::{Deserialize, Serialize};

pub use self::admin::KafkaProbe;
use self::admin::{Partitions, TopicSpec};
#[cfg(feature = "testing")]
pub use self::delivery::SOURCE_TOPIC_HEADER;
use self::member::{Member, MemberPlan};
pub use self::publish::KafkaPublisher;
use super::{Publish, Source, SourceError, SourceFactory};
use crate::retry::Backoff;

/// Kafka settings of a consumer (`[consumer.kafka]`).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct KafkaSettings {
    /// Bootstrap brokers, `host:port[,host:port…]` (`bootstrap.servers`). Default `127.0.0.1:9092`.
    pub brokers: String,
    /// The Kafka consumer group (`group.id`). Default: the dedup consumer group (`consumer.group`).
    pub group_id: Option<String>,
    /// Topics consumed; no default (an engine refuses to start a group without any).
    pub topics: Vec<String>,
    /// Group session timeout, in ms (`session.timeout.ms`): a member silent this long (a crashed
    /// process) loses its partitions to the others. Default 10000.
    pub session_timeout_ms: u64,
    /// Most bytes one fetch returns (`fetch.max.bytes`). Default 1048576 (the test broker ignores
    /// the per-partition limit, and larger fetches of a big backlog stall its group session).
    pub fetch_max_bytes: u32,
    /// Most bytes per partition in one fetch (`max.partition.fetch.bytes`). Default 1048576.
    pub max_partition_fetch_bytes: u32,
    /// Longest time the broker may wait to fill a fetch, in ms (`fetch.wait.max.ms`). Default 100.
    pub fetch_wait_max_ms: u64,
    /// Records fetched and not yet settled, per process, at which the member pauses its
    /// partitions until half have settled (back-pressure). Default 1000.
    pub max_in_flight: usize,
    /// On revocation, how long to wait for records in progress before abandoning them to the
    /// next owner, in ms. Default 5000.
    pub revoke_grace_ms: u64,
    /// Create missing source, retry and dead-letter topics at start. Default true.
    pub create_topics: bool,
    /// Partitions of created source topics (dead-letter topics get their source topic's
    /// count). Default 4.
    pub partitions: i32,
    /// Partitions of created retry topics. Default 1: retries are few, one member holds a
    /// level's copies in due order, and every partition costs the brokers a fetch.
    pub retry_partitions: i32,
    /// Replication factor of created topics. Default 1.
    pub replication_factor: i32,
    /// Tries to publish one dead-letter copy before giving up (the record stays `dead` in the
    /// database, with its payload, either way). Default 3.
    pub dead_letter_publish_attempts: u32,
    /// Bound on each publish (copies, simulator, requeue) and each admin request (topics, lag),
    /// in ms. Default 10000.
    pub request_timeout_ms: u64,
    /// Client id shown in the broker's logs. Default `dedup-console`.
    pub client_id: String,
}

impl Default for KafkaSettings {
    fn default() -> Self {
        Self {
            brokers: "127.0.0.1:9092".to_owned(),
            group_id: None,
            topics: Vec::new(),
            session_timeout_ms: 10_000,
            fetch_max_bytes: 1024 * 1024,
            max_partition_fetch_bytes: 1024 * 1024,
            fetch_wait_max_ms: 100,
            max_in_flight: 1000,
            revoke_grace_ms: 5000,
            create_topics: true,
            partitions: 4,
            retry_partitions: 1,
            replication_factor: 1,
            dead_letter_publish_attempts: 3,
            request_timeout_ms: 10_000,
            client_id: "dedup-console".to_owned(),
        }
    }
}

impl KafkaSettings {
    /// What keeps these settings from naming a source: no topics.
    ///
    /// Errors: the reason, naming the setting.
    pub(crate) fn check(&self) -> Result<(), String> {
        if self.topics.is_empty() { Err("Kafka: no topics to consume (`topics`)".to_owned()) } else { Ok(()) }
    }

    /// The retry topic of `topic` for copies delayed by `level` (a back-off level):
    /// `<topic>.<group id>.retry.<ms>`. The group id keeps two groups reading one topic from
    /// consuming each other's retries.
    pub fn retry_topic(&self, topic: &str, group_id: &str, level: Duration) -> String {
        format!("{topic}.{group_id}.retry.{}", level.as_millis())
    }

    /// The dead-letter topic of `topic`: `<topic>.DLT`.
    pub fn dead_letter_topic(topic: &str) -> String {
        format!("{topic}.DLT")
    }
}

/// Opens the workers' sources on this process's group member (started by the first `open`), publishes to
/// the cluster, and measures the group's lag.
pub struct KafkaConnector {
    settings: KafkaSettings,
    group_id: String,
    backoff: Backoff,
    id_header: String,
    member: tokio::sync::Mutex<Option<Arc<Member>>>,
    publisher: std::sync::Mutex<Option<KafkaPublisher>>,
    lag_client: std::sync::Mutex<Option<Arc<BaseConsumer>>>,
    connected: Arc<AtomicBool>,
}

impl KafkaConnector {
    /// A connector for the Kafka group `settings.group_id`, else `group`; `backoff` gives the
    /// retry levels (one retry topic each); message ids are published in header `id_header`.
    /// Does not connect until first used.
    pub fn new(settings: KafkaSettings, group: &str, backoff: Backoff, id_header: &str) -> Self {
        let group_id = settings.group_id.clone().unwrap_or_else(|| group.to_owned());
        Self {
            settings,
            group_id,
            backoff,
            id_header: id_header.to_owned(),
            member: tokio::sync::Mutex::new(None),
            publisher: std::sync::Mutex::new(None),
            lag_client: std::sync::Mutex::new(None),
            connected: Arc::new(AtomicBool::new(false)),
        }
    }

    /// The Kafka consumer group.
    pub fn group_id(&self) -> &str {
        &self.group_id
    }

    /// The retry topics of every source topic, one per back-off level.
    pub(crate) fn retry_topics(&self) -> Vec<String> {
        let levels = self.backoff.levels();
        self.settings
            .topics
            .iter()
            .flat_map(|t| levels.iter().map(|l| self.settings.retry_topic(t, &self.group_id, *l)))
            .collect()
    }

    /// What the member subscribes to: the source topics and their retry topics.
    fn subscribed_topics(&self) -> Vec<String> {
        self.settings.topics.iter().cloned().chain(self.retry_topics()).collect()
    }

    /// The shared producer (created on first use).
    ///
    /// Errors: [`SourceError::Broker`] for an invalid client configuration.
    pub(crate) fn publisher(&self) -> Result<KafkaPublisher, SourceError> {
        let mut publisher = self.publisher.lock().unwrap_or_else(|e| e.into_inner());
        if publisher.is_none() {
            *publisher = Some(KafkaPublisher::new(&self.settings, &self.id_header)?);
        }
        Ok(publisher.clone().expect("just set"))
    }

    /// Creates the missing source, retry and dead-letter topics (or, with `create_topics` off,
    /// checks they exist).
    ///
    /// Errors: as [`SourceFactory::open`].
    pub(crate) async fn ensure_topics(&self) -> Result<(), SourceError> {
        let mut wanted = Vec::new();
        for topic in &self.settings.topics {
            wanted.push(TopicSpec { name: topic.clone(), partitions: Partitions::Fixed(self.settings.partitions) });
            for level in self.backoff.levels() {
                let name = self.settings.retry_topic(topic, &self.group_id, level);
                wanted.push(TopicSpec { name, partitions: Partitions::Fixed(self.settings.retry_partitions) });
            }
            let name = KafkaSettings::dead_letter_topic(topic);
            wanted.push(TopicSpec { name, partitions: Partitions::Like(topic.clone()) });
        }
        admin::ensure_topics(&self.settings, &wanted).await
    }

    /// Records this process has fetched and not yet settled (what back-pressure bounds; the
    /// tests watch it).
    #[cfg(feature = "testing")]
    pub fn in_flight(&self) -> usize {
        let member = self.member.try_lock().ok().and_then(|m| m.clone());
        member.map_or(0, |m| m.shared.offsets().in_flight())
    }

    /// The group's lag on the source and retry topics: records not yet consumed and committed.
    ///
    /// Errors: [`SourceError::Disconnected`] when the cluster does not answer in time.
    pub async fn lag(&self) -> Result<u64, SourceError> {
        let client = self.lag_client()?;
        let topics = self.subscribed_topics();
        let timeout = Duration::from_millis(self.settings.request_timeout_ms);
        tokio::task::spawn_blocking(move || admin::lag(&client, &topics, timeout))
            .await
            .expect("lag task does not panic")
            .map_err(|e| admin::unreachable(&self.settings.brokers, e))
    }

    fn lag_client(&self) -> Result<Arc<BaseConsumer>, SourceError> {
        let mut client = self.lag_client.lock().unwrap_or_else(|e| e.into_inner());
        if client.is_none() {
            let consumer: BaseConsumer = ClientConfig::new()
                .set("bootstrap.servers", &self.settings.brokers)
                .set("group.id", &self.group_id)
                .set("enable.auto.commit", "false")
                .create()
                .map_err(|e| SourceError::Broker(format!("cannot create a Kafka client: {e}")))?;
            *client = Some(Arc::new(consumer));
        }
        Ok(client.clone().expect("just set"))
    }

    fn consumer_config(&self) -> ClientConfig {
        let s = &self.settings;
        let mut config = ClientConfig::new();
        config
            .set("bootstrap.servers", &s.brokers)
            .set("group.id", &self.group_id)
            .set("client.id", &s.client_id)
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("auto.offset.reset", "earliest")
            .set("session.timeout.ms", s.session_timeout_ms.to_string())
            .set("heartbeat.interval.ms", (s.session_timeout_ms / 3).clamp(100, 3000).to_string())
            .set("fetch.max.bytes", s.fetch_max_bytes.to_string())
            // librdkafka wants fetch.max.bytes >= message.max.bytes, a request-size limit a
            // consumer never comes near: keep it out of the way of smaller fetches.
            .set("message.max.bytes", s.fetch_max_bytes.clamp(1000, 1_000_000).to_string())
            .set("max.partition.fetch.bytes", s.max_partition_fetch_bytes.to_string())
            .set("fetch.wait.max.ms", s.fetch_wait_max_ms.to_string())
            // librdkafka's prefetch queue: about two fetches, not its 64 MiB default; when it is
            // full, fetch again soon (its default waits a second).
            .set("queued.max.messages.kbytes", (s.fetch_max_bytes / 512).max(1).to_string())
            .set("fetch.queue.backoff.ms", "50");
        config
    }

    /// The running member, started (topics ensured, subscribed) when there is none.
    async fn member(&self) -> Result<Arc<Member>, SourceError> {
        let mut member = self.member.lock().await;
        if let Some(running) = member.as_ref().filter(|m| m.is_running()) {
            return Ok(running.clone());
        }
        self.ensure_topics().await?;
        let plan = MemberPlan {
            topics: self.subscribed_topics(),
            retry_topics: self.retry_topics().into_iter().collect::<HashSet<_>>(),
            max_in_flight: self.settings.max_in_flight,
            revoke_grace: Duration::from_millis(self.settings.revoke_grace_ms),
            source_topics: self.settings.topics.clone(),
            idle_check: Duration::from_millis(self.settings.session_timeout_ms),
        };
        let started = Arc::new(Member::start(&self.consumer_config(), plan, self.connected.clone())?);
        self.connected.store(true, Ordering::Relaxed);
        *member = Some(started.clone());
        Ok(started)
    }
}

#[async_trait]
impl SourceFactory for KafkaConnector {
    async fn open(&self, _worker: usize) -> Result<Box<dyn Source>, SourceError> {
        let member = self.member().await?;
        Ok(Box::new(source::KafkaSource::new(
            member.shared.clone(),
            self.publisher()?,
            self.settings.clone(),
            self.group_id.clone(),
            self.backoff.clone(),
        )))
    }

    fn broker(&self) -> crate::message::Broker {
        crate::message::Broker::Kafka
    }

    /// The group's lag ([`KafkaConnector::lag`]).
    async fn depth(&self) -> Option<u64> {
        self.lag().await.ok()
    }

    fn connected(&self) -> bool {
        self.connected.load(Ordering::Relaxed)
    }

    /// Never waits on the member lock: a worker's `open` holds it while a member starts (topics
    /// ensured, up to `request_timeout_ms` per worker while the cluster does not answer), and the
    /// instance heartbeat, which asks every group, would wait behind it (the instance shown gone).
    /// A member being started owns nothing yet.
    async fn owned(&self) -> Vec<String> {
        let Some(member) = self.member.try_lock().ok().and_then(|m| m.clone()) else { return Vec::new() };
        let mut owned: Vec<_> = member.shared.offsets().assigned().cloned().collect();
        owned.sort();
        owned.into_iter().map(|tp| format!("{}[{}]", tp.topic, tp.partition)).collect()
    }

    /// Stops the member: commits what is done and leaves the group.
    async fn close(&self) {
        let member = self.member.lock().await.take();
        if let Some(member) = member {
            let _ = tokio::task::spawn_blocking(move || member.stop()).await;
        }
        self.connected.store(false, Ordering::Relaxed);
    }

    /// The shared producer, once the topics exist (the test broker creates none on produce).
    async fn open_publisher(&self) -> Result<Arc<dyn Publish>, SourceError> {
        self.ensure_topics().await?;
        Ok(Arc::new(self.publisher()?))
    }

    fn destination(&self) -> String {
        self.settings.topics.first().cloned().unwrap_or_default()
    }
}
