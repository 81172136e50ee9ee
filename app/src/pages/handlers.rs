//! Handlers (`/handlers`): every handler (consumer group, message type) and whether it takes
//! deliveries — running, paused by its circuit breaker (with the failures and the next probe),
//! by a 410 answer, or by an operator (who, why) — refreshed every 5 seconds; operators pause
//! and resume them behind a confirmation that asks for the reason. While paused, a handler's
//! deliveries wait in the broker: nothing is claimed, spent, dead-lettered or discarded.

use std::time::Duration;

use leptos::prelude::*;

use crate::components::confirm::ReasonAndButtons;
use crate::components::session::IfRole;
use crate::components::ticker::use_ticker;
use crate::error::ConsoleError;
use crate::format::{opt_time, pause_state_label, short_time};
use crate::wire::account::RoleView;
use crate::wire::handlers::{HandlerControlKind, HandlerControlRequest, HandlerView};

/// Every handler's pause state. Role: viewer.
#[server(prefix = "/api/fn", endpoint = "list_handlers", client = crate::csrf::CsrfClient)]
pub async fn list_handlers() -> Result<Vec<HandlerView>, ConsoleError> {
    crate::ssr::service::handlers::handler_list(&crate::ssr::service::console_state()?).await
}

/// Pauses or resumes a handler; the same engine call as `POST /api/v1/handlers/{group}/{type}/…`.
/// Role: operator.
#[server(prefix = "/api/fn", endpoint = "control_handler", input = leptos::server_fn::codec::Json, client = crate::csrf::CsrfClient)]
pub async fn control_handler(
    group: String,
    message_type: String,
    control: HandlerControlKind,
    request: HandlerControlRequest,
) -> Result<HandlerView, ConsoleError> {
    let state = crate::ssr::service::console_state()?;
    let actor = crate::ssr::service::auth::request_auth().actor();
    crate::ssr::service::handlers::handler_control(&state, &actor, &group, &message_type, control, &request).await
}

/// The handlers page.
#[component]
pub fn HandlersPage() -> impl IntoView {
    let tick = use_ticker(Duration::from_secs(5), Signal::from(true));
    let done = RwSignal::new(0u32);
    let handlers = Resource::new(move || (tick.get(), done.get()), |_| list_handlers());
    view! {
        <h1>"Handlers"</h1>
        <p class="muted">
            "Each handler of each consumer group. A paused handler takes none of its deliveries: they wait in the "
            "broker (nothing is recorded, retried, dead-lettered or discarded) while the group's other types keep "
            "flowing. The circuit breaker resumes its own pauses after a successful probe; a 410 Gone or an "
            "operator's pause waits for an operator."
        </p>
        <Transition fallback=|| view! { <p class="muted">"Loading…"</p> }>
            {move || Suspend::new(async move {
                match handlers.await {
                    Ok(list) if list.is_empty() => {
                        view! {
                            <p class="empty" data-testid="no-handlers">
                                "No handler yet: a running engine lists its handlers here."
                            </p>
                        }
                            .into_any()
                    }
                    Ok(list) => view! { <Handlers list done /> }.into_any(),
                    Err(e) => view! { <p class="error">{e.to_string()}</p> }.into_any(),
                }
            })}
        </Transition>
    }
}

#[component]
fn Handlers(list: Vec<HandlerView>, done: RwSignal<u32>) -> impl IntoView {
    let open = RwSignal::new(None::<(HandlerView, HandlerControlKind)>);
    view! {
        <table class="records" data-testid="handlers">
            <thead>
                <tr>
                    <th>"Group"</th>
                    <th>"Message type"</th>
                    <th>"Kind"</th>
                    <th>"State"</th>
                    <th>"Since"</th>
                    <th>"By"</th>
                    <th>"Why"</th>
                    <th>"Actions"</th>
                </tr>
            </thead>
            <tbody>{list.into_iter().map(|h| view! { <HandlerRow h open /> }).collect_view()}</tbody>
        </table>
        {move || open.get().map(|(h, kind)| view! { <ConfirmControl h kind open done /> })}
    }
}

#[component]
fn HandlerRow(h: HandlerView, open: RwSignal<Option<(HandlerView, HandlerControlKind)>>) -> impl IntoView {
    let kind = if h.paused() { HandlerControlKind::Resume } else { HandlerControlKind::Pause };
    let failure = h.error_class.clone().map(|class| {
        let status = h.http_status.map(|s| format!("HTTP {s}")).unwrap_or_else(|| "no answer".to_owned());
        format!("last failure {class} ({status}) at {}", opt_time(h.failed_at.as_deref()))
    });
    let probe = (h.state == "breaker").then(|| format!("next probe {}", opt_time(h.probe_at.as_deref())));
    let target = StoredValue::new(h.clone());
    view! {
        <tr data-group=h.consumer_group.clone() data-type=h.message_type.clone() data-state=h.state.clone()>
            <td>{h.consumer_group.clone()}</td>
            <td class="mono">{h.message_type.clone()}</td>
            <td>{h.kind.clone().unwrap_or_default()}</td>
            <td class=if h.paused() { "error" } else { "" } data-testid="handler-state">{pause_state_label(&h.state)}</td>
            <td>{short_time(&h.since)}</td>
            <td>{h.changed_by.clone().unwrap_or_default()}</td>
            <td>
                {h.paused().then(|| h.reason.clone()).flatten()}
                {h.paused().then(|| failure.map(|f| view! { <div class="small muted">{f}</div> })).flatten()}
                {probe.map(|p| view! { <div class="small muted">{p}</div> })}
            </td>
            <td class="actions">
                <IfRole role=RoleView::Operator>
                    <button data-control=kind.label() on:click=move |_| open.set(Some((target.get_value(), kind)))>
                        {kind.label()}
                        "…"
                    </button>
                </IfRole>
            </td>
        </tr>
    }
}

#[component]
fn ConfirmControl(
    h: HandlerView,
    kind: HandlerControlKind,
    open: RwSignal<Option<(HandlerView, HandlerControlKind)>>,
    done: RwSignal<u32>,
) -> impl IntoView {
    let action = ServerAction::<ControlHandler>::new();
    let reason = RwSignal::new(String::new());
    let shown = StoredValue::new(h.clone());
    let submit = move |()| {
        let h = shown.get_value();
        action.dispatch(ControlHandler {
            group: h.consumer_group,
            message_type: h.message_type,
            control: kind,
            request: HandlerControlRequest { reason: Some(reason.get_untracked()), expected_version: Some(h.version) },
        });
    };
    let close = move |()| {
        open.set(None);
        if action.value().with_untracked(|v| matches!(v, Some(Ok(_)))) {
            done.update(|n| *n += 1);
        }
    };
    let blocked = move || {
        action.pending().get()
            || action.value().with(|v| matches!(v, Some(Ok(_))))
            || reason.with(|r| r.trim().is_empty())
    };
    let consequence = match kind {
        HandlerControlKind::Pause => {
            "Its deliveries will wait in the broker until an operator resumes it (every process of the group stops \
             taking them within a second); nothing is discarded. The group's other types keep flowing."
        }
        HandlerControlKind::Resume => {
            "Its held deliveries are taken again as they come back from the broker's delay queues (within its \
             probe interval)."
        }
    };
    view! {
        <div class="dialog" role="dialog" aria-modal="true" aria-labelledby="handler-confirm-title" data-testid="confirm-dialog">
            <h3 id="handler-confirm-title">{format!("{} the handler of {}?", kind.label(), h.message_type)}</h3>
            <p>
                "Group " <strong>{h.consumer_group.clone()}</strong> " · " <span class="mono">{h.message_type.clone()}</span>
                " · " {pause_state_label(&h.state)}
            </p>
            <p class="muted small">{consequence}</p>
            <ReasonAndButtons
                reason_label="Reason (required)"
                reason
                submit_label=kind.label()
                blocked
                on_submit=submit
                on_close=close
            />
            {move || {
                action
                    .value()
                    .get()
                    .map(|result| match result {
                        Ok(h) => {
                            view! {
                                <p class="ok" role="status" data-testid="action-result">
                                    {format!("Done: the handler of {} is {} now.", h.message_type, pause_state_label(&h.state))}
                                </p>
                            }
                                .into_any()
                        }
                        Err(e) => view! { <p class="error" role="alert" data-testid="action-error">{e.to_string()}</p> }.into_any(),
                    })
            }}
        </div>
    }
}
