//! `dedup-console simulate`: publishes an order event stream the way real producers do — with
//! retries that resend the same message id seconds later, reordering, and poison messages — and
//! records what it sent (`simulation_runs`, `simulation_messages`) for the verifier. The few
//! statements that record a run are a `RunBook` (PostgreSQL's here, MySQL's in
//! `crate::mysql`); planning, publishing and counting are shared.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::time::{Duration, Instant};

use futures::StreamExt;
use futures::stream::FuturesUnordered;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use sqlx::PgPool;

mod run_book;

use run_book::PgRunBook;
pub(crate) use run_book::{RecordedMessage, RunBook};

use super::{OrderSettings, sku};
use dedup_engine::{Broker, IdPolicy, InboundMessage, Outbound, POISON_TYPE, Publish, SourceRef, TypePolicy};

/// What to publish.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SimulateParams {
    /// Orders; each gets CREATE, PAY and NOTIFY.
    pub orders: u64,
    /// Messages per second (0: as fast as the broker confirms).
    pub rate: f64,
    /// Share of messages a producer "retries": sent again with the same id (0.0–1.0).
    pub duplicate_rate: f64,
    /// Longest delay of such a resend, in ms (each is uniform between 200 ms and this).
    pub duplicate_delay_ms: u64,
    /// Events are shuffled within windows of this many messages (1: in order).
    pub reorder_window: usize,
    /// Share of orders followed by a poison message (no id, bad JSON, or oversize — not on Kafka
    /// when the payload limit leaves no room under its record limit) (0.0–1.0).
    pub poison_rate: f64,
    /// The consumer groups the messages reach (the verifier checks their records).
    pub groups: Vec<SimulatedGroup>,
    /// Exchange (RabbitMQ) or topic (Kafka) to publish to.
    pub exchange: String,
    /// Random seed (a run is reproducible given the seed).
    pub seed: u64,
}

/// A consumer group a run's messages reach.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SimulatedGroup {
    /// Its name.
    pub name: String,
    /// Its queue's binding keys on the exchange (RabbitMQ topic patterns: `*` one word, `#`
    /// any number). Empty: every message reaches it (a Kafka group reads the whole topic).
    pub binding_keys: Vec<String>,
}

impl SimulatedGroup {
    /// Whether a message published with `routing_key` reaches this group.
    pub fn receives(&self, routing_key: &str) -> bool {
        self.binding_keys.is_empty() || self.binding_keys.iter().any(|b| topic_matches(b, routing_key))
    }
}

/// AMQP topic matching: `pattern`'s words (split at `.`) against `key`'s; `*` stands for one
/// word, `#` for zero or more.
fn topic_matches(pattern: &str, key: &str) -> bool {
    fn words(p: &[&str], k: &[&str]) -> bool {
        match (p.split_first(), k.split_first()) {
            (None, None) => true,
            (Some((&"#", rest)), _) => words(rest, k) || (!k.is_empty() && words(p, &k[1..])),
            (Some((&"*", rest)), Some((_, k_rest))) => words(rest, k_rest),
            (Some((w, rest)), Some((x, k_rest))) if w == x => words(rest, k_rest),
            _ => false,
        }
    }
    words(&pattern.split('.').collect::<Vec<_>>(), &key.split('.').collect::<Vec<_>>())
}

/// What a run published.
#[derive(Debug, Clone, Serialize)]
pub struct SimulationReport {
    /// The run's id (`simulation_runs.id`).
    pub run_id: i64,
    /// Order numbers of this run start with this.
    pub order_prefix: String,
    /// Orders.
    pub orders: u64,
    /// Distinct messages (including poison).
    pub messages: u64,
    /// Copies published in all (messages + duplicates).
    pub published: u64,
    /// Duplicate copies.
    pub duplicates: u64,
    /// Poison messages.
    pub poison: u64,
    /// Wall time, in seconds.
    pub seconds: f64,
    /// Copies per second.
    pub rate: f64,
}

/// One message to publish.
#[derive(Debug, Clone)]
struct Outgoing {
    /// AMQP message-id property (`None` for poison without an id).
    message_id: Option<String>,
    /// The id the record is expected under.
    record_id: String,
    routing_key: &'static str,
    /// Kafka record key: the order number, so an order's events share a partition, as real
    /// producers key them.
    key: String,
    payload: Vec<u8>,
    poison: bool,
}

fn event(order_no: &str, kind: &'static str, version: u32, body: Value) -> Outgoing {
    let id = format!("ORDER.{kind}.{order_no}:{version}");
    let mut body = body;
    body["messageId"] = Value::String(id.clone());
    Outgoing {
        message_id: Some(id.clone()),
        record_id: id,
        key: order_no.to_owned(),
        routing_key: match kind {
            "CREATE" => "order.create",
            "PAY" => "order.pay",
            _ => "order.notify",
        },
        payload: serde_json::to_vec(&body).expect("JSON serialises"),
        poison: false,
    }
}

fn order_events(order_no: &str, rng: &mut StdRng, orders: &OrderSettings) -> [Outgoing; 3] {
    let quantity = rng.random_range(1..=3);
    let amount = rng.random_range(500..50_000);
    let phone = format!("+86138{:08}", rng.random_range(0..100_000_000u32));
    [
        event(
            order_no,
            "CREATE",
            1,
            json!({
                "orderNo": order_no, "sku": sku(rng.random_range(1..=orders.skus.max(1))),
                "quantity": quantity, "amountCents": amount, "phone": phone
            }),
        ),
        event(order_no, "PAY", 2, json!({"orderNo": order_no, "amountCents": amount, "expectedVersion": 1})),
        event(
            order_no,
            "NOTIFY",
            3,
            json!({
                "orderNo": order_no, "kind": "PAID", "phone": phone,
                "text": format!("Order {order_no} is paid. Thank you!")
            }),
        ),
    ]
}

/// Prefix of the `message_id` a run records for a poison message without a usable id: such a
/// message's dead records (one per delivery) are found by the SHA-256 (hex) that follows it.
pub const POISON_BY_PAYLOAD: &str = "POISON:";

/// Kafka's default limit on one record (`message.max.bytes`, about 1 MB): an oversize poison is
/// only sent when the payload limit leaves room under it.
const KAFKA_RECORD_LIMIT_BYTES: usize = 1_000_000;

fn poison(order_no: &str, rng: &mut StdRng, policy: &IdPolicy, broker: Broker) -> Outgoing {
    let oversize_fits = broker != Broker::Kafka || policy.max_payload_bytes + 1024 < KAFKA_RECORD_LIMIT_BYTES;
    let no_id = || (None, serde_json::to_vec(&json!({"orderNo": order_no, "note": "no message id"})).unwrap());
    let (message_id, payload) = match rng.random_range(0..10) {
        0..5 => no_id(),
        5..9 => (
            Some(format!("ORDER.GARBLED.{order_no}:1")),
            format!("{{\"orderNo\": \"{order_no}\", garbled").into_bytes(),
        ),
        _ if oversize_fits => {
            let pad = " ".repeat(policy.max_payload_bytes);
            (None, serde_json::to_vec(&json!({"orderNo": order_no, "pad": pad})).unwrap())
        }
        _ => no_id(),
    };
    // Ask the consumer's own rules which record id this poison will be stored under (on Kafka
    // the key — the order number — stands in for a missing id header).
    let routing_key = "order.poison";
    let probe = InboundMessage {
        payload: payload.clone(),
        headers: serde_json::Map::new(),
        property_message_id: message_id.clone(),
        type_property: None,
        published_at: None,
        content_type: Some("application/json".to_owned()),
        broker,
        source: SourceRef {
            routing_key: Some(if broker == Broker::Kafka { order_no } else { routing_key }.to_owned()),
            ..SourceRef::default()
        },
        redelivered: false,
        headers_too_deep: false,
    };
    let record_id = match policy.identify(&probe, &TypePolicy::default()) {
        // Without a usable id each delivery gets a dead record of its own: the verifier finds
        // them by payload.
        Err(p) if p.message_type == POISON_TYPE => {
            let hex: String = probe.payload_hash().iter().map(|b| format!("{b:02x}")).collect();
            format!("{POISON_BY_PAYLOAD}{hex}")
        }
        Err(p) => p.record_id.to_string(),
        Ok(found) => found.id.to_string(),
    };
    Outgoing { message_id, record_id, routing_key, key: order_no.to_owned(), payload, poison: true }
}

/// Publishes a run and records it. `progress` is called with (copies published, copies planned).
///
/// Errors: database (recording the run) or broker (a publish not confirmed) errors, as text.
pub async fn simulate(
    pool: &PgPool,
    publisher: &dyn Publish,
    params: &SimulateParams,
    orders: &OrderSettings,
    policy: &IdPolicy,
    progress: impl Fn(u64, u64),
) -> anyhow::Result<SimulationReport> {
    simulate_on(&PgRunBook(pool), publisher, params, orders, policy, progress).await
}

/// [`simulate`], recording the run in `book`.
pub(crate) async fn simulate_on(
    book: &dyn RunBook,
    publisher: &dyn Publish,
    params: &SimulateParams,
    orders: &OrderSettings,
    policy: &IdPolicy,
    progress: impl Fn(u64, u64),
) -> anyhow::Result<SimulationReport> {
    let started = Instant::now();
    let run_id = book.start(params).await?;
    // Time and run id: unique even across databases (a fresh database restarts run ids).
    let order_prefix = format!("{}{run_id:04}", chrono::Utc::now().format("%Y%m%d%H%M%S"));
    book.name_orders(run_id, &order_prefix).await?;

    let mut rng = StdRng::seed_from_u64(params.seed);
    let mut plan: Vec<Outgoing> = Vec::with_capacity(usize::try_from(params.orders * 3).unwrap_or(0));
    for i in 0..params.orders {
        let order_no = format!("{order_prefix}{i:07}");
        plan.extend(order_events(&order_no, &mut rng, orders));
        if params.poison_rate > 0.0 && rng.random_bool(params.poison_rate.clamp(0.0, 1.0)) {
            plan.push(poison(&order_no, &mut rng, policy, publisher.broker()));
        }
    }
    for window in plan.chunks_mut(params.reorder_window.max(1)) {
        window.shuffle(&mut rng);
    }
    let duplicate_rate = params.duplicate_rate.clamp(0.0, 1.0);
    let duplicates_planned = (plan.len() as f64 * duplicate_rate).round() as u64;
    let total_planned = plan.len() as u64 + duplicates_planned;

    let mut copies: HashMap<usize, i32> = HashMap::new();
    // Resends due later: (due, index into plan).
    let mut resends: BinaryHeap<Reverse<(Instant, usize)>> = BinaryHeap::new();
    let headers = serde_json::Map::new();
    let mut in_flight = FuturesUnordered::new();
    let interval = (params.rate > 0.0).then(|| Duration::from_secs_f64(1.0 / params.rate));
    let mut next_slot = Instant::now();
    let mut next_index = 0;
    let (mut published, mut duplicates) = (0u64, 0u64);
    let max_delay = params.duplicate_delay_ms.max(201);

    loop {
        let now = Instant::now();
        let index = match resends.peek() {
            Some(Reverse((due, _))) if *due <= now || next_index >= plan.len() => {
                let Reverse((due, index)) = resends.pop().expect("peeked");
                tokio::time::sleep_until(due.into()).await;
                duplicates += 1;
                index
            }
            _ if next_index < plan.len() => {
                next_index += 1;
                if rng.random_bool(duplicate_rate) {
                    let delay = Duration::from_millis(rng.random_range(200..max_delay));
                    resends.push(Reverse((Instant::now() + delay, next_index - 1)));
                }
                next_index - 1
            }
            _ => break,
        };
        if let Some(interval) = interval {
            tokio::time::sleep_until(next_slot.into()).await;
            next_slot = next_slot.max(Instant::now() - interval) + interval;
        }
        let out = &plan[index];
        *copies.entry(index).or_insert(0) += 1;
        in_flight.push(publisher.publish(Outbound {
            destination: &params.exchange,
            routing_key: out.routing_key,
            key: Some(&out.key),
            message_id: out.message_id.as_deref(),
            payload: &out.payload,
            headers: &headers,
            content_type: Some("application/json"),
            type_property: None,
        }));
        if in_flight.len() >= 256 {
            in_flight.next().await.expect("non-empty")?;
        }
        published += 1;
        if published % 500 == 0 {
            progress(published, total_planned);
        }
    }
    while let Some(result) = in_flight.next().await {
        result?;
    }
    progress(published, published);

    let mut recorded = Vec::new();
    for (index, n) in &copies {
        let out = &plan[*index];
        for group in params.groups.iter().filter(|g| g.receives(out.routing_key)) {
            recorded.push(RecordedMessage {
                group: group.name.as_str(),
                message_id: out.record_id.as_str(),
                poison: out.poison,
                copies: *n,
            });
        }
    }
    for chunk in recorded.chunks(5000) {
        book.record_messages(run_id, chunk).await?;
    }
    let poison_count = plan.iter().filter(|o| o.poison).count() as u64;
    book.finish(run_id, published as i64, duplicates as i64, poison_count as i64).await?;
    let seconds = started.elapsed().as_secs_f64();
    Ok(SimulationReport {
        run_id,
        order_prefix,
        orders: params.orders,
        messages: plan.len() as u64,
        published,
        duplicates,
        poison: poison_count,
        seconds,
        rate: published as f64 / seconds.max(1e-9),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topic_patterns_match_as_rabbitmq_does() {
        assert!(topic_matches("order.#", "order.pay"));
        assert!(topic_matches("order.#", "order"));
        assert!(topic_matches("#", "order.pay.x"));
        assert!(topic_matches("order.*", "order.notify"));
        assert!(!topic_matches("order.*", "order.notify.x"));
        assert!(!topic_matches("order.pay", "order.payx"));
        assert!(topic_matches("*.pay", "order.pay"));
        let group = SimulatedGroup { name: "g".into(), binding_keys: vec!["order.create".into(), "order.pay".into()] };
        assert!(group.receives("order.pay") && !group.receives("order.notify"));
        assert!(SimulatedGroup { name: "k".into(), binding_keys: vec![] }.receives("anything"));
    }
}
