//! Cleanup (`/cleanup`): the schedules (create, edit, enable/disable), a dry run and "run now"
//! per schedule, the history of runs (rows deleted, duration, errors), and the retention advice
//! from the longest delay observed (duplicates, late duplicates, late deliveries), and the late
//! duplicates per group: copies that came back after cleanup deleted their record.

use std::time::Duration;

use leptos::prelude::*;

use crate::components::session::IfRole;
use crate::components::ticker::use_ticker;
use crate::error::ConsoleError;
use crate::format::{count, millis, opt_time, short_time};
use crate::wire::account::RoleView;
use crate::wire::operations::{CleanupRunView, CleanupView, ScheduleRequest, ScheduleView};

/// The cleanup page's data. Role: viewer.
#[server(prefix = "/api/fn", endpoint = "get_cleanup", client = crate::csrf::CsrfClient)]
pub async fn get_cleanup() -> Result<CleanupView, ConsoleError> {
    crate::ssr::service::operations::cleanup_overview(&crate::ssr::service::console_state()?).await
}

/// Creates (`id` none) or edits a schedule. Role: admin.
#[server(prefix = "/api/fn", endpoint = "save_schedule", input = leptos::server_fn::codec::Json, client = crate::csrf::CsrfClient)]
pub async fn save_schedule(id: Option<i64>, schedule: ScheduleRequest) -> Result<ScheduleView, ConsoleError> {
    let state = crate::ssr::service::console_state()?;
    crate::ssr::service::operations::schedule_save(
        &state,
        &crate::ssr::service::auth::request_auth().actor(),
        id,
        &schedule,
    )
    .await
}

/// Records a schedule would delete now. Role: viewer.
#[server(prefix = "/api/fn", endpoint = "dry_run_schedule", client = crate::csrf::CsrfClient)]
pub async fn dry_run_schedule(id: i64) -> Result<i64, ConsoleError> {
    crate::ssr::service::operations::schedule_dry_run(&crate::ssr::service::console_state()?, id).await
}

/// Starts a manual run; returns its id. Role: admin.
#[server(prefix = "/api/fn", endpoint = "run_schedule_now", client = crate::csrf::CsrfClient)]
pub async fn run_schedule_now(id: i64) -> Result<i64, ConsoleError> {
    let state = crate::ssr::service::console_state()?;
    crate::ssr::service::operations::schedule_run_now(&state, &crate::ssr::service::auth::request_auth().actor(), id)
        .await
}

/// The cleanup page.
#[component]
pub fn CleanupPage() -> impl IntoView {
    let save = ServerAction::<SaveSchedule>::new();
    let run_now = ServerAction::<RunScheduleNow>::new();
    let busy = RwSignal::new(false);
    let tick = use_ticker(Duration::from_secs(1), busy.into());
    let data = Resource::new(move || (save.version().get(), run_now.version().get(), tick.get()), |_| get_cleanup());
    let editing = RwSignal::new(None::<(Option<i64>, ScheduleRequest)>);
    Effect::new(move |_| {
        if let Some(Ok(_)) = save.value().get() {
            editing.set(None);
        }
    });
    view! {
        <h1>"Cleanup"</h1>
        <p class="muted">
            "Schedules delete records older than their retention in small batches (consumers never wait on them). "
            "Only succeeded records unless a schedule says otherwise; processing records never."
        </p>
        <Transition fallback=|| view! { <p class="muted">"Loading…"</p> }>
            {move || Suspend::new(async move {
                match data.await {
                    Ok(v) => {
                        busy.set(v.runs.iter().any(|r| r.finished_at.is_none()));
                        view! { <Cleanup v editing run_now /> }.into_any()
                    }
                    Err(e) => view! { <p class="error">{e.to_string()}</p> }.into_any(),
                }
            })}
        </Transition>
        <IfRole role=RoleView::Admin>
            <p>
                <button data-testid="new-schedule" on:click=move |_| editing.set(Some((None, ScheduleRequest::default())))>
                    "New schedule…"
                </button>
            </p>
        </IfRole>
        {move || editing.get().map(|(id, s)| view! { <ScheduleForm id s save editing /> })}
        {move || {
            run_now
                .value()
                .get()
                .map(|r| match r {
                    Ok(id) => view! { <p class="ok" role="status" data-testid="run-started">{format!("Run {id} started.")}</p> }.into_any(),
                    Err(e) => view! { <p class="error" role="alert">{e.to_string()}</p> }.into_any(),
                })
        }}
    }
}

#[component]
fn Cleanup(
    v: CleanupView,
    editing: RwSignal<Option<(Option<i64>, ScheduleRequest)>>,
    run_now: ServerAction<RunScheduleNow>,
) -> impl IntoView {
    let advice = match (v.longest_duplicate_delay_ms, v.minimum_retention_ms) {
        (Some(ms), Some(minimum)) => format!(
            "Longest delay observed (duplicates, late deliveries): {}. Keep records at least {} ({}× that).",
            millis(ms),
            millis(minimum),
            v.safety_factor
        ),
        _ => "No duplicate seen yet: no delay to keep records for.".to_owned(),
    };
    let late_duplicates = v.late_duplicates.into_iter().map(|l| {
        let handled = if l.held == l.count {
            "held for an operator".to_owned()
        } else if l.held == 0 {
            "their handlers ran again".to_owned()
        } else {
            format!("{} held for an operator, the others' handlers ran again", l.held)
        };
        view! {
            <li data-group=l.consumer_group.clone()>
                {format!(
                    "{}: {} late duplicates (copies that came back after cleanup deleted their record, known by its fingerprint), up to {} after the first delivery, the last {}; {handled}. ",
                    l.consumer_group,
                    count(l.count),
                    millis(l.longest_delay_ms),
                    short_time(&l.last_seen_at),
                )}
                <a href=format!(
                    "/records?group={}&flag=late_duplicate",
                    crate::wire::records::encode_component(&l.consumer_group),
                )>"List them"</a>
            </li>
        }
    }).collect_view();
    let late = v.late_deliveries.into_iter().map(|l| {
        view! {
            <li>
                {format!(
                    "{}: {} deliveries arrived older than the retention (oldest {} after it was sent) and found no record; their handlers ran again.",
                    l.consumer_group,
                    l.count,
                    millis(l.max_age_ms),
                )}
            </li>
        }
    }).collect_view();
    view! {
        <section class="panel" aria-labelledby="advice-title">
            <h2 id="advice-title">"Retention advice"</h2>
            <p data-testid="retention-advice">{advice}</p>
            <ul class="small error" data-testid="late-duplicates">{late_duplicates}</ul>
            <ul class="small error" data-testid="late-deliveries">{late}</ul>
        </section>
        <section class="panel" aria-labelledby="schedules-title">
            <h2 id="schedules-title">"Schedules"</h2>
            {if v.schedules.is_empty() {
                view! { <p class="empty">"No schedule yet."</p> }.into_any()
            } else {
                view! {
                    <table class="records" data-testid="schedules">
                        <thead>
                            <tr>
                                <th>"Name"</th>
                                <th>"Cron (UTC)"</th>
                                <th class="num">"Retention"</th>
                                <th>"Statuses"</th>
                                <th class="num">"Batch"</th>
                                <th class="num" title="Fingerprints of deleted records are kept this long: a copy arriving within it is known as a late duplicate">
                                    "Fingerprints"
                                </th>
                                <th>"Next run"</th>
                                <th>"Actions"</th>
                            </tr>
                        </thead>
                        <tbody>
                            {v.schedules.into_iter().map(|s| view! { <ScheduleRow s editing run_now /> }).collect_view()}
                        </tbody>
                    </table>
                }
                    .into_any()
            }}
        </section>
        <section class="panel" aria-labelledby="runs-title">
            <h2 id="runs-title">"Runs"</h2>
            <Runs runs=v.runs />
        </section>
    }
}

#[component]
fn ScheduleRow(
    s: ScheduleView,
    editing: RwSignal<Option<(Option<i64>, ScheduleRequest)>>,
    run_now: ServerAction<RunScheduleNow>,
) -> impl IntoView {
    let id = s.id;
    let dry_run = Action::new(move |_: &()| dry_run_schedule(id));
    let confirming = RwSignal::new(false);
    let settings = StoredValue::new(s.settings.clone());
    let c = s.settings;
    view! {
        <tr data-schedule-id=id data-schedule-name=c.name.clone()>
            <td>
                {c.name.clone()}
                {(!c.enabled).then(|| view! { " " <span class="badge badge-processing">"disabled"</span> })}
            </td>
            <td class="mono">{c.cron.clone()}</td>
            <td class="num">
                {format!("{} d", c.retention_days)}
                {s.retention_warning.map(|w| view! { <div class="small error" data-testid="retention-warning">{w}</div> })}
            </td>
            <td>{c.statuses.join(", ")}</td>
            <td class="num">{count(i64::from(c.batch_size))}</td>
            <td class="num" data-testid="fingerprint-days">{format!("{} d", s.fingerprint_horizon_days)}</td>
            <td>{opt_time(s.next_run_at.as_deref())}</td>
            <td class="actions">
                <IfRole role=RoleView::Admin>
                    <button on:click=move |_| editing.set(Some((Some(id), settings.get_value())))>"Edit…"</button>
                </IfRole>
                <button data-testid="dry-run" on:click=move |_| { dry_run.dispatch(()); }>"Dry run"</button>
                <IfRole role=RoleView::Admin>
                    <button data-testid="run-now" on:click=move |_| confirming.set(true)>"Run now…"</button>
                </IfRole>
                {move || {
                    dry_run
                        .value()
                        .get()
                        .map(|r| match r {
                            Ok(n) => view! {
                                <span data-testid="dry-run-result" data-value=n>{format!("{} records would be deleted", count(n))}</span>
                            }
                                .into_any(),
                            Err(e) => view! { <span class="error">{e.to_string()}</span> }.into_any(),
                        })
                }}
                {move || {
                    confirming
                        .get()
                        .then(|| {
                            let n = dry_run.value().get().and_then(Result::ok);
                            view! {
                                <div class="dialog" role="dialog" aria-modal="true" data-testid="run-confirm">
                                    <h3>"Run this schedule now?"</h3>
                                    <p>
                                        {match n {
                                            Some(n) => format!("{} records would be deleted (dry run just now).", count(n)),
                                            None => "Run a dry run first to see how many records would be deleted.".to_owned(),
                                        }}
                                    </p>
                                    <p class="dialog-buttons">
                                        <button
                                            class="primary"
                                            data-testid="run-confirm-submit"
                                            disabled=n.is_none()
                                            on:click=move |_| {
                                                run_now.dispatch(RunScheduleNow { id });
                                                confirming.set(false);
                                            }
                                        >
                                            {format!("Delete {} records", n.map(count).unwrap_or_default())}
                                        </button>
                                        <button on:click=move |_| confirming.set(false)>"Cancel"</button>
                                    </p>
                                </div>
                            }
                        })
                }}
            </td>
        </tr>
    }
}

#[component]
fn Runs(runs: Vec<CleanupRunView>) -> impl IntoView {
    if runs.is_empty() {
        return view! { <p class="empty">"No run yet."</p> }.into_any();
    }
    view! {
        <table class="records" data-testid="cleanup-runs">
            <thead>
                <tr>
                    <th>"Run"</th>
                    <th>"Schedule"</th>
                    <th>"Trigger"</th>
                    <th>"Started"</th>
                    <th class="num">"Rows deleted"</th>
                    <th class="num">"Duration"</th>
                    <th>"Error"</th>
                </tr>
            </thead>
            <tbody>
                {runs
                    .into_iter()
                    .map(|r| {
                        view! {
                            <tr data-run-id=r.id data-finished=r.finished_at.is_some().to_string()>
                                <td class="num">{r.id}</td>
                                <td class="num">{r.schedule_id}</td>
                                <td>{format!("{} ({})", r.trigger, r.actor)}</td>
                                <td>{short_time(&r.started_at)}</td>
                                <td class="num" data-testid="rows-deleted">{count(r.rows_deleted)}</td>
                                <td class="num">
                                    {r.seconds.map(|s| millis((s * 1000.0).round() as i64)).unwrap_or_else(|| "running…".to_owned())}
                                </td>
                                <td class="error">{r.error.unwrap_or_default()}</td>
                            </tr>
                        }
                    })
                    .collect_view()}
            </tbody>
        </table>
    }
    .into_any()
}

#[component]
fn ScheduleForm(
    id: Option<i64>,
    s: ScheduleRequest,
    save: ServerAction<SaveSchedule>,
    editing: RwSignal<Option<(Option<i64>, ScheduleRequest)>>,
) -> impl IntoView {
    let name = RwSignal::new(s.name);
    let cron = RwSignal::new(s.cron);
    let retention = RwSignal::new(s.retention_days.to_string());
    let batch = RwSignal::new(s.batch_size.to_string());
    let statuses = RwSignal::new(s.statuses.join(","));
    let group = RwSignal::new(s.consumer_group.unwrap_or_default());
    let enabled = RwSignal::new(s.enabled);
    let fingerprints = RwSignal::new(s.fingerprint_days.map(|d| d.to_string()).unwrap_or_default());
    let text = |label: &'static str, value: RwSignal<String>, test: &'static str| {
        view! {
            <label>
                {label}
                <input type="text" data-testid=test prop:value=move || value.get() on:input=move |ev| value.set(event_target_value(&ev)) />
            </label>
        }
    };
    let submit = move |_| {
        let number = |v: RwSignal<String>| v.get_untracked().trim().parse::<i32>().unwrap_or(-1);
        save.dispatch(SaveSchedule {
            id,
            schedule: ScheduleRequest {
                name: name.get_untracked(),
                cron: cron.get_untracked(),
                retention_days: number(retention),
                batch_size: number(batch),
                statuses: statuses
                    .get_untracked()
                    .split(',')
                    .map(|s| s.trim().to_owned())
                    .filter(|s| !s.is_empty())
                    .collect(),
                consumer_group: Some(group.get_untracked()).filter(|g| !g.trim().is_empty()),
                enabled: enabled.get_untracked(),
                fingerprint_days: Some(fingerprints).filter(|d| !d.get_untracked().trim().is_empty()).map(number),
            },
        });
    };
    view! {
        <div class="dialog" role="dialog" aria-modal="true" data-testid="schedule-form">
            <h3>{if id.is_some() { "Edit schedule" } else { "New schedule" }}</h3>
            {text("Name", name, "schedule-name")}
            {text("Cron expression (UTC: minute hour day month weekday)", cron, "schedule-cron")}
            {text("Retention (days)", retention, "schedule-retention")}
            {text("Batch size (records per delete)", batch, "schedule-batch")}
            {text("Statuses (comma-separated: succeeded, failed, dead)", statuses, "schedule-statuses")}
            {text("Consumer group (empty: all)", group, "schedule-group")}
            {text("Keep fingerprints of deleted records (days; empty: 10 × retention; 0: none)", fingerprints, "schedule-fingerprints")}
            <label>
                <input type="checkbox" prop:checked=move || enabled.get() on:change=move |ev| enabled.set(event_target_checked(&ev)) />
                " Enabled"
            </label>
            <p class="dialog-buttons">
                <button class="primary" data-testid="schedule-save" disabled=move || save.pending().get() on:click=submit>
                    "Save"
                </button>
                <button on:click=move |_| editing.set(None)>"Close"</button>
            </p>
            {move || {
                save.value().get().and_then(|r| r.err()).map(|e| view! { <p class="error" role="alert" data-testid="schedule-error">{e.to_string()}</p> })
            }}
        </div>
    }
}
