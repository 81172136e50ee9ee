//! The overview's panels.

use leptos::prelude::*;
use leptos_router::components::A;

use crate::base::href;
use crate::components::chart::{ChartKind, ChartPoint, TimeChart};
use crate::error::ConsoleError;
use crate::format::{bytes, count, millis, opt_time, percent, short_time};
use crate::wire::overview::{
    ConsumerView, DelayBucketView, GROWTH_RANGES, GroupView, GrowthView, LiveView, TrafficView,
};

/// One number with its label; `data-value` carries the raw number for tests and scrapers. With
/// `list`, the label links to the records it counts (a `/records?…` path).
#[component]
fn Stat(
    label: &'static str,
    testid: &'static str,
    value: Signal<i64>,
    #[prop(optional)] list: Option<&'static str>,
) -> impl IntoView {
    let label = match list {
        Some(path) => view! {
            <A href=href(path) attr:class="stat-label" attr:data-testid=format!("{testid}-list")>
                {label}
            </A>
        }
        .into_any(),
        None => view! { <span class="stat-label">{label}</span> }.into_any(),
    };
    view! {
        <div class="stat" data-testid=testid data-value=move || value.get()>
            <span class="stat-value">{move || count(value.get())}</span>
            {label}
        </div>
    }
}

/// Counts by status, stuck and last-minute traffic, replaced by each pushed snapshot while not
/// paused.
#[component]
pub fn LivePanel(initial: LiveView, live: RwSignal<Option<LiveView>>, paused: RwSignal<bool>) -> impl IntoView {
    let current = Memo::new(move |_| live.get().unwrap_or_else(|| initial.clone()));
    let stat = move |f: fn(&LiveView) -> i64| Signal::derive(move || current.with(f));
    view! {
        <section class="panel" aria-labelledby="live-title">
            <div class="panel-head">
                <h2 id="live-title">"Dedup records"</h2>
                <button
                    type="button"
                    data-testid="live-toggle"
                    aria-pressed=move || paused.get().to_string()
                    on:click=move |_| paused.update(|p| *p = !*p)
                >
                    {move || if paused.get() { "Resume live updates" } else { "Pause live updates" }}
                </button>
                <span
                    data-testid="live-state"
                    class=move || if paused.get() { "badge badge-failed" } else { "badge badge-up" }
                >
                    {move || if paused.get() { "paused" } else { "live" }}
                </span>
                <span class="muted">
                    "Last update "
                    <time data-testid="live-updated-at">{move || short_time(&current.get().at)}</time>
                    " UTC"
                </span>
            </div>
            <div class="stats">
                <Stat label="total" testid="live-total" value=stat(|l| l.totals.total) />
                <Stat label="processing" testid="live-processing" value=stat(|l| l.totals.processing) />
                <Stat label="succeeded" testid="live-succeeded" value=stat(|l| l.totals.succeeded) />
                <Stat label="failed" testid="live-failed" value=stat(|l| l.totals.failed) />
                <Stat label="dead" testid="live-dead" value=stat(|l| l.totals.dead) />
                <Stat label="stuck" testid="live-stuck" value=stat(|l| l.stuck) />
                <Stat
                    label="possible double effects"
                    testid="live-double-effects"
                    value=stat(|l| l.double_effects)
                    list="/records?flag=double_effect"
                />
                <Stat
                    label="late duplicates, 30 days"
                    testid="live-late-duplicates"
                    value=stat(|l| l.late_duplicates)
                    list="/records?flag=late_duplicate"
                />
                <Stat
                    label="id conflicts"
                    testid="live-conflicts"
                    value=stat(|l| l.conflicts)
                    list="/records?flag=conflict"
                />
                <Stat
                    label="deliveries, last minute"
                    testid="live-deliveries"
                    value=stat(|l| l.last_minute.deliveries)
                />
            </div>
        </section>
    }
}

/// A traffic table row: label and how to read it from a window.
type TrafficRow = (&'static str, fn(&TrafficView) -> String);

/// Deliveries, duplicates and the Redis fast path over the last hour and day.
#[component]
pub fn TrafficPanel(last_hour: TrafficView, last_day: TrafficView) -> impl IntoView {
    let rows: [TrafficRow; 8] = [
        ("Deliveries", |t| count(t.deliveries)),
        ("New records", |t| count(t.created)),
        ("Duplicates", |t| count(t.duplicates)),
        ("Duplicate rate", |t| percent(t.duplicate_rate)),
        ("Redis hit ratio", |t| percent(t.redis_hit_ratio)),
        ("Redis fallbacks", |t| count(t.redis_fallbacks)),
        ("Retries", |t| count(t.retries)),
        ("New dead letters", |t| count(t.dead)),
    ];
    view! {
        <section class="panel" aria-labelledby="traffic-title">
            <h2 id="traffic-title">"Traffic"</h2>
            <table data-testid="traffic-table">
                <thead>
                    <tr>
                        <th></th>
                        <th class="num">"Last hour"</th>
                        <th class="num">"Last 24 h"</th>
                    </tr>
                </thead>
                <tbody>
                    {rows
                        .into_iter()
                        .map(|(label, f)| {
                            view! {
                                <tr>
                                    <td>{label}</td>
                                    <td class="num">{f(&last_hour)}</td>
                                    <td class="num">{f(&last_day)}</td>
                                </tr>
                            }
                        })
                        .collect_view()}
                </tbody>
            </table>
            <p class="muted" data-testid="traffic-flush-note">
                "Counted in memory and written every stats_flush_ms (1 s by default): a process killed without a clean stop loses up to that much of its counts, never a record."
            </p>
        </section>
    }
}

/// The engine's consumer groups: message types handled, broker and connection, workers,
/// in-flight deliveries, queue depth (RabbitMQ) or lag (Kafka), last error.
#[component]
pub fn ConsumersPanel(consumers: Vec<ConsumerView>) -> impl IntoView {
    let empty = consumers.is_empty();
    view! {
        <section class="panel" aria-labelledby="consumers-title">
            <h2 id="consumers-title">"Consumers"</h2>
            {empty.then(|| view! { <p class="muted">"No consumer group is declared."</p> })}
            <table class="table" data-testid="consumers">
                <thead>
                    <tr>
                        <th scope="col">"Group"</th>
                        <th scope="col">"Broker"</th>
                        <th scope="col" class="num">"Workers"</th>
                        <th scope="col" class="num">"In flight"</th>
                        <th scope="col" class="num">"Waiting"</th>
                    </tr>
                </thead>
                <tbody>
                    {consumers.into_iter().map(consumer_row).collect_view()}
                </tbody>
            </table>
        </section>
    }
}

/// One group's row: its name and types, then its broker state and numbers; the last error,
/// when there is one, under the name, and the run of failed batches in progress or the last
/// recovery from one.
fn consumer_row(c: ConsumerView) -> impl IntoView {
    let state = match (c.enabled, c.connected, &c.topology_refused, &c.failing) {
        (false, ..) => "disabled",
        (true, _, Some(_), _) => "topology refused",
        (true, false, None, _) => "disconnected",
        (true, true, None, Some(_)) => "retrying",
        (true, true, None, None) => "connected",
    };
    let badge = if state == "connected" { "badge badge-up" } else { "badge badge-down" };
    let (broker, waiting) = if c.broker == "kafka" { ("Kafka", "lag") } else { ("RabbitMQ", "queued") };
    let depth = c.queue_depth.map_or_else(|| "unknown".to_owned(), |d| format!("{} {waiting}", count(d as i64)));
    let types = if c.types.is_empty() { "no handlers".to_owned() } else { c.types.join(", ") };
    let (group, group_attr) = (c.group.clone(), c.group);
    view! {
        <tr data-testid="consumer" data-group=group_attr>
            <td>
                <span class="mono">{group}</span>
                <div class="small muted">{types}</div>
                {match c.topology_refused {
                    Some(why) => view! { <div class="small error" data-testid="topology-refused">{why}</div> }.into_any(),
                    None => c.last_error.map(|e| view! { <div class="small error">"Last error: " {e}</div> }).into_any(),
                }}
                {match c.failing {
                    Some(run) => view! {
                        <div class="small error" data-testid="batches-failing">
                            {run} " (database trouble; retrying)"
                        </div>
                    }
                        .into_any(),
                    None => c.last_recovery.map(|r| view! {
                        <div class="small muted" data-testid="batches-recovered">
                            "Batches: " {r} "; " {c.failed_batches} " given back since start"
                        </div>
                    })
                        .into_any(),
                }}
            </td>
            <td>
                {broker} " "
                <span class=badge data-testid="consumer-state">
                    {state}
                </span>
            </td>
            <td class="num">{c.running_workers}</td>
            <td class="num">{c.in_flight}</td>
            <td class="num">{depth}</td>
        </tr>
    }
}

/// Counts by consumer group.
#[component]
pub fn GroupsPanel(groups: Vec<GroupView>) -> impl IntoView {
    view! {
        <section class="panel" aria-labelledby="groups-title">
            <h2 id="groups-title">"Consumer groups"</h2>
            <table data-testid="groups-table">
                <thead>
                    <tr>
                        <th>"Group"</th>
                        <th class="num">"Processing"</th>
                        <th class="num">"Succeeded"</th>
                        <th class="num">"Failed"</th>
                        <th class="num">"Dead"</th>
                    </tr>
                </thead>
                <tbody>
                    {groups
                        .into_iter()
                        .map(|g| {
                            let href = href(&format!("/records?group={}", crate::wire::records::encode_component(&g.name)));
                            view! {
                                <tr>
                                    <td>
                                        <A href=href>{g.name}</A>
                                    </td>
                                    <td class="num">{count(g.counts.processing)}</td>
                                    <td class="num">{count(g.counts.succeeded)}</td>
                                    <td class="num">{count(g.counts.failed)}</td>
                                    <td class="num">{count(g.counts.dead)}</td>
                                </tr>
                            }
                        })
                        .collect_view()}
                </tbody>
            </table>
        </section>
    }
}

/// How late duplicates arrive after the first delivery (last 30 days): what cleanup retention
/// must outlast.
#[component]
pub fn DelaysPanel(buckets: Vec<DelayBucketView>) -> impl IntoView {
    let empty = buckets.is_empty();
    view! {
        <section class="panel" aria-labelledby="delays-title">
            <h2 id="delays-title">"Duplicate delays (30 days)"</h2>
            <Show when=move || !empty fallback=|| view! { <p class="empty">"No duplicates yet."</p> }>
                <table data-testid="delays-table">
                    <thead>
                        <tr>
                            <th>"Arrived within"</th>
                            <th class="num">"Duplicates"</th>
                            <th class="num">"Longest"</th>
                        </tr>
                    </thead>
                    <tbody>
                        {buckets
                            .clone()
                            .into_iter()
                            .map(|b| {
                                view! {
                                    <tr>
                                        <td>{b.le_ms.map_or("longer".to_owned(), millis)}</td>
                                        <td class="num">{count(b.count)}</td>
                                        <td class="num">{millis(b.max_delay_ms)}</td>
                                    </tr>
                                }
                            })
                            .collect_view()}
                    </tbody>
                </table>
            </Show>
        </section>
    }
}

/// The growth chart: records created per bucket, total records, and size on disk over time.
#[component]
pub fn GrowthPanel(growth: Resource<Result<GrowthView, ConsoleError>>, range: Memo<Option<String>>) -> impl IntoView {
    let selected = move || range.get().unwrap_or_else(|| "24h".to_owned());
    view! {
        <section class="panel" aria-labelledby="growth-title">
            <div class="panel-head">
                <h2 id="growth-title">"Dedup-table growth"</h2>
                <nav class="ranges" aria-label="Chart range">
                    {GROWTH_RANGES
                        .into_iter()
                        .map(|r| {
                            view! {
                                <A href=href(&format!("/?range={r}"))>
                                    <span class=move || {
                                        if selected() == r { "range current" } else { "range" }
                                    }>{r}</span>
                                </A>
                            }
                        })
                        .collect_view()}
                </nav>
            </div>
            <Transition fallback=|| view! { <p class="muted">"Loading…"</p> }>
                {move || Suspend::new(async move {
                    match growth.await {
                        Ok(g) => view! { <GrowthCharts g /> }.into_any(),
                        Err(e) => view! { <p class="error">{e.to_string()}</p> }.into_any(),
                    }
                })}
            </Transition>
        </section>
    }
}

#[component]
fn GrowthCharts(g: GrowthView) -> impl IntoView {
    let series = |f: fn(&crate::wire::overview::GrowthPointView) -> Option<f64>| -> Vec<ChartPoint> {
        g.points.iter().map(|p| (short_time(&p.at), f(p))).collect()
    };
    let created = series(|p| Some(p.created as f64));
    let total = series(|p| p.total_records.map(|n| n as f64));
    let size = series(|p| Some((p.table_bytes? + p.index_bytes?) as f64));
    let latest = g.points.iter().rev().find(|p| p.total_records.is_some()).cloned();
    view! {
        <div class="charts" data-testid="growth" data-range=g.range.clone() data-points=g.points.len()>
            <div>
                <h3>{format!("Records created per {}", millis(g.bucket_secs * 1000))}</h3>
                <TimeChart title="Records created per interval" points=created kind=ChartKind::Bars format=|v| count(v as i64) />
            </div>
            <div>
                <h3>"Total records"</h3>
                <TimeChart title="Total records over time" points=total kind=ChartKind::Line format=|v| count(v as i64) />
            </div>
            <div>
                <h3>"Table + index size on disk"</h3>
                <TimeChart title="Table and index size over time" points=size kind=ChartKind::Line format=|v| bytes(v as i64) />
                <p class="muted small">
                    {latest
                        .map(|p| {
                            format!(
                                "At {}: table {}, indexes {}",
                                opt_time(Some(&p.at)),
                                bytes(p.table_bytes.unwrap_or(0)),
                                bytes(p.index_bytes.unwrap_or(0)),
                            )
                        })
                        .unwrap_or_else(|| "No size sample yet (taken every minute).".to_owned())}
                </p>
            </div>
        </div>
    }
}
