//! Overview: live record counts (server-sent events, with pause/resume), traffic and duplicate
//! rates, the dedup-table growth chart, the consumer, every instance that consumes, the HTTP
//! endpoints, duplicate delays and the health of the dependencies.

mod endpoints;
mod instances;
mod panels;

use leptos::prelude::*;
use leptos_router::hooks::use_query_map;

use self::endpoints::EndpointsPanel;
use self::instances::InstancesPanel;
use self::panels::{ConsumersPanel, DelaysPanel, GroupsPanel, GrowthPanel, LivePanel, TrafficPanel};
use crate::components::live::use_live_feed;
use crate::error::ConsoleError;
use crate::wire::overview::{GrowthView, LiveView, OverviewView};
use crate::wire::{DependencyView, HealthView};

/// Probes PostgreSQL, Redis and RabbitMQ (concurrently, each bounded by the probe timeout).
/// Unless `fresh` (the panel's Refresh button; absent: false), a report up to 5 s old is shown as it is (the
/// panel says when it was made): a page view then pays no AMQP handshake of its own, which kept
/// the overview's `load` 18 ms behind its static copy (BENCHMARKS.md, issue 23).
#[server(prefix = "/api/fn", endpoint = "get_health", client = crate::csrf::CsrfClient)]
pub async fn get_health(#[server(default)] fresh: bool) -> Result<HealthView, ConsoleError> {
    let state = crate::ssr::service::console_state()?;
    let report = match fresh {
        true => state.probes.check().await,
        false => state.probes.recent(std::time::Duration::from_secs(5)).await,
    };
    Ok(report.into())
}

/// Counts, traffic, consumer state, HTTP endpoints and duplicate delays.
#[server(prefix = "/api/fn", endpoint = "get_overview", client = crate::csrf::CsrfClient)]
pub async fn get_overview() -> Result<OverviewView, ConsoleError> {
    crate::ssr::service::console::overview(&crate::ssr::service::console_state()?).await
}

/// The growth chart over `range` (`1h`, `24h`, `7d`, `30d`; default `24h`).
#[server(prefix = "/api/fn", endpoint = "get_growth", client = crate::csrf::CsrfClient)]
pub async fn get_growth(range: Option<String>) -> Result<GrowthView, ConsoleError> {
    crate::ssr::service::console::growth(&crate::ssr::service::console_state()?, range.as_deref()).await
}

/// The overview page. The chart's range is the `range` query parameter.
#[component]
pub fn OverviewPage() -> impl IntoView {
    let query = use_query_map();
    let range = Memo::new(move |_| query.read().get("range"));
    let overview = Resource::new(|| (), |_| get_overview());
    let growth = Resource::new(move || range.get(), get_growth);
    let live = RwSignal::new(None::<LiveView>);
    let paused = RwSignal::new(false);
    use_live_feed(live, paused);
    view! {
        <h1>"Overview"</h1>
        <Transition fallback=|| view! { <p class="muted">"Loading…"</p> }>
            {move || Suspend::new(async move {
                match overview.await {
                    Ok(data) => {
                        view! {
                            <LivePanel initial=data.live live paused />
                            <div class="columns">
                                <TrafficPanel last_hour=data.last_hour last_day=data.last_day />
                                <ConsumersPanel consumers=data.consumers />
                            </div>
                            <InstancesPanel instances=data.instances />
                            <EndpointsPanel endpoints=data.endpoints />
                            <div class="columns">
                                <GroupsPanel groups=data.groups />
                                <DelaysPanel buckets=data.duplicate_delays />
                            </div>
                        }
                            .into_any()
                    }
                    Err(e) => view! { <p class="error">{e.to_string()}</p> }.into_any(),
                }
            })}
        </Transition>
        <GrowthPanel growth range />
        <HealthPanel />
    }
}

/// The dependencies' health, with a refresh button.
#[component]
fn HealthPanel() -> impl IntoView {
    let refreshes = RwSignal::new(0u32);
    let health = Resource::new(move || refreshes.get(), |n| get_health(n > 0));
    view! {
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
