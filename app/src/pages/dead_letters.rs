//! Dead letters grouped by error class (error kind + first line, numbers masked): each group's
//! size, first and last seen, and message types, with a link to its records.

use leptos::prelude::*;
use leptos_router::components::A;

use crate::base::href;
use crate::components::bulk_requeue::BulkRequeue;
use crate::error::ConsoleError;
use crate::format::{count, short_time};
use crate::wire::failures::DeadLetterGroupView;
use crate::wire::records::RecordsQuery;

/// Dead letters grouped by error class, largest group first.
#[server(prefix = "/api/fn", endpoint = "list_dead_letter_groups", client = crate::csrf::CsrfClient)]
pub async fn list_dead_letter_groups() -> Result<Vec<DeadLetterGroupView>, ConsoleError> {
    crate::ssr::service::console::dead_letters(&crate::ssr::service::console_state()?).await
}

/// The dead-letters page.
#[component]
pub fn DeadLettersPage() -> impl IntoView {
    let groups = Resource::new(|| (), |_| list_dead_letter_groups());
    view! {
        <h1>"Dead letters"</h1>
        <p class="muted">
            "Records whose attempts ran out, and poison messages. Each waits for an operator. "
            "Requeue a group after fixing its cause: a preview shows the exact count first."
        </p>
        <p>
            <BulkRequeue
                filter=RecordsQuery { status: Some("dead".to_owned()), ..RecordsQuery::default() }
                label="all dead letters"
            />
        </p>
        <Transition fallback=|| view! { <p class="muted">"Loading…"</p> }>
            {move || Suspend::new(async move {
                match groups.await {
                    Ok(g) => view! { <Groups groups=g /> }.into_any(),
                    Err(e) => view! { <p class="error">{e.to_string()}</p> }.into_any(),
                }
            })}
        </Transition>
    }
}

#[component]
fn Groups(groups: Vec<DeadLetterGroupView>) -> impl IntoView {
    if groups.is_empty() {
        return view! { <p class="empty" data-testid="no-dead-letters">"No dead letters."</p> }.into_any();
    }
    view! {
        <table class="records" data-testid="dead-letter-groups">
            <thead>
                <tr>
                    <th>"Error class"</th>
                    <th class="num">"Records"</th>
                    <th>"First seen"</th>
                    <th>"Last seen"</th>
                    <th>"Message types"</th>
                    <th>"Actions"</th>
                </tr>
            </thead>
            <tbody>
                {groups
                    .into_iter()
                    .map(|g| {
                        let drill = RecordsQuery {
                            status: Some("dead".to_owned()),
                            error_class: g.error_class.clone(),
                            ..RecordsQuery::default()
                        };
                        let label = g.error_class.clone().unwrap_or_else(|| "(no error class)".to_owned());
                        let requeue_label = format!("dead letters of {label}");
                        let filter = drill.clone();
                        view! {
                            <tr>
                                <td>
                                    <A href=href(&drill.href())>{label}</A>
                                </td>
                                <td class="num">{count(g.records)}</td>
                                <td>{short_time(&g.first_seen_at)}</td>
                                <td>{short_time(&g.last_seen_at)}</td>
                                <td>{g.message_types.join(", ")}</td>
                                <td>
                                    <BulkRequeue filter label=requeue_label />
                                </td>
                            </tr>
                        }
                    })
                    .collect_view()}
            </tbody>
        </table>
    }
    .into_any()
}
