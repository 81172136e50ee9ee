//! `dedup-console verify`: proves a simulation run's effects happened exactly once and that
//! every message it published is accounted for.
//!
//! Violations (each makes `ok` false): an order with more than one stock reservation, more
//! than one payment, or more than one SMS of a kind; a paid order without exactly one payment;
//! a created order without exactly one reservation; a SKU whose `reserved` differs from the sum
//! of its reservations; a published message id with no dedup record (lost, or still queued
//! when the wait ran out); with Kafka ([`check_kafka_lag`]), records the consumer group has not
//! consumed and committed.
//!
//! The statements that read a run and count are a `RunLedger` (PostgreSQL's here, MySQL's in
//! `crate::mysql`); the waiting and the judging are shared.

use std::time::{Duration, Instant};

use async_trait::async_trait;
use serde::Serialize;
use sqlx::{PgPool, Row};

use dedup_engine::Schema;
use dedup_engine::kafka::KafkaConnector;

use crate::simulate::POISON_BY_PAYLOAD;

/// The verifier's findings.
#[derive(Debug, Clone, Default, Serialize)]
pub struct VerifyReport {
    /// No violation.
    pub ok: bool,
    /// The run checked.
    pub run_id: i64,
    /// Its order-number prefix.
    pub order_prefix: String,
    /// Orders the run published.
    pub orders: i64,
    /// Orders that exist.
    pub orders_created: i64,
    /// Orders that are `PAID`.
    pub orders_paid: i64,
    /// SMS sends for the run's orders.
    pub sms_sent: i64,
    /// Distinct message ids published (poison included).
    pub messages: i64,
    /// Copies published (duplicates included).
    pub copies: i64,
    /// Message ids whose record is `succeeded`.
    pub succeeded: i64,
    /// Message ids whose record is `dead` (poison included).
    pub dead: i64,
    /// Poison messages whose record is `dead`.
    pub poison_dead: i64,
    /// Message ids whose record is `failed` (a retry is due).
    pub failed: i64,
    /// Message ids whose record is `processing` (in flight, or stuck) and holds no parked
    /// delivery.
    pub processing: i64,
    /// Message ids whose record is stuck with a redelivery parked on it (`on_lease_expiry =
    /// hold`): it waits for an operator (release, mark succeeded, dead-letter), not for the
    /// consumer.
    pub parked: i64,
    /// Message ids without a record.
    pub missing: i64,
    /// Orders with more than one reservation.
    pub double_reservations: i64,
    /// Orders with more than one payment.
    pub double_payments: i64,
    /// (order, kind) pairs with more than one SMS.
    pub double_sms: i64,
    /// Paid orders without exactly one payment, or created orders without exactly one reservation.
    pub inconsistent_orders: i64,
    /// SKUs whose `reserved` differs from the sum of their reservations.
    pub inventory_mismatches: i64,
    /// Kafka: records of the group's source and retry topics not yet consumed and committed
    /// (the lag); `None` when not checked (RabbitMQ).
    pub kafka_lag: Option<u64>,
    /// What is wrong, one line each.
    pub violations: Vec<String>,
}

/// The statements that read a run and count its effects, on one database.
#[async_trait]
pub(crate) trait RunLedger: Sync {
    /// `(id, orders, order prefix)` of run `run_id`, or of the latest run when `None`.
    async fn run(&self, run_id: Option<i64>) -> Result<Option<(i64, i64, Option<String>)>, sqlx::Error>;
    /// Whether the run has published everything and recorded its messages (`finished_at`).
    async fn finished(&self, run_id: i64) -> Result<bool, sqlx::Error>;
    /// The counts of the report (`messages` to `inventory_mismatches`) for run `run_id`, whose
    /// order numbers start with `prefix`; the rest left default.
    async fn counts(&self, run_id: i64, prefix: &str) -> Result<VerifyReport, sqlx::Error>;
}

/// Checks run `run_id` (the latest run when `None`), polling for up to `wait` until the run has
/// recorded its messages and none is missing, failed or processing (parked ones wait for an
/// operator, not for the consumer: counted apart). A run that recorded no message is a
/// violation: there was nothing to check. The dedup records are read from `engine_schema`.
///
/// Errors: no such run, or a database error.
pub async fn verify(
    pool: &PgPool,
    engine_schema: &Schema,
    run_id: Option<i64>,
    wait: Duration,
) -> anyhow::Result<VerifyReport> {
    verify_on(&PgLedger { pool, engine: engine_schema }, run_id, wait).await
}

/// [`verify`], reading from `ledger`.
pub(crate) async fn verify_on(
    ledger: &dyn RunLedger,
    run_id: Option<i64>,
    wait: Duration,
) -> anyhow::Result<VerifyReport> {
    let run = ledger.run(run_id).await?;
    let Some((run_id, orders, Some(prefix))) = run else {
        anyhow::bail!(match run_id {
            Some(id) => format!("no simulation run {id}"),
            None => "no simulation run recorded; run `dedup-console simulate` first".to_owned(),
        });
    };
    let started = Instant::now();
    loop {
        // A run records its messages when it has published them all (`finished_at`).
        let finished = ledger.finished(run_id).await?;
        let mut report = ledger.counts(run_id, &prefix).await?;
        report.run_id = run_id;
        report.order_prefix.clone_from(&prefix);
        report.orders = orders;
        judge(&mut report);
        let settled = report.missing == 0 && report.failed == 0 && report.processing == 0;
        if (finished && report.messages > 0 && settled) || started.elapsed() >= wait {
            if !finished || report.messages == 0 {
                report.violations.push(format!(
                    "run {run_id} has recorded no message yet (still publishing, or it stopped): nothing was checked"
                ));
                report.ok = false;
            }
            return Ok(report);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Adds the Kafka group's lag to `report`, polling for up to `wait` until it is 0 (the
/// consumer commits offsets shortly after the records are committed in the database). A lag
/// left is a violation: offsets were not committed past work that is done.
///
/// Errors: Kafka did not answer.
pub async fn check_kafka_lag(
    report: &mut VerifyReport,
    connector: &KafkaConnector,
    wait: Duration,
) -> anyhow::Result<()> {
    let started = Instant::now();
    let lag = loop {
        let lag = connector.lag().await?;
        if lag == 0 || started.elapsed() >= wait {
            break lag;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    report.kafka_lag = Some(lag);
    if lag > 0 {
        report
            .violations
            .push(format!("{lag} records of Kafka group {} not consumed and committed", connector.group_id()));
        report.ok = false;
    }
    Ok(())
}

async fn count(pool: &PgPool, sql: &str, prefix: &str) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar(sql).bind(format!("{prefix}%")).fetch_one(pool).await
}

/// The ledger on PostgreSQL, the dedup records in `engine`.
struct PgLedger<'a> {
    pool: &'a PgPool,
    engine: &'a Schema,
}

#[async_trait]
impl RunLedger for PgLedger<'_> {
    async fn run(&self, run_id: Option<i64>) -> Result<Option<(i64, i64, Option<String>)>, sqlx::Error> {
        sqlx::query_as(
            "SELECT id, (parameters->>'orders')::bigint, parameters->>'order_prefix' FROM shop.simulation_runs
             WHERE $1::bigint IS NULL OR id = $1 ORDER BY id DESC LIMIT 1",
        )
        .bind(run_id)
        .fetch_optional(self.pool)
        .await
    }

    async fn finished(&self, run_id: i64) -> Result<bool, sqlx::Error> {
        sqlx::query_scalar("SELECT finished_at IS NOT NULL FROM shop.simulation_runs WHERE id = $1")
            .bind(run_id)
            .fetch_one(self.pool)
            .await
    }

    async fn counts(&self, run_id: i64, prefix: &str) -> Result<VerifyReport, sqlx::Error> {
        let (pool, engine_schema) = (self.pool, self.engine);
        // A published message's record: by message id, or — a poison message without a usable id,
        // one dead record per delivery — by payload.
        let row = sqlx::query(&format!(
            "SELECT count(*) AS messages, COALESCE(sum(m.copies), 0)::bigint AS copies,
                    count(*) FILTER (WHERE r.status IS NULL) AS missing,
                    count(*) FILTER (WHERE r.status = 'succeeded') AS succeeded,
                    count(*) FILTER (WHERE r.status = 'dead') AS dead,
                    count(*) FILTER (WHERE r.status = 'dead' AND m.poison) AS poison_dead,
                    count(*) FILTER (WHERE r.status = 'failed') AS failed,
                    count(*) FILTER (WHERE r.status = 'processing' AND NOT r.parked) AS processing,
                    count(*) FILTER (WHERE r.status = 'processing' AND r.parked) AS parked
             FROM shop.simulation_messages m
             LEFT JOIN LATERAL (
                 SELECT status, parked_at IS NOT NULL AS parked FROM {s}.dedup_records
                 WHERE consumer_group = m.consumer_group AND message_id = m.message_id
                 UNION ALL
                 SELECT status, false FROM {s}.dedup_records
                 WHERE m.message_id LIKE '{POISON_BY_PAYLOAD}%' AND consumer_group = m.consumer_group
                   AND message_type = 'POISON' AND payload_hash = decode(substr(m.message_id, {skip}), 'hex')
                 LIMIT 1
             ) r ON true
             WHERE m.run_id = $1",
            s = engine_schema.quoted(),
            skip = POISON_BY_PAYLOAD.len() + 1,
        ))
        .bind(run_id)
        .fetch_one(pool)
        .await?;
        let mut r = VerifyReport {
            messages: row.try_get("messages")?,
            copies: row.try_get("copies")?,
            missing: row.try_get("missing")?,
            succeeded: row.try_get("succeeded")?,
            dead: row.try_get("dead")?,
            poison_dead: row.try_get("poison_dead")?,
            failed: row.try_get("failed")?,
            processing: row.try_get("processing")?,
            parked: row.try_get("parked")?,
            ..VerifyReport::default()
        };
        r.orders_created = count(pool, "SELECT count(*) FROM shop.orders WHERE order_no LIKE $1", prefix).await?;
        r.orders_paid =
            count(pool, "SELECT count(*) FROM shop.orders WHERE order_no LIKE $1 AND status = 'PAID'", prefix).await?;
        r.sms_sent = count(pool, "SELECT count(*) FROM shop.notifications WHERE order_no LIKE $1", prefix).await?;
        r.double_reservations = count(
            pool,
            "SELECT count(*) FROM (SELECT order_no FROM shop.inventory_reservations WHERE order_no LIKE $1
                                   GROUP BY order_no HAVING count(*) > 1) d",
            prefix,
        )
        .await?;
        r.double_payments = count(
            pool,
            "SELECT count(*) FROM (SELECT order_no FROM shop.payments WHERE order_no LIKE $1
                                   GROUP BY order_no HAVING count(*) > 1) d",
            prefix,
        )
        .await?;
        r.double_sms = count(
            pool,
            "SELECT count(*) FROM (SELECT order_no, kind FROM shop.notifications WHERE order_no LIKE $1
                                   GROUP BY order_no, kind HAVING count(*) > 1) d",
            prefix,
        )
        .await?;
        r.inconsistent_orders = count(
            pool,
            "SELECT count(*) FROM shop.orders o WHERE o.order_no LIKE $1 AND (
                 (SELECT count(*) FROM shop.inventory_reservations x WHERE x.order_no = o.order_no) <> 1
              OR (o.status = 'PAID') <> ((SELECT count(*) FROM shop.payments p WHERE p.order_no = o.order_no) = 1))",
            prefix,
        )
        .await?;
        r.inventory_mismatches = sqlx::query_scalar(
            "SELECT count(*) FROM shop.inventory i
             WHERE i.reserved <> COALESCE((SELECT sum(quantity) FROM shop.inventory_reservations x WHERE x.sku = i.sku), 0)",
        )
        .fetch_one(pool)
        .await?;
        Ok(r)
    }
}

/// Sets `report`'s violations and `ok` from its counts.
fn judge(r: &mut VerifyReport) {
    let mut violations = Vec::new();
    let mut flag = |n: i64, what: &str| {
        if n > 0 {
            violations.push(format!("{n} {what}"));
        }
    };
    flag(r.double_reservations, "orders with stock reserved more than once");
    flag(r.double_payments, "orders paid more than once");
    flag(r.double_sms, "(order, kind) pairs with more than one SMS");
    flag(r.inconsistent_orders, "orders whose reservation or payment does not match their status");
    flag(r.inventory_mismatches, "SKUs whose reserved stock differs from their reservations");
    flag(r.missing, "published message ids without a dedup record (lost, or still queued)");
    r.ok = violations.is_empty();
    r.violations = violations;
}
