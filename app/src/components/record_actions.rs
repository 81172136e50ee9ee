//! The operator actions on one record (release, mark succeeded, dead-letter, requeue): buttons
//! for the actions the record's status allows, each behind a confirmation dialog that names the
//! record, the exact count (one record) and the consequence, and asks for the reason.

use leptos::prelude::*;

use crate::components::confirm::ReasonAndButtons;
use crate::components::session::IfRole;
use crate::error::ConsoleError;
use crate::wire::account::RoleView;
use crate::wire::actions::{ActionResultView, RecordActionKind, RecordActionRequest};

/// Runs one action on one record; the same engine call as `POST /api/v1/records/{id}/<action>`.
/// Needs the `operator` role.
#[server(prefix = "/api/fn", endpoint = "act_on_record", input = leptos::server_fn::codec::Json, client = crate::csrf::CsrfClient)]
pub async fn act_on_record(
    id: i64,
    action: RecordActionKind,
    request: RecordActionRequest,
) -> Result<ActionResultView, ConsoleError> {
    let state = crate::ssr::service::console_state()?;
    crate::ssr::service::actions::act(&state, &crate::ssr::service::auth::request_auth().actor(), id, action, &request)
        .await
}

/// What the buttons act on: the record as the page showed it.
#[derive(Debug, Clone, PartialEq)]
pub struct ActionTarget {
    /// Record id.
    pub id: i64,
    /// Message id (shown in the dialog).
    pub message_id: String,
    /// Status shown; sent as `expected_status`.
    pub status: String,
    /// Lease token shown (processing records).
    pub lease_token: Option<String>,
    /// Whether the lease had expired when shown.
    pub lease_expired: bool,
    /// Version shown; sent as `expected_version` (the stuck list has none: the lease token
    /// guards its processing records).
    pub version: Option<i64>,
}

/// Action buttons for `target`; `on_done` runs when the dialog of a successful action is
/// closed (refresh the page's data; the dialog keeps showing the result until then).
#[component]
pub fn RecordActions(target: ActionTarget, #[prop(into)] on_done: Callback<()>) -> impl IntoView {
    let kinds = RecordActionKind::for_status(&target.status);
    if kinds.is_empty() {
        return ().into_any();
    }
    let open = RwSignal::new(None::<RecordActionKind>);
    let target = StoredValue::new(target);
    // Hidden from viewers (the server refuses them anyway).
    view! {
        <IfRole role=RoleView::Operator>
        <span class="actions" data-testid="record-actions">
            {kinds
                .iter()
                .map(|&kind| {
                    view! {
                        <button
                            class=if kind == RecordActionKind::MarkSucceeded { "danger" } else { "" }
                            data-action=format!("{kind:?}")
                            on:click=move |_| open.set(Some(kind))
                        >
                            {kind.label()}
                            "…"
                        </button>
                    }
                })
                .collect_view()}
            {move || {
                open.get()
                    .map(|kind| {
                        view! { <ConfirmAction kind target=target.get_value() open on_done /> }
                    })
            }}
        </span>
        </IfRole>
    }
    .into_any()
}

#[component]
fn ConfirmAction(
    kind: RecordActionKind,
    target: ActionTarget,
    open: RwSignal<Option<RecordActionKind>>,
    on_done: Callback<()>,
) -> impl IntoView {
    let action = ServerAction::<ActOnRecord>::new();
    let reason = RwSignal::new(String::new());
    let force = RwSignal::new(false);
    let requeue = RwSignal::new(false);
    let live_lease = target.status == "processing" && !target.lease_expired;
    let t = target.clone();
    let submit = move |()| {
        action.dispatch(ActOnRecord {
            id: t.id,
            action: kind,
            request: RecordActionRequest {
                expected_status: Some(t.status.clone()),
                lease_token: t.lease_token.clone(),
                expected_version: t.version,
                force: force.get_untracked(),
                reason: Some(reason.get_untracked()).filter(|r| !r.trim().is_empty()),
                requeue: requeue.get_untracked(),
            },
        });
    };
    let close = move |()| {
        open.set(None);
        if action.value().with_untracked(|v| matches!(v, Some(Ok(_)))) {
            on_done.run(());
        }
    };
    let blocked = move || {
        action.pending().get()
            || action.value().with(|v| matches!(v, Some(Ok(_))))
            || (kind.needs_reason() && reason.with(|r| r.trim().is_empty()))
            || (live_lease && !force.get())
    };
    view! {
        <div class="dialog" role="dialog" aria-modal="true" aria-labelledby="confirm-title" data-testid="confirm-dialog">
            <h3 id="confirm-title">{format!("{} 1 record?", kind.label())}</h3>
            <p>
                "Record " <strong>{target.id}</strong> " · " <span class="mono">{target.message_id.clone()}</span> " · "
                {target.status.clone()}
                {target.lease_token.clone().map(|t| view! { " · lease " <span class="mono">{t}</span> })}
            </p>
            <p class="muted small">{kind.consequence()}</p>
            {live_lease
                .then(|| {
                    view! {
                        <p class="error">
                            "Its lease is still live: the worker may still be running the handler."
                        </p>
                        <label>
                            <input
                                type="checkbox"
                                data-testid="confirm-force"
                                on:change=move |ev| force.set(event_target_checked(&ev))
                            />
                            " Force it anyway"
                        </label>
                    }
                })}
            {(kind == RecordActionKind::Release)
                .then(|| {
                    view! {
                        <label>
                            <input
                                type="checkbox"
                                data-testid="confirm-requeue"
                                on:change=move |ev| requeue.set(event_target_checked(&ev))
                            />
                            " Also requeue its stored message now"
                        </label>
                    }
                })}
            <ReasonAndButtons
                reason_label=if kind.needs_reason() { "Reason (required)" } else { "Reason (optional)" }
                reason
                submit_label=format!("{} 1 record", kind.label())
                blocked
                on_submit=submit
                on_close=close
            />
            {move || {
                action
                    .value()
                    .get()
                    .map(|result| match result {
                        Ok(r) => {
                            view! {
                                <p class="ok" role="status" data-testid="action-result">
                                    {format!(
                                        "Done: record {} is {} now{}.",
                                        r.record_id,
                                        r.status,
                                        if r.republished { ", its message was published again" } else { "" },
                                    )}
                                </p>
                            }
                                .into_any()
                        }
                        Err(e) => {
                            view! {
                                <p class="error" role="alert" data-testid="action-error">
                                    {e.to_string()}
                                </p>
                            }
                                .into_any()
                        }
                    })
            }}
        </div>
    }
}
