//! Records: every dedup record, filtered by consumer group, status, message type, error class,
//! time range and attempts, searched by message id (exact or prefix), sorted by time or
//! attempts, paged by keyset. The filters live in the URL, so a view can be shared; selected
//! rows are kept across pages for the bulk actions.

use std::collections::BTreeSet;

use leptos::prelude::*;
use leptos_router::components::{A, Form};
use leptos_router::hooks::use_query_map;

use crate::base::href;
use crate::components::records_table::RecordsTable;
use crate::error::ConsoleError;
use crate::wire::records::{RecordFilterOptions, RecordPageView, RecordsQuery};

/// One page of records matching `query`.
#[server(prefix = "/api/fn", endpoint = "list_records", client = crate::csrf::CsrfClient)]
pub async fn list_records(#[server(default)] query: RecordsQuery) -> Result<RecordPageView, ConsoleError> {
    crate::ssr::service::console::records(&crate::ssr::service::console_state()?, &query).await
}

/// The consumer groups and message types the filter offers.
#[server(prefix = "/api/fn", endpoint = "get_record_filters", client = crate::csrf::CsrfClient)]
pub async fn get_record_filters() -> Result<RecordFilterOptions, ConsoleError> {
    crate::ssr::service::console::filter_options(&crate::ssr::service::console_state()?).await
}

/// The records page.
#[component]
pub fn RecordsPage() -> impl IntoView {
    let query_map = use_query_map();
    let query = Memo::new(move |_| query_map.with(|m| RecordsQuery::from_lookup(|k| m.get(k))));
    let page = Resource::new(move || query.get(), list_records);
    let options = Resource::new(|| (), |_| get_record_filters());
    let selected = RwSignal::new(BTreeSet::<i64>::new());
    view! {
        <h1>"Records"</h1>
        <Transition fallback=|| ()>
            {move || Suspend::new(async move {
                let options = options.await.unwrap_or_default();
                view! { <FilterForm q=query.get() options /> }
            })}
        </Transition>
        <div class="selection" data-testid="selection">
            <span data-testid="selection-count">
                {move || format!("{} selected", selected.with(BTreeSet::len))}
            </span>
            <button
                type="button"
                disabled=move || selected.with(BTreeSet::is_empty)
                on:click=move |_| selected.set(BTreeSet::new())
            >
                "Clear selection"
            </button>
        </div>
        <Transition fallback=|| view! { <p class="muted">"Loading…"</p> }>
            {move || Suspend::new(async move {
                match page.await {
                    Ok(p) => {
                        let q = query.get_untracked();
                        view! {
                            <RecordsTable rows=p.rows.clone() selected />
                            <Pager q p />
                        }
                            .into_any()
                    }
                    Err(e) => {
                        view! {
                            <p class="error" role="alert" data-testid="records-error">
                                {e.to_string()}
                            </p>
                        }
                            .into_any()
                    }
                }
            })}
        </Transition>
    }
}

/// A `<select>` of `choices` named `name`, with an "any" entry, `current` selected.
#[component]
fn Choice(
    name: &'static str,
    label: &'static str,
    choices: Vec<String>,
    current: Option<String>,
    #[prop(default = "any")] any: &'static str,
) -> impl IntoView {
    let current = current.unwrap_or_default();
    view! {
        <label>
            {label}
            <select name=name data-testid=format!("filter-{name}")>
                <option value="" selected=current.is_empty()>
                    {any}
                </option>
                {choices
                    .into_iter()
                    .map(|c| {
                        let selected = c == current;
                        view! {
                            <option value=c.clone() selected=selected>
                                {c.clone()}
                            </option>
                        }
                    })
                    .collect_view()}
            </select>
        </label>
    }
}

/// The filter form: a GET form, so submitting navigates to `/records?<filters>` (client-side
/// once hydrated); paging cursors are dropped, so new filters start at the first page.
#[component]
fn FilterForm(q: RecordsQuery, options: RecordFilterOptions) -> impl IntoView {
    let text = |name: &'static str, label: &'static str, value: Option<String>, kind: &'static str| {
        view! {
            <label>
                {label}
                <input
                    type=kind
                    name=name
                    value=value.unwrap_or_default()
                    data-testid=format!("filter-{name}")
                />
            </label>
        }
    };
    let statuses = ["processing", "succeeded", "failed", "dead"].map(String::from).to_vec();
    view! {
        <Form action=href("/records") method="get">
            <div class="filters" data-testid="records-filters">
                <Choice name="group" label="Consumer group" choices=options.groups current=q.group.clone() />
                <Choice name="status" label="Status" choices=statuses current=q.status.clone() />
                <Choice
                    name="type"
                    label="Message type"
                    choices=options.message_types
                    current=q.message_type.clone()
                />
                {text("id", "Message id (exact)", q.id.clone(), "search")}
                {text("prefix", "Message id prefix (id order)", q.prefix.clone(), "search")}
                {text("min_attempts", "Attempts ≥", q.min_attempts.clone(), "number")}
                {text("from", "First seen from (UTC)", q.from.clone(), "text")}
                {text("to", "to (UTC)", q.to.clone(), "text")}
                {text("error_class", "Error class", q.error_class.clone(), "text")}
                <Choice name="flag" label="Flag" choices=vec!["double_effect".to_owned(), "late_duplicate".to_owned(), "conflict".to_owned()] current=q.flag.clone() />
                <Choice
                    name="sort"
                    label="Sort by"
                    choices=vec!["attempts".to_owned(), "message_id".to_owned()]
                    current=q.sort.clone()
                    any="time"
                />
                <Choice
                    name="order"
                    label="Order"
                    choices=vec!["asc".to_owned()]
                    current=q.order.clone()
                    any="desc"
                />
                <div class="filter-actions">
                    <button type="submit" class="primary" data-testid="apply-filters">
                        "Apply"
                    </button>
                    <A href=href("/records")>"Reset"</A>
                </div>
            </div>
        </Form>
    }
}

/// Previous / next page links (keyset cursors in the URL).
#[component]
fn Pager(q: RecordsQuery, p: RecordPageView) -> impl IntoView {
    let prev = p.prev.map(|c| href(&q.at_page(None, Some(c)).href()));
    let next = p.next.map(|c| href(&q.at_page(Some(c), None).href()));
    // A filter no index narrows searched a bounded stretch of the table: say so, rather than
    // let an empty or short page read as "no more matches".
    let searched = p.searched_to.map(|id| {
        view! {
            <p class="muted" role="status" data-testid="records-searched-to">
                {format!(
                    "No index narrows this filter in this order, so a page searches a bounded stretch of the records: this one stopped at record #{id}. The next page searches further.",
                )}
            </p>
        }
    });
    view! {
        {searched}
        <nav class="pager" aria-label="Pages">
            {match prev {
                Some(href) => view! { <A href=href attr:data-testid="pager-prev">"← Previous page"</A> }.into_any(),
                None => view! { <span class="muted">"First page"</span> }.into_any(),
            }}
            {match next {
                Some(href) => view! { <A href=href attr:data-testid="pager-next">"Next page →"</A> }.into_any(),
                None => view! { <span class="muted">"Last page"</span> }.into_any(),
            }}
        </nav>
    }
}
