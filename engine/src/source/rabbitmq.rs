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

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use futures::StreamExt;
use lapin::Confirmation;
use lapin::options::{
    BasicAckOptions, BasicCancelOptions, BasicConsumeOptions, BasicNackOptions, BasicPublishOptions, BasicQosOptions,
    ConfirmSelectOptions, ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties, ExchangeKind};
use serde::{Deserialize, Serialize};
use tokio::sync::Mutex;

use super::amqp_values::{json_to_table, table_to_json};
use super::{Outbound, Publish, PublishFailed, Source, SourceError, SourceFactory};
use crate::message::{Broker, InboundMessage, SourceRef};
use crate::pipeline::Disposition;
use crate::retry::Backoff;
use crate::service::{Service, Unreachable};

/// Header on retry and dead-letter copies naming the exchange the message was first published
/// to (a copy travels through other queues, but a requeue must go back to the original).
pub const SOURCE_EXCHANGE_HEADER: &str = "x-dedup-source-exchange";
/// Header on copies naming the original routing key.
pub const SOURCE_ROUTING_KEY_HEADER: &str = "x-dedup-source-routing-key";
pub use super::DEAD_LETTER_REASON_HEADER;

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
    connection: Mutex<Option<Arc<Connection>>>,
    connected: Arc<AtomicBool>,
}

impl RabbitConnector {
    /// A connector; does not connect until first used.
    pub fn new(url: &str, settings: RabbitSettings, backoff: Backoff) -> Self {
        Self {
            url: url.to_owned(),
            settings,
            backoff,
            connection: Mutex::new(None),
            connected: Arc::new(AtomicBool::new(false)),
        }
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
        let result = RabbitSource::open(&conn, &self.settings, self.backoff.clone(), worker).await;
        if result.is_err() {
            self.invalidate().await;
        }
        Ok(Box::new(result?))
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
            let _ = conn.close(200, "shutting down".into()).await;
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

/// A confirm-mode publishing channel.
#[derive(Clone)]
pub struct Publisher {
    channel: Channel,
}

/// Why a publish failed.
#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    /// The channel or connection failed.
    #[error("publish failed: {0}")]
    Channel(#[from] lapin::Error),
    /// The broker refused the message (negative confirm, e.g. a full queue that rejects).
    #[error("the broker refused the message (nack)")]
    Nacked,
    /// No queue is bound for the routing key (the message came back, mandatory).
    #[error("unroutable: no queue bound for exchange {exchange:?} and routing key {routing_key:?}")]
    Unroutable {
        /// The exchange.
        exchange: String,
        /// The routing key.
        routing_key: String,
    },
}

impl Publisher {
    /// Opens a channel on `conn` and turns on publisher confirms.
    pub async fn open(conn: &Connection) -> Result<Self, SourceError> {
        let channel = conn.create_channel().await.map_err(disconnected)?;
        channel.confirm_select(ConfirmSelectOptions::default()).await.map_err(broker)?;
        Ok(Self { channel })
    }

    /// Publishes persistently and waits for the broker's confirm. `mandatory`: an unroutable
    /// message is an error.
    pub async fn publish(
        &self,
        exchange: &str,
        routing_key: &str,
        payload: &[u8],
        properties: BasicProperties,
    ) -> Result<(), PublishError> {
        let confirm = self
            .channel
            .basic_publish(
                exchange.into(),
                routing_key.into(),
                BasicPublishOptions { mandatory: true, ..BasicPublishOptions::default() },
                payload,
                properties.with_delivery_mode(2),
            )
            .await?
            .await?;
        match confirm {
            Confirmation::Ack(None) | Confirmation::NotRequested => Ok(()),
            Confirmation::Ack(Some(_)) => {
                Err(PublishError::Unroutable { exchange: exchange.to_owned(), routing_key: routing_key.to_owned() })
            }
            Confirmation::Nack(_) => Err(PublishError::Nacked),
        }
    }

    /// Whether the channel is usable.
    pub fn is_open(&self) -> bool {
        self.channel.status().connected()
    }
}

#[async_trait]
impl Publish for Publisher {
    fn broker(&self) -> Broker {
        Broker::RabbitMq
    }

    /// To `destination` (the exchange) with `routing_key`; the message id in the AMQP property.
    async fn publish(&self, message: Outbound<'_>) -> Result<(), PublishFailed> {
        let props = properties_for(message.message_id, message.headers, message.content_type);
        Publisher::publish(self, message.destination, message.routing_key, message.payload, props)
            .await
            .map_err(|e| PublishFailed(e.to_string()))
    }
}

/// Properties for publishing a message with a business message id (simulator, requeue).
pub fn properties_for(
    message_id: Option<&str>,
    headers: &serde_json::Map<String, serde_json::Value>,
    content_type: Option<&str>,
) -> BasicProperties {
    let mut props = BasicProperties::default().with_headers(json_to_table(headers));
    if let Some(id) = message_id {
        props = props.with_message_id(ShortString::from(id));
    }
    if let Some(ct) = content_type {
        props = props.with_content_type(ShortString::from(ct));
    }
    props
}

struct Held {
    tag: u64,
    properties: BasicProperties,
}

/// One worker's consumer on the work queue.
pub struct RabbitSource {
    channel: Channel,
    consumer: lapin::Consumer,
    publisher: Publisher,
    settings: RabbitSettings,
    backoff: Backoff,
    consumer_tag: String,
    batch: Vec<InboundMessage>,
    held: Vec<Held>,
    stopped: bool,
}

impl RabbitSource {
    async fn open(
        conn: &Connection,
        settings: &RabbitSettings,
        backoff: Backoff,
        worker: usize,
    ) -> Result<Self, SourceError> {
        let channel = conn.create_channel().await.map_err(disconnected)?;
        channel.basic_qos(settings.prefetch, BasicQosOptions::default()).await.map_err(broker)?;
        let consumer_tag = format!("dedup-{}-{}-{worker}", crate::worker::hostname(), std::process::id());
        let consumer = channel
            .basic_consume(
                settings.queue.as_str().into(),
                consumer_tag.as_str().into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await
            .map_err(broker)?;
        let publisher = Publisher::open(conn).await?;
        Ok(Self {
            channel,
            consumer,
            publisher,
            settings: settings.clone(),
            backoff,
            consumer_tag,
            batch: Vec::new(),
            held: Vec::new(),
            stopped: false,
        })
    }

    fn take(&mut self, delivery: lapin::message::Delivery) {
        let props = &delivery.properties;
        let headers = props.headers().as_ref().map(table_to_json).unwrap_or_default();
        let header_str = |name: &str| headers.get(name).and_then(|v| v.as_str()).map(str::to_owned);
        // Copies that went through a retry queue carry where the message was first published.
        let source = SourceRef {
            exchange: header_str(SOURCE_EXCHANGE_HEADER).or_else(|| Some(delivery.exchange.as_str().to_owned())),
            routing_key: header_str(SOURCE_ROUTING_KEY_HEADER)
                .or_else(|| Some(delivery.routing_key.as_str().to_owned())),
            queue: Some(self.settings.queue.clone()),
            offset: None,
        };
        self.batch.push(InboundMessage {
            payload: delivery.data,
            headers,
            property_message_id: props.message_id().as_ref().map(|s| s.as_str().to_owned()),
            content_type: props.content_type().as_ref().map(|s| s.as_str().to_owned()),
            broker: Broker::RabbitMq,
            source,
            redelivered: delivery.redelivered,
        });
        self.held.push(Held { tag: delivery.delivery_tag, properties: delivery.properties });
    }

    /// The copy's properties: the original's, plus headers naming the original source.
    fn copy_properties(&self, index: usize, extra: &[(&str, &str)]) -> BasicProperties {
        let message = &self.batch[index];
        let mut headers = self.held[index].properties.headers().clone().unwrap_or_default();
        for (name, value) in [
            (SOURCE_EXCHANGE_HEADER, message.source.exchange.as_deref().unwrap_or_default()),
            (SOURCE_ROUTING_KEY_HEADER, message.source.routing_key.as_deref().unwrap_or_default()),
        ]
        .into_iter()
        .chain(extra.iter().copied())
        {
            headers.insert(name.into(), AMQPValue::LongString(LongString::from(value)));
        }
        self.held[index].properties.clone().with_headers(headers)
    }

    async fn publish_retry(&self, index: usize, delay: Duration) -> Result<(), PublishError> {
        let queue = self.settings.retry_queue(self.backoff.level_for(delay));
        self.publisher.publish("", &queue, &self.batch[index].payload, self.copy_properties(index, &[])).await
    }

    async fn publish_dead_letter(&self, index: usize, reason: &str) {
        let (exchange, routing_key) = self.settings.dead_letter_target();
        let reason: String = reason.chars().take(1000).collect();
        let props = self.copy_properties(index, &[(DEAD_LETTER_REASON_HEADER, &reason)]);
        let what = format!("message id {:?}", self.batch[index].property_message_id);
        super::publish_dead_letter(self.settings.dead_letter_publish_attempts, &what, || {
            self.publisher.publish(&exchange, &routing_key, &self.batch[index].payload, props.clone())
        })
        .await;
    }
}

#[async_trait]
impl Source for RabbitSource {
    async fn next_batch(&mut self, max: usize, linger: Duration) -> Result<Option<&[InboundMessage]>, SourceError> {
        self.batch.clear();
        self.held.clear();
        if self.stopped {
            return Ok(None);
        }
        match self.consumer.next().await {
            None => return Err(SourceError::Disconnected("the consumer was cancelled or its channel closed".into())),
            Some(Err(e)) => return Err(disconnected(e)),
            Some(Ok(delivery)) => self.take(delivery),
        }
        let deadline = tokio::time::Instant::now() + linger;
        while self.batch.len() < max.max(1) {
            match tokio::time::timeout_at(deadline, self.consumer.next()).await {
                Ok(Some(Ok(delivery))) => self.take(delivery),
                // Settle what we have; the error shows again on the next call.
                Ok(Some(Err(_)) | None) | Err(_) => break,
            }
        }
        Ok(Some(&self.batch))
    }

    async fn settle(&mut self, dispositions: &[Disposition]) -> Result<(), SourceError> {
        debug_assert_eq!(dispositions.len(), self.batch.len());
        let mut requeue = vec![false; self.batch.len()];
        for (index, disposition) in dispositions.iter().enumerate() {
            match disposition {
                Disposition::Retry { delay } => {
                    if let Err(e) = self.publish_retry(index, *delay).await {
                        // Without a confirmed copy the original must stay with the broker.
                        tracing::warn!(error = %e, "retry copy not published; redelivering the original now");
                        requeue[index] = true;
                    }
                }
                Disposition::DeadLetter { reason } => self.publish_dead_letter(index, reason).await,
                Disposition::Redeliver => requeue[index] = true,
                Disposition::Ack(_) => {}
            }
        }
        if !requeue.contains(&true) {
            if let Some(last) = self.held.last() {
                // Every delivery of this channel up to `last` belongs to this batch.
                self.channel.basic_ack(last.tag, BasicAckOptions { multiple: true }).await.map_err(disconnected)?;
            }
            return Ok(());
        }
        for (held, requeue) in self.held.iter().zip(requeue) {
            if requeue {
                self.channel
                    .basic_nack(held.tag, BasicNackOptions { multiple: false, requeue: true })
                    .await
                    .map_err(disconnected)?;
            } else {
                self.channel.basic_ack(held.tag, BasicAckOptions::default()).await.map_err(disconnected)?;
            }
        }
        Ok(())
    }

    async fn stop(&mut self) {
        self.stopped = true;
        let _ = self.channel.basic_cancel(self.consumer_tag.as_str().into(), BasicCancelOptions::default()).await;
        let _ = self.channel.close(200, "worker stopped".into()).await;
    }
}
