//! The overview's HTTP endpoint cards: one per HTTP handler (consumer group and message type),
//! with its URL, whether it is paused and why, its calls of the last 15 minutes by answer class,
//! success rate and p50/p95 latency. Header values are never shown (the engine does not hand
//! them out).

use leptos::prelude::*;

use crate::base::href;
use crate::format::{count, duration, pause_state_label, percent, short_time};
use crate::wire::overview::EndpointView;

/// What an answer class means, as the card says it.
fn class_label(class: &str) -> &'static str {
    match class {
        "succeeded" => "succeeded (2xx)",
        "in_progress" => "in progress (409)",
        "conflict" => "conflict (422)",
        "refused" => "refused (4xx)",
        "unavailable" => "unavailable (5xx, 408, 425, 429)",
        "transport" => "no answer (timeout, connection)",
        _ => "other (3xx, 2xx asking for a retry, …)",
    }
}

/// The endpoint cards; nothing when the engine has no HTTP handler.
#[component]
pub fn EndpointsPanel(endpoints: Vec<EndpointView>) -> impl IntoView {
    (!endpoints.is_empty()).then(|| {
        view! {
            <section class="panel" aria-labelledby="endpoints-title">
                <div class="panel-head">
                    <h2 id="endpoints-title">"HTTP endpoints"</h2>
                </div>
                <div class="columns" data-testid="endpoints">
                    {endpoints.into_iter().map(|e| view! { <EndpointCard e /> }).collect_view()}
                </div>
            </section>
        }
    })
}

#[component]
fn EndpointCard(e: EndpointView) -> impl IntoView {
    let window = duration(e.window_secs);
    let over = if e.sampled {
        format!(
            "its newest {} calls (since {})",
            count(e.sample_calls),
            e.oldest_at.as_deref().map(short_time).unwrap_or_default()
        )
    } else {
        format!("the last {window}")
    };
    let ms = |v: Option<i32>| v.map_or_else(|| "—".to_owned(), |v| format!("{} ms", count(i64::from(v))));
    let (state, badge) = if e.consuming { ("consuming", "badge badge-up") } else { ("not consuming here", "badge") };
    let paused = e.pause_state != "running";
    view! {
        <article class="endpoint" data-testid="endpoint" data-group=e.group.clone() data-type=e.message_type.clone()>
            <div class="panel-head">
                <h3 class="mono">{e.message_type.clone()}</h3>
                <span class="muted small mono">{e.group.clone()}</span>
                <span class=badge data-testid="endpoint-state">
                    {state}
                </span>
                {paused.then(|| {
                    view! {
                        <a class="badge badge-down" href=href("/handlers") data-testid="endpoint-paused">
                            {pause_state_label(&e.pause_state)}
                        </a>
                    }
                })}
            </div>
            <p class="mono small" data-testid="endpoint-url">
                {e.method.clone()} " " {e.url.clone()}
            </p>
            {paused.then(|| {
                let since = e.paused_since.as_deref().map(short_time).unwrap_or_default();
                view! {
                    <p class="small error" data-testid="endpoint-pause-reason">
                        "Paused since " {since} ": " {e.pause_reason.clone().unwrap_or_default()}
                        " — its deliveries wait in the broker; resume it on the Handlers page."
                    </p>
                }
            })}
            <div class="stats">
                <div class="stat" data-testid="endpoint-calls" data-value=e.calls>
                    <span class="stat-value">{count(e.calls)}</span>
                    <span class="stat-label">"calls"</span>
                </div>
                <div
                    class="stat"
                    data-testid="endpoint-success-rate"
                    data-value=e.success_rate.map(|r| r.to_string()).unwrap_or_default()
                >
                    <span class="stat-value">{e.success_rate.map_or_else(|| "—".to_owned(), percent)}</span>
                    <span class="stat-label">"succeeded"</span>
                </div>
                <div class="stat" data-testid="endpoint-p50">
                    <span class="stat-value">{ms(e.p50_ms)}</span>
                    <span class="stat-label">"p50 latency"</span>
                </div>
                <div class="stat" data-testid="endpoint-p95">
                    <span class="stat-value">{ms(e.p95_ms)}</span>
                    <span class="stat-label">"p95 latency"</span>
                </div>
            </div>
            {if e.calls == 0 {
                view! { <p class="empty">"No calls in the last " {window.clone()} "."</p> }.into_any()
            } else {
                view! {
                    <table data-testid="endpoint-answers">
                        <thead>
                            <tr>
                                <th>"Answer class"</th>
                                <th class="num">"Calls"</th>
                            </tr>
                        </thead>
                        <tbody>
                            {e
                                .answers
                                .into_iter()
                                .filter(|a| a.calls > 0)
                                .map(|a| {
                                    view! {
                                        <tr data-class=a.class.clone()>
                                            <td>{class_label(&a.class)}</td>
                                            <td class="num">{count(a.calls)}</td>
                                        </tr>
                                    }
                                })
                                .collect_view()}
                        </tbody>
                    </table>
                    <p class="muted small">"Over " {over} "."</p>
                }
                    .into_any()
            }}
        </article>
    }
}
