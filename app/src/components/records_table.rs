//! The records table shared by the records, retries and dead-letter pages: one row per record,
//! linking to its detail, with optional selection checkboxes.

use std::collections::BTreeSet;

use leptos::prelude::*;
use leptos_router::components::A;

use super::badge::StatusBadge;
use crate::base::href;
use crate::format::short_time;
use crate::wire::records::RecordSummary;

/// A table of records. With `selected`, each row gets a checkbox and the header one that
/// selects or clears the whole page.
#[component]
pub fn RecordsTable(
    rows: Vec<RecordSummary>,
    #[prop(optional)] selected: Option<RwSignal<BTreeSet<i64>>>,
) -> impl IntoView {
    if rows.is_empty() {
        return view! { <p class="empty" data-testid="no-records">"No records match."</p> }.into_any();
    }
    let page_ids: Vec<i64> = rows.iter().map(|r| r.id).collect();
    let head_box = selected.map(|sel| {
        let ids = page_ids.clone();
        let all_checked = {
            let ids = ids.clone();
            move || sel.with(|s| ids.iter().all(|id| s.contains(id)))
        };
        view! {
            <th class="select">
                <input
                    type="checkbox"
                    aria-label="Select all records on this page"
                    data-testid="select-page"
                    prop:checked=all_checked.clone()
                    on:change=move |_| {
                        let check = !all_checked();
                        sel.update(|s| {
                            for id in &ids {
                                if check {
                                    s.insert(*id);
                                } else {
                                    s.remove(id);
                                }
                            }
                        });
                    }
                />
            </th>
        }
    });
    view! {
        <table class="records" data-testid="records-table">
            <thead>
                <tr>
                    {head_box}
                    <th>"Id"</th>
                    <th>"Message id"</th>
                    <th>"Group"</th>
                    <th>"Type"</th>
                    <th>"Status"</th>
                    <th class="num">"Attempts"</th>
                    <th>"First seen (UTC)"</th>
                    <th>"Error class"</th>
                </tr>
            </thead>
            <tbody>
                {rows.into_iter().map(|r| view! { <RecordRow r selected /> }).collect_view()}
            </tbody>
        </table>
    }
    .into_any()
}

#[component]
fn RecordRow(r: RecordSummary, selected: Option<RwSignal<BTreeSet<i64>>>) -> impl IntoView {
    let id = r.id;
    let status = r.status.clone();
    let select = selected.map(|sel| {
        view! {
            <td class="select">
                <input
                    type="checkbox"
                    aria-label=format!("Select record {id}")
                    prop:checked=move || sel.with(|s| s.contains(&id))
                    on:change=move |_| {
                        sel.update(|s| {
                            if !s.remove(&id) {
                                s.insert(id);
                            }
                        })
                    }
                />
            </td>
        }
    });
    view! {
        <tr data-record-id=id data-status=status>
            {select}
            <td class="num">
                <A href=href(&format!("/records/{id}"))>{id}</A>
            </td>
            <td class="mono">{r.message_id}</td>
            <td>{r.consumer_group}</td>
            <td>{r.message_type}</td>
            <td>
                <StatusBadge status=r.status />
            </td>
            <td class="num">{format!("{}/{}", r.attempts, r.max_attempts)}</td>
            <td>{short_time(&r.first_seen_at)}</td>
            <td class="small">{r.error_class.unwrap_or_default()}</td>
        </tr>
    }
}
