//! Retries: `failed` records waiting for their retry copy — the distribution of attempts, the
//! most retried message types, the next retry due, and the records with the most attempts.

use leptos::prelude::*;
use leptos_router::components::A;

use crate::base::href;
use crate::components::bulk_requeue::BulkRequeue;
use crate::components::records_table::RecordsTable;
use crate::error::ConsoleError;
use crate::format::{count, opt_time};
use crate::wire::failures::RetriesView;
use crate::wire::records::RecordsQuery;

/// The retries page's data.
#[server(prefix = "/api/fn", endpoint = "get_retries", client = crate::csrf::CsrfClient)]
pub async fn get_retries() -> Result<RetriesView, ConsoleError> {
    crate::ssr::service::console::retries(&crate::ssr::service::console_state()?).await
}

/// The retries page.
#[component]
pub fn RetriesPage() -> impl IntoView {
    let retries = Resource::new(|| (), |_| get_retries());
    view! {
        <h1>"Retries"</h1>
        <Transition fallback=|| view! { <p class="muted">"Loading…"</p> }>
            {move || Suspend::new(async move {
                match retries.await {
                    Ok(r) => view! { <Retries r /> }.into_any(),
                    Err(e) => view! { <p class="error">{e.to_string()}</p> }.into_any(),
                }
            })}
        </Transition>
    }
}

#[component]
fn Retries(r: RetriesView) -> impl IntoView {
    let failed: i64 = r.distribution.iter().map(|b| b.records).sum();
    let widest = r.distribution.iter().map(|b| b.records).max().unwrap_or(1).max(1);
    view! {
        <p data-testid="retries-summary">
            {format!("{} failed records; next retry due {}", count(failed), opt_time(r.next_retry_at.as_deref()))}
            " · " <A href=href("/records?status=failed&sort=attempts")>"all failed records by attempts"</A> " · "
            <BulkRequeue
                filter=RecordsQuery { status: Some("failed".to_owned()), ..RecordsQuery::default() }
                label="all failed records now"
            />
        </p>
        <div class="columns">
            <section class="panel" aria-labelledby="dist-title">
                <h2 id="dist-title">"Attempts made"</h2>
                <table data-testid="attempts-distribution">
                    <tbody>
                        {r
                            .distribution
                            .into_iter()
                            .map(|b| {
                                let width = format!("width: {:.1}%", b.records as f64 * 100.0 / widest as f64);
                                view! {
                                    <tr data-attempts=b.attempts>
                                        <td class="num">
                                            {format!("{} attempt{}", b.attempts, if b.attempts == 1 { "" } else { "s" })}
                                        </td>
                                        <td class="bar-cell">
                                            <span class="hbar" style=width></span>
                                        </td>
                                        <td class="num">{count(b.records)}</td>
                                    </tr>
                                }
                            })
                            .collect_view()}
                    </tbody>
                </table>
            </section>
            <section class="panel" aria-labelledby="types-title">
                <h2 id="types-title">"Most retried message types"</h2>
                <table data-testid="retried-types">
                    <thead>
                        <tr>
                            <th>"Type"</th>
                            <th class="num">"Failed records"</th>
                            <th class="num">"Attempts"</th>
                            <th class="num">"Most on one"</th>
                        </tr>
                    </thead>
                    <tbody>
                        {r
                            .top_types
                            .into_iter()
                            .map(|t| {
                                view! {
                                    <tr>
                                        <td>{t.message_type}</td>
                                        <td class="num">{count(t.records)}</td>
                                        <td class="num">{count(t.attempts)}</td>
                                        <td class="num">{t.max_attempts}</td>
                                    </tr>
                                }
                            })
                            .collect_view()}
                    </tbody>
                </table>
            </section>
        </div>
        <section class="panel" aria-labelledby="most-title">
            <h2 id="most-title">"Most retried records"</h2>
            <RecordsTable rows=r.most_retried />
        </section>
    }
}
