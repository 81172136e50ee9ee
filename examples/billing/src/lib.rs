//! The billing example: a service of its own that embeds the dedup engine, built with RabbitMQ
//! only. Its producer is shaped like a Spring AMQP one: message ids `<invoice no>:<EVENT>:<version>`
//! in the AMQP `message_id` property, the event class in the `__TypeId__` header, a JSON body.
//!
//! - `INVOICE.PAID` ([`PayInvoice`], transactional): the invoice `OPEN → PAID` by a conditional
//!   update on its status, and one ledger entry, in the claim's transaction.
//! - `INVOICE.RECEIPT` ([`SendReceipt`], leased, `hold`): a receipt e-mail through an HTTP mail
//!   service (here a stand-in, [`mail`], which logs every call so double sends are countable),
//!   sent with `Idempotency-Key: <message id>`.
//!
//! Its tables live in the schema `billing`, next to the engine's `dedup`, in one database. It
//! mounts the dedup console at `/ops/dedup`, behind its own staff sign-in ([`staff`]).

pub mod mail;
pub mod page;
pub mod producer;
pub mod staff;

use std::time::Duration;

use dedup_engine::SchemaError;
use dedup_engine::prelude::*;
use sqlx::migrate::Migrator;
use sqlx::{PgConnection, PgPool, Row};

use crate::mail::{MailClient, Receipt};

/// The schema of the example's tables.
pub const SCHEMA: &str = "billing";

/// The example's migrations, applied in [`SCHEMA`].
pub static MIGRATOR: Migrator = sqlx::migrate!("./migrations");

/// The consumer group's name.
pub const GROUP: &str = "billing";

/// `__TypeId__` of a paid invoice (the Java class a Spring producer sends).
pub const PAID_EVENT: &str = "com.example.billing.InvoicePaidEvent";
/// `__TypeId__` of a receipt request.
pub const RECEIPT_EVENT: &str = "com.example.billing.InvoiceReceiptEvent";

/// Applies the example's migrations in [`SCHEMA`], with their own history.
///
/// Errors: the database's, or a migration's.
pub async fn migrate(pool: &PgPool) -> Result<(), SchemaError> {
    dedup_engine::migrate_schema(pool, &Schema::parse(SCHEMA).expect("a valid schema name"), &MIGRATOR).await
}

/// Where the billing group reads from and how long its leases are.
#[derive(Debug, Clone)]
pub struct BillingQueue {
    /// RabbitMQ URL.
    pub amqp_url: String,
    /// Exchange the producer publishes to.
    pub exchange: String,
    /// The group's queue.
    pub queue: String,
    /// Lease of each claim.
    pub lease: Duration,
}

/// The billing group's topology: `queue` bound to the topic exchange `exchange` with
/// `invoice.#`.
pub fn rabbit_settings(exchange: &str, queue: &str) -> RabbitSettings {
    RabbitSettings::for_queue(exchange, queue, ["invoice.#"])
}

/// The billing consumer group: its queue, the type from `__TypeId__` mapped to handler types,
/// and its two handlers.
pub fn group(queue: &BillingQueue, mail: MailClient) -> Group {
    Group::rabbitmq(GROUP, &queue.amqp_url, rabbit_settings(&queue.exchange, &queue.queue))
        .types(
            TypePolicy::from_sources([TypeSource::Header("__TypeId__".into())])
                .map(PAID_EVENT, "INVOICE.PAID")
                .map(RECEIPT_EVENT, "INVOICE.RECEIPT"),
        )
        .lease(queue.lease)
        .transactional("INVOICE.PAID", PayInvoice)
        .leased("INVOICE.RECEIPT", SendReceipt { mail }, LeaseExpiryPolicy::Hold)
}

/// `INVOICE.PAID`: `{ "invoiceNo" }`. The invoice goes `OPEN → PAID` and its payment is booked
/// in the ledger, both only when the conditional update took (a second run finds it `PAID` and
/// does nothing).
///
/// Errors: `INVOICE_NOT_FOUND` (retryable: the invoice may be committed a moment later).
pub struct PayInvoice;

#[async_trait]
impl TransactionalHandler for PayInvoice {
    async fn handle(&self, input: &HandlerInput<'_>, tx: &mut PgConnection) -> Result<(), HandlerError> {
        let invoice = input.str_field("invoiceNo")?;
        let paid = sqlx::query(
            "UPDATE billing.invoices SET status = 'PAID', version = version + 1, paid_at = now()
             WHERE invoice_no = $1 AND status = 'OPEN'
             RETURNING amount_cents",
        )
        .bind(invoice)
        .fetch_optional(&mut *tx)
        .await?;
        match paid {
            Some(row) => {
                let amount: i64 = row.try_get(0)?;
                sqlx::query(
                    "INSERT INTO billing.ledger_entries (invoice_no, account, amount_cents, message_id)
                     VALUES ($1, 'cash', $2, $3)",
                )
                .bind(invoice)
                .bind(amount)
                .bind(input.message_id.as_str())
                .execute(&mut *tx)
                .await?;
                Ok(())
            }
            None => {
                let exists: bool =
                    sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM billing.invoices WHERE invoice_no = $1)")
                        .bind(invoice)
                        .fetch_one(&mut *tx)
                        .await?;
                if exists {
                    Ok(()) // paid already
                } else {
                    Err(HandlerError::retryable("INVOICE_NOT_FOUND", format!("invoice {invoice} not found (yet)")))
                }
            }
        }
    }
}

/// `INVOICE.RECEIPT`: `{ "invoiceNo", "email" }`. Sends the receipt through the mail service,
/// once the lease is checked; the message id is the call's `Idempotency-Key`.
///
/// Errors: `MAIL_UNAVAILABLE` (retryable: 5xx, timeouts, no connection), `MAIL_REJECTED`
/// (permanent: 4xx), `LEASE_LOST`.
pub struct SendReceipt {
    /// The mail service.
    pub mail: MailClient,
}

#[async_trait]
impl LeasedHandler for SendReceipt {
    async fn handle(&self, input: &HandlerInput<'_>, lease: &LeaseGuard) -> Result<(), HandlerError> {
        let receipt = Receipt::new(input.str_field("invoiceNo")?, input.str_field("email")?);
        lease.check()?;
        self.mail.send(input.message_id.as_str(), &receipt).await
    }
}
