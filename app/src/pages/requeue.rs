//! Requeues (`/requeue`): bulk requeue jobs with live progress (done / skipped / failed, rate,
//! ETA), refreshed every second while one runs, and pause / resume / cancel.

use std::time::Duration;

use leptos::prelude::*;

use crate::components::session::IfRole;
use crate::components::ticker::use_ticker;
use crate::error::ConsoleError;
use crate::format::{count, duration, opt_time, short_time};
use crate::wire::account::RoleView;
use crate::wire::operations::{JobControlKind, RequeueJobView};

/// The latest bulk requeue jobs. Role: viewer.
#[server(prefix = "/api/fn", endpoint = "list_requeue_jobs", client = crate::csrf::CsrfClient)]
pub async fn list_requeue_jobs() -> Result<Vec<RequeueJobView>, ConsoleError> {
    crate::ssr::service::operations::requeue_jobs(&crate::ssr::service::console_state()?).await
}

/// Pauses, resumes or cancels a job. Role: operator.
#[server(prefix = "/api/fn", endpoint = "control_requeue_job", input = leptos::server_fn::codec::Json, client = crate::csrf::CsrfClient)]
pub async fn control_requeue_job(id: i64, control: JobControlKind) -> Result<RequeueJobView, ConsoleError> {
    let state = crate::ssr::service::console_state()?;
    crate::ssr::service::operations::requeue_control(
        &state,
        &crate::ssr::service::auth::request_auth().actor(),
        id,
        control,
    )
    .await
}

/// The requeues page.
#[component]
pub fn RequeuePage() -> impl IntoView {
    let running = RwSignal::new(true);
    let tick = use_ticker(Duration::from_secs(1), running.into());
    let control = ServerAction::<ControlRequeueJob>::new();
    let jobs = Resource::new(move || (tick.get(), control.version().get()), |_| list_requeue_jobs());
    view! {
        <h1>"Requeues"</h1>
        <p class="muted">
            "Bulk requeue jobs, newest first. Start one from the Dead letters or Retries page. "
            "Progress is kept in the database: it survives a reload and a server restart."
        </p>
        {move || {
            control
                .value()
                .get()
                .and_then(|r| r.err())
                .map(|e| view! { <p class="error" role="alert">{e.to_string()}</p> })
        }}
        <Transition fallback=|| view! { <p class="muted">"Loading…"</p> }>
            {move || Suspend::new(async move {
                match jobs.await {
                    Ok(list) => {
                        running.set(list.iter().any(|j| j.state == "running"));
                        view! { <Jobs list control /> }.into_any()
                    }
                    Err(e) => view! { <p class="error">{e.to_string()}</p> }.into_any(),
                }
            })}
        </Transition>
    }
}

#[component]
fn Jobs(list: Vec<RequeueJobView>, control: ServerAction<ControlRequeueJob>) -> impl IntoView {
    if list.is_empty() {
        return view! { <p class="empty" data-testid="no-jobs">"No bulk requeue yet."</p> }.into_any();
    }
    view! {
        <table class="records" data-testid="requeue-jobs">
            <thead>
                <tr>
                    <th>"Job"</th>
                    <th>"State"</th>
                    <th class="num">"Done"</th>
                    <th class="num">"Skipped"</th>
                    <th class="num">"Failed"</th>
                    <th class="num">"Pending"</th>
                    <th class="num">"Rate"</th>
                    <th>"ETA"</th>
                    <th>"Started"</th>
                    <th>"Actions"</th>
                </tr>
            </thead>
            <tbody>{list.into_iter().map(|job| view! { <JobRow job control /> }).collect_view()}</tbody>
        </table>
    }
    .into_any()
}

#[component]
fn JobRow(job: RequeueJobView, control: ServerAction<ControlRequeueJob>) -> impl IntoView {
    let id = job.id;
    let button = move |kind: JobControlKind, label: &'static str| {
        view! {
            <button data-control=label on:click=move |_| { control.dispatch(ControlRequeueJob { id, control: kind }); }>
                {label}
            </button>
        }
    };
    let (running, paused) = (job.state == "running", job.state == "paused");
    view! {
        <tr id=format!("job-{id}") data-job-id=id data-state=job.state.clone()>
            <td class="num" title=job.filter.clone()>
                {id}
                <span class="muted small">{format!(" by {}", job.created_by)}</span>
            </td>
            <td>
                {job.state.clone()}
                {job.paused_reason.clone().map(|r| view! { <div class="small error" data-testid="paused-reason">{r}</div> })}
            </td>
            <td class="num" data-testid="job-done">{count(job.done)}</td>
            <td class="num" data-testid="job-skipped">{count(job.skipped)}</td>
            <td class="num" data-testid="job-failed">{count(job.failed)}</td>
            <td class="num">{count(job.pending)}</td>
            <td class="num">{format!("{:.0}/s of {:.0}/s", job.observed_rate, job.rate_per_sec)}</td>
            <td>{job.eta_secs.map(|s| duration(s.ceil() as i64)).unwrap_or_else(|| "—".to_owned())}</td>
            <td>{short_time(&job.created_at)} " → " {opt_time(job.finished_at.as_deref())}</td>
            <td class="actions">
                <IfRole role=RoleView::Operator>
                    {running.then(|| button(JobControlKind::Pause, "Pause"))}
                    {paused.then(|| button(JobControlKind::Resume, "Resume"))}
                    {(running || paused).then(|| button(JobControlKind::Cancel, "Cancel"))}
                </IfRole>
            </td>
        </tr>
    }
}
