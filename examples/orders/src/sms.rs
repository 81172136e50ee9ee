//! The SMS gateway stand-in: accepts a send after a configurable latency, rejects a configurable
//! share of sends, and records every accepted send in `notifications` — outside the consumer's
//! transaction, like a real gateway — so double sends are countable. Where the log lives is its
//! [`SendLog`] (PostgreSQL's here, MySQL's in `crate::mysql`).

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use dedup_engine::LeaseGuard;
use rand::Rng;
use sqlx::{Database, Encode, Executor, IntoArguments, PgPool, Pool, Type};

/// One SMS.
#[derive(Debug, Clone, Copy)]
pub struct Sms<'a> {
    /// The order it is about.
    pub order_no: &'a str,
    /// What it says happened (`PAID`).
    pub kind: &'a str,
    /// Recipient.
    pub phone: &'a str,
    /// Text.
    pub body: &'a str,
    /// The message that asked for it.
    pub message_id: &'a str,
}

/// Why the gateway did not send.
#[derive(Debug, thiserror::Error)]
pub enum SmsError {
    /// The stand-in rejected the send (its failure rate).
    #[error("SMS gateway rejected the send (simulated outage)")]
    Rejected,
    /// The gateway could not be reached: nothing was sent.
    #[error("SMS gateway unreachable: {0}")]
    Unreachable(sqlx::Error),
    /// Recording the send failed after it went out.
    #[error("SMS gateway log unavailable: {0}")]
    Log(#[from] sqlx::Error),
    /// The lease was lost while the gateway waited: the SMS was not sent.
    #[error("lease lost before the send; not sent")]
    LeaseLost,
}

/// Where the gateway records the sends it accepted (`notifications`), on one database.
#[async_trait]
pub(crate) trait SendLog: std::fmt::Debug + Send + Sync + 'static {
    /// Records `sms` (autocommit). Errors: [`SmsError::Unreachable`] when no connection was
    /// had (nothing sent), [`SmsError::Log`] when the statement failed.
    async fn record(&self, sms: Sms<'_>) -> Result<(), SmsError>;
}

/// The send log on a pool of database `DB`: `insert` takes the order, kind, phone, body and
/// message id, in that order (`$1`… on PostgreSQL, `?` on MySQL).
#[derive(Debug)]
pub(crate) struct SqlSendLog<DB: Database> {
    pub(crate) pool: Pool<DB>,
    pub(crate) insert: String,
}

#[async_trait]
impl<DB: Database> SendLog for SqlSendLog<DB>
where
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    for<'q> &'q str: Encode<'q, DB> + Type<DB>,
    for<'q> DB::Arguments<'q>: IntoArguments<'q, DB>,
{
    async fn record(&self, sms: Sms<'_>) -> Result<(), SmsError> {
        let mut conn = self.pool.acquire().await.map_err(SmsError::Unreachable)?;
        sqlx::query::<DB>(&self.insert)
            .bind(sms.order_no)
            .bind(sms.kind)
            .bind(sms.phone)
            .bind(sms.body)
            .bind(sms.message_id)
            .execute(&mut *conn)
            .await?;
        Ok(())
    }
}

/// The stand-in gateway.
#[derive(Debug, Clone)]
pub struct SmsGateway {
    log: Arc<dyn SendLog>,
    latency: Duration,
    failure_rate: f64,
}

impl SmsGateway {
    /// A gateway logging to `pool`'s `notifications`.
    pub fn new(pool: PgPool, latency_ms: u64, failure_rate: f64) -> Self {
        let insert =
            "INSERT INTO shop.notifications (order_no, kind, phone, body, message_id) VALUES ($1, $2, $3, $4, $5)";
        Self::with_log(Arc::new(SqlSendLog { pool, insert: insert.to_owned() }), latency_ms, failure_rate)
    }

    /// A gateway logging to `log`.
    pub(crate) fn with_log(log: Arc<dyn SendLog>, latency_ms: u64, failure_rate: f64) -> Self {
        Self { log, latency: Duration::from_millis(latency_ms), failure_rate: failure_rate.clamp(0.0, 1.0) }
    }

    /// Sends: waits the latency, maybe rejects, else — the lease still held, checked last —
    /// records the send (autocommit).
    pub async fn send(&self, sms: Sms<'_>, lease: &LeaseGuard) -> Result<(), SmsError> {
        tokio::time::sleep(self.latency).await;
        if self.failure_rate > 0.0 && rand::rng().random_bool(self.failure_rate) {
            return Err(SmsError::Rejected);
        }
        lease.check().map_err(|_| SmsError::LeaseLost)?;
        self.log.record(sms).await
    }
}
