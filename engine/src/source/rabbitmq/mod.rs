//! The RabbitMQ source (lapin): topology, manual acks after the database commit, delayed retry
//! queues, a dead-letter queue, and reconnection.
//!
//! Topology, declared at start (idempotent):
//! - the exchange messages are published to (`exchange`, of `exchange_type`: topic by default,
//!   direct or fanout), and the work queue (`queue`) bound to it with `binding_keys` — or, with
//!   `topology = "existing"`, both made by the team's own tooling and only checked (passively);
//!   a broker refusing them (an exchange of another type, a queue with other arguments, one that
//!   is missing, no permission) is a [`SourceError::Topology`]: the group is unhealthy on
//!   `/readyz` and the console's overview until it is fixed;
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
//! confirm-mode [`Publisher`]; `source.rs`: a worker's consumer ([`RabbitSource`]);
//! `header_depth.rs`: the connections' bound on how deeply a message's header tables nest, so
//! that no thread needs more than the default stack.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use lapin::options::{ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions};
use lapin::protocol::{AMQPErrorKind, AMQPSoftError};
use lapin::types::{AMQPValue, FieldTable, LongString};
use lapin::{Channel, Connection, ConnectionProperties, ErrorKind, ExchangeKind};
use serde::{Deserialize, Serialize};
use tokio::sync::Mutex;

use super::{Publish, Source, SourceError, SourceFactory};
use crate::retry::Backoff;
use crate::service::{Service, Unreachable};

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
mod header_depth;
mod publish;
mod source;

pub(crate) use header_depth::connect;
pub use publish::{PublishError, Publisher, properties_for};
pub use source::RabbitSource;

/// RabbitMQ settings of a consumer. The exchange, queue and binding keys have no default (an
/// engine refuses to start a group without a queue): name them ([`RabbitSettings::for_queue`]).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RabbitSettings {
    /// Exchange the messages are published to.
    pub exchange: String,
    /// The type the exchange is declared with: `topic` (default), `direct` or `fanout`. A
    /// declare of an exchange that exists with another type is refused by the broker.
    pub exchange_type: ExchangeType,
    /// Whether the exchange, the work queue and its bindings are declared at start (`declare`,
    /// default) or exist already (`existing`: checked, never declared nor bound).
    pub topology: Topology,
    /// The work queue (durable).
    pub queue: String,
    /// Binding keys of the work queue on `exchange` (a fanout exchange ignores them; without
    /// any the queue is bound once with the key `""`).
    pub binding_keys: Vec<String>,
    /// Unacknowledged deliveries per worker channel (`basic.qos`). Default 200.
    pub prefetch: u16,
    /// Exchange of dead-letter copies; `""` (default) is the default exchange.
    pub dead_letter_exchange: String,
    /// Routing key of dead-letter copies; default `<queue>.dead` (the queue declared for them).
    pub dead_letter_routing_key: Option<String>,
    /// Tries to publish one dead-letter copy before giving up (the record stays `dead` in the
    /// database, with its payload, either way). Default 3.
    pub dead_letter_publish_attempts: u32,
    /// Name shown for the connection in RabbitMQ's management tools (`<name> <host>:<pid>`);
    /// `""` (default): the queue's name.
    pub connection_name: String,
}

impl Default for RabbitSettings {
    fn default() -> Self {
        Self {
            exchange: String::new(),
            exchange_type: ExchangeType::Topic,
            topology: Topology::Declare,
            queue: String::new(),
            binding_keys: Vec::new(),
            prefetch: 200,
            dead_letter_exchange: String::new(),
            dead_letter_routing_key: None,
            dead_letter_publish_attempts: 3,
            connection_name: String::new(),
        }
    }
}

/// The type of a declared exchange ([`RabbitSettings::exchange_type`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ExchangeType {
    /// Routes by binding patterns (`order.#`).
    #[default]
    Topic,
    /// Routes by exact routing key.
    Direct,
    /// Routes every message to every bound queue.
    Fanout,
}

impl ExchangeType {
    fn kind(self) -> ExchangeKind {
        match self {
            ExchangeType::Topic => ExchangeKind::Topic,
            ExchangeType::Direct => ExchangeKind::Direct,
            ExchangeType::Fanout => ExchangeKind::Fanout,
        }
    }
}

/// Who makes a group's exchange, work queue and bindings ([`RabbitSettings::topology`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Topology {
    /// The engine, at start (idempotent declares).
    #[default]
    Declare,
    /// The team's own tooling: the engine checks that the exchange and the queue exist
    /// (passive declares) and binds nothing. Its own retry and dead-letter queues are declared
    /// as usual.
    Existing,
}

impl RabbitSettings {
    /// Defaults, with messages published to `exchange` (a durable topic exchange) and consumed
    /// from `queue`, bound with `binding_keys`.
    pub fn for_queue(
        exchange: impl Into<String>,
        queue: impl Into<String>,
        binding_keys: impl IntoIterator<Item = impl Into<String>>,
    ) -> Self {
        Self {
            exchange: exchange.into(),
            binding_keys: binding_keys.into_iter().map(Into::into).collect(),
            queue: queue.into(),
            ..Self::default()
        }
    }

    /// What keeps these settings from naming a topology: no queue, or no exchange to declare.
    ///
    /// Errors: the reason, naming the setting.
    pub(crate) fn check(&self) -> Result<(), String> {
        if self.queue.is_empty() {
            return Err("RabbitMQ: no queue (`queue`)".to_owned());
        }
        if self.exchange.is_empty() && self.topology == Topology::Declare {
            return Err(
                "RabbitMQ: no exchange to declare (`exchange`; the default exchange cannot be bound)".to_owned()
            );
        }
        Ok(())
    }

    /// The name of the retry queue for `delay`.
    pub(crate) fn retry_queue(&self, delay: Duration) -> String {
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

    fn connection_name(&self) -> &str {
        if self.connection_name.is_empty() { &self.queue } else { &self.connection_name }
    }
}

/// Connects to RabbitMQ, declares the topology and opens one source per worker.
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
    /// a key of its own (an engine gives its groups' connectors the key all its processes share).
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
    pub(crate) fn with_source_key(mut self, key: SourceKey) -> Self {
        self.source_key = key;
        self
    }

    /// The live connection, connecting (and declaring the topology) when there is none.
    ///
    /// Errors: [`SourceError::Disconnected`] with the [`Unreachable`] text (service, redacted
    /// URL, how to start it).
    pub(crate) async fn connection(&self) -> Result<Arc<Connection>, SourceError> {
        let mut guard = self.connection.lock().await;
        if let Some(conn) = guard.as_ref().filter(|c| c.status().connected()) {
            return Ok(conn.clone());
        }
        self.connected.store(false, Ordering::Relaxed);
        let name = format!("{} {}:{}", self.settings.connection_name(), crate::worker::hostname(), std::process::id());
        let conn = header_depth::connect(&self.url, ConnectionProperties::default().with_connection_name(name.into()))
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
        match s.topology {
            Topology::Declare => {
                let kind = s.exchange_type.kind();
                let options = ExchangeDeclareOptions { durable: true, ..ExchangeDeclareOptions::default() };
                channel
                    .exchange_declare(s.exchange.as_str().into(), kind, options, FieldTable::default())
                    .await
                    .map_err(|e| {
                        topology(e, &format!("declaring the {:?} exchange {:?}", s.exchange_type, s.exchange))
                    })?;
                channel
                    .queue_declare(s.queue.as_str().into(), durable, FieldTable::default())
                    .await
                    .map_err(|e| topology(e, &format!("declaring the queue {:?}", s.queue)))?;
                let keys: Vec<&str> = if s.binding_keys.is_empty() {
                    vec![""]
                } else {
                    s.binding_keys.iter().map(String::as_str).collect()
                };
                for key in keys {
                    channel
                        .queue_bind(
                            s.queue.as_str().into(),
                            s.exchange.as_str().into(),
                            key.into(),
                            QueueBindOptions::default(),
                            FieldTable::default(),
                        )
                        .await
                        .map_err(|e| topology(e, &format!("binding {:?} to {:?} with {key:?}", s.queue, s.exchange)))?;
                }
            }
            Topology::Existing => {
                if !s.exchange.is_empty() {
                    let passive = ExchangeDeclareOptions { passive: true, ..ExchangeDeclareOptions::default() };
                    channel
                        .exchange_declare(
                            s.exchange.as_str().into(),
                            ExchangeKind::Topic,
                            passive,
                            FieldTable::default(),
                        )
                        .await
                        .map_err(|e| topology(e, &format!("checking the existing exchange {:?}", s.exchange)))?;
                }
                let passive = QueueDeclareOptions { passive: true, ..QueueDeclareOptions::default() };
                channel
                    .queue_declare(s.queue.as_str().into(), passive, FieldTable::default())
                    .await
                    .map_err(|e| topology(e, &format!("checking the existing queue {:?}", s.queue)))?;
            }
        }
        for delay in self.backoff.levels() {
            let mut args = FieldTable::default();
            args.insert(
                "x-message-ttl".into(),
                AMQPValue::LongLongInt(i64::try_from(delay.as_millis()).unwrap_or(i64::MAX)),
            );
            args.insert("x-dead-letter-exchange".into(), AMQPValue::LongString(LongString::from("")));
            args.insert("x-dead-letter-routing-key".into(), AMQPValue::LongString(LongString::from(s.queue.as_str())));
            let queue = s.retry_queue(delay);
            channel
                .queue_declare(queue.as_str().into(), durable, args)
                .await
                .map_err(|e| topology(e, &format!("declaring the retry queue {queue:?}")))?;
        }
        if s.dead_letter_exchange.is_empty() && s.dead_letter_routing_key.is_none() {
            let queue = s.dead_letter_queue();
            channel
                .queue_declare(queue.as_str().into(), durable, FieldTable::default())
                .await
                .map_err(|e| topology(e, &format!("declaring the dead-letter queue {queue:?}")))?;
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

/// A failed declare while `doing`: [`SourceError::Topology`] when the broker refused it (406
/// PRECONDITION_FAILED: it exists otherwise; 404 NOT_FOUND; 403 ACCESS_REFUSED), else a broker
/// error.
fn topology(e: lapin::Error, doing: &str) -> SourceError {
    let refused = matches!(
        e.kind(),
        ErrorKind::ProtocolError(amqp) if matches!(
            amqp.kind(),
            AMQPErrorKind::Soft(AMQPSoftError::PRECONDITIONFAILED | AMQPSoftError::NOTFOUND | AMQPSoftError::ACCESSREFUSED)
        )
    );
    if refused { SourceError::Topology(format!("{doing}: {e}")) } else { SourceError::Broker(format!("{doing}: {e}")) }
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

    async fn owned(&self) -> Vec<String> {
        if self.connected() { vec![format!("queue {}", self.settings.queue)] } else { Vec::new() }
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
