//! Dead letters grouped by error class (error kind + first line, numbers masked): each group's
//! size, first and last seen, and message types, with a link to its records. HTTP handlers'
//! error classes are shown apart, under their answer class: conflict (422), refused (other
//! 4xx), exhausted retries, transport.

use leptos::prelude::*;
use leptos_router::components::A;

use crate::base::href;
use crate::components::bulk_requeue::BulkRequeue;
use crate::error::ConsoleError;
use crate::format::{count, short_time};
use crate::wire::failures::DeadLetterGroupView;
use crate::wire::records::RecordsQuery;

/// Dead letters grouped by error class: HTTP handlers' classes first, then largest group first.
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

/// The answer classes of HTTP handlers' dead letters: URL value, label, what it means.
const ANSWER_CLASSES: [(&str, &str, &str); 4] = [
    (
        "conflict",
        "Conflict (422)",
        "the key was used before with another payload, or the payload failed the service's validation",
    ),
    ("refused", "Refused (4xx)", "another 4xx, or a 2xx answering dead"),
    ("exhausted", "Exhausted retries", "retried answers (5xx, 429, 409 past its limit, …) until the attempts ran out"),
    ("transport", "Transport", "timeouts and connection errors until the attempts ran out"),
];

#[component]
fn Groups(groups: Vec<DeadLetterGroupView>) -> impl IntoView {
    if groups.is_empty() {
        return view! { <p class="empty" data-testid="no-dead-letters">"No dead letters."</p> }.into_any();
    }
    let (http, other): (Vec<_>, Vec<_>) = groups.into_iter().partition(|g| g.answer_class.is_some());
    view! {
        {(!http.is_empty()).then(|| view! { <HttpGroups groups=http /> })}
        {(!other.is_empty())
            .then(|| {
                view! {
                    <h2>"By error class"</h2>
                    <table class="records" data-testid="dead-letter-groups">
                        <GroupsHead />
                        <tbody>{other.into_iter().map(group_row).collect_view()}</tbody>
                    </table>
                }
            })}
    }
    .into_any()
}

/// HTTP handlers' dead letters by answer class, each class's error classes under it.
#[component]
fn HttpGroups(groups: Vec<DeadLetterGroupView>) -> impl IntoView {
    view! {
        <h2>"HTTP handlers, by answer class"</h2>
        <table class="records" data-testid="dead-letter-answer-classes">
            <GroupsHead />
            {ANSWER_CLASSES
                .into_iter()
                .filter_map(|(key, label, meaning)| {
                    let rows: Vec<_> =
                        groups.iter().filter(|g| g.answer_class.as_deref() == Some(key)).cloned().collect();
                    if rows.is_empty() {
                        return None;
                    }
                    let total: i64 = rows.iter().map(|g| g.records).sum();
                    Some(view! {
                        <tbody data-answer-class=key>
                            <tr>
                                <th scope="rowgroup" colspan="6">
                                    {label} " · " <span data-testid="answer-class-records">{count(total)}</span>
                                    " records · " <span class="muted">{meaning}</span>
                                </th>
                            </tr>
                            {rows.into_iter().map(group_row).collect_view()}
                        </tbody>
                    })
                })
                .collect_view()}
        </table>
    }
}

#[component]
fn GroupsHead() -> impl IntoView {
    view! {
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
    }
}

/// One error class: a link to its records, its numbers, a bulk requeue of them.
fn group_row(g: DeadLetterGroupView) -> impl IntoView {
    let drill =
        RecordsQuery { status: Some("dead".to_owned()), error_class: g.error_class.clone(), ..RecordsQuery::default() };
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
}
