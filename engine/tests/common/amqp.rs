//! A RabbitMQ test broker for operator actions that republish: publishers on it, and what its
//! work queue received, as deliveries.

use dedup_engine::actions::Publishers;
use dedup_engine::message::InboundMessage;
use dedup_engine::retry::Backoff;
use dedup_engine::testing::{TestBroker, amqp_url};
use lapin::options::BasicGetOptions;
use serde_json::json;

use super::{GROUP, message};

/// Publishers on a test broker whose work queue gets what is published to its exchange.
pub async fn broker() -> (TestBroker, Publishers) {
    let broker = TestBroker::new(&amqp_url(), Backoff { initial_ms: 1000, max_ms: 1000 });
    let connector = broker.connector();
    connector.publisher().await.expect("RabbitMQ at AMQP_URL");
    let mut publishers = Publishers::default();
    publishers.add(GROUP, connector);
    (broker, publishers)
}

/// What the broker's work queue holds, as deliveries.
pub async fn published(broker: &TestBroker) -> Vec<InboundMessage> {
    let channel = broker.channel().await;
    let mut copies = Vec::new();
    while let Some(got) =
        channel.basic_get(broker.settings.queue.as_str().into(), BasicGetOptions { no_ack: true }).await.unwrap()
    {
        let props = &got.delivery.properties;
        let header =
            props.headers().as_ref().and_then(|h| h.inner().get("x-message-id")).and_then(|v| v.as_long_string());
        let id = match (props.message_id(), header) {
            (Some(id), _) => id.to_string(),
            (None, Some(long)) => long.to_string(),
            (None, None) => panic!("a copy without a message id"),
        };
        let mut m = message(&id, json!({}));
        m.payload = got.delivery.data.clone();
        m.type_property = props.kind().as_ref().map(|t| t.to_string());
        for (name, value) in props.headers().as_ref().map(|h| h.inner().iter()).into_iter().flatten() {
            if let Some(text) = value.as_long_string() {
                m.headers.insert(name.to_string(), json!(text.to_string()));
            }
        }
        copies.push(m);
    }
    copies
}
