//! Cluster-side helpers: creating the topics a consumer needs, measuring its group's lag, and
//! the readiness probe.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::error::{KafkaResult, RDKafkaErrorCode};
use rdkafka::producer::{FutureProducer, Producer};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

use super::KafkaSettings;
use crate::service::{Service, Unreachable};
use crate::source::SourceError;

/// A topic the consumer needs.
#[derive(Debug, Clone)]
pub(super) struct TopicSpec {
    /// Its name.
    pub name: String,
    /// How many partitions to create it with.
    pub partitions: Partitions,
}

/// The partition count of a topic to create.
#[derive(Debug, Clone)]
pub(super) enum Partitions {
    /// This many.
    Fixed(i32),
    /// As many as this topic has (dead-letter topics follow their source topic); when that
    /// topic is missing too, `settings.partitions`.
    Like(String),
}

/// Kafka could not be reached: names the service, the brokers and how to start the local one.
pub(super) fn unreachable(brokers: &str, cause: impl std::fmt::Display) -> SourceError {
    let error = Unreachable { service: Service::Kafka, url: brokers.to_owned(), cause: cause.to_string() };
    SourceError::Disconnected(error.to_string())
}

/// Partition counts of the cluster's topics (one metadata round trip, off the async runtime).
async fn partition_counts(
    admin: &Arc<AdminClient<DefaultClientContext>>,
    timeout: Duration,
) -> KafkaResult<HashMap<String, usize>> {
    let admin = admin.clone();
    tokio::task::spawn_blocking(move || {
        let metadata = admin.inner().fetch_metadata(None, timeout)?;
        Ok(metadata
            .topics()
            .iter()
            .filter(|t| t.error().is_none())
            .map(|t| (t.name().to_owned(), t.partitions().len()))
            .collect())
    })
    .await
    .expect("metadata task does not panic")
}

/// Creates the missing topics of `wanted` (when `settings.create_topics`), then waits until the
/// cluster's metadata shows all of them.
///
/// Errors: [`SourceError::Disconnected`] when the cluster does not answer;
/// [`SourceError::Broker`] when topics are missing and may not be created, or creating one failed.
pub(super) async fn ensure_topics(settings: &KafkaSettings, wanted: &[TopicSpec]) -> Result<(), SourceError> {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", &settings.brokers)
        .create()
        .map_err(|e| SourceError::Broker(format!("cannot create the Kafka admin client: {e}")))?;
    let admin = Arc::new(admin);
    let timeout = Duration::from_millis(settings.request_timeout_ms);
    let existing = partition_counts(&admin, timeout).await.map_err(|e| unreachable(&settings.brokers, e))?;
    let missing: Vec<&TopicSpec> = wanted.iter().filter(|t| !existing.contains_key(&t.name)).collect();
    if missing.is_empty() {
        return Ok(());
    }
    let names: Vec<&str> = missing.iter().map(|t| t.name.as_str()).collect();
    if !settings.create_topics {
        return Err(SourceError::Broker(format!(
            "Kafka topics {names:?} do not exist; create them, or set consumer.kafka.create_topics = true"
        )));
    }
    let new_topics: Vec<NewTopic<'_>> = missing
        .iter()
        .map(|t| {
            let partitions = match &t.partitions {
                Partitions::Fixed(n) => *n,
                Partitions::Like(topic) => {
                    existing.get(topic).map_or(settings.partitions, |p| i32::try_from(*p).unwrap_or(i32::MAX))
                }
            };
            NewTopic::new(&t.name, partitions, TopicReplication::Fixed(settings.replication_factor))
        })
        .collect();
    let options = AdminOptions::new().operation_timeout(Some(timeout));
    let results = admin.create_topics(&new_topics, &options).await.map_err(|e| unreachable(&settings.brokers, e))?;
    for result in results {
        match result {
            Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((name, code)) => return Err(SourceError::Broker(format!("cannot create Kafka topic {name}: {code}"))),
        }
    }
    let started = Instant::now();
    loop {
        let counts = partition_counts(&admin, timeout).await.map_err(|e| unreachable(&settings.brokers, e))?;
        if names.iter().all(|n| counts.contains_key(*n)) {
            tracing::info!(topics = ?names, "Kafka topics created");
            return Ok(());
        }
        if started.elapsed() > timeout {
            return Err(SourceError::Broker(format!("created Kafka topics {names:?} do not show up in the metadata")));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Records of `topics` the group of `consumer` has not committed yet: over their partitions,
/// the high watermark minus the committed offset (see [`positions`]). Blocking: call it off
/// the async runtime.
pub(super) fn lag(consumer: &BaseConsumer, topics: &[String], timeout: Duration) -> KafkaResult<u64> {
    let lag =
        positions(consumer, topics, timeout)?.iter().map(|(from, high)| u64::try_from(high - from).unwrap_or(0)).sum();
    // Serve (and drop) the client's queued events: nothing else polls this consumer.
    let _ = consumer.poll(Duration::ZERO);
    Ok(lag)
}

/// Per partition of `topics`, in metadata order: the committed offset of the group of
/// `consumer` (the low watermark where nothing is committed) and the high watermark. Blocking:
/// a metadata request, an offset fetch and a watermark request per partition, each bounded by
/// `timeout`.
pub(super) fn positions<C: ConsumerContext>(
    consumer: &BaseConsumer<C>,
    topics: &[String],
    timeout: Duration,
) -> KafkaResult<Vec<(i64, i64)>> {
    let metadata = consumer.fetch_metadata(None, timeout)?;
    let mut partitions = TopicPartitionList::new();
    for topic in metadata.topics().iter().filter(|t| topics.iter().any(|name| name == t.name())) {
        for partition in topic.partitions() {
            partitions.add_partition(topic.name(), partition.id());
        }
    }
    let committed = consumer.committed_offsets(partitions, timeout)?;
    committed
        .elements()
        .iter()
        .map(|element| {
            let (low, high) = consumer.fetch_watermarks(element.topic(), element.partition(), timeout)?;
            let from = match element.offset() {
                Offset::Offset(offset) => offset,
                _ => low,
            };
            Ok((from, high))
        })
        .collect()
}

/// The readiness probe of a Kafka cluster: a metadata round trip on a long-lived client.
pub struct KafkaProbe {
    producer: FutureProducer,
    brokers: String,
}

impl KafkaProbe {
    /// A probe of the cluster at `brokers` (`host:port[,…]`). Does not connect yet.
    ///
    /// Errors: an invalid client configuration.
    pub fn new(brokers: &str) -> anyhow::Result<Self> {
        let producer = ClientConfig::new().set("bootstrap.servers", brokers).create()?;
        Ok(Self { producer, brokers: brokers.to_owned() })
    }

    /// The brokers probed.
    pub fn brokers(&self) -> &str {
        &self.brokers
    }

    /// Asks a broker for the cluster's metadata, waiting at most `timeout`.
    ///
    /// Errors: no broker answered in time.
    pub async fn check(&self, timeout: Duration) -> anyhow::Result<()> {
        let producer = self.producer.clone();
        tokio::task::spawn_blocking(move || producer.client().fetch_metadata(None, timeout).map(|_| ())).await??;
        Ok(())
    }
}
