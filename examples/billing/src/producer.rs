//! A producer shaped like a Spring AMQP one (what the seeds' services send): it issues invoices
//! (rows in `billing.invoices`, as the invoicing system would) and publishes, per invoice, a paid
//! event and a receipt request — ids `<invoice no>:PAID:2` and `<invoice no>:RECEIPT:3` in the
//! AMQP `message_id` property, the event class in the `__TypeId__` header, a JSON body — and
//! publishes a share of them twice, as a producer retrying after a lost confirm does.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};
use sqlx::PgPool;

use dedup_engine::rabbitmq::{Publisher, properties_for};

/// What to publish.
#[derive(Debug, Clone)]
pub struct PublishParams {
    /// Invoices to issue (each gets a paid event and a receipt request).
    pub invoices: u64,
    /// Share of messages published a second time with the same id (0–1).
    pub duplicate_rate: f64,
    /// The exchange.
    pub exchange: String,
    /// Random seed.
    pub seed: u64,
}

/// What was published.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublishReport {
    /// Invoice numbers start with this.
    pub prefix: String,
    /// Invoices issued.
    pub invoices: u64,
    /// Messages published, copies included.
    pub published: u64,
    /// Copies published a second time.
    pub duplicates: u64,
}

/// Issues `params.invoices` invoices and publishes their events through `publisher`.
///
/// Errors: the database's (issuing invoices) or the broker's (a publish not confirmed).
pub async fn publish_invoices(
    pool: &PgPool,
    publisher: &Publisher,
    params: &PublishParams,
) -> anyhow::Result<PublishReport> {
    let mut rng = StdRng::seed_from_u64(params.seed);
    let prefix = chrono::Utc::now().format("%Y%m%d%H%M%S").to_string();
    let numbers: Vec<String> = (0..params.invoices).map(|i| format!("{prefix}{i:06}")).collect();
    let amounts: Vec<i64> = numbers.iter().map(|_| rng.random_range(1_000..100_000)).collect();
    sqlx::query(
        "INSERT INTO billing.invoices (invoice_no, customer, email, amount_cents, status)
         SELECT n, 'Customer ' || n, 'billing+' || n || '@example.com', a, 'OPEN'
         FROM unnest($1::text[], $2::bigint[]) AS i(n, a)",
    )
    .bind(&numbers)
    .bind(&amounts)
    .execute(pool)
    .await?;
    let mut report = PublishReport { prefix, invoices: params.invoices, published: 0, duplicates: 0 };
    // Half of the second copies follow at once, half after everything else (a late retry).
    let mut late = Vec::new();
    for invoice in &numbers {
        let email = format!("billing+{invoice}@example.com");
        let events = [
            (format!("{invoice}:PAID:2"), crate::PAID_EVENT, "invoice.paid", json!({ "invoiceNo": invoice })),
            (
                format!("{invoice}:RECEIPT:3"),
                crate::RECEIPT_EVENT,
                "invoice.receipt",
                json!({ "invoiceNo": invoice, "email": email }),
            ),
        ];
        for (id, type_id, routing_key, body) in events {
            publish(publisher, &params.exchange, routing_key, &id, type_id, &body).await?;
            report.published += 1;
            if rng.random_bool(params.duplicate_rate.clamp(0.0, 1.0)) {
                report.duplicates += 1;
                if rng.random_bool(0.5) {
                    publish(publisher, &params.exchange, routing_key, &id, type_id, &body).await?;
                    report.published += 1;
                } else {
                    late.push((id, type_id, routing_key, body));
                }
            }
        }
    }
    for (id, type_id, routing_key, body) in late {
        publish(publisher, &params.exchange, routing_key, &id, type_id, &body).await?;
        report.published += 1;
    }
    Ok(report)
}

/// One message as a Spring `RabbitTemplate` with a Jackson converter sends it.
async fn publish(
    publisher: &Publisher,
    exchange: &str,
    routing_key: &str,
    id: &str,
    type_id: &str,
    body: &Value,
) -> anyhow::Result<()> {
    let mut headers = serde_json::Map::new();
    headers.insert("__TypeId__".to_owned(), Value::String(type_id.to_owned()));
    let props = properties_for(Some(id), &headers, Some("application/json"));
    publisher.publish(exchange, routing_key, &serde_json::to_vec(body)?, props).await?;
    Ok(())
}
