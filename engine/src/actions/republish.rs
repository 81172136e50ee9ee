//! Republishing a record's stored message (requeue, release with requeue, drills): its payload,
//! headers, content type and the same message id, to the exchange and routing key (Kafka: topic
//! and key) it first came from, through the broker connection of the record's consumer group
//! ([`Publishers`]).

use std::sync::Arc;

use sqlx::FromRow;

use super::ActionError;
use crate::source::{Outbound, Publish, SourceFactory};

/// The broker connections operator actions republish through: every consumer group's source.
/// Cheap to clone.
#[derive(Clone, Default)]
pub struct Publishers {
    groups: Vec<(String, Arc<dyn SourceFactory>)>,
}

impl Publishers {
    /// Adds `group`'s source.
    pub fn add(&mut self, group: &str, source: Arc<dyn SourceFactory>) {
        self.groups.push((group.to_owned(), source));
    }

    /// A publisher for record `id` of `group` that came from `broker` (`rabbitmq`, `kafka`):
    /// through the group's own source when it reads from that broker, else through the first
    /// source that does (the record's exchange or topic is named in the copy either way).
    ///
    /// Errors: [`ActionError::NoPublisher`] when no source reads from `broker`;
    /// [`ActionError::Publish`] when the broker cannot be reached.
    pub(crate) async fn for_record(&self, id: i64, group: &str, broker: &str) -> Result<Arc<dyn Publish>, ActionError> {
        let of_broker = |(_, s): &&(String, Arc<dyn SourceFactory>)| s.broker().as_str() == broker;
        let source = self
            .groups
            .iter()
            .filter(of_broker)
            .find(|(g, _)| g == group)
            .or_else(|| self.groups.iter().find(of_broker))
            .map(|(_, s)| s)
            .ok_or_else(|| ActionError::NoPublisher { id, broker: broker.to_owned() })?;
        source.open_publisher().await.map_err(|e| ActionError::Publish(e.to_string()))
    }

    /// Closes every source's connection.
    pub async fn close(&self) {
        for (_, source) in &self.groups {
            source.close().await;
        }
    }
}

/// What a record keeps for a republish (the columns of `dedup_records` with the same names).
#[derive(Debug, Clone, FromRow)]
pub struct StoredMessage {
    /// Record id.
    pub id: i64,
    /// The record's consumer group (its broker connection publishes the copy).
    pub consumer_group: String,
    /// The business message id, sent again unchanged.
    pub message_id: String,
    /// `rabbitmq` or `kafka`.
    pub source_broker: String,
    /// Exchange (RabbitMQ) or topic (Kafka).
    pub source_exchange: Option<String>,
    /// Routing key (RabbitMQ) or record key (Kafka).
    pub source_routing_key: Option<String>,
    /// The stored payload; `None` once the record succeeded.
    pub payload: Option<Vec<u8>>,
    /// True when only the payload's start was kept.
    pub payload_truncated: bool,
    /// Headers as JSON (an object).
    pub headers: Option<serde_json::Value>,
    /// Content type.
    pub content_type: Option<String>,
    /// The AMQP `type` property, if the delivery had one.
    pub type_property: Option<String>,
    /// A poison message: never republished.
    pub poison: bool,
}

impl StoredMessage {
    /// Columns to select for [`StoredMessage`].
    pub const COLUMNS: &'static str = "id, consumer_group, message_id, source_broker, source_exchange, \
                                       source_routing_key, payload, payload_truncated, headers, content_type, \
                                       type_property, poison";

    /// Why this record cannot be republished, if it cannot: poison, or no complete payload.
    pub fn check_republishable(&self) -> Result<(), ActionError> {
        if self.poison {
            return Err(ActionError::Poison(self.id));
        }
        if self.payload.is_none() {
            return Err(ActionError::MissingPayload { id: self.id, what: "no stored payload" });
        }
        if self.payload_truncated {
            return Err(ActionError::MissingPayload { id: self.id, what: "only a truncated payload" });
        }
        Ok(())
    }
}

/// Publishes the stored message through its group's broker ([`Publishers::for_record`]) and
/// waits for the broker's confirm.
///
/// Errors: [`ActionError::Poison`] / [`ActionError::MissingPayload`] (see
/// [`StoredMessage::check_republishable`]), [`ActionError::NoPublisher`],
/// [`ActionError::Publish`] when the broker refused or did not confirm it.
pub async fn republish(publishers: &Publishers, stored: &StoredMessage) -> Result<(), ActionError> {
    stored.check_republishable()?;
    let publisher = publishers.for_record(stored.id, &stored.consumer_group, &stored.source_broker).await?;
    let published = publish_stored(publisher.as_ref(), stored).await;
    publisher.close().await;
    published
}

/// Publishes the stored message through `publisher` (of the record's broker) and waits for the
/// broker's confirm.
///
/// Errors: [`ActionError::Publish`].
pub(crate) async fn publish_stored(publisher: &dyn Publish, stored: &StoredMessage) -> Result<(), ActionError> {
    let empty = serde_json::Map::new();
    let headers = stored.headers.as_ref().and_then(|h| h.as_object()).unwrap_or(&empty);
    let routing_key = stored.source_routing_key.as_deref().unwrap_or_default();
    let outbound = Outbound {
        destination: stored.source_exchange.as_deref().unwrap_or_default(),
        routing_key,
        key: (!routing_key.is_empty()).then_some(routing_key),
        message_id: Some(&stored.message_id),
        payload: stored.payload.as_deref().unwrap_or_default(),
        headers,
        content_type: stored.content_type.as_deref(),
        type_property: stored.type_property.as_deref(),
    };
    publisher.publish(outbound).await.map_err(|e| ActionError::Publish(e.0))
}
