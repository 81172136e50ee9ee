//! The duplicate drill on a succeeded record: publish its message id again, then follow the
//! record every second until the copy is seen, and show which layer caught it and that the
//! handler did not run again.

use std::time::Duration;

use leptos::prelude::*;

use crate::components::session::IfRole;
use crate::components::ticker::use_ticker;
use crate::error::ConsoleError;
use crate::wire::account::RoleView;
use crate::wire::operations::{DrillRequest, DrillView};

/// Publishes a drill copy. Role: operator.
#[server(prefix = "/api/fn", endpoint = "start_drill", input = leptos::server_fn::codec::Json, client = crate::csrf::CsrfClient)]
pub async fn start_drill(request: DrillRequest) -> Result<DrillView, ConsoleError> {
    let state = crate::ssr::service::console_state()?;
    crate::ssr::service::operations::drill_start(&state, &crate::ssr::service::auth::request_auth().actor(), &request)
        .await
}

/// A drill's state. Role: viewer.
#[server(prefix = "/api/fn", endpoint = "get_drill", client = crate::csrf::CsrfClient)]
pub async fn get_drill(id: i64) -> Result<DrillView, ConsoleError> {
    crate::ssr::service::operations::drill(&crate::ssr::service::console_state()?, id).await
}

/// The drill button and its dialog for record `record_id` (a succeeded one).
#[component]
pub fn DrillButton(record_id: i64) -> impl IntoView {
    let open = RwSignal::new(false);
    view! {
        <IfRole role=RoleView::Operator>
            <button data-testid="drill" on:click=move |_| open.set(true)>"Duplicate drill…"</button>
            {move || open.get().then(|| view! { <DrillDialog record_id open /> })}
        </IfRole>
    }
}

#[component]
fn DrillDialog(record_id: i64, open: RwSignal<bool>) -> impl IntoView {
    let payload = RwSignal::new(String::new());
    let start = ServerAction::<StartDrill>::new();
    let drill_id = Memo::new(move |_| start.value().get().and_then(Result::ok).map(|d| d.id));
    let following = RwSignal::new(false);
    let tick = use_ticker(Duration::from_secs(1), following.into());
    let report = Resource::new(
        move || (drill_id.get(), tick.get()),
        |(id, _)| async move {
            match id {
                Some(id) => get_drill(id).await.map(Some),
                None => Ok(None),
            }
        },
    );
    view! {
        <div class="dialog" role="dialog" aria-modal="true" data-testid="drill-dialog">
            <h3>"Duplicate drill on 1 record"</h3>
            <p class="muted small">
                "Publishes this record's message id again to its original exchange and routing key. The consumer "
                "must skip it as a duplicate; nothing happens twice. Give the original payload to let the Redis "
                "fast path catch it (its marker holds the payload's hash); without it the database catches it "
                "and counts a payload conflict."
            </p>
            <label>
                "Original payload (optional)"
                <textarea prop:value=move || payload.get() on:input=move |ev| payload.set(event_target_value(&ev))></textarea>
            </label>
            <p class="dialog-buttons">
                <button
                    class="primary"
                    data-testid="drill-submit"
                    disabled=move || start.pending().get() || drill_id.get().is_some()
                    on:click=move |_| {
                        start.dispatch(StartDrill {
                            request: DrillRequest {
                                record_id: Some(record_id),
                                message_type: None,
                                original_payload: Some(payload.get_untracked()).filter(|p| !p.is_empty()),
                            },
                        });
                        following.set(true);
                    }
                >
                    "Publish 1 copy"
                </button>
                <button on:click=move |_| open.set(false)>"Close"</button>
            </p>
            {move || start.value().get().and_then(|r| r.err()).map(|e| view! { <p class="error" role="alert">{e.to_string()}</p> })}
            <Transition>
                {move || Suspend::new(async move {
                    match report.await {
                        Ok(Some(d)) => {
                            if d.caught_by.is_some() {
                                following.set(false);
                            }
                            view! { <Report d /> }.into_any()
                        }
                        Ok(None) => ().into_any(),
                        Err(e) => view! { <p class="error">{e.to_string()}</p> }.into_any(),
                    }
                })}
            </Transition>
        </div>
    }
}

#[component]
fn Report(d: DrillView) -> impl IntoView {
    let verdict = match (&d.caught_by, d.passed) {
        (None, _) => "Copy published; waiting for the consumer…".to_owned(),
        (Some(layer), true) => format!("Caught as a duplicate by {layer}; the handler did not run again. Passed."),
        (Some(layer), false) => format!("Seen by {layer}, but the handler ran again or the record changed. FAILED."),
    };
    view! {
        <dl class="facts" data-testid="drill-report" data-caught-by=d.caught_by.clone().unwrap_or_default() data-passed=d.passed.to_string()>
            <dt>"Verdict"</dt>
            <dd data-testid="drill-verdict">{verdict}</dd>
            <dt>"Redis marker when published"</dt>
            <dd>{if d.marker_present { "present" } else { "absent" }}</dd>
            <dt>"Duplicates added"</dt>
            <dd>{d.duplicates_added}</dd>
            <dt>"Handler attempts added"</dt>
            <dd>{d.attempts_added}</dd>
            <dt>"Record status now"</dt>
            <dd>{d.status.clone().unwrap_or_else(|| "gone".to_owned())}</dd>
        </dl>
    }
}
