//! Every instance on the overview: each engine process that consumes from this database, with
//! what each of its consumer groups owns (Kafka partitions, or the RabbitMQ queue), its workers
//! and in-flight deliveries, and when it was last seen — so an operator sees who owns what
//! during a rebalance, whichever process serves the page.

use leptos::prelude::*;

use crate::wire::overview::{InstanceConsumerView, InstanceView};

/// The instances, newest start first; a gone one (no heartbeat for 30 s) is marked.
#[component]
pub fn InstancesPanel(instances: Vec<InstanceView>) -> impl IntoView {
    let empty = instances.is_empty();
    view! {
        <section class="panel" aria-labelledby="instances-title">
            <h2 id="instances-title">"Instances"</h2>
            {empty.then(|| view! { <p class="muted">"No process consumes from this database."</p> })}
            <table class="table" data-testid="instances">
                <thead>
                    <tr>
                        <th scope="col">"Instance"</th>
                        <th scope="col">"Group"</th>
                        <th scope="col">"Owns"</th>
                        <th scope="col" class="num">"Workers"</th>
                        <th scope="col" class="num">"In flight"</th>
                    </tr>
                </thead>
                <tbody>{instances.into_iter().map(instance_rows).collect_view()}</tbody>
            </table>
        </section>
    }
}

/// An instance's rows: one per consumer group, the instance named on the first.
fn instance_rows(i: InstanceView) -> impl IntoView {
    let span = i.consumers.len().max(1).to_string();
    let (badge, state) = if i.gone { ("badge badge-down", "gone") } else { ("badge badge-up", "live") };
    let head = view! {
        <td rowspan=span>
            <span class="mono">{i.name}</span>
            " "
            <span class=badge data-testid="instance-state">{state}</span>
            {i.this_process.then(|| view! { <span class="small muted">" (this process)"</span> })}
            <div class="small muted">"started " {i.started_at} ", last seen " {i.last_seen_at}</div>
        </td>
    };
    let mut consumers = i.consumers.into_iter();
    let first = consumers.next();
    let id = i.instance_id;
    view! {
        <tr data-testid="instance" data-instance=id>
            {head}
            {match first {
                Some(c) => consumer_cells(c).into_any(),
                None => view! { <td colspan="4" class="muted">"no consumer groups"</td> }.into_any(),
            }}
        </tr>
        {consumers.map(|c| view! { <tr>{consumer_cells(c)}</tr> }).collect_view()}
    }
}

fn consumer_cells(c: InstanceConsumerView) -> impl IntoView {
    let broker = if c.broker == "kafka" { "Kafka" } else { "RabbitMQ" };
    let owned = if c.owned.is_empty() { "nothing".to_owned() } else { c.owned.join(", ") };
    view! {
        <td>
            <span class="mono">{c.group.clone()}</span>
            <div class="small muted">{broker} {(!c.connected).then_some(" (disconnected)")}</div>
        </td>
        <td class="mono small" data-testid="instance-owns" data-group=c.group>{owned}</td>
        <td class="num">{c.workers}</td>
        <td class="num">{c.in_flight}</td>
    }
}
