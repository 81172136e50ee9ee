//! The order handlers.

use async_trait::async_trait;
use sqlx::PgConnection;

use super::sms::{Sms, SmsError, SmsGateway};
use dedup_engine::{HandlerError, HandlerInput, LeaseGuard, LeasedHandler, TransactionalHandler};

/// `ORDER.CREATE` (transactional): the order as `PENDING`, and its stock reserved.
///
/// Payload: `{ "orderNo", "sku", "quantity", "amountCents", "phone" }`.
/// Errors: `INVALID_PAYLOAD`, `OUT_OF_STOCK` and `ORDER_EXISTS` (another order under the same
/// number; all permanent). The same order again (a replay under a new message id, or a late
/// duplicate after its record was cleaned up) is a no-op, as PAY treats an order already `PAID`.
pub struct CreateOrder;

#[async_trait]
impl TransactionalHandler for CreateOrder {
    async fn handle(&self, input: &HandlerInput<'_>, tx: &mut PgConnection) -> Result<(), HandlerError> {
        let order = NewOrder::parse(input)?;
        let NewOrder { order_no, sku, quantity, amount, phone } = order;
        let existing: Option<(String, i32, i64, String)> =
            sqlx::query_as("SELECT sku, quantity, amount_cents, phone FROM shop.orders WHERE order_no = $1")
                .bind(order_no)
                .fetch_optional(&mut *tx)
                .await?;
        if let Some((e_sku, e_quantity, e_amount, e_phone)) = existing {
            return order.created_before(&e_sku, e_quantity, e_amount, &e_phone);
        }
        let reserved = sqlx::query(
            "UPDATE shop.inventory SET available = available - $2, reserved = reserved + $2
             WHERE sku = $1 AND available >= $2",
        )
        .bind(sku)
        .bind(quantity)
        .execute(&mut *tx)
        .await?;
        if reserved.rows_affected() == 0 {
            return Err(order.out_of_stock());
        }
        let inserted = sqlx::query(
            "INSERT INTO shop.orders (order_no, status, sku, quantity, amount_cents, phone, version)
             VALUES ($1, 'PENDING', $2, $3, $4, $5, 1)",
        )
        .bind(order_no)
        .bind(sku)
        .bind(quantity)
        .bind(amount)
        .bind(phone)
        .execute(&mut *tx)
        .await;
        if let Err(e) = inserted {
            // A unique violation aborts the batch's transaction; it runs again with a savepoint
            // per message, where it aborts only this message's changes.
            if e.as_database_error().is_some_and(|d| d.constraint() == Some("orders_pkey")) {
                return Err(order.exists());
            }
            return Err(e.into());
        }
        sqlx::query(
            "INSERT INTO shop.inventory_reservations (order_no, sku, quantity, message_id) VALUES ($1, $2, $3, $4)",
        )
        .bind(order_no)
        .bind(sku)
        .bind(quantity)
        .bind(input.message_id.as_str())
        .execute(&mut *tx)
        .await?;
        Ok(())
    }

    /// The SKU's inventory row is the hot row all CREATEs of that SKU lock.
    fn lock_key(&self, input: &HandlerInput<'_>) -> Option<String> {
        NewOrder::lock_key(input)
    }
}

/// `ORDER.PAY` (transactional): the state machine `PENDING → PAID`, by a conditional update on
/// status and version; the payment is booked only when the update took.
///
/// Payload: `{ "orderNo", "amountCents", "expectedVersion" }`.
/// Errors: `ORDER_NOT_FOUND` (retryable: the CREATE may arrive later), `VERSION_CONFLICT`
/// (permanent). An order already `PAID` is a no-op.
pub struct PayOrder;

#[async_trait]
impl TransactionalHandler for PayOrder {
    async fn handle(&self, input: &HandlerInput<'_>, tx: &mut PgConnection) -> Result<(), HandlerError> {
        let payment = Payment::parse(input)?;
        let Payment { order_no, amount, expected } = payment;
        let paid = sqlx::query(
            "UPDATE shop.orders SET status = 'PAID', version = version + 1, paid_at = now()
             WHERE order_no = $1 AND status = 'PENDING' AND version = $2",
        )
        .bind(order_no)
        .bind(expected)
        .execute(&mut *tx)
        .await?;
        if paid.rows_affected() == 1 {
            sqlx::query("INSERT INTO shop.payments (order_no, amount_cents, message_id) VALUES ($1, $2, $3)")
                .bind(order_no)
                .bind(amount)
                .bind(input.message_id.as_str())
                .execute(&mut *tx)
                .await?;
            return Ok(());
        }
        let current: Option<(String, i32)> =
            sqlx::query_as("SELECT status, version FROM shop.orders WHERE order_no = $1")
                .bind(order_no)
                .fetch_optional(&mut *tx)
                .await?;
        payment.not_paid_now(current.as_ref().map(|(status, version)| (status.as_str(), *version)))
    }
}

/// The lines of an `ORDER.CREATE`, and what its handlers (PostgreSQL's here, MySQL's in
/// `crate::mysql`) make of what they find.
#[derive(Debug, Clone, Copy)]
pub(crate) struct NewOrder<'a> {
    pub(crate) order_no: &'a str,
    pub(crate) sku: &'a str,
    pub(crate) quantity: i32,
    pub(crate) amount: i64,
    pub(crate) phone: &'a str,
}

impl<'a> NewOrder<'a> {
    /// The payload's lines. Errors: `INVALID_PAYLOAD` (a field missing, a quantity not positive).
    pub(crate) fn parse(input: &'a HandlerInput<'_>) -> Result<Self, HandlerError> {
        Ok(Self {
            order_no: input.str_field("orderNo")?,
            sku: input.str_field("sku")?,
            quantity: i32::try_from(input.i64_field("quantity")?)
                .ok()
                .filter(|q| *q > 0)
                .ok_or_else(|| HandlerError::permanent("INVALID_PAYLOAD", "quantity must be a positive integer"))?,
            amount: input.i64_field("amountCents")?,
            phone: input.str_field("phone")?,
        })
    }

    /// The SKU: its inventory row is the hot row all CREATEs of that SKU lock.
    pub(crate) fn lock_key(input: &HandlerInput<'_>) -> Option<String> {
        input.str_field("sku").ok().map(str::to_owned)
    }

    /// An order under this number exists with these lines: this order, created before (a
    /// no-op: nothing is reserved twice), or `ORDER_EXISTS` (another order).
    pub(crate) fn created_before(
        &self,
        sku: &str,
        quantity: i32,
        amount: i64,
        phone: &str,
    ) -> Result<(), HandlerError> {
        if (sku, quantity, amount, phone) == (self.sku, self.quantity, self.amount, self.phone) {
            Ok(())
        } else {
            Err(HandlerError::permanent(
                "ORDER_EXISTS",
                format!("order {} exists already, with other lines", self.order_no),
            ))
        }
    }

    /// `OUT_OF_STOCK`: the reservation found too few units.
    pub(crate) fn out_of_stock(&self) -> HandlerError {
        HandlerError::permanent("OUT_OF_STOCK", format!("no {} units of {} available", self.quantity, self.sku))
    }

    /// `ORDER_EXISTS`: the order's insert met another transaction's order under this number.
    pub(crate) fn exists(&self) -> HandlerError {
        HandlerError::permanent("ORDER_EXISTS", format!("order {} exists already", self.order_no))
    }
}

/// The lines of an `ORDER.PAY`, and what its handlers make of an order the conditional update
/// did not take.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Payment<'a> {
    pub(crate) order_no: &'a str,
    pub(crate) amount: i64,
    pub(crate) expected: i32,
}

impl<'a> Payment<'a> {
    /// The payload's lines. Errors: `INVALID_PAYLOAD`.
    pub(crate) fn parse(input: &'a HandlerInput<'_>) -> Result<Self, HandlerError> {
        Ok(Self {
            order_no: input.str_field("orderNo")?,
            amount: input.i64_field("amountCents")?,
            expected: i32::try_from(input.i64_field("expectedVersion")?)
                .map_err(|_| HandlerError::permanent("INVALID_PAYLOAD", "expectedVersion out of range"))?,
        })
    }

    /// The update `PENDING → PAID` did not take; `current` is the order's `(status, version)`
    /// read after it (`None`: no such order).
    pub(crate) fn not_paid_now(&self, current: Option<(&str, i32)>) -> Result<(), HandlerError> {
        let (order_no, expected) = (self.order_no, self.expected);
        match current {
            None => Err(HandlerError::retryable("ORDER_NOT_FOUND", format!("order {order_no} not found (yet)"))),
            Some(("PAID", _)) => Ok(()),
            // Created by a transaction that committed between our update and this read.
            Some(("PENDING", version)) if version == expected => Err(HandlerError::retryable(
                "ORDER_NOT_FOUND",
                format!("order {order_no} appeared concurrently; retrying"),
            )),
            Some((status, version)) => Err(HandlerError::permanent(
                "VERSION_CONFLICT",
                format!("order {order_no} is {status} at version {version}, expected PENDING at {expected}"),
            )),
        }
    }
}

/// `ORDER.NOTIFY` (leased): sends "order paid" by SMS through the gateway stand-in.
///
/// Payload: `{ "orderNo", "kind", "phone", "text" }`.
/// Errors: `SMS_GATEWAY_UNAVAILABLE` (retryable); `SMS_GATEWAY_NO_ANSWER` when the send went
/// out and its answer was lost ([`HandlerError::outcome_unknown`]: under `hold` the record is
/// parked for an operator, never sent twice).
pub struct NotifyOrder {
    gateway: SmsGateway,
}

impl NotifyOrder {
    /// A handler sending through `gateway`.
    pub fn new(gateway: SmsGateway) -> Self {
        Self { gateway }
    }
}

#[async_trait]
impl LeasedHandler for NotifyOrder {
    async fn handle(&self, input: &HandlerInput<'_>, lease: &LeaseGuard) -> Result<(), HandlerError> {
        let sms = Sms {
            order_no: input.str_field("orderNo")?,
            kind: input.str_field("kind")?,
            phone: input.str_field("phone")?,
            body: input.str_field("text")?,
            message_id: input.message_id.as_str(),
        };
        self.gateway.send(sms, lease).await.map_err(|e| match e {
            SmsError::Rejected => HandlerError::retryable("SMS_GATEWAY_UNAVAILABLE", e.to_string()),
            // The send went out and its answer was lost (a restart, a killed connection): it may
            // have been accepted, so it is not retried blindly (the record's lease expiry policy).
            SmsError::Log(db) if answer_lost(&db) => {
                HandlerError::outcome_unknown("SMS_GATEWAY_NO_ANSWER", db.to_string())
            }
            // Refused, or not reached: nothing was sent.
            SmsError::Log(db) | SmsError::Unreachable(db) => db.into(),
            SmsError::LeaseLost => HandlerError::lease_lost(),
        })
    }
}

/// Whether a failed write may have been applied all the same: the connection broke while the
/// statement was out (I/O, protocol), or the server ended the session (SQLSTATE class 08,
/// connection exception; 57P01–57P03, shutdown), possibly after its commit. Any other
/// answer from the server means the statement did not take effect.
fn answer_lost(error: &sqlx::Error) -> bool {
    match error {
        sqlx::Error::Io(_) | sqlx::Error::Protocol(_) => true,
        sqlx::Error::Database(db) => db.code().is_some_and(|code| code.starts_with("08") || code.starts_with("57P")),
        _ => false,
    }
}
