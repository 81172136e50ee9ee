//! Test support: a fresh PostgreSQL database per test, migrated, dropped afterwards
//! ([`TestDatabase`]); with `mysql`, a fresh MySQL/MariaDB database
//! ([`mysql::TestMySqlDatabase`]) — each database's in its store's folder
//! (`store/<database>/test_database.rs`); with the `rabbitmq` and `kafka` features, a test's own
//! queues ([`TestBroker`]) and topics.
//!
//! Enabled by the `testing` feature (the engine's and the server's tests turn it on).

#[cfg(feature = "rabbitmq")]
pub mod amqp;
mod counters;
#[cfg(feature = "kafka")]
pub mod kafka;

/// A fresh MySQL/MariaDB database per test (feature `mysql`): [`TestMySqlDatabase`] on the
/// server of [`admin_url`].
#[cfg(feature = "mysql")]
pub mod mysql {
    pub use crate::store::mysql::test_database::{TestMySqlDatabase, admin_url};
}

pub use self::counters::deadlock_reruns;
use crate::message::{Broker, InboundMessage, SourceRef};
pub use crate::store::postgres::test_database::{TestDatabase, admin_url, database_url};

/// A delivery as the tests' RabbitMQ hands it over: `payload` as `application/json`, `id` (if
/// any) in the AMQP `message_id` property, from exchange `test.exchange` with routing key
/// `test.key` on queue `test.queue`, not redelivered.
pub fn rabbitmq_delivery(id: Option<&str>, payload: Vec<u8>) -> InboundMessage {
    InboundMessage {
        payload,
        headers: serde_json::Map::new(),
        property_message_id: id.map(str::to_owned),
        type_property: None,
        published_at: None,
        content_type: Some("application/json".to_owned()),
        broker: Broker::RabbitMq,
        source: SourceRef {
            exchange: Some("test.exchange".to_owned()),
            routing_key: Some("test.key".to_owned()),
            queue: Some("test.queue".to_owned()),
            offset: None,
            key_not_text: false,
        },
        redelivered: false,
        headers_too_deep: false,
    }
}

/// RabbitMQ of the tests (`AMQP_URL`, default local guest).
pub fn amqp_url() -> String {
    std::env::var("AMQP_URL").unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".to_owned())
}

/// Redis of the tests (`REDIS_URL`, default local).
pub fn redis_url() -> String {
    std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned())
}

#[cfg(feature = "rabbitmq")]
/// A test's own exchange, work queue, retry and dead-letter queues (names `t-<uuid>.*`) and
/// connection name; all deleted when dropped.
pub struct TestBroker {
    /// The settings naming them (prefetch 50, binding `#`).
    pub settings: crate::source::rabbitmq::RabbitSettings,
    /// The back-off whose levels are the retry queues.
    pub backoff: crate::retry::Backoff,
    url: String,
    extra_queues: Vec<String>,
}

#[cfg(feature = "rabbitmq")]
impl TestBroker {
    /// Fresh names on the broker at `url`.
    pub fn new(url: &str, backoff: crate::retry::Backoff) -> Self {
        let tag = uuid::Uuid::new_v4().simple().to_string();
        let settings = crate::source::rabbitmq::RabbitSettings {
            exchange: format!("t-{tag}.events"),
            queue: format!("t-{tag}.work"),
            binding_keys: vec!["#".to_owned()],
            prefetch: 50,
            connection_name: format!("dedup-test-{tag}"),
            ..crate::source::rabbitmq::RabbitSettings::default()
        };
        Self { settings, backoff, url: url.to_owned(), extra_queues: Vec::new() }
    }

    /// Deletes `queue` too when dropped.
    pub fn also_delete(&mut self, queue: &str) {
        self.extra_queues.push(queue.to_owned());
    }

    /// A work queue of another consumer group on the same exchange, `<queue>.<suffix>`, deleted
    /// when dropped together with its retry and dead-letter queues.
    pub fn another_queue(&mut self, suffix: &str) -> String {
        let queue = format!("{}.{suffix}", self.settings.queue);
        let settings = crate::source::rabbitmq::RabbitSettings { queue: queue.clone(), ..self.settings.clone() };
        for delay in self.backoff.levels() {
            self.also_delete(&settings.retry_queue(delay));
        }
        self.also_delete(&settings.dead_letter_queue());
        self.also_delete(&queue);
        queue
    }

    /// A connector on these names.
    pub fn connector(&self) -> std::sync::Arc<crate::source::rabbitmq::RabbitConnector> {
        std::sync::Arc::new(crate::source::rabbitmq::RabbitConnector::new(
            &self.url,
            self.settings.clone(),
            self.backoff.clone(),
        ))
    }

    /// A plain channel on a new connection.
    pub async fn channel(&self) -> lapin::Channel {
        let conn =
            lapin::Connection::connect(&self.url, lapin::ConnectionProperties::default()).await.expect("RabbitMQ");
        conn.create_channel().await.expect("channel")
    }

    /// (ready messages, consumers) of `queue`; `None` when it does not exist (yet).
    pub async fn queue_state(&self, queue: &str) -> Option<(u32, u32)> {
        let options = lapin::options::QueueDeclareOptions { passive: true, ..Default::default() };
        let q = self.channel().await.queue_declare(queue.into(), options, Default::default()).await.ok()?;
        Some((q.message_count(), q.consumer_count()))
    }

    /// Messages ready in `queue` (unacknowledged ones not counted). Panics when it is missing.
    pub async fn depth(&self, queue: &str) -> u32 {
        self.queue_state(queue).await.expect("queue exists").0
    }
}

#[cfg(feature = "rabbitmq")]
impl Drop for TestBroker {
    fn drop(&mut self) {
        let mut queues: Vec<String> = self.backoff.levels().into_iter().map(|d| self.settings.retry_queue(d)).collect();
        queues.push(self.settings.queue.clone());
        queues.push(self.settings.dead_letter_queue());
        queues.append(&mut self.extra_queues);
        let exchange = self.settings.exchange.clone();
        let url = self.url.clone();
        let _ = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().ok()?;
            runtime.block_on(async move {
                let conn = lapin::Connection::connect(&url, lapin::ConnectionProperties::default()).await.ok()?;
                let channel = conn.create_channel().await.ok()?;
                for q in queues {
                    let _ = channel.queue_delete(q.as_str().into(), Default::default()).await;
                }
                let _ = channel.exchange_delete(exchange.as_str().into(), Default::default()).await;
                conn.close(200, "test done".into()).await.ok()
            })
        })
        .join();
    }
}
