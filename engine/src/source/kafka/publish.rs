//! Publishing to Kafka: retry and dead-letter copies, the simulator, and requeues of stored
//! records (back to their original topic with the same message id and key).

use std::time::Duration;

use async_trait::async_trait;
use rdkafka::ClientConfig;
use rdkafka::message::OwnedHeaders;
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::util::Timeout;

use super::KafkaSettings;
use super::delivery::{CONTENT_TYPE_HEADER, header_value, is_bookkeeping, owned_headers};
use crate::message::Broker;
use crate::source::{Outbound, Publish, PublishFailed, SourceError};

/// A Kafka producer that waits for each record's acknowledgement (`acks=all`). Not idempotent:
/// the local test broker's idempotence check breaks under concurrent produces, and a record the
/// producer's own retry duplicates is a duplicate delivery like any other — the dedup table
/// skips it. Cheap to clone.
#[derive(Clone)]
pub struct KafkaPublisher {
    producer: FutureProducer,
    id_header: String,
    timeout: Duration,
}

impl KafkaPublisher {
    /// A producer on `settings.brokers`; `id_header` is the header message ids are written to
    /// (the first header of the consumer's `ids.from`). Does not connect until the first send.
    ///
    /// Errors: [`SourceError::Broker`] for an invalid client configuration.
    pub fn new(settings: &KafkaSettings, id_header: &str) -> Result<Self, SourceError> {
        let producer = ClientConfig::new()
            .set("bootstrap.servers", &settings.brokers)
            .set("client.id", &settings.client_id)
            .set("message.timeout.ms", settings.request_timeout_ms.to_string())
            .set("acks", "all")
            .set("enable.idempotence", "false")
            .set("linger.ms", "5")
            .create()
            .map_err(|e| SourceError::Broker(format!("cannot create the Kafka producer: {e}")))?;
        Ok(Self {
            producer,
            id_header: id_header.to_owned(),
            timeout: Duration::from_millis(settings.request_timeout_ms),
        })
    }

    /// Sends one record and waits until the broker has acknowledged it (at most the publish
    /// timeout); returns its partition and offset. Without a key the producer picks the
    /// partition.
    ///
    /// Errors: the broker did not acknowledge the record (unknown topic, timeout, refusal).
    pub async fn send(
        &self,
        topic: &str,
        key: Option<&[u8]>,
        payload: &[u8],
        headers: OwnedHeaders,
    ) -> Result<(i32, i64), PublishFailed> {
        let mut record = FutureRecord::<[u8], [u8]>::to(topic).payload(payload).headers(headers);
        if let Some(key) = key {
            record = record.key(key);
        }
        match self.producer.send(record, Timeout::After(self.timeout)).await {
            Ok(delivery) => Ok((delivery.partition, delivery.offset)),
            Err((e, _)) => Err(PublishFailed(format!("publishing to Kafka topic {topic:?} failed: {e}"))),
        }
    }
}

#[async_trait]
impl Publish for KafkaPublisher {
    fn broker(&self) -> Broker {
        Broker::Kafka
    }

    /// To `destination` (the topic) with `key`; the message id in the id header and the content
    /// type in `content-type`, overriding stored headers of those names. The engine's own copy
    /// bookkeeping headers (`x-dedup-*`) are not republished.
    async fn publish(&self, message: Outbound<'_>) -> Result<(), PublishFailed> {
        let stored: Vec<(&str, Option<Vec<u8>>)> = message
            .headers
            .iter()
            .filter(|(k, _)| !is_bookkeeping(k))
            .filter(|(k, _)| message.message_id.is_none() || **k != self.id_header)
            .filter(|(k, _)| message.content_type.is_none() || *k != CONTENT_TYPE_HEADER)
            .map(|(k, v)| (k.as_str(), header_value(v)))
            .collect();
        let set = [(self.id_header.as_str(), message.message_id), (CONTENT_TYPE_HEADER, message.content_type)];
        let headers = owned_headers(
            stored
                .iter()
                .map(|(k, v)| (*k, v.as_deref()))
                .chain(set.iter().filter_map(|(k, v)| Some((*k, Some(v.as_ref()?.as_bytes()))))),
        );
        self.send(message.destination, message.key.map(str::as_bytes), message.payload, headers).await.map(|_| ())
    }
}
