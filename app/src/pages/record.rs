//! Record detail (`/records/:id`): every field, the payload (pretty JSON, text or hex — always
//! shown as text, never as markup), headers and source, the attempt history with errors,
//! duplicates and their delay, and the Redis marker next to the database state.

use leptos::prelude::*;
use leptos_router::hooks::use_params_map;

use crate::components::badge::StatusBadge;
use crate::components::conflicts::Conflicts;
use crate::components::drill::DrillButton;
use crate::components::record_actions::{ActionTarget, RecordActions};
use crate::error::ConsoleError;
use crate::format::{count, duration, millis, opt_time, short_time};
use crate::pages::audit::AuditTable;
use crate::wire::operations::AuditEntryView;
use crate::wire::records::{AttemptView, MarkerView, PayloadView, RecordDetailView, SourceView};

/// One record with its history and marker.
#[server(prefix = "/api/fn", endpoint = "get_record", client = crate::csrf::CsrfClient)]
pub async fn get_record(id: i64) -> Result<RecordDetailView, ConsoleError> {
    crate::ssr::service::console::record(&crate::ssr::service::console_state()?, id).await
}

/// The audit entries naming a record. Role: viewer.
#[server(prefix = "/api/fn", endpoint = "get_record_audit", client = crate::csrf::CsrfClient)]
pub async fn get_record_audit(group: String, message_id: String) -> Result<Vec<AuditEntryView>, ConsoleError> {
    crate::ssr::service::operations::record_audit(&crate::ssr::service::console_state()?, &group, &message_id).await
}

/// The record detail page.
#[component]
pub fn RecordPage() -> impl IntoView {
    let params = use_params_map();
    let id = Memo::new(move |_| params.with(|p| p.get("id")).and_then(|s| s.parse::<i64>().ok()));
    // Bumped by every completed action, so the page shows the record's new state.
    let changed = RwSignal::new(0usize);
    let record = Resource::new(
        move || (id.get(), changed.get()),
        |(id, _)| async move {
            match id {
                Some(id) => get_record(id).await,
                None => Err(ConsoleError::BadRequest("record ids are whole numbers".to_owned())),
            }
        },
    );
    view! {
        <Transition fallback=|| view! { <p class="muted">"Loading…"</p> }>
            {move || Suspend::new(async move {
                match record.await {
                    Ok(r) => view! { <Detail r on_done=move || changed.update(|n| *n += 1) /> }.into_any(),
                    Err(e) => {
                        view! {
                            <h1>"Record"</h1>
                            <p class="error" role="alert">
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

/// A term/definition pair; `—` when the value is absent.
fn fact(term: &'static str, value: Option<String>) -> impl IntoView {
    view! {
        <dt>{term}</dt>
        <dd>{value.unwrap_or_else(|| "—".to_owned())}</dd>
    }
}

#[component]
fn Detail(r: RecordDetailView, #[prop(into)] on_done: Callback<()>) -> impl IntoView {
    let s = r.record.clone();
    let target = ActionTarget {
        id: s.id,
        message_id: s.message_id.clone(),
        status: s.status.clone(),
        lease_token: r.lease_token.clone(),
        lease_expired: r.lease_expired,
        version: Some(r.version),
    };
    let succeeded = s.status == "succeeded";
    // Redeliveries the dedup absorbed without calling the far side (HTTP handlers).
    let absorbed = (r.calls > 0 && s.duplicate_count > 0).then(|| absorbed_text(s.duplicate_count, r.calls));
    let (audit_group, audit_message_id) = (s.consumer_group.clone(), s.message_id.clone());
    let record_id = s.id;
    view! {
        <h1>
            "Record " {s.id} " " <StatusBadge status=s.status.clone() />
        </h1>
        {r.possible_double_effect
            .then(|| {
                view! {
                    <p class="error" role="alert" data-testid="double-effect">
                        "Possible double effect: an attempt's effect ran after its lease was lost ("
                        {r.takeovers} " takeover(s)). Check the effect (the SMS, the e-mail, the call) before acting."
                    </p>
                }
            })}
        {r.late_duplicate
            .map(|l| {
                let what = if l.held {
                    "Held for an operator (late_duplicates = \"hold\"): release it to run its handler again, or mark it succeeded if the first delivery's effect stands."
                } else {
                    "Its handler ran again: check that the business change guarded against a second effect."
                };
                view! {
                    <p class="error" role="alert" data-testid="late-duplicate">
                        {format!(
                            "Late duplicate: a copy of a message first seen {} ({} before this copy), whose record cleanup had deleted. ",
                            crate::format::short_time(&l.first_seen_at),
                            crate::format::millis(l.delay_ms),
                        )}
                        {what}
                    </p>
                }
            })}
        {absorbed.map(|text| view! { <p class="ok" data-testid="redeliveries-absorbed">{text}</p> })}
        <RecordActions target on_done />
        <Conflicts conflicts=r.conflicts.clone() on_done />
        {succeeded.then(|| view! { <DrillButton record_id /> })}
        <p class="mono" data-testid="record-message-id">
            {s.message_id.clone()}
        </p>
        <div class="columns">
            <section class="panel" aria-labelledby="db-title">
                <h2 id="db-title">"Database state"</h2>
                <dl class="facts" data-testid="record-facts">
                    {fact("Consumer group", Some(s.consumer_group))}
                    {fact("Message type", Some(s.message_type))}
                    {fact("Status", Some(s.status))}
                    {fact("Handler mode", s.handler_mode)}
                    {fact("Attempts", Some(format!("{} of {}", s.attempts, s.max_attempts)))}
                    {fact("Re-entries after expired lease", Some(r.reentries.to_string()))}
                    {fact("First seen", Some(short_time(&s.first_seen_at)))}
                    {fact("Updated", Some(short_time(&s.updated_at)))}
                    {fact("Completed", r.completed_at.as_deref().map(short_time))}
                    {fact("Next attempt", s.next_attempt_at.as_deref().map(short_time))}
                    {fact("Lease owner", r.lease_owner)}
                    {fact("Lease token", r.lease_token)}
                    {fact(
                        "Lease expires",
                        r.lease_expires_at
                            .as_deref()
                            .map(|t| {
                                format!("{}{}", short_time(t), if r.lease_expired { " (expired: stuck)" } else { "" })
                            }),
                    )}
                    {fact("Parked redelivery", r.parked_at.as_deref().map(short_time))}
                    {fact("Error class", s.error_class)}
                </dl>
            </section>
            <section class="panel" aria-labelledby="dup-title">
                <h2 id="dup-title">"Duplicates and fast path"</h2>
                <dl class="facts">
                    {fact("Duplicate deliveries", Some(s.duplicate_count.to_string()))}
                    {(r.calls > 0).then(|| fact("Calls of the service", Some(r.calls.to_string())))}
                    {fact("Last duplicate", r.last_duplicate_at.as_deref().map(short_time))}
                    {fact("Its delay after first seen", r.last_duplicate_delay_ms.map(millis))}
                    {fact("Payload conflicts", Some(r.payload_conflicts.to_string()))}
                    {fact("Redis key", Some(r.marker_key))}
                </dl>
                <Marker m=r.marker />
                <h3>"Source"</h3>
                <dl class="facts" data-testid="record-source">
                    {source_facts(r.source)}
                    {fact("Content type", r.content_type)}
                </dl>
            </section>
        </div>
        {r
            .last_error
            .map(|e| {
                view! {
                    <section class="panel" aria-labelledby="error-title">
                        <h2 id="error-title">"Last error"</h2>
                        <pre class="code error">{e}</pre>
                    </section>
                }
            })}
        <section class="panel" aria-labelledby="payload-title">
            <h2 id="payload-title">"Payload"</h2>
            <Payload p=r.payload truncated=r.payload_truncated hash=r.payload_hash />
            <h3>"Headers"</h3>
            <pre class="code" data-testid="record-headers">
                {r.headers.unwrap_or_else(|| "(not kept: the record succeeded)".to_owned())}
            </pre>
        </section>
        <section class="panel" aria-labelledby="history-title">
            <h2 id="history-title">"Attempt history"</h2>
            <History attempts=r.attempts />
        </section>
        <section class="panel" aria-labelledby="audit-title">
            <h2 id="audit-title">"Audit entries"</h2>
            <RecordAudit group=audit_group message_id=audit_message_id />
        </section>
    }
}

#[component]
fn Marker(m: MarkerView) -> impl IntoView {
    let text = match (m.state.as_str(), m.ttl_secs) {
        ("present", Some(ttl)) => format!("expires in {}", duration(ttl)),
        ("present", None) => "no expiry".to_owned(),
        ("absent", _) => "a duplicate would be judged by the database".to_owned(),
        _ => m.error.unwrap_or_default(),
    };
    let class = if m.state == "present" { "badge badge-up" } else { "badge badge-processing" };
    let state = m.state.clone();
    view! {
        <p data-testid="marker" data-state=state>
            "Redis marker: " <span class=class>{m.state}</span> " " {text}
        </p>
    }
}

#[component]
fn Payload(p: Option<PayloadView>, truncated: bool, hash: String) -> impl IntoView {
    match p {
        None => view! {
            <p class="empty">"Not kept: a succeeded record drops its payload."</p>
            <p class="muted small mono">"SHA-256 " {hash}</p>
        }
        .into_any(),
        Some(p) => view! {
            <p class="muted small">
                {format!("{} bytes, shown as {}", p.bytes, p.format)}
                {truncated.then_some(" (truncated: only the start was kept)")} " · SHA-256 "
                <span class="mono">{hash}</span>
            </p>
            // A text node: Leptos escapes it, so markup in a payload is shown, never run.
            <pre class="code" data-testid="record-payload" data-format=p.format>
                {p.text}
            </pre>
        }
        .into_any(),
    }
}

#[component]
fn History(attempts: Vec<AttemptView>) -> impl IntoView {
    if attempts.is_empty() {
        return view! { <p class="empty">"No attempts recorded."</p> }.into_any();
    }
    view! {
        <ol class="timeline" data-testid="attempts">
            {attempts
                .into_iter()
                .map(|a| {
                    let outcome = a.outcome.clone().unwrap_or_else(|| "running or abandoned".to_owned());
                    let data_outcome = outcome.clone();
                    let taken_over =
                        a.taken_over_by.clone().map(|by| format!(" (taken over by {by})")).unwrap_or_default();
                    let flag = match outcome.as_str() {
                        "deferred" => Some((
                            "badge badge-processing",
                            "deferred: the service was still working on it; not counted",
                        )),
                        "lease_lost" => Some(("badge badge-down", "lease lost")),
                        _ => None,
                    };
                    view! {
                        <li data-outcome=data_outcome data-late-effect=a.late_effect.to_string()>
                            <strong>{format!("Attempt {}", a.attempt)}</strong>
                            " · "
                            {outcome}
                            {taken_over}
                            {flag
                                .map(|(class, text)| {
                                    view! { " " <span class=class data-testid="attempt-flag">{text}</span> }
                                })}
                            {a.late_effect
                                .then(|| view! { <span class="badge badge-down">"effect ran after the lease was lost"</span> })}
                            " · "
                            {short_time(&a.started_at)}
                            " → "
                            {opt_time(a.ended_at.as_deref())}
                            " · "
                            <span class="mono small">{a.worker.clone()}</span>
                            <CallAnswer a=a.clone() />
                            {a.error.map(|e| view! { <pre class="code error small">{e}</pre> })}
                        </li>
                    }
                })
                .collect_view()}
        </ol>
    }
    .into_any()
}

/// What the far side answered on one attempt (HTTP handlers): status, latency, answer class,
/// and the body excerpt or transport error — a text node, escaped, never markup. Nothing for
/// attempts that made no call.
#[component]
fn CallAnswer(a: AttemptView) -> impl IntoView {
    let status = a.answer_status.map_or_else(|| "no answer".to_owned(), |s| format!("HTTP {s}"));
    let data_status = a.answer_status.map(|s| s.to_string()).unwrap_or_default();
    let class = a.answer_class.unwrap_or_default();
    let data_class = class.clone();
    let answer = a.answer.filter(|t| !t.is_empty());
    a.latency_ms.map(|latency| {
        view! {
            <div class="small" data-testid="attempt-answer" data-status=data_status data-class=data_class>
                <strong>{status}</strong>
                " · "
                {format!("{} ms", count(i64::from(latency)))}
                {(!class.is_empty()).then(|| view! { " · " <span class="mono">{class}</span> })}
                {answer
                    .map(|text| {
                        view! {
                            <details>
                                <summary>{format!("Answer ({} characters)", text.chars().count())}</summary>
                                <pre class="code small" data-testid="attempt-answer-text">
                                    {text}
                                </pre>
                            </details>
                        }
                    })}
            </div>
        }
    })
}

/// "3 redeliveries absorbed; the service was called once".
fn absorbed_text(redeliveries: i32, calls: usize) -> String {
    let redeliveries =
        if redeliveries == 1 { "1 redelivery".to_owned() } else { format!("{redeliveries} redeliveries") };
    let calls = match calls {
        1 => "once".to_owned(),
        2 => "twice".to_owned(),
        n => format!("{n} times"),
    };
    format!("{redeliveries} absorbed; the service was called {calls}")
}

#[component]
fn RecordAudit(group: String, message_id: String) -> impl IntoView {
    let entries = Resource::new(move || (group.clone(), message_id.clone()), |(g, m)| get_record_audit(g, m));
    view! {
        <Transition fallback=|| view! { <p class="muted">"Loading…"</p> }>
            {move || Suspend::new(async move {
                match entries.await {
                    Ok(entries) => view! { <AuditTable entries /> }.into_any(),
                    Err(e) => view! { <p class="error">{e.to_string()}</p> }.into_any(),
                }
            })}
        </Transition>
    }
}

/// Where the record came from, in its broker's terms: exchange, routing key and queue
/// (RabbitMQ), or topic, key and partition (Kafka); and where its message id was found.
fn source_facts(source: SourceView) -> impl IntoView {
    let [place, key, queue] =
        if source.broker == "kafka" { ["Topic", "Key", "Partition"] } else { ["Exchange", "Routing key", "Queue"] };
    view! {
        {fact("Broker", Some(source.broker))}
        {fact(place, source.exchange)}
        {fact(key, source.routing_key)}
        {fact(queue, source.queue)}
        {fact("Id from", source.id_from)}
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn absorbed_redeliveries_read_well() {
        assert_eq!(super::absorbed_text(3, 1), "3 redeliveries absorbed; the service was called once");
        assert_eq!(super::absorbed_text(1, 2), "1 redelivery absorbed; the service was called twice");
        assert_eq!(super::absorbed_text(7, 4), "7 redeliveries absorbed; the service was called 4 times");
    }
}
