//! One worker's consumer on the work queue: deliveries in batches, settled after the
//! pipeline's commit (copies first, then one multiple ack, or per-delivery acks and nacks).

use std::time::Duration;

use async_trait::async_trait;
use futures::StreamExt;
use lapin::options::{BasicAckOptions, BasicCancelOptions, BasicConsumeOptions, BasicNackOptions, BasicQosOptions};
use lapin::types::{AMQPValue, FieldTable, LongString};
use lapin::{BasicProperties, Channel, Connection};
use tracing::field::Empty;

use super::amqp_values::headers_to_json;
use super::publish::{PublishError, Publisher};
use super::{
    CLOSE_TIMEOUT, DEAD_LETTER_REASON_HEADER, RabbitSettings, SOURCE_EXCHANGE_HEADER, SOURCE_ROUTING_KEY_HEADER,
    SOURCE_SIGNATURE_HEADER, SourceKey, broker, disconnected,
};
use crate::message::{Broker, InboundMessage, SourceRef};
use crate::pipeline::Disposition;
use crate::retry::Backoff;
use crate::source::{Source, SourceError};

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
    source_key: SourceKey,
    consumer_tag: String,
    batch: Vec<InboundMessage>,
    held: Vec<Held>,
    stopped: bool,
}

impl RabbitSource {
    pub(super) async fn open(
        conn: &Connection,
        settings: &RabbitSettings,
        backoff: Backoff,
        source_key: SourceKey,
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
        tracing::info!(queue = %settings.queue, consumer_tag = %consumer_tag, "consuming from RabbitMQ");
        let publisher = Publisher::open(conn).await?;
        Ok(Self {
            channel,
            consumer,
            publisher,
            settings: settings.clone(),
            backoff,
            source_key,
            consumer_tag,
            batch: Vec::new(),
            held: Vec::new(),
            stopped: false,
        })
    }

    fn take(&mut self, delivery: lapin::message::Delivery) {
        let props = &delivery.properties;
        let (headers, headers_too_deep) = props.headers().as_ref().map(headers_to_json).unwrap_or_default();
        let header_str = |name: &str| headers.get(name).and_then(|v| v.as_str());
        let message_id = props.message_id().as_ref().map(|s| s.as_str());
        // Copies that went through a retry queue carry where the message was first published,
        // signed by the product; anyone else's headers of those names are ignored.
        let signed_origin = match (
            header_str(SOURCE_EXCHANGE_HEADER),
            header_str(SOURCE_ROUTING_KEY_HEADER),
            header_str(SOURCE_SIGNATURE_HEADER),
        ) {
            (Some(exchange), Some(routing_key), Some(signature))
                if self.source_key.verify(exchange, routing_key, message_id, &delivery.data, signature) =>
            {
                Some((exchange.to_owned(), routing_key.to_owned()))
            }
            _ => None,
        };
        let (exchange, routing_key) = signed_origin
            .unwrap_or_else(|| (delivery.exchange.as_str().to_owned(), delivery.routing_key.as_str().to_owned()));
        let source = SourceRef {
            exchange: Some(exchange),
            routing_key: Some(routing_key),
            queue: Some(self.settings.queue.clone()),
            offset: None,
            key_not_text: false,
        };
        self.batch.push(InboundMessage {
            payload: delivery.data,
            headers,
            property_message_id: props.message_id().as_ref().map(|s| s.as_str().to_owned()),
            type_property: props.kind().as_ref().map(|s| s.as_str().to_owned()),
            published_at: props
                .timestamp()
                .and_then(|secs| chrono::DateTime::from_timestamp(i64::try_from(secs).ok()?, 0)),
            content_type: props.content_type().as_ref().map(|s| s.as_str().to_owned()),
            broker: Broker::RabbitMq,
            source,
            redelivered: delivery.redelivered,
            headers_too_deep,
        });
        self.held.push(Held { tag: delivery.delivery_tag, properties: delivery.properties });
    }

    /// The copy's properties: the original's, plus headers naming the original source, signed.
    fn copy_properties(&self, index: usize, extra: &[(&str, &str)]) -> BasicProperties {
        let message = &self.batch[index];
        let mut headers = self.held[index].properties.headers().clone().unwrap_or_default();
        let exchange = message.source.exchange.as_deref().unwrap_or_default();
        let routing_key = message.source.routing_key.as_deref().unwrap_or_default();
        let signature =
            self.source_key.sign(exchange, routing_key, message.property_message_id.as_deref(), &message.payload);
        for (name, value) in [
            (SOURCE_EXCHANGE_HEADER, exchange),
            (SOURCE_ROUTING_KEY_HEADER, routing_key),
            (SOURCE_SIGNATURE_HEADER, signature.as_str()),
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
        crate::source::publish_dead_letter(self.settings.dead_letter_publish_attempts, &what, || {
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

    /// In a `DEBUG` span `settle`: `count` deliveries, the `retry_copies` and
    /// `dead_letter_copies` published, then `acks` and `requeues` (nacks with requeue), and
    /// whether one `multiple` ack covered the batch.
    #[tracing::instrument(
        level = "debug",
        name = "settle",
        skip_all,
        fields(
            broker = "rabbitmq",
            count = dispositions.len(),
            retry_copies = Empty,
            dead_letter_copies = Empty,
            acks = Empty,
            requeues = Empty,
            multiple = Empty,
        )
    )]
    async fn settle(&mut self, dispositions: &[Disposition]) -> Result<(), SourceError> {
        debug_assert_eq!(dispositions.len(), self.batch.len());
        let span = tracing::Span::current();
        let mut requeue = vec![false; self.batch.len()];
        let (mut retry_copies, mut dead_letter_copies) = (0, 0);
        for (index, disposition) in dispositions.iter().enumerate() {
            match disposition {
                // A held delivery waits in the same delay queues (a nack with requeue would put
                // it back at the head of the queue at once: a hot loop).
                Disposition::Retry { delay } | Disposition::Held { delay } => {
                    retry_copies += 1;
                    if let Err(e) = self.publish_retry(index, *delay).await {
                        // Without a confirmed copy the original must stay with the broker.
                        tracing::warn!(error = %e, "retry copy not published; redelivering the original now");
                        requeue[index] = true;
                    }
                }
                Disposition::DeadLetter { reason } => {
                    dead_letter_copies += 1;
                    self.publish_dead_letter(index, reason).await;
                }
                Disposition::Redeliver => requeue[index] = true,
                Disposition::Ack(_) => {}
            }
        }
        span.record("retry_copies", retry_copies).record("dead_letter_copies", dead_letter_copies);
        let requeues = requeue.iter().filter(|r| **r).count();
        span.record("acks", self.held.len() - requeues).record("requeues", requeues);
        if requeues == 0 {
            if let Some(last) = self.held.last() {
                // Every delivery of this channel up to `last` belongs to this batch.
                span.record("multiple", true);
                self.channel.basic_ack(last.tag, BasicAckOptions { multiple: true }).await.map_err(disconnected)?;
            }
            return Ok(());
        }
        span.record("multiple", false);
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
        let cancel = self.channel.basic_cancel(self.consumer_tag.as_str().into(), BasicCancelOptions::default());
        let _ = tokio::time::timeout(CLOSE_TIMEOUT, cancel).await;
        let _ = tokio::time::timeout(CLOSE_TIMEOUT, self.channel.close(200, "worker stopped".into())).await;
        self.publisher.close().await;
    }
}
