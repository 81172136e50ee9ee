//! Bulk requeue from a filter: a button that opens a dialog with the preview (how many records
//! the filter matches now, how many would be requeued, how many skipped and why), the rate,
//! canary and failure threshold, and a confirmation naming the exact count. The selection is
//! frozen when confirmed; progress is on the Requeues page.

use leptos::prelude::*;
use leptos_router::components::A;

use crate::base::href;
use crate::components::session::IfRole;
use crate::error::ConsoleError;
use crate::format::count;
use crate::wire::account::RoleView;
use crate::wire::operations::{RequeueJobView, RequeuePreviewView, RequeueStartRequest};
use crate::wire::records::RecordsQuery;

/// What a bulk requeue of `filter` would do now. Role: viewer.
#[server(prefix = "/api/fn", endpoint = "preview_requeue", input = leptos::server_fn::codec::Json, client = crate::csrf::CsrfClient)]
pub async fn preview_requeue(filter: RecordsQuery) -> Result<RequeuePreviewView, ConsoleError> {
    crate::ssr::service::operations::requeue_preview(&crate::ssr::service::console_state()?, &filter).await
}

/// Freezes the selection and starts the job. Role: operator.
#[server(prefix = "/api/fn", endpoint = "start_requeue", input = leptos::server_fn::codec::Json, client = crate::csrf::CsrfClient)]
pub async fn start_requeue(request: RequeueStartRequest) -> Result<RequeueJobView, ConsoleError> {
    let state = crate::ssr::service::console_state()?;
    crate::ssr::service::operations::requeue_start(&state, &crate::ssr::service::auth::request_auth().actor(), &request)
        .await
}

/// The button and its dialog for `filter`; `label` names the selection ("dead letters of class X").
#[component]
pub fn BulkRequeue(filter: RecordsQuery, #[prop(into)] label: String) -> impl IntoView {
    let open = RwSignal::new(false);
    let filter = StoredValue::new(filter);
    let label = StoredValue::new(label);
    view! {
        <IfRole role=RoleView::Operator>
            <button data-testid="bulk-requeue" on:click=move |_| open.set(true)>
                "Requeue…"
            </button>
            {move || open.get().then(|| view! { <BulkDialog filter=filter.get_value() label=label.get_value() open /> })}
        </IfRole>
    }
}

fn number<T: std::str::FromStr>(text: &str, default: T) -> T {
    text.trim().parse().unwrap_or(default)
}

#[component]
fn BulkDialog(filter: RecordsQuery, label: String, open: RwSignal<bool>) -> impl IntoView {
    let preview_filter = filter.clone();
    let preview = Resource::new(|| (), move |_| preview_requeue(preview_filter.clone()));
    let rate = RwSignal::new("50".to_owned());
    let canary = RwSignal::new("10".to_owned());
    let threshold = RwSignal::new("0.2".to_owned());
    let reason = RwSignal::new(String::new());
    let start = ServerAction::<StartRequeue>::new();
    let filter = StoredValue::new(filter);
    let confirm = move |expected: i64| {
        start.dispatch(StartRequeue {
            request: RequeueStartRequest {
                filter: filter.get_value(),
                rate_per_sec: Some(number(&rate.get_untracked(), 50.0)),
                canary_size: Some(number(&canary.get_untracked(), 10)),
                failure_threshold: Some(number(&threshold.get_untracked(), 0.2)),
                expected_count: Some(expected),
                reason: Some(reason.get_untracked()).filter(|r| !r.trim().is_empty()),
            },
        });
    };
    let field = |name: &'static str, value: RwSignal<String>, test: &'static str| {
        view! {
            <label>
                {name}
                <input type="text" data-testid=test prop:value=move || value.get() on:input=move |ev| value.set(event_target_value(&ev)) />
            </label>
        }
    };
    view! {
        <div class="dialog" role="dialog" aria-modal="true" aria-labelledby="bulk-title" data-testid="bulk-dialog">
            <h3 id="bulk-title">"Requeue " {label}</h3>
            <Transition fallback=|| view! { <p class="muted">"Counting…"</p> }>
                {move || Suspend::new(async move {
                    match preview.await {
                        Err(e) => view! { <p class="error" role="alert">{e.to_string()}</p> }.into_any(),
                        Ok(p) => {
                            let n = p.would_requeue;
                            view! {
                                <Preview p />
                                {field("Rate (messages/s)", rate, "bulk-rate")}
                                {field("Canary batch (must all succeed first)", canary, "bulk-canary")}
                                {field("Pause when this share of publishes fails (0–1)", threshold, "bulk-threshold")}
                                <label>
                                    "Reason (optional)"
                                    <textarea data-testid="bulk-reason" prop:value=move || reason.get() on:input=move |ev| reason.set(event_target_value(&ev))></textarea>
                                </label>
                                <p class="dialog-buttons">
                                    <button
                                        class="primary"
                                        data-testid="bulk-confirm"
                                        disabled=move || n == 0 || start.pending().get() || start.value().with(|v| matches!(v, Some(Ok(_))))
                                        on:click=move |_| confirm(n)
                                    >
                                        {format!("Requeue {} records", count(n))}
                                    </button>
                                    <button on:click=move |_| open.set(false)>"Close"</button>
                                </p>
                            }
                                .into_any()
                        }
                    }
                })}
            </Transition>
            {move || start.value().get().map(started)}
        </div>
    }
}

fn started(result: Result<RequeueJobView, ConsoleError>) -> AnyView {
    match result {
        Ok(job) => view! {
            <p class="ok" role="status" data-testid="bulk-started">
                {format!("Job {} started: {} records frozen. ", job.id, count(job.total - job.skipped))}
                <A href=href(&format!("/requeue#job-{}", job.id))>"Follow its progress"</A>
            </p>
        }
        .into_any(),
        Err(e) => view! { <p class="error" role="alert" data-testid="bulk-error">{e.to_string()}</p> }.into_any(),
    }
}

#[component]
fn Preview(p: RequeuePreviewView) -> impl IntoView {
    view! {
        <dl class="facts" data-testid="bulk-preview">
            <dt>"Matched now"</dt>
            <dd data-testid="bulk-matched">{count(p.matched)}</dd>
            <dt>"Would be requeued"</dt>
            <dd data-testid="bulk-would-requeue">{count(p.would_requeue)}</dd>
            {p
                .skipped
                .into_iter()
                .map(|s| {
                    view! {
                        <dt>{format!("Skipped: {}", s.reason)}</dt>
                        <dd>{count(s.count)}</dd>
                    }
                })
                .collect_view()}
        </dl>
        <p class="muted small">
            "The selection is frozen when you confirm: records arriving later are not included. "
            "A canary batch runs first; the job pauses itself if too many publishes fail."
        </p>
    }
}
