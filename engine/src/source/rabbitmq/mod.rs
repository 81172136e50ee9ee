//! The RabbitMQ source (lapin): topology, manual acks after the database commit, delayed retry
//! queues, a dead-letter queue, and reconnection.
//!
//! Topology, declared at start (idempotent):
//! - the exchange messages are published to (`exchange`, default `orders.events`, topic);
//! - the work queue (`queue`) bound to it with `binding_keys`;
//! - one retry queue per back-off delay, `<queue>.retry.<ms>`, whose `x-message-ttl` is the
//!   delay and whose dead-letter target is the work queue (through the default exchange): a
//!   copy published there comes back after the delay. This is RabbitMQ's standard delayed
//!   retry without plugins, and it keeps the work queue moving meanwhile;
//! - the dead-letter queue `<queue>.dead` (or the configured dead-letter target).
//!
//! Each worker has its own channel (consumer, `basic.qos` prefetch) and its own confirm-mode
//! publishing channel. A batch is settled after the pipeline's commit: copies first (retry or
//! dead letter, each confirmed by the broker), then one `basic.ack` with `multiple` for the
//! whole batch (the worker's channel has no other unacked deliveries), or per-delivery acks
//! and `basic.nack(requeue)` when some must be redelivered.
//!
//! This file: settings, connection and topology ([`RabbitConnector`]); `publish.rs`: the
//! confirm-mode [`Publisher`]; `source.rs`: a worker's consumer ([`RabbitSource`]).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use lapin::options::{ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions};
use lapin::types::{AMQPValue, FieldTable, LongString};
use lapin::{Channel, Connection, ConnectionProperties, ExchangeKind};
use serde::{Deserialize, Serialize};
use tokio::sync::Mutex;

use super::{Publish, Source, SourceError, SourceFactory};
use crate::retry::Backoff;
use crate::service::{Service, Unreachable};

/// Stack size for threads spawned without an explicit one that a process consuming from RabbitMQ
/// should set (`RUST_MIN_STACK`, before its async runtime starts), in bytes: a virtual
/// reservation, pages are committed only when touched.
///
/// lapin parses each AMQP frame recursively on its own thread (`lapin-io-loop`), spawned with
/// the default 2 MiB stack: a producer's content header of deeply nested header tables (up to
/// RabbitMQ's `frame_max` of 128 KiB, about 18 000 levels) overflows it and aborts the whole
/// process, again at every restart while the message stays queued.
pub const MIN_THREAD_STACK_BYTES: usize = 512 << 20;

/// How long a shutdown waits for the broker to confirm a consumer cancel, a channel's close or
/// the connection's close. lapin's futures wait for the broker's reply; a reply that never came
/// is the likely cause of a `serve` that did not stop within 30 s of SIGTERM in a CI run (its
/// last log line: lapin's "invalid channel state: Closing"). The broker drops a connection's
/// channels with it anyway.
pub(super) const CLOSE_TIMEOUT: Duration = Duration::from_secs(5);

/// Header on retry and dead-letter copies naming the exchange the message was first published
/// to (a copy travels through other queues, but a requeue must go back to the original).
pub const SOURCE_EXCHANGE_HEADER: &str = "x-dedup-source-exchange";
/// Header on copies naming the original routing key.
pub const SOURCE_ROUTING_KEY_HEADER: &str = "x-dedup-source-routing-key";
/// Header on copies signing the two above ([`SourceKey`]): without a valid signature they are
/// ignored, so a producer cannot choose where a retry copy, a dead letter or a requeue goes.
pub const SOURCE_SIGNATURE_HEADER: &str = "x-dedup-source-signature";

/// The key that signs the source headers of the copies this product publishes (HMAC-SHA256 over
/// exchange, routing key, message id property and the payload's SHA-256). Every process consuming a queue must share it: the
/// engine keeps one in its database (`engine_keys`); a connector without one makes its own
/// (its copies are then trusted by itself only).
#[derive(Clone)]
pub struct SourceKey(Arc<[u8; 32]>);

impl SourceKey {
    /// A key of these bytes.
    pub fn new(bytes: [u8; 32]) -> Self {
        Self(Arc::new(bytes))
    }

    /// The signature (hex) of a copy's original exchange and routing key, bound to the copy's
    /// message id property and payload: lifted onto another message, it does not verify.
    pub(crate) fn sign(&self, exchange: &str, routing_key: &str, message_id: Option<&str>, payload: &[u8]) -> String {
        use hmac::{Hmac, Mac};
        use sha2::Digest;
        let mut mac = Hmac::<sha2::Sha256>::new_from_slice(self.0.as_slice()).expect("any key length");
        for part in [exchange, routing_key, message_id.unwrap_or_default()] {
            mac.update(part.as_bytes());
            mac.update(&[0]);
        }
        mac.update(&sha2::Sha256::digest(payload));
        mac.finalize().into_bytes().iter().map(|b| format!("{b:02x}")).collect()
    }

    /// Whether `signature` is this key's for these values (compared in constant time).
    pub(crate) fn verify(
        &self,
        exchange: &str,
        routing_key: &str,
        message_id: Option<&str>,
        payload: &[u8],
        signature: &str,
    ) -> bool {
        let expected = self.sign(exchange, routing_key, message_id, payload);
        expected.len() == signature.len()
            && expected.bytes().zip(signature.bytes()).fold(0u8, |acc, (a, b)| acc | (a ^ b)) == 0
    }
}

impl std::fmt::Debug for SourceKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SourceKey(…)")
    }
}
pub use super::DEAD_LETTER_REASON_HEADER;

pub mod amqp_values;
mod publish;
mod source;

pub use publish::{PublishError, Publisher, properties_for};
pub use source::RabbitSource;

/// RabbitMQ settings of a consumer.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RabbitSettings {
    /// Exchange the messages are published to (declared as a durable topic exchange).
    pub exchange: String,
    /// The work queue (durable).
    pub queue: String,
    /// Binding keys of the work queue on `exchange`.
    pub binding_keys: Vec<String>,
    /// Unacknowledged deliveries per worker channel (`basic.qos`).
    pub prefetch: u16,
    /// Exchange of dead-letter copies; `""` is the default exchange.
    pub dead_letter_exchange: String,
    /// Routing key of dead-letter copies; default `<queue>.dead` (the queue declared for them).
    pub dead_letter_routing_key: Option<String>,
    /// Tries to publish one dead-letter copy before giving up (the record stays `dead` in the
    /// database, with its payload, either way).
    pub dead_letter_publish_attempts: u32,
    /// Name shown for the connection in RabbitMQ's management tools (`<name> <host>:<pid>`).
    pub connection_name: String,
}

impl Default for RabbitSettings {
    fn default() -> Self {
        Self {
            exchange: "orders.events".to_owned(),
            queue: "orders.order-service".to_owned(),
            binding_keys: vec!["order.#".to_owned()],
            prefetch: 200,
            dead_letter_exchange: String::new(),
            dead_letter_routing_key: None,
            dead_letter_publish_attempts: 3,
            connection_name: "dedup-console".to_owned(),
        }
    }
}

impl RabbitSettings {
    /// Defaults, with messages published to `exchange` (a durable topic exchange) and consumed
    /// from `queue`, bound with `binding_keys`; the connection named after the queue.
    pub fn for_queue(
        exchange: impl Into<String>,
        queue: impl Into<String>,
        binding_keys: impl IntoIterator<Item = impl Into<String>>,
    ) -> Self {
        let queue = queue.into();
        Self {
            exchange: exchange.into(),
            binding_keys: binding_keys.into_iter().map(Into::into).collect(),
            connection_name: queue.clone(),
            queue,
            ..Self::default()
        }
    }

    /// The name of the retry queue for `delay`.
    pub fn retry_queue(&self, delay: Duration) -> String {
        format!("{}.retry.{}", self.queue, delay.as_millis())
    }

    /// The queue declared for dead-letter copies.
    pub fn dead_letter_queue(&self) -> String {
        format!("{}.dead", self.queue)
    }

    fn dead_letter_target(&self) -> (String, String) {
        let key = self.dead_letter_routing_key.clone().unwrap_or_else(|| self.dead_letter_queue());
        (self.dead_letter_exchange.clone(), key)
    }
}

/// Connects to RabbitMQ, declares the topology and opens one [`RabbitSource`] per worker.
/// Holds the shared connection; reconnects when it is gone.
pub struct RabbitConnector {
    url: String,
    settings: RabbitSettings,
    backoff: Backoff,
    source_key: SourceKey,
    connection: Mutex<Option<Arc<Connection>>>,
    connected: Arc<AtomicBool>,
}

impl RabbitConnector {
    /// A connector; does not connect until first used. It signs its copies' source headers with
    /// a key of its own; give it the engine's with [`RabbitConnector::with_source_key`].
    pub fn new(url: &str, settings: RabbitSettings, backoff: Backoff) -> Self {
        Self {
            url: url.to_owned(),
            settings,
            backoff,
            source_key: SourceKey::new(rand::random()),
            connection: Mutex::new(None),
            connected: Arc::new(AtomicBool::new(false)),
        }
    }

    /// Signs and trusts source headers with `key` (shared by every process on the queue).
    pub fn with_source_key(mut self, key: SourceKey) -> Self {
        self.source_key = key;
        self
    }

    /// The settings.
    pub fn settings(&self) -> &RabbitSettings {
        &self.settings
    }

    /// The live connection, connecting (and declaring the topology) when there is none.
    ///
    /// Errors: [`SourceError::Disconnected`] with the [`Unreachable`] text (service, redacted
    /// URL, how to start it).
    pub async fn connection(&self) -> Result<Arc<Connection>, SourceError> {
        let mut guard = self.connection.lock().await;
        if let Some(conn) = guard.as_ref().filter(|c| c.status().connected()) {
            return Ok(conn.clone());
        }
        self.connected.store(false, Ordering::Relaxed);
        let name = format!("{} {}:{}", self.settings.connection_name, crate::worker::hostname(), std::process::id());
        let conn = Connection::connect(&self.url, ConnectionProperties::default().with_connection_name(name.into()))
            .await
            .map_err(|e| SourceError::Disconnected(Unreachable::new(Service::RabbitMq, &self.url, e).to_string()))?;
        let conn = Arc::new(conn);
        let channel = conn.create_channel().await.map_err(broker)?;
        self.declare_topology(&channel).await?;
        let _ = channel.close(200, "topology declared".into()).await;
        tracing::info!(queue = %self.settings.queue, "connected to RabbitMQ; topology declared");
        self.connected.store(true, Ordering::Relaxed);
        *guard = Some(conn.clone());
        Ok(conn)
    }

    async fn declare_topology(&self, channel: &Channel) -> Result<(), SourceError> {
        let s = &self.settings;
        let durable = QueueDeclareOptions { durable: true, ..QueueDeclareOptions::default() };
        channel
            .exchange_declare(
                s.exchange.as_str().into(),
                ExchangeKind::Topic,
                ExchangeDeclareOptions { durable: true, ..ExchangeDeclareOptions::default() },
                FieldTable::default(),
            )
            .await
            .map_err(broker)?;
        channel.queue_declare(s.queue.as_str().into(), durable, FieldTable::default()).await.map_err(broker)?;
        for key in &s.binding_keys {
            channel
                .queue_bind(
                    s.queue.as_str().into(),
                    s.exchange.as_str().into(),
                    key.as_str().into(),
                    QueueBindOptions::default(),
                    FieldTable::default(),
                )
                .await
                .map_err(broker)?;
        }
        for delay in self.backoff.levels() {
            let mut args = FieldTable::default();
            args.insert(
                "x-message-ttl".into(),
                AMQPValue::LongLongInt(i64::try_from(delay.as_millis()).unwrap_or(i64::MAX)),
            );
            args.insert("x-dead-letter-exchange".into(), AMQPValue::LongString(LongString::from("")));
            args.insert("x-dead-letter-routing-key".into(), AMQPValue::LongString(LongString::from(s.queue.as_str())));
            channel.queue_declare(s.retry_queue(delay).as_str().into(), durable, args).await.map_err(broker)?;
        }
        if s.dead_letter_exchange.is_empty() && s.dead_letter_routing_key.is_none() {
            channel
                .queue_declare(s.dead_letter_queue().as_str().into(), durable, FieldTable::default())
                .await
                .map_err(broker)?;
        }
        Ok(())
    }

    /// A confirm-mode channel for publishing (simulator, requeue).
    pub async fn publisher(&self) -> Result<Publisher, SourceError> {
        let conn = self.connection().await?;
        Publisher::open(&conn).await
    }

    /// Forgets the connection so the next use reconnects.
    async fn invalidate(&self) {
        self.connected.store(false, Ordering::Relaxed);
        *self.connection.lock().await = None;
    }
}

fn broker(e: lapin::Error) -> SourceError {
    SourceError::Broker(e.to_string())
}

fn disconnected(e: lapin::Error) -> SourceError {
    SourceError::Disconnected(e.to_string())
}

#[async_trait]
impl SourceFactory for RabbitConnector {
    async fn open(&self, worker: usize) -> Result<Box<dyn Source>, SourceError> {
        let conn = self.connection().await?;
        let result =
            RabbitSource::open(&conn, &self.settings, self.backoff.clone(), self.source_key.clone(), worker).await;
        if result.is_err() {
            self.invalidate().await;
        }
        Ok(Box::new(result?))
    }

    fn broker(&self) -> crate::message::Broker {
        crate::message::Broker::RabbitMq
    }

    async fn depth(&self) -> Option<u64> {
        let conn = { self.connection.lock().await.clone()? };
        let channel = conn.create_channel().await.ok()?;
        let queue = channel
            .queue_declare(
                self.settings.queue.as_str().into(),
                QueueDeclareOptions { passive: true, ..QueueDeclareOptions::default() },
                FieldTable::default(),
            )
            .await
            .ok();
        let _ = channel.close(200, "depth".into()).await;
        queue.map(|q| u64::from(q.message_count()))
    }

    fn connected(&self) -> bool {
        self.connected.load(Ordering::Relaxed)
    }

    async fn close(&self) {
        if let Some(conn) = self.connection.lock().await.take() {
            let _ = tokio::time::timeout(CLOSE_TIMEOUT, conn.close(200, "shutting down".into())).await;
        }
        self.connected.store(false, Ordering::Relaxed);
    }

    async fn open_publisher(&self) -> Result<Arc<dyn Publish>, SourceError> {
        Ok(Arc::new(self.publisher().await?))
    }

    fn destination(&self) -> String {
        self.settings.exchange.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::SourceKey;

    #[test]
    fn a_source_signature_fits_only_its_own_message() {
        let key = SourceKey::new([7; 32]);
        let signature = key.sign("orders", "order.notify", None, b"{\"orderNo\":\"1\"}");
        assert!(key.verify("orders", "order.notify", None, b"{\"orderNo\":\"1\"}", &signature));
        assert!(!key.verify("orders", "order.notify", None, b"{\"orderNo\":\"2\"}", &signature), "another payload");
        assert!(!key.verify("orders", "order.notify", Some("ORDER.PAY.1:1"), b"{\"orderNo\":\"1\"}", &signature));
        assert!(!key.verify("orders", "order.pay", None, b"{\"orderNo\":\"1\"}", &signature), "another origin");
        assert!(!SourceKey::new([8; 32]).verify("orders", "order.notify", None, b"{\"orderNo\":\"1\"}", &signature));
    }
}
