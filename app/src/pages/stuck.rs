//! Stuck: `processing` records whose lease expired by the database clock, longest stuck first,
//! with the lease owner, attempts, handler mode, and a crash-loop flag for records that keep
//! re-entering processing.

use leptos::prelude::*;
use leptos_router::components::A;

use crate::base::href;
use crate::components::record_actions::{ActionTarget, RecordActions};
use crate::error::ConsoleError;
use crate::format::{count, duration, opt_time, short_time};
use crate::wire::failures::{StuckRecordView, StuckView};

/// The stuck records.
#[server(prefix = "/api/fn", endpoint = "list_stuck", client = crate::csrf::CsrfClient)]
pub async fn list_stuck() -> Result<StuckView, ConsoleError> {
    crate::ssr::service::console::stuck(&crate::ssr::service::console_state()?).await
}

/// The stuck page.
#[component]
pub fn StuckPage() -> impl IntoView {
    // Bumped by every completed action, so the list drops records that were acted on.
    let changed = RwSignal::new(0usize);
    let stuck = Resource::new(move || changed.get(), |_| list_stuck());
    view! {
        <h1>"Stuck"</h1>
        <p class="muted">
            "Records in processing whose lease has expired (database clock): their worker died or "
            "outlived its lease. Leased handlers under " <code>"on_lease_expiry = hold"</code>
            " wait here for an operator."
        </p>
        <Transition fallback=|| view! { <p class="muted">"Loading…"</p> }>
            {move || Suspend::new(async move {
                match stuck.await {
                    Ok(s) => view! { <StuckTable s on_done=move || changed.update(|n| *n += 1) /> }.into_any(),
                    Err(e) => view! { <p class="error">{e.to_string()}</p> }.into_any(),
                }
            })}
        </Transition>
    }
}

#[component]
fn StuckTable(s: StuckView, #[prop(into)] on_done: Callback<()>) -> impl IntoView {
    if s.rows.is_empty() {
        return view! { <p class="empty" data-testid="no-stuck">"Nothing is stuck."</p> }.into_any();
    }
    let shown = s.rows.len() as i64;
    view! {
        <p data-testid="stuck-total" data-value=s.total>
            {format!("{} stuck", count(s.total))}
            {(s.total > shown).then(|| format!(", the {shown} longest stuck shown"))}
        </p>
        <table class="records" data-testid="stuck-table">
            <thead>
                <tr>
                    <th>"Id"</th>
                    <th>"Message id"</th>
                    <th>"Group"</th>
                    <th>"Mode"</th>
                    <th>"Lease owner"</th>
                    <th>"Stuck for"</th>
                    <th class="num">"Attempts"</th>
                    <th class="num">"Re-entries"</th>
                    <th>"Parked"</th>
                    <th>"Actions"</th>
                </tr>
            </thead>
            <tbody>{s.rows.into_iter().map(|r| view! { <StuckRow r on_done /> }).collect_view()}</tbody>
        </table>
    }
    .into_any()
}

#[component]
fn StuckRow(r: StuckRecordView, on_done: Callback<()>) -> impl IntoView {
    let target = ActionTarget {
        id: r.id,
        message_id: r.message_id.clone(),
        status: "processing".to_owned(),
        lease_token: Some(r.lease_token.clone()),
        lease_expired: true,
        version: None,
    };
    view! {
        <tr data-record-id=r.id data-crash-loop=r.crash_loop.to_string()>
            <td class="num">
                <A href=href(&format!("/records/{}", r.id))>{r.id}</A>
            </td>
            <td class="mono">{r.message_id}</td>
            <td>{r.consumer_group}</td>
            <td>{r.handler_mode.unwrap_or_default()}</td>
            <td class="mono">{r.lease_owner.unwrap_or_default()}</td>
            <td title=format!("lease expired {}", short_time(&r.lease_expires_at))>{duration(r.stuck_secs)}</td>
            <td class="num">{format!("{}/{}", r.attempts, r.max_attempts)}</td>
            <td class="num">
                {r.reentries}
                {r
                    .crash_loop
                    .then(|| {
                        view! {
                            " "
                            <span class="badge badge-dead" title="keeps re-entering processing">
                                "crash loop"
                            </span>
                        }
                    })}
            </td>
            <td>{opt_time(r.parked_at.as_deref())}</td>
            <td>
                <RecordActions target on_done />
            </td>
        </tr>
    }
}
