//! Audit (`/audit`): every operator action (who, when, action, reason, records or filter,
//! counts, outcome), newest first, filtered by actor, action, outcome and time, paged by entry id.

use leptos::prelude::*;
use leptos_router::components::{A, Form};
use leptos_router::hooks::use_query_map;

use crate::base::href;
use crate::error::ConsoleError;
use crate::format::short_time;
use crate::wire::operations::{AuditEntryView, AuditPageView, AuditQuery};

/// One page of the audit log. Role: viewer.
#[server(prefix = "/api/fn", endpoint = "get_audit", client = crate::csrf::CsrfClient)]
pub async fn get_audit(#[server(default)] q: AuditQuery) -> Result<AuditPageView, ConsoleError> {
    crate::ssr::service::operations::audit_page(&crate::ssr::service::console_state()?, &q).await
}

fn query_href(q: &AuditQuery) -> String {
    let pairs = [
        ("actor", &q.actor),
        ("action", &q.action),
        ("outcome", &q.outcome),
        ("from", &q.from),
        ("to", &q.to),
        ("before", &q.before),
    ];
    let query: Vec<String> =
        pairs.iter().filter_map(|(k, v)| v.as_ref().map(|v| format!("{k}={}", encode_query(v)))).collect();
    if query.is_empty() { href("/audit") } else { href(&format!("/audit?{}", query.join("&"))) }
}

/// Percent-encodes a query value (unreserved characters kept).
fn encode_query(value: &str) -> String {
    value
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// The audit page.
#[component]
pub fn AuditPage() -> impl IntoView {
    let map = use_query_map();
    let query = Memo::new(move |_| {
        map.with(|m| {
            let get = |k: &str| m.get(k).filter(|v| !v.trim().is_empty());
            AuditQuery {
                actor: get("actor"),
                action: get("action"),
                outcome: get("outcome"),
                from: get("from"),
                to: get("to"),
                before: get("before"),
            }
        })
    });
    let page = Resource::new(move || query.get(), get_audit);
    view! {
        <h1>"Audit"</h1>
        {move || view! { <Filters q=query.get() /> }}
        <Transition fallback=|| view! { <p class="muted">"Loading…"</p> }>
            {move || Suspend::new(async move {
                match page.await {
                    Ok(p) => {
                        let next = p.next.clone().map(|before| query_href(&AuditQuery { before: Some(before), ..query.get_untracked() }));
                        view! {
                            <AuditTable entries=p.entries />
                            <p class="pager">{next.map(|href| view! { <A href=href>"Older entries →"</A> })}</p>
                        }
                            .into_any()
                    }
                    Err(e) => view! { <p class="error" role="alert">{e.to_string()}</p> }.into_any(),
                }
            })}
        </Transition>
    }
}

#[component]
fn Filters(q: AuditQuery) -> impl IntoView {
    let outcome = q.outcome.clone().unwrap_or_default();
    view! {
        <Form action=href("/audit") method="get">
            <div class="filters">
                <label>"Actor" <input name="actor" value=q.actor.unwrap_or_default() placeholder="console" /></label>
                <label>"Action starts with" <input name="action" value=q.action.unwrap_or_default() placeholder="record." /></label>
                <label>
                    "Outcome"
                    <select name="outcome">
                        {["", "ok", "refused", "failed"]
                            .into_iter()
                            .map(|o| view! { <option value=o selected=o == outcome>{if o.is_empty() { "any" } else { o }}</option> })
                            .collect_view()}
                    </select>
                </label>
                <label>"From (UTC)" <input name="from" value=q.from.unwrap_or_default() placeholder="2026-01-31T08:00" /></label>
                <label>"To (UTC)" <input name="to" value=q.to.unwrap_or_default() /></label>
                <div class="filter-actions">
                    <button class="primary" type="submit">"Filter"</button>
                    <A href=href("/audit")>"Clear"</A>
                </div>
            </div>
        </Form>
    }
}

/// Audit entries as a table (also on the record detail page).
#[component]
pub fn AuditTable(entries: Vec<AuditEntryView>) -> impl IntoView {
    if entries.is_empty() {
        return view! { <p class="empty" data-testid="no-audit">"No audit entries."</p> }.into_any();
    }
    view! {
        <table class="records" data-testid="audit-table">
            <thead>
                <tr>
                    <th>"When"</th>
                    <th>"Actor"</th>
                    <th>"Action"</th>
                    <th>"Outcome"</th>
                    <th>"Reason"</th>
                    <th>"Records"</th>
                    <th>"Detail"</th>
                </tr>
            </thead>
            <tbody>
                {entries
                    .into_iter()
                    .map(|e| {
                        let badge = match e.outcome.as_str() {
                            "ok" => "badge badge-succeeded",
                            "refused" => "badge badge-failed",
                            _ => "badge badge-dead",
                        };
                        let records = match e.message_count {
                            0 => String::new(),
                            n if n > e.message_ids.len() => format!("{} … ({n})", e.message_ids.join(", ")),
                            _ => e.message_ids.join(", "),
                        };
                        let (action, outcome) = (e.action.clone(), e.outcome.clone());
                        view! {
                            <tr data-audit-id=e.id data-action=action data-outcome=outcome>
                                <td>{short_time(&e.at)}</td>
                                <td class="mono">{e.actor}</td>
                                <td class="mono">{e.action}</td>
                                <td><span class=badge>{e.outcome}</span></td>
                                <td>{e.reason.unwrap_or_default()}</td>
                                <td class="mono small">{records}</td>
                                <td class="mono small">{e.detail}</td>
                            </tr>
                        }
                    })
                    .collect_view()}
            </tbody>
        </table>
    }
    .into_any()
}
