//! The broker under test (RabbitMQ or Kafka): its sources, publishing the bench's messages, and
//! Kafka's raw phase without the engine.

use std::sync::Arc;
use std::time::{Duration, Instant};

use dedup_engine::source::{Outbound, SourceFactory};
use dedup_engine::testing::TestBroker;
use dedup_engine::testing::kafka::TestKafka;
use futures::StreamExt;
use futures::stream::FuturesUnordered;
use rdkafka::ClientConfig;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};

use crate::BODY;
use crate::phases::Phase;

/// The broker under test: where sources come from and messages go.
pub enum Bench {
    RabbitMq(TestBroker),
    Kafka(TestKafka),
}

impl Bench {
    pub fn name(&self) -> &'static str {
        match self {
            Bench::RabbitMq(_) => "RabbitMQ",
            Bench::Kafka(_) => "Kafka",
        }
    }

    /// A fresh connector (each phase opens and closes its own).
    pub fn factory(&self) -> Arc<dyn SourceFactory> {
        match self {
            Bench::RabbitMq(broker) => broker.connector(),
            Bench::Kafka(kafka) => kafka.connector(),
        }
    }

    /// Publishes one message per id (keyed by id, so Kafka spreads them over the partitions).
    pub async fn publish(&self, ids: &[String]) {
        let factory = self.factory();
        let publisher = factory.open_publisher().await.unwrap();
        let destination = factory.destination();
        let headers = serde_json::Map::new();
        let mut in_flight = FuturesUnordered::new();
        for id in ids {
            in_flight.push(publisher.publish(Outbound {
                destination: &destination,
                routing_key: "bench",
                key: Some(id),
                message_id: Some(id),
                payload: BODY,
                headers: &headers,
                content_type: Some("application/json"),
                type_property: None,
            }));
            if in_flight.len() >= 512 {
                in_flight.next().await.unwrap().unwrap();
            }
        }
        while let Some(r) = in_flight.next().await {
            r.unwrap();
        }
        drop(in_flight);
        factory.close().await;
    }
}

/// A plain rdkafka loop on the bench's group: poll, and commit the position every `batch`
/// records (asynchronously, then once synchronously at the end).
pub fn raw_kafka(kafka: &TestKafka, total: usize, batch: usize) -> Phase {
    let s = &kafka.settings;
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &s.brokers)
        .set("group.id", &kafka.group)
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "earliest")
        .set("fetch.max.bytes", s.fetch_max_bytes.to_string())
        .set("max.partition.fetch.bytes", s.max_partition_fetch_bytes.to_string())
        .set("fetch.wait.max.ms", s.fetch_wait_max_ms.to_string())
        .set("session.timeout.ms", s.session_timeout_ms.to_string())
        .create()
        .unwrap();
    consumer.subscribe(&[kafka.topic()]).unwrap();
    let (mut seen, mut first) = (0, None);
    while seen < total {
        let Some(record) = consumer.poll(Duration::from_millis(100)) else { continue };
        record.unwrap();
        first.get_or_insert_with(Instant::now);
        seen += 1;
        if seen % batch == 0 {
            consumer.commit_consumer_state(CommitMode::Async).unwrap();
        }
    }
    consumer.commit_consumer_state(CommitMode::Sync).unwrap();
    let elapsed = first.unwrap().elapsed();
    eprintln!("raw rdkafka poll + commit: {total} in {elapsed:.1?}");
    Phase { name: "raw rdkafka poll + commit", messages: total, elapsed, pipeline: Duration::ZERO }
}
