//! Republishing a record's stored message (requeue, release with requeue, drills): its payload,
//! headers, content type and the same message id, to the exchange and routing key (Kafka: topic
//! and key) it first came from.

use sqlx::FromRow;

use super::ActionError;
use crate::source::{Outbound, Publish};

/// What a record keeps for a republish (the columns of `dedup_records` with the same names).
#[derive(Debug, Clone, FromRow)]
pub struct StoredMessage {
    /// Record id.
    pub id: i64,
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
    /// `None` for poison messages.
    pub handler_mode: Option<String>,
}

impl StoredMessage {
    /// Columns to select for [`StoredMessage`].
    pub const COLUMNS: &'static str = "id, message_id, source_broker, source_exchange, source_routing_key, payload, \
                                       payload_truncated, headers, content_type, handler_mode";

    /// Why this record cannot be republished, if it cannot: poison, or no complete payload.
    pub fn check_republishable(&self) -> Result<(), ActionError> {
        if self.handler_mode.is_none() {
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

/// Publishes the stored message through `publisher` and waits for the broker's confirm.
///
/// Errors: [`ActionError::Poison`] / [`ActionError::MissingPayload`] (see
/// [`StoredMessage::check_republishable`]), [`ActionError::BrokerMismatch`] when the record came
/// from another broker, [`ActionError::Publish`] when the broker refused or did not confirm it.
pub async fn republish(publisher: &dyn Publish, stored: &StoredMessage) -> Result<(), ActionError> {
    stored.check_republishable()?;
    if publisher.broker().as_str() != stored.source_broker {
        return Err(ActionError::BrokerMismatch {
            id: stored.id,
            record: stored.source_broker.clone(),
            publisher: publisher.broker().as_str().to_owned(),
        });
    }
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
    };
    publisher.publish(outbound).await.map_err(|e| ActionError::Publish(e.0))
}
