//! Overview: the health of the dependencies (more panels arrive with the console issue).

use leptos::prelude::*;

use crate::error::ConsoleError;
use crate::wire::{DependencyView, HealthView};

/// Probes PostgreSQL, Redis and RabbitMQ (concurrently, each bounded by the probe timeout).
#[server(prefix = "/api/fn", endpoint = "get_health")]
pub async fn get_health() -> Result<HealthView, ConsoleError> {
    let state = crate::ssr::console_state()?;
    Ok(state.probes.check().await.into())
}

/// The overview page.
#[component]
pub fn OverviewPage() -> impl IntoView {
    let refreshes = RwSignal::new(0u32);
    let health = Resource::new(move || refreshes.get(), |_| get_health());
    view! {
        <h1>"Overview"</h1>
        <section class="panel" aria-labelledby="health-title">
            <div class="panel-head">
                <h2 id="health-title">"Dependencies"</h2>
                <button
                    type="button"
                    data-testid="refresh-health"
                    on:click=move |_| refreshes.update(|n| *n += 1)
                >
                    "Refresh"
                </button>
                <span class="muted" data-testid="refresh-count">
                    {move || match refreshes.get() {
                        0 => String::new(),
                        n => format!("refreshed {n}×"),
                    }}
                </span>
            </div>
            <Transition fallback=|| view! { <p class="muted">"Probing…"</p> }>
                {move || Suspend::new(async move {
                    match health.await {
                        Ok(report) => view! { <HealthTable report /> }.into_any(),
                        Err(e) => view! { <p class="error">{e.to_string()}</p> }.into_any(),
                    }
                })}
            </Transition>
        </section>
    }
}

#[component]
fn HealthTable(report: HealthView) -> impl IntoView {
    view! {
        <table class="health" data-testid="health-table">
            <thead>
                <tr>
                    <th>"Dependency"</th>
                    <th>"State"</th>
                    <th>"Latency"</th>
                    <th>"URL"</th>
                </tr>
            </thead>
            <tbody>
                {report.dependencies.into_iter().map(|d| view! { <HealthRow d /> }).collect_view()}
            </tbody>
        </table>
        <p class="muted">"Checked at " <time data-testid="checked-at">{report.checked_at}</time></p>
    }
}

#[component]
fn HealthRow(d: DependencyView) -> impl IntoView {
    let state = if d.up { "up" } else { "down" };
    view! {
        <tr data-dependency=d.key.clone() data-state=state>
            <td>{d.name}</td>
            <td>
                <span class=format!("badge badge-{state}")>{state}</span>
                {d.error.map(|e| view! { <div class="error small">{e}</div> })}
            </td>
            <td class="num">{format!("{:.1} ms", d.latency_ms)}</td>
            <td class="mono">{d.url}</td>
        </tr>
    }
}
