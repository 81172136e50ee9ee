//! The order domain of `dedup-console seed` ([`order_domain`]): what the console's synthetic
//! records are made of — three services, the order events, the errors of card payments, a
//! gateway and an SMS provider, and order payloads.

use dedup_engine::console::seed::HandlerMode;
use dedup_engine::console::seed::{SeedDomain, SeedError, SeedGroup, SeedMessage, SeedType};

/// The seed's groups (`order-service` 60 %, `billing-service` 25 %, `notification-service`
/// 15 %), types (`ORDER.CREATE`, `ORDER.PAY`, `ORDER.NOTIFY` leased, `ORDER.CANCEL`,
/// `INVENTORY.RESERVE`), errors and payloads, from the exchange `orders.events`.
pub fn order_domain() -> SeedDomain {
    let group = |name: &str, share| SeedGroup { name: name.to_owned(), share, queue: format!("orders.{name}") };
    let event = |name: &str, share, mode| SeedType { name: name.to_owned(), share, mode };
    let error = |class: &str, detail| SeedError { class: class.to_owned(), detail };
    SeedDomain {
        groups: vec![group("order-service", 0.6), group("billing-service", 0.25), group("notification-service", 0.15)],
        message_types: vec![
            event("ORDER.CREATE", 0.3, HandlerMode::Transactional),
            event("ORDER.PAY", 0.3, HandlerMode::Transactional),
            event("ORDER.NOTIFY", 0.25, HandlerMode::Leased),
            event("ORDER.CANCEL", 0.1, HandlerMode::Transactional),
            event("INVENTORY.RESERVE", 0.05, HandlerMode::Transactional),
        ],
        errors: vec![
            error("PAYMENT_DECLINED", |n| format!("card ending {} declined by issuer", 1000 + n % 9000)),
            error("GATEWAY_TIMEOUT", |n| format!("gateway did not answer within {} ms", 1000 * (1 + n % 5))),
            error("ORDER_NOT_FOUND", |n| format!("order {n:014} not found (yet)")),
            // What a database error's class looks like (`HandlerError::unclassified`).
            error("DATABASE: error returned from database: deadlock detected", |n| {
                format!(
                    "error returned from database: deadlock detected\nDETAIL: Process {} waits for ShareLock",
                    n % 90_000
                )
            }),
            error("SMS_GATEWAY_UNAVAILABLE", |n| format!("rate limited, {} requests in flight", n % 50)),
        ],
        exchange: "orders.events".to_owned(),
        payload: order_payload,
    }
}

/// An order event's payload: its message id, order number, SKU, quantity, amount and phone.
fn order_payload(m: &SeedMessage<'_>) -> serde_json::Value {
    let n = m.number;
    serde_json::json!({
        "messageId": m.message_id, "orderNo": format!("{n:014}"), "sku": crate::sku(1 + (n % 200) as u32),
        "quantity": 1 + n % 3, "amountCents": 500 + (n * 7919) % 100_000, "phone": format!("+1555{:07}", n % 10_000_000)
    })
}
