//! Publishing to RabbitMQ: a confirm-mode channel (copies for retries, dead letters and
//! requeues are published persistently and confirmed by the broker) and the AMQP properties of a
//! copy.

use async_trait::async_trait;
use lapin::Confirmation;
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::types::ShortString;
use lapin::{BasicProperties, Channel, Connection};

use super::amqp_values::json_to_table;
use super::{broker, disconnected};
use crate::message::Broker;
use crate::source::{Outbound, Publish, PublishFailed, SourceError};

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
    pub(crate) async fn open(conn: &Connection) -> Result<Self, SourceError> {
        let channel = conn.create_channel().await.map_err(disconnected)?;
        channel.confirm_select(ConfirmSelectOptions::default()).await.map_err(broker)?;
        Ok(Self { channel })
    }

    /// Closes the channel (waiting up to [`super::CLOSE_TIMEOUT`] for the broker). Left to its
    /// drop, lapin would close it in the background, racing the connection's close: that race
    /// is logged as an ERROR on a normal shutdown.
    pub(crate) async fn close(&self) {
        let _ = tokio::time::timeout(super::CLOSE_TIMEOUT, self.channel.close(200, "closed".into())).await;
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
}

#[async_trait]
impl Publish for Publisher {
    fn broker(&self) -> Broker {
        Broker::RabbitMq
    }

    /// To `destination` (the exchange) with `routing_key`; the message id in the AMQP property.
    async fn publish(&self, message: Outbound<'_>) -> Result<(), PublishFailed> {
        let mut props = properties_for(message.message_id, message.headers, message.content_type);
        if let Some(kind) = message.type_property {
            props = props.with_type(ShortString::from(kind));
        }
        Publisher::publish(self, message.destination, message.routing_key, message.payload, props)
            .await
            .map_err(|e| PublishFailed(e.to_string()))
    }

    async fn close(&self) {
        Publisher::close(self).await;
    }
}

/// The longest AMQP short string (the `message_id` property), bytes.
const MAX_SHORT_STRING_BYTES: usize = 255;

/// The header a message id too long for the AMQP property travels in: the id header the default
/// `ids.from` reads after the property.
const LONG_ID_HEADER: &str = "x-message-id";

/// Properties for publishing a message with a business message id (simulator, requeue): its
/// headers and content type, and the AMQP `timestamp` of now. A message id longer than the AMQP
/// property allows (255 bytes; a message id may have 512) goes in the `x-message-id` header
/// instead.
pub fn properties_for(
    message_id: Option<&str>,
    headers: &serde_json::Map<String, serde_json::Value>,
    content_type: Option<&str>,
) -> BasicProperties {
    let sent = u64::try_from(chrono::Utc::now().timestamp()).unwrap_or_default();
    let long_id = message_id.filter(|id| id.len() > MAX_SHORT_STRING_BYTES);
    let table = match long_id {
        Some(id) => {
            let mut headers = headers.clone();
            headers.insert(LONG_ID_HEADER.to_owned(), serde_json::Value::String(id.to_owned()));
            json_to_table(&headers)
        }
        None => json_to_table(headers),
    };
    let mut props = BasicProperties::default().with_headers(table).with_timestamp(sent);
    if let Some(id) = message_id.filter(|_| long_id.is_none()) {
        props = props.with_message_id(ShortString::from(id));
    }
    if let Some(ct) = content_type {
        props = props.with_content_type(ShortString::from(ct));
    }
    props
}
