//! Kafka test support: the local test broker (started once per test process if none answers),
//! a test's own topic and consumer group, and helpers to read topics and committed offsets.
//!
//! The brokers are `KAFKA_BROKERS` (default `127.0.0.1:9092`). When nothing answers there, the
//! first test to ask runs `scripts/kafka-broker start` (which installs the broker on first use).

use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use rdkafka::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Headers, Message};
use rdkafka::{Offset, TopicPartitionList};

use crate::retry::Backoff;
use crate::source::kafka::{KafkaConnector, KafkaSettings};

/// The Kafka brokers of the tests, with the local test broker started if none answers.
/// Panics when it cannot be started: the Kafka tests need it.
pub fn kafka_brokers() -> String {
    static STARTED: OnceLock<String> = OnceLock::new();
    STARTED
        .get_or_init(|| {
            let brokers = std::env::var("KAFKA_BROKERS").unwrap_or_else(|_| "127.0.0.1:9092".to_owned());
            if brokers == "127.0.0.1:9092" && !answers(&brokers) {
                let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/kafka-broker");
                let status = std::process::Command::new(script).arg("start").status();
                assert!(
                    matches!(status, Ok(s) if s.success()),
                    "no Kafka broker at {brokers} and `{script} start` failed: {status:?}"
                );
            }
            brokers
        })
        .clone()
}

fn answers(brokers: &str) -> bool {
    let client: Result<BaseConsumer, _> = ClientConfig::new().set("bootstrap.servers", brokers).create();
    client.is_ok_and(|c| c.fetch_metadata(None, Duration::from_secs(3)).is_ok())
}

/// A record read back from a topic.
#[derive(Debug, Clone)]
pub struct ReadRecord {
    /// Partition.
    pub partition: i32,
    /// Offset.
    pub offset: i64,
    /// Key, as text.
    pub key: Option<String>,
    /// Headers with UTF-8 values (others are skipped).
    pub headers: Vec<(String, String)>,
    /// Payload.
    pub payload: Vec<u8>,
}

impl ReadRecord {
    /// The last value of header `name`.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().rev().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
    }
}

/// A test's own Kafka topic `t-<uuid>` and group `g-<uuid>`. Topics are not deleted afterwards:
/// the test broker's storage fails for good when a client still fetches a deleted topic.
pub struct TestKafka {
    /// Settings naming them: session timeout 6 s, revoke grace 1 s, `partitions` partitions.
    pub settings: KafkaSettings,
    /// The Kafka consumer group.
    pub group: String,
    /// The back-off whose levels are the retry topics.
    pub backoff: Backoff,
}

impl TestKafka {
    /// Fresh names with `partitions` partitions (the topic is created by the first connector
    /// that opens or publishes).
    pub fn new(partitions: i32, backoff: Backoff) -> Self {
        let tag = uuid::Uuid::new_v4().simple().to_string();
        let settings = KafkaSettings {
            brokers: kafka_brokers(),
            group_id: Some(format!("g-{tag}")),
            topics: vec![format!("t-{tag}")],
            session_timeout_ms: 6000,
            revoke_grace_ms: 1000,
            partitions,
            ..KafkaSettings::default()
        };
        Self { group: format!("g-{tag}"), settings, backoff }
    }

    /// The topic.
    pub fn topic(&self) -> &str {
        &self.settings.topics[0]
    }

    /// A connector on these names (message ids in `x-message-id`).
    pub fn connector(&self) -> Arc<KafkaConnector> {
        Arc::new(KafkaConnector::new(self.settings.clone(), &self.group, self.backoff.clone(), "x-message-id"))
    }

    /// Every record of `topic` from the beginning, waiting up to `within` until there are at least
    /// `min`.
    pub async fn read(&self, topic: &str, min: usize, within: Duration) -> Vec<ReadRecord> {
        let (brokers, topic) = (self.settings.brokers.clone(), topic.to_owned());
        tokio::task::spawn_blocking(move || read_blocking(&brokers, &topic, min, within))
            .await
            .expect("reader does not panic")
    }

    /// The group's committed offset of each partition of `topic` (`None`: nothing committed).
    pub async fn committed(&self, topic: &str) -> Vec<Option<i64>> {
        let (brokers, topic, group) = (self.settings.brokers.clone(), topic.to_owned(), self.group.clone());
        tokio::task::spawn_blocking(move || {
            let consumer: BaseConsumer = client(&brokers, &group);
            let partitions = partition_count(&consumer, &topic);
            let mut tpl = TopicPartitionList::new();
            tpl.add_partition_range(&topic, 0, partitions - 1);
            let committed = consumer.committed_offsets(tpl, Duration::from_secs(10)).expect("committed offsets");
            committed.elements().iter().map(|e| e.offset().to_raw().filter(|o| *o >= 0)).collect()
        })
        .await
        .expect("offset reader does not panic")
    }
}

fn client(brokers: &str, group: &str) -> BaseConsumer {
    ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .set("fetch.max.bytes", "1048576")
        .create()
        .expect("Kafka client")
}

fn partition_count(consumer: &BaseConsumer, topic: &str) -> i32 {
    let metadata = consumer.fetch_metadata(Some(topic), Duration::from_secs(10)).expect("topic metadata");
    let count = metadata.topics().first().map_or(0, |t| t.partitions().len());
    i32::try_from(count).expect("partition count fits")
}

fn read_blocking(brokers: &str, topic: &str, min: usize, within: Duration) -> Vec<ReadRecord> {
    let consumer = client(brokers, &format!("reader-{}", uuid::Uuid::new_v4().simple()));
    let started = Instant::now();
    let mut partitions = partition_count(&consumer, topic);
    while partitions == 0 && started.elapsed() < within {
        std::thread::sleep(Duration::from_millis(200));
        partitions = partition_count(&consumer, topic);
    }
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions {
        tpl.add_partition_offset(topic, p, Offset::Beginning).expect("partition added");
    }
    consumer.assign(&tpl).expect("assign");
    let mut records = Vec::new();
    while records.len() < min && started.elapsed() < within {
        let Some(Ok(m)) = consumer.poll(Duration::from_millis(200)) else { continue };
        let headers = m.headers().map_or_else(Vec::new, |h| {
            h.iter().filter_map(|h| Some((h.key.to_owned(), String::from_utf8(h.value?.to_vec()).ok()?))).collect()
        });
        records.push(ReadRecord {
            partition: m.partition(),
            offset: m.offset(),
            key: m.key().map(|k| String::from_utf8_lossy(k).into_owned()),
            headers,
            payload: m.payload().unwrap_or_default().to_vec(),
        });
    }
    records
}
