//! The conflicting copies kept on a record (a reused id: another message type; or another
//! payload under the same id), each with what came, how often, and — for operators — buttons
//! that settle it once: requeue it under a new message id of its own, or dismiss it with a
//! reason.

use leptos::prelude::*;

use crate::components::session::IfRole;
use crate::error::ConsoleError;
use crate::format::short_time;
use crate::wire::account::RoleView;
use crate::wire::records::{ConflictRequeuedView, ConflictView};

/// Requeues conflict `id` under a new message id. Role: operator.
#[server(prefix = "/api/fn", endpoint = "requeue_conflict", client = crate::csrf::CsrfClient)]
pub async fn requeue_conflict(id: i64) -> Result<ConflictRequeuedView, ConsoleError> {
    let state = crate::ssr::service::console_state()?;
    crate::ssr::service::actions::requeue_conflict(&state, &crate::ssr::service::auth::request_auth().actor(), id).await
}

/// Dismisses conflict `id` with `reason`. Role: operator.
#[server(prefix = "/api/fn", endpoint = "dismiss_conflict", client = crate::csrf::CsrfClient)]
pub async fn dismiss_conflict(id: i64, reason: String) -> Result<(), ConsoleError> {
    let state = crate::ssr::service::console_state()?;
    let actor = crate::ssr::service::auth::request_auth().actor();
    crate::ssr::service::actions::dismiss_conflict(&state, &actor, id, &reason).await
}

/// The record's conflicting copies; `on_done` after a requeue or a dismissal.
#[component]
pub fn Conflicts(conflicts: Vec<ConflictView>, #[prop(into)] on_done: Callback<()>) -> impl IntoView {
    if conflicts.is_empty() {
        return ().into_any();
    }
    let requeue = ServerAction::<RequeueConflict>::new();
    let dismiss = ServerAction::<DismissConflict>::new();
    Effect::new(move |_| {
        if matches!(requeue.value().get(), Some(Ok(_))) || matches!(dismiss.value().get(), Some(Ok(()))) {
            on_done.run(());
        }
    });
    let rows = conflicts
        .into_iter()
        .map(|c| {
            let id = c.id;
            let payload = c.kind != "type";
            let what = if payload {
                "the same type, another payload: judged a duplicate (requeue it only if its event must run)".to_owned()
            } else {
                format!("another message type, {}: a reused id, dead-lettered", c.message_type)
            };
            let reason = RwSignal::new(String::new());
            let source =
                [c.source_exchange, c.source_routing_key].into_iter().flatten().collect::<Vec<_>>().join(" / ");
            view! {
                <tr data-conflict-id=id data-kind=c.kind.clone()>
                    <td>
                        {what}
                        <div class="small muted" data-testid="conflict-id-source">
                            {format!("id from {}", c.id_source)}
                        </div>
                    </td>
                    <td class="num">{c.copies}</td>
                    <td>{short_time(&c.first_seen_at)} " – " {short_time(&c.last_seen_at)}</td>
                    <td class="mono">{source}</td>
                    <td>
                        <pre class="payload small">{c.payload_excerpt}</pre>
                        <span class="muted small">{format!("{} bytes", c.payload_bytes)}</span>
                    </td>
                    <td>
                        {match (c.settled_at, c.requeued_as) {
                            (Some(at), Some(new_id)) => view! {
                                <span class="small" data-testid="conflict-settled">
                                    {format!("requeued as {new_id} by {} ({})", c.settled_by.unwrap_or_default(), short_time(&at))}
                                </span>
                            }
                                .into_any(),
                            (Some(at), None) => view! {
                                <span class="small" data-testid="conflict-settled">
                                    {format!("dismissed by {} ({})", c.settled_by.unwrap_or_default(), short_time(&at))}
                                </span>
                            }
                                .into_any(),
                            (None, _) => view! {
                                <IfRole role=RoleView::Operator>
                                    <button
                                        class=if payload { "" } else { "primary" }
                                        data-testid="conflict-requeue"
                                        disabled=move || requeue.pending().get()
                                        on:click=move |_| { requeue.dispatch(RequeueConflict { id }); }
                                    >
                                        "Requeue under a new id"
                                    </button>
                                    <input
                                        type="text"
                                        placeholder="why dismiss it"
                                        data-testid="conflict-dismiss-reason"
                                        prop:value=move || reason.get()
                                        on:input=move |ev| reason.set(event_target_value(&ev))
                                    />
                                    <button
                                        data-testid="conflict-dismiss"
                                        disabled=move || dismiss.pending().get() || reason.get().trim().is_empty()
                                        on:click=move |_| { dismiss.dispatch(DismissConflict { id, reason: reason.get_untracked() }); }
                                    >
                                        "Dismiss"
                                    </button>
                                </IfRole>
                            }
                                .into_any(),
                        }}
                    </td>
                </tr>
            }
        })
        .collect_view();
    view! {
        <section class="panel" aria-labelledby="conflicts-title" data-testid="conflicts">
            <h2 id="conflicts-title">"Conflicting copies"</h2>
            <p class="muted small">
                "Deliveries that carried this record's message id but not its message type or payload. Each is "
                "kept whole until settled once: a requeue publishes it again under the id "
                "<message id>#conflict-<n>, so it becomes a record of its own; a dismissal (with a reason) "
                "closes it. Many of them mean the id source is wrong (README, \"Message ids\")."
            </p>
            <table class="records">
                <thead>
                    <tr>
                        <th>"What"</th>
                        <th class="num">"Copies"</th>
                        <th>"Seen"</th>
                        <th>"From"</th>
                        <th>"Payload"</th>
                        <th>"Settle"</th>
                    </tr>
                </thead>
                <tbody>{rows}</tbody>
            </table>
            {move || {
                let failed = requeue.value().get().and_then(|r| r.err()).or_else(|| dismiss.value().get().and_then(|r| r.err()));
                failed.map(|e| view! { <p class="error" role="alert">{e.to_string()}</p> })
            }}
        </section>
    }
    .into_any()
}
