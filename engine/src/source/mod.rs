//! Message sources: where deliveries come from and how their dispositions are carried out.
//!
//! The engine core never acknowledges anything itself: the pipeline returns a
//! [`Disposition`](crate::pipeline::Disposition) per delivery, and the source applies it in its
//! broker's terms — RabbitMQ acks, delayed retry queues and a dead-letter queue; Kafka offset
//! commits that never pass an unfinished record, retry topics and a dead-letter topic.
//! One [`Source`] belongs to one worker; a [`SourceFactory`] opens them and reopens them after a
//! connection loss. A [`Publish`] sends new messages (simulator, demo traffic) and requeued
//! records to the same broker.

#[cfg(feature = "kafka")]
pub mod kafka;
#[cfg(feature = "rabbitmq")]
pub mod rabbitmq;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use crate::message::{Broker, InboundMessage};
use crate::pipeline::Disposition;

/// Bytes as a JSON string when they are UTF-8, else as an array of numbers (AMQP long strings,
/// Kafka header values).
#[cfg(any(feature = "rabbitmq", feature = "kafka"))]
pub(crate) fn bytes_to_json(bytes: &[u8]) -> serde_json::Value {
    match std::str::from_utf8(bytes) {
        Ok(s) => serde_json::Value::String(s.to_owned()),
        Err(_) => serde_json::Value::Array(bytes.iter().map(|b| serde_json::Value::from(*b)).collect()),
    }
}

/// Header on dead-letter copies (queue or topic) with the reason the record is dead.
pub const DEAD_LETTER_REASON_HEADER: &str = "x-dedup-dead-letter-reason";

/// Errors of a source.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    /// The connection or channel is gone; open a new source (after a back-off).
    #[error("broker connection lost: {0}")]
    Disconnected(String),
    /// The broker refused an operation (permissions, limits).
    #[error("broker error: {0}")]
    Broker(String),
    /// The broker refused the group's topology: an exchange or queue that exists with other
    /// settings (RabbitMQ's 406 PRECONDITION_FAILED, e.g. a `direct` exchange declared as
    /// `topic`), one that is missing where it should exist, or no permission to declare it. The
    /// workers keep trying (someone may fix it), and the group is unhealthy meanwhile.
    #[error("the broker refused the consumer group's topology: {0}")]
    Topology(String),
}

/// One worker's stream of deliveries.
#[async_trait]
pub trait Source: Send {
    /// Waits for the next batch: at least one delivery, at most `max`, gathering for at most
    /// `linger` after the first arrived. `Ok(None)` when the source was stopped (shutdown). The
    /// batch must be settled with [`Source::settle`] before the next call.
    async fn next_batch(&mut self, max: usize, linger: Duration) -> Result<Option<&[InboundMessage]>, SourceError>;

    /// Carries out one disposition per delivery of the last batch, in order: retry and
    /// dead-letter copies are published (and confirmed) before their originals are
    /// acknowledged.
    async fn settle(&mut self, dispositions: &[Disposition]) -> Result<(), SourceError>;

    /// Stops taking deliveries (cancels the subscription); deliveries not yet taken go back to
    /// the broker.
    async fn stop(&mut self);
}

/// Opens sources for workers.
#[async_trait]
pub trait SourceFactory: Send + Sync + 'static {
    /// Opens the source of worker number `worker` (0-based), connecting if needed.
    async fn open(&self, worker: usize) -> Result<Box<dyn Source>, SourceError>;

    /// Messages waiting in the source (queue depth or consumer lag), if known.
    async fn depth(&self) -> Option<u64>;

    /// The broker this source reads from.
    fn broker(&self) -> crate::message::Broker;

    /// Whether the broker connection is up.
    fn connected(&self) -> bool;

    /// What this process owns of the source, as the overview's instance list shows it: the Kafka
    /// partitions assigned to its group member (`<topic>[<partition>]`, sorted), or the RabbitMQ
    /// queue its workers' channels read (`queue <name>`) while connected. Default: nothing.
    async fn owned(&self) -> Vec<String> {
        Vec::new()
    }

    /// Closes the connection (after the workers have stopped).
    async fn close(&self);

    /// A publisher on the same broker, connecting if needed.
    ///
    /// Errors: as [`SourceFactory::open`].
    async fn open_publisher(&self) -> Result<Arc<dyn Publish>, SourceError>;

    /// Where new messages for this consumer are published: the exchange (RabbitMQ) or the first
    /// topic (Kafka).
    fn destination(&self) -> String;
}

/// A message to publish, in broker-neutral terms. A requeue fills it from a stored record:
/// `destination`, `routing_key` and `key` from its [`SourceRef`](crate::message::SourceRef), so
/// the copy goes back where the original came from with the same message id and key.
#[derive(Debug, Clone, Copy)]
pub struct Outbound<'a> {
    /// Exchange (RabbitMQ) or topic (Kafka).
    pub destination: &'a str,
    /// RabbitMQ routing key (Kafka ignores it).
    pub routing_key: &'a str,
    /// Kafka record key, which also picks the partition (RabbitMQ ignores it); `None`: no key.
    pub key: Option<&'a str>,
    /// The business message id: the AMQP `message_id` property, or the Kafka id header.
    pub message_id: Option<&'a str>,
    /// The body.
    pub payload: &'a [u8],
    /// Headers, as stored on records (JSON values).
    pub headers: &'a serde_json::Map<String, serde_json::Value>,
    /// Content type (AMQP property; Kafka header `content-type`).
    pub content_type: Option<&'a str>,
    /// The AMQP `type` property (RabbitMQ; Kafka has none and ignores it).
    pub type_property: Option<&'a str>,
}

/// A publish that the broker did not confirm.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct PublishFailed(pub String);

/// Publishes messages to one broker and waits for its confirmation.
#[async_trait]
pub trait Publish: Send + Sync {
    /// Which broker this publishes to.
    fn broker(&self) -> Broker;

    /// Publishes `message` persistently and returns once the broker has confirmed it.
    ///
    /// Errors: the broker refused or did not confirm it (unroutable, nacked, timed out).
    async fn publish(&self, message: Outbound<'_>) -> Result<(), PublishFailed>;

    /// Closes what this publisher holds of the broker connection (RabbitMQ: its channel), before
    /// the connection itself is closed: left to a drop, lapin closes the channel in the
    /// background, racing the connection's close, and logs that race as an ERROR. Default: nothing
    /// to close.
    async fn close(&self) {}
}

/// Tries `publish` up to `attempts` times (at least once), 100 ms × attempt apart, for a
/// dead-letter copy of `what` (a description for the log). DESIGN.md ("Retries and dead
/// letters"): those tries are bounded, and the record stays `dead` in the database with its
/// payload either way; a copy that could not be published is counted in
/// `dedup_dead_letter_publish_failures_total`. Returns whether the copy was published.
#[cfg(any(feature = "rabbitmq", feature = "kafka"))]
pub(crate) async fn publish_dead_letter<T, E, F>(
    attempts: u32,
    what: &(dyn std::fmt::Display + Sync),
    mut publish: impl FnMut() -> F,
) -> bool
where
    E: std::fmt::Display,
    F: Future<Output = Result<T, E>>,
{
    let attempts = attempts.max(1);
    for attempt in 1..=attempts {
        match publish().await {
            Ok(_) => return true,
            Err(e) => {
                tracing::warn!(attempt, attempts, error = %e, "dead-letter copy not published");
                if attempt < attempts {
                    tokio::time::sleep(Duration::from_millis(100 * u64::from(attempt))).await;
                }
            }
        }
    }
    metrics::counter!("dedup_dead_letter_publish_failures_total").increment(1);
    tracing::error!(
        message = %what,
        "dead-letter copy could not be published; the record stays dead in the database with its payload"
    );
    false
}
