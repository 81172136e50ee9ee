//! The receipt e-mail: a client of an HTTP mail service ([`MailClient`]), and a stand-in for
//! that service ([`stand_in`]) which logs every call it receives in `billing.mail_calls` — on its
//! own connection, outside any consumer transaction, as a provider's log would — so a double
//! send shows as two calls with one `Idempotency-Key`.

use std::net::SocketAddr;
use std::time::Duration;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use axum::{Json, Router};
use dedup_engine::HandlerError;
use serde::{Deserialize, Serialize};
use sqlx::PgPool;

/// One receipt e-mail.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Receipt {
    /// The invoice it is for.
    pub invoice_no: String,
    /// Recipient.
    pub to: String,
    /// Subject line.
    pub subject: String,
}

impl Receipt {
    /// The receipt of invoice `invoice_no`, to `to`.
    pub fn new(invoice_no: &str, to: &str) -> Self {
        Self {
            invoice_no: invoice_no.to_owned(),
            to: to.to_owned(),
            subject: format!("Receipt for invoice {invoice_no}"),
        }
    }
}

/// A client of the mail service at `base_url` (`POST <base_url>/send`).
#[derive(Debug, Clone)]
pub struct MailClient {
    http: reqwest::Client,
    send_url: String,
}

impl MailClient {
    /// A client whose calls time out after `timeout` (a call that hangs must not outlive the
    /// lease: keep it well below).
    ///
    /// Errors: the HTTP client could not be built.
    pub fn new(base_url: &str, timeout: Duration) -> anyhow::Result<Self> {
        let http = reqwest::Client::builder().timeout(timeout).build()?;
        Ok(Self { http, send_url: format!("{}/send", base_url.trim_end_matches('/')) })
    }

    /// Sends `receipt` with `Idempotency-Key: <key>`.
    ///
    /// Errors: `MAIL_UNAVAILABLE` (retryable) on a 5xx, a timeout or no connection;
    /// `MAIL_REJECTED` (permanent) on a 4xx.
    pub async fn send(&self, key: &str, receipt: &Receipt) -> Result<(), HandlerError> {
        let response = self
            .http
            .post(&self.send_url)
            .header("Idempotency-Key", key)
            .json(receipt)
            .send()
            .await
            .map_err(|e| HandlerError::retryable("MAIL_UNAVAILABLE", format!("mail service: {e}")))?;
        let status = response.status();
        if status.is_success() {
            Ok(())
        } else if status.is_client_error() {
            Err(HandlerError::permanent("MAIL_REJECTED", format!("mail service answered {status}")))
        } else {
            Err(HandlerError::retryable("MAIL_UNAVAILABLE", format!("mail service answered {status}")))
        }
    }
}

/// Serves the stand-in on `listen` until `shutdown` resolves: `POST /send` with a JSON
/// [`Receipt`] and an `Idempotency-Key` header is logged in `billing.mail_calls` and answered
/// 202 after `latency` (a provider's round trip); without the header, 400.
///
/// Errors: the address cannot be bound.
pub async fn stand_in(
    pool: PgPool,
    listen: SocketAddr,
    latency: Duration,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let app = Router::new().route("/send", post(receive)).with_state(StandIn { pool, latency });
    let listener = tokio::net::TcpListener::bind(listen).await?;
    tracing::info!("mail stand-in listening on http://{}", listener.local_addr()?);
    axum::serve(listener, app).with_graceful_shutdown(shutdown).await?;
    Ok(())
}

#[derive(Clone)]
struct StandIn {
    pool: PgPool,
    latency: Duration,
}

async fn receive(
    State(StandIn { pool, latency }): State<StandIn>,
    headers: HeaderMap,
    Json(receipt): Json<Receipt>,
) -> StatusCode {
    let Some(key) = headers.get("idempotency-key").and_then(|v| v.to_str().ok()) else {
        return StatusCode::BAD_REQUEST;
    };
    tokio::time::sleep(latency).await;
    let logged = sqlx::query(
        "INSERT INTO billing.mail_calls (idempotency_key, invoice_no, recipient, subject) VALUES ($1, $2, $3, $4)",
    )
    .bind(key)
    .bind(&receipt.invoice_no)
    .bind(&receipt.to)
    .bind(&receipt.subject)
    .execute(&pool)
    .await;
    match logged {
        Ok(_) => StatusCode::ACCEPTED,
        Err(e) => {
            tracing::warn!(error = %e, "mail stand-in: logging the call failed");
            StatusCode::SERVICE_UNAVAILABLE
        }
    }
}
