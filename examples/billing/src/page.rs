//! The service's own page at `/`: invoices with their status, ledger entries and receipt calls,
//! so a double effect shows at a glance (every value HTML-escaped).

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{Html, IntoResponse, Response};
use html_escape::encode_text;
use sqlx::PgPool;

/// Invoices shown, newest first.
const SHOWN: i64 = 200;

#[derive(sqlx::FromRow)]
struct Totals {
    invoices: i64,
    paid: i64,
    ledger_entries: i64,
    mail_calls: i64,
    double_entries: i64,
    double_receipts: i64,
}

#[derive(sqlx::FromRow)]
struct Row {
    invoice_no: String,
    customer: String,
    amount_cents: i64,
    status: String,
    entries: i64,
    receipts: i64,
}

/// `GET /`.
pub async fn index(State(pool): State<PgPool>) -> Response {
    match render(&pool).await {
        Ok(html) => Html(html).into_response(),
        Err(e) => {
            tracing::warn!(error = %e, "billing page");
            (StatusCode::SERVICE_UNAVAILABLE, "the billing database is unavailable").into_response()
        }
    }
}

async fn render(pool: &PgPool) -> Result<String, sqlx::Error> {
    let t: Totals = sqlx::query_as(
        "SELECT (SELECT count(*) FROM billing.invoices) AS invoices,
                (SELECT count(*) FROM billing.invoices WHERE status = 'PAID') AS paid,
                (SELECT count(*) FROM billing.ledger_entries) AS ledger_entries,
                (SELECT count(*) FROM billing.mail_calls) AS mail_calls,
                (SELECT count(*) FROM (SELECT 1 FROM billing.ledger_entries GROUP BY invoice_no
                                       HAVING count(*) > 1) d) AS double_entries,
                (SELECT count(*) FROM (SELECT 1 FROM billing.mail_calls GROUP BY invoice_no
                                       HAVING count(*) > 1) d) AS double_receipts",
    )
    .fetch_one(pool)
    .await?;
    let rows: Vec<Row> = sqlx::query_as(
        "SELECT i.invoice_no, i.customer, i.amount_cents, i.status,
                (SELECT count(*) FROM billing.ledger_entries l WHERE l.invoice_no = i.invoice_no) AS entries,
                (SELECT count(*) FROM billing.mail_calls m WHERE m.invoice_no = i.invoice_no) AS receipts
         FROM billing.invoices i ORDER BY i.issued_at DESC, i.invoice_no DESC LIMIT $1",
    )
    .bind(SHOWN)
    .fetch_all(pool)
    .await?;
    let body: String = rows
        .iter()
        .map(|r| {
            format!(
                "<tr><td>{}</td><td>{}</td><td class=num>{}.{:02}</td><td>{}</td><td class=num>{}</td><td class=num>{}</td></tr>",
                encode_text(&r.invoice_no),
                encode_text(&r.customer),
                r.amount_cents / 100,
                r.amount_cents % 100,
                encode_text(&r.status),
                r.entries,
                r.receipts,
            )
        })
        .collect();
    Ok(format!(
        "<!doctype html><html lang=en><head><meta charset=utf-8><title>Billing</title><link rel=icon href=data:,>
<style>body{{font:15px system-ui,sans-serif;margin:2rem}}table{{border-collapse:collapse}}
td,th{{padding:.25rem .75rem;border-bottom:1px solid #ddd;text-align:left}}.num{{text-align:right}}</style></head>
<body><h1>Billing</h1>
<p><a href=/ops/dedup>Dedup console</a> (staff sign-in) · <a href=/signout>Sign out</a></p>
<p data-testid=totals>{} invoices, {} paid; {} ledger entries, {} receipt calls; {} invoices booked twice, {} receipted twice.</p>
<table><thead><tr><th>Invoice</th><th>Customer</th><th class=num>Amount</th><th>Status</th><th class=num>Ledger entries</th><th class=num>Receipts</th></tr></thead>
<tbody>{body}</tbody></table></body></html>",
        t.invoices, t.paid, t.ledger_entries, t.mail_calls, t.double_entries, t.double_receipts,
    ))
}
