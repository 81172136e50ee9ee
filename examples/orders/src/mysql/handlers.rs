//! `ORDER.CREATE` and `ORDER.PAY` on MySQL: the PostgreSQL handlers' statements in MySQL's
//! terms, with their parsing and judgements shared (`crate::handlers`).

use async_trait::async_trait;
use sqlx::error::ErrorKind;
use sqlx::{MySql, MySqlConnection};

use super::Shop;
use crate::handlers::{NewOrder, Payment};
use dedup_engine::{HandlerError, HandlerInput, TransactionalHandler};

/// Text of a `_bin` column: sqlx reads those as bytes only.
fn text(bytes: Vec<u8>) -> String {
    String::from_utf8(bytes).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
}

/// `ORDER.CREATE` on MySQL (transactional): the order as `PENDING`, and its stock reserved —
/// as [`crate::CreateOrder`] does on PostgreSQL, with its payload, errors and lock key.
#[derive(Debug, Clone)]
pub struct CreateOrder {
    shop: Shop,
}

impl CreateOrder {
    /// The handler writing in `shop`'s tables.
    pub fn new(shop: Shop) -> Self {
        Self { shop }
    }
}

#[async_trait]
impl TransactionalHandler<MySql> for CreateOrder {
    async fn handle(&self, input: &HandlerInput<'_>, tx: &mut MySqlConnection) -> Result<(), HandlerError> {
        let order = NewOrder::parse(input)?;
        let existing: Option<(Vec<u8>, i32, i64, Vec<u8>)> = sqlx::query_as(
            &self.shop.sql("SELECT sku, quantity, amount_cents, phone FROM {shop}.orders WHERE order_no = ?"),
        )
        .bind(order.order_no)
        .fetch_optional(&mut *tx)
        .await?;
        if let Some((sku, quantity, amount, phone)) = existing {
            return order.created_before(&text(sku), quantity, amount, &text(phone));
        }
        // Affected rows are the rows found (sqlx sends CLIENT_FOUND_ROWS): the condition decides.
        let reserved = sqlx::query(&self.shop.sql(
            "UPDATE {shop}.inventory SET available = available - ?, reserved = reserved + ?
             WHERE sku = ? AND available >= ?",
        ))
        .bind(order.quantity)
        .bind(order.quantity)
        .bind(order.sku)
        .bind(order.quantity)
        .execute(&mut *tx)
        .await?;
        if reserved.rows_affected() == 0 {
            return Err(order.out_of_stock());
        }
        let inserted = sqlx::query(&self.shop.sql(
            "INSERT INTO {shop}.orders (order_no, status, sku, quantity, amount_cents, phone, version)
             VALUES (?, 'PENDING', ?, ?, ?, ?, 1)",
        ))
        .bind(order.order_no)
        .bind(order.sku)
        .bind(order.quantity)
        .bind(order.amount)
        .bind(order.phone)
        .execute(&mut *tx)
        .await;
        if let Err(e) = inserted {
            // The primary key is the table's only unique key (InnoDB 1062). The pipeline runs
            // each message in a savepoint, so the error undoes this message's reservation only.
            if e.as_database_error().is_some_and(|d| d.kind() == ErrorKind::UniqueViolation) {
                return Err(order.exists());
            }
            return Err(e.into());
        }
        sqlx::query(&self.shop.sql(
            "INSERT INTO {shop}.inventory_reservations (order_no, sku, quantity, message_id) VALUES (?, ?, ?, ?)",
        ))
        .bind(order.order_no)
        .bind(order.sku)
        .bind(order.quantity)
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

/// `ORDER.PAY` on MySQL (transactional): the state machine `PENDING → PAID` by a conditional
/// update on status and version, the payment booked only when the update took — as
/// [`crate::PayOrder`] does on PostgreSQL, with its payload and errors (`ORDER_NOT_FOUND`
/// retryable: the CREATE may arrive later).
#[derive(Debug, Clone)]
pub struct PayOrder {
    shop: Shop,
}

impl PayOrder {
    /// The handler writing in `shop`'s tables.
    pub fn new(shop: Shop) -> Self {
        Self { shop }
    }
}

#[async_trait]
impl TransactionalHandler<MySql> for PayOrder {
    async fn handle(&self, input: &HandlerInput<'_>, tx: &mut MySqlConnection) -> Result<(), HandlerError> {
        let payment = Payment::parse(input)?;
        // Affected rows are the rows found, which the WHERE on status makes the rows changed.
        let paid = sqlx::query(&self.shop.sql(
            "UPDATE {shop}.orders SET status = 'PAID', version = version + 1, paid_at = UTC_TIMESTAMP(6)
             WHERE order_no = ? AND status = 'PENDING' AND version = ?",
        ))
        .bind(payment.order_no)
        .bind(payment.expected)
        .execute(&mut *tx)
        .await?;
        if paid.rows_affected() == 1 {
            sqlx::query(
                &self.shop.sql("INSERT INTO {shop}.payments (order_no, amount_cents, message_id) VALUES (?, ?, ?)"),
            )
            .bind(payment.order_no)
            .bind(payment.amount)
            .bind(input.message_id.as_str())
            .execute(&mut *tx)
            .await?;
            return Ok(());
        }
        let current: Option<(Vec<u8>, i32)> =
            sqlx::query_as(&self.shop.sql("SELECT status, version FROM {shop}.orders WHERE order_no = ?"))
                .bind(payment.order_no)
                .fetch_optional(&mut *tx)
                .await?;
        let current = current.map(|(status, version)| (text(status), version));
        payment.not_paid_now(current.as_ref().map(|(status, version)| (status.as_str(), *version)))
    }
}
