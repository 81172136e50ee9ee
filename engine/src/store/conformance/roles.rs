//! Conformance cases of what the pipeline asks of a store beyond claims and leases
//! (`store/roles.rs`): conflicting copies ([`ConflictCopies`]), fingerprints and late
//! duplicates ([`LateFingerprints`]), handler pauses ([`PauseBooks`]).

use chrono::{DateTime, Utc};

use super::claims::{claim_one, claimed, complete, existing, group, lease, msg, record, Msg};
use super::{ConflictRow, GROUP, Harness, assert_counts};
use crate::console::console_store;
use crate::message::IdSourceKind;
use crate::record::{ConsumerGroup, HandlerMode};
use crate::store::DedupStore;
use crate::store::{ConflictCopy, ConflictKind, HeldDelivery, LATE_DUPLICATE_CLASS, MAX_OPEN_PAYLOAD_COPIES};
use crate::store::roles::{ConflictCopies, LateFingerprints, PauseBooks};

/// PostgreSQL's `dedup_fingerprint(GROUP, 'ORDER.PAY', 'ORDER.PAY.1:1')`: the first 8 bytes of
/// MD5("conformance-group\nORDER.PAY\nORDER.PAY.1:1"), `ffcdb1c67693cc48`, as a signed integer.
/// A number rather than the case's database computing it, so that a store whose fingerprint is
/// not PostgreSQL's finds nothing.
const PAY_1_FINGERPRINT: i64 = -14_159_757_861_204_920;

const DAY_MS: i64 = 86_400_000;

/// 40 days ago, in whole seconds (stored exactly by every database).
fn forty_days_ago() -> DateTime<Utc> {
    DateTime::from_timestamp(Utc::now().timestamp() - 40 * 86_400, 0).expect("a valid time")
}

/// A delay measured from [`forty_days_ago`] a moment ago.
fn about_forty_days(delay_ms: i64) -> bool {
    (40 * DAY_MS..40 * DAY_MS + 60_000).contains(&delay_ms)
}

/// A copy of `m` conflicting with record `record_id`, its id from the Kafka key.
pub(super) fn copy(record_id: i64, m: &Msg, kind: ConflictKind) -> ConflictCopy<'_> {
    ConflictCopy {
        record_id,
        message_id: m.id.as_str(),
        kind,
        message_type: m.message_type,
        id_source: "key".to_owned(),
        payload_hash: &m.hash,
        message: &m.message,
    }
}

/// Keeps `copies` in a transaction of the caller's, committed or rolled back.
pub(super) async fn keep<H: Harness>(h: &H, copies: &[ConflictCopy<'_>], commit: bool) {
    let mut tx = h.store().pool().begin().await.unwrap();
    h.store().keep_conflicts(&mut *tx, &group(), copies).await.expect("the copies are kept");
    if commit { tx.commit().await.unwrap() } else { tx.rollback().await.unwrap() }
}

/// The (kind, payload, copies, open) of record `id`'s copies, sorted.
async fn kept<H: Harness>(h: &H, id: i64) -> Vec<(String, String, i32, bool)> {
    let rows = h.conflicts(id).await.into_iter();
    let mut rows: Vec<_> =
        rows.map(|r| (r.kind, String::from_utf8(r.payload).unwrap(), r.copies, r.open)).collect();
    rows.sort();
    rows
}

fn row(kind: &str, payload: &str, copies: i32, open: bool) -> (String, String, i32, bool) {
    (kind.to_owned(), payload.to_owned(), copies, open)
}

/// Copies are kept on the caller's connection (gone with its rollback), one row per record and
/// payload with how many came; a copy of an open row counts on it, one of a settled row opens a
/// new one; a record keeps at most [`MAX_OPEN_PAYLOAD_COPIES`] open payload conflicts, while a
/// reused id's copy is always kept. The whole message is stored.
pub async fn conflicting_copies_are_kept_one_open_row_per_record_and_payload<H: Harness>() {
    let h = H::fresh().await;
    let lease = lease("w");
    let m = msg("ORDER.PAY.1:1", "ORDER.PAY", r#"{"n":1}"#);
    let c = claimed(claim_one(&h, &m, &lease).await);
    complete(&h, &[&c], &lease).await;
    let mut other = msg("ORDER.PAY.1:1", "ORDER.PAY", r#"{"n":2}"#);
    other.message.headers.insert("x-trace".to_owned(), serde_json::json!({ "span": [1, 2] }));
    let create = msg("ORDER.PAY.1:1", "ORDER.CREATE", r#"{"n":1}"#);

    keep(&h, &[copy(c.id, &other, ConflictKind::Payload)], false).await;
    assert_eq!(kept(&h, c.id).await, [], "rolled back with the caller's transaction");
    let batch = [
        copy(c.id, &other, ConflictKind::Payload),
        copy(c.id, &create, ConflictKind::Type),
        copy(c.id, &other, ConflictKind::Payload),
    ];
    keep(&h, &batch, true).await;
    assert_eq!(kept(&h, c.id).await, [row("payload", r#"{"n":2}"#, 2, true), row("type", r#"{"n":1}"#, 1, true)]);
    let stored = h.conflicts(c.id).await.into_iter().find(|r| r.kind == "payload").unwrap();
    let headers: serde_json::Value = serde_json::from_str(stored.headers.as_deref().unwrap()).unwrap();
    assert_eq!(
        ConflictRow { headers: None, ..stored },
        ConflictRow {
            kind: "payload".to_owned(),
            message_type: "ORDER.PAY".to_owned(),
            id_source: "key".to_owned(),
            payload: br#"{"n":2}"#.to_vec(),
            headers: None,
            source_broker: "rabbitmq".to_owned(),
            copies: 2,
            open: true,
        }
    );
    assert_eq!(headers, serde_json::Value::Object(other.message.headers.clone()));

    keep(&h, &[copy(c.id, &other, ConflictKind::Payload)], true).await;
    assert_eq!(kept(&h, c.id).await[0], row("payload", r#"{"n":2}"#, 3, true), "counted on its open row");
    h.settle_conflicts(c.id).await;
    keep(&h, &[copy(c.id, &other, ConflictKind::Payload)], true).await;
    assert_eq!(
        kept(&h, c.id).await,
        [row("payload", r#"{"n":2}"#, 1, true), row("payload", r#"{"n":2}"#, 3, false), row("type", r#"{"n":1}"#, 1, false)],
        "a copy after its row was settled opens a new one"
    );

    let more: Vec<Msg> = (3..10).map(|n| msg("ORDER.PAY.1:1", "ORDER.PAY", &format!(r#"{{"n":{n}}}"#))).collect();
    for m in &more {
        keep(&h, &[copy(c.id, m, ConflictKind::Payload)], true).await;
    }
    let reused = msg("ORDER.PAY.1:1", "ORDER.REFUND", r#"{"n":10}"#);
    keep(&h, &[copy(c.id, &reused, ConflictKind::Type)], true).await;
    let rows = kept(&h, c.id).await;
    let open_payloads = rows.iter().filter(|r| r.0 == "payload" && r.3).count();
    assert_eq!(i64::try_from(open_payloads).unwrap(), MAX_OPEN_PAYLOAD_COPIES, "{rows:?}");
    assert!(rows.contains(&row("type", r#"{"n":10}"#, 1, true)), "a reused id's copy past the limit: {rows:?}");
    assert_counts(&h, "keeping copies").await;
}

/// Eight copies of one record and payload kept at once, each on a connection of its own (as
/// leased batches keep theirs) and two of them in pairs, make one open row counting every copy,
/// with no error (no deadlock between the inserts of one new key).
pub async fn eight_copies_kept_at_once_make_one_row_counting_them_all<H: Harness>() {
    let h = H::fresh().await;
    let lease = lease("w");
    let m = msg("ORDER.PAY.1:1", "ORDER.PAY", r#"{"n":1}"#);
    let c = claimed(claim_one(&h, &m, &lease).await);
    let other = msg("ORDER.PAY.1:1", "ORDER.PAY", r#"{"n":2}"#);
    let group = group();
    let one = |n: usize| {
        let (h, other, group) = (&h, &other, &group);
        async move {
            let copies = vec![copy(c.id, other, ConflictKind::Payload); n];
            let mut conn = h.store().pool().acquire().await?;
            h.store().keep_conflicts(&mut *conn, group, &copies).await
        }
    };
    let kept_at_once = futures::future::join_all((0..8).map(|i| one(if i < 2 { 2 } else { 1 }))).await;
    assert!(kept_at_once.iter().all(Result::is_ok), "{kept_at_once:?}");
    assert_eq!(kept(&h, c.id).await, [row("payload", r#"{"n":2}"#, 10, true)]);
}

/// A fingerprint matches the deliveries of its group, message type and id only (the same
/// fingerprint as PostgreSQL's); a record created since its sighting is noted as a late
/// duplicate once, with its delay; a record first seen before the sighting is none.
pub async fn a_fingerprint_matches_its_group_type_and_id_and_its_late_duplicate_is_noted_once<H: Harness>() {
    let h = H::fresh().await;
    let store = h.store();
    let seen = forty_days_ago();
    h.keep_fingerprint(PAY_1_FINGERPRINT, seen).await;
    let ids = ["ORDER.PAY.1:1", "ORDER.PAY.1:1", "ORDER.PAY.2:1"];
    let types = ["ORDER.PAY", "ORDER.CREATE", "ORDER.PAY"];
    let matches = store.fingerprint_matches(&group(), &ids, &types).await.unwrap();
    assert_eq!(matches, [("ORDER.PAY.1:1".to_owned(), seen)]);
    let elsewhere = ConsumerGroup::parse("another-group").unwrap();
    assert_eq!(store.fingerprint_matches(&elsewhere, &ids, &types).await.unwrap(), []);
    assert_eq!(store.note_late_duplicates(&group(), &matches).await.unwrap(), Vec::<i64>::new(), "no record yet");

    let lease = lease("w");
    let m = msg("ORDER.PAY.1:1", "ORDER.PAY", r#"{"n":1}"#);
    let c = claimed(claim_one(&h, &m, &lease).await);
    complete(&h, &[&c], &lease).await;
    let delays = store.note_late_duplicates(&group(), &matches).await.unwrap();
    assert!(delays.len() == 1 && about_forty_days(delays[0]), "{delays:?}");
    assert_eq!(store.note_late_duplicates(&group(), &matches).await.unwrap(), Vec::<i64>::new(), "noted once");
    assert_eq!(h.late_duplicates().await, [(c.id, delays[0], false)]);

    let m2 = msg("ORDER.PAY.2:1", "ORDER.PAY", r#"{"n":2}"#);
    claimed(claim_one(&h, &m2, &lease).await);
    let later = vec![("ORDER.PAY.2:1".to_owned(), Utc::now() + chrono::Duration::days(1))];
    assert_eq!(store.note_late_duplicates(&group(), &later).await.unwrap(), Vec::<i64>::new(), "seen before");
    assert_eq!(h.late_duplicates().await.len(), 1);
}

/// A late duplicate held is a new record `processing`, parked under an expired lease no worker
/// owns, with its whole message and the `LATE_DUPLICATE` class, counted and noted as held; a
/// second hold of its id finds the record and changes nothing; a leased claim that may reclaim
/// expired leases does not take it over.
pub async fn a_late_duplicate_held_is_a_parked_record_with_its_message_and_its_note<H: Harness>() {
    let h = H::fresh().await;
    let m = msg("ORDER.PAY.1:1", "ORDER.PAY", r#"{"n":1}"#);
    let group = group();
    let held = HeldDelivery {
        group: &group,
        message_id: &m.id,
        message_type: m.message_type,
        handler_mode: HandlerMode::Leased,
        max_attempts: 3,
        payload_hash: &m.hash,
        message: &m.message,
        id_source: IdSourceKind::Key,
        first_seen_at: forty_days_ago(),
    };
    let (id, delay_ms) = h.store().hold_late_duplicate(&held).await.unwrap().expect("a new record");
    assert!(about_forty_days(delay_ms), "{delay_ms}");
    let r = record(&h, &m).await;
    assert_eq!(
        (r.id, r.status.as_str(), r.attempts, r.max_attempts, r.parked, r.leased, r.has_payload),
        (id, "processing", 0, 3, true, true, true)
    );
    assert_eq!((r.error_class.as_deref(), r.id_source.as_deref()), (Some(LATE_DUPLICATE_CLASS), Some("k")));
    assert!(r.last_error.as_deref().is_some_and(|e| e.starts_with("late duplicate")), "{r:?}");
    assert_eq!(h.late_duplicates().await, [(id, delay_ms, true)]);
    let note = console_store(&h.engine_pool()).late_duplicate_note(id).await.unwrap().expect("the console reads it");
    assert_eq!((note.0, note.1, note.2), (forty_days_ago(), delay_ms, true));
    assert_eq!(h.message_types().await, ["ORDER.PAY"]);
    assert_counts(&h, "holding a late duplicate").await;

    assert_eq!(h.store().hold_late_duplicate(&held).await.unwrap(), None, "its record exists");
    assert_eq!(h.late_duplicates().await, [(id, delay_ms, true)]);
    assert_counts(&h, "holding it again").await;

    let taken = super::leases::claim_leased(&h, &m, &lease("reclaimer"), true).await;
    assert_eq!(existing(taken).id, id);
    let r = record(&h, &m).await;
    assert_eq!((r.status.as_str(), r.attempts, r.parked), ("processing", 0, true), "only an operator runs it");
    assert_counts(&h, "a reclaiming claim").await;
}

/// A group's handlers are registered `running` (a registration again keeps the state, updates
/// the kind); only the others are read as paused; a breaker's probe is taken by one caller per
/// interval, an operator's pause has none.
pub async fn handlers_register_running_and_the_paused_are_read_and_probed_once<H: Harness>() {
    let h = H::fresh().await;
    let book = h.store().pause_book();
    let handlers = [("ORDER.PAY".to_owned(), "transactional"), ("ORDER.NOTIFY".to_owned(), "leased")];
    book.register(GROUP, &handlers).await.unwrap();
    assert_eq!(book.paused(GROUP).await.unwrap(), []);
    let pay = h.pause_row(GROUP, "ORDER.PAY").await.expect("registered");
    assert_eq!((pay.state.as_str(), pay.kind.as_deref(), pay.version), ("running", Some("transactional"), 1));

    h.set_pause_state(GROUP, "ORDER.PAY", "operator").await;
    book.register(GROUP, &[("ORDER.PAY".to_owned(), "http")]).await.unwrap();
    let pay = h.pause_row(GROUP, "ORDER.PAY").await.unwrap();
    assert_eq!((pay.state.as_str(), pay.kind.as_deref(), pay.version), ("operator", Some("http"), 2));
    assert_eq!(book.paused(GROUP).await.unwrap(), [("ORDER.PAY".to_owned(), "operator".to_owned(), None)]);
    assert_eq!(book.paused("another-group").await.unwrap(), []);
    assert_eq!(book.take_probe(GROUP, "ORDER.PAY", 60_000).await.unwrap(), None, "an operator's pause");

    h.set_pause_state(GROUP, "ORDER.NOTIFY", "breaker").await;
    let before = Utc::now();
    let probe = book.take_probe(GROUP, "ORDER.NOTIFY", 60_000).await.unwrap().expect("due: never probed");
    assert!(probe > before + chrono::Duration::seconds(50), "the next one a probe interval on: {probe}");
    assert_eq!(book.take_probe(GROUP, "ORDER.NOTIFY", 60_000).await.unwrap(), None, "taken");
    let mut paused = book.paused(GROUP).await.unwrap();
    paused.sort();
    assert_eq!(
        paused,
        [
            ("ORDER.NOTIFY".to_owned(), "breaker".to_owned(), Some(probe)),
            ("ORDER.PAY".to_owned(), "operator".to_owned(), None)
        ]
    );
}

#[cfg(feature = "http")]
/// The engine's pause (a breaker's, a 410's) is stored with its failure and read; the same
/// pause again keeps its probe time and version; a probe's success ends a breaker's pause only;
/// a 410's pause is not turned into a breaker's, and an operator's is never overridden.
pub async fn an_engine_pause_is_stored_and_ended_by_a_probe_never_over_an_operators<H: Harness>() {
    use crate::store::roles::EnginePause;
    let h = H::fresh().await;
    let book = h.store().pause_book();
    book.register(GROUP, &[("ORDER.PAY".to_owned(), "http")]).await.unwrap();
    let pause = |message_type, state| EnginePause {
        group: GROUP,
        message_type,
        state,
        reason: "HTTP 503 from the charge service",
        error_class: "HTTP_UNAVAILABLE",
        http_status: Some(503),
        probe_interval_ms: 60_000,
    };
    let before = Utc::now();
    let (state, probe) = book.pause(&pause("ORDER.PAY", "breaker")).await.unwrap().expect("paused");
    let probe = probe.expect("a breaker's pause has a probe time");
    assert!(state == "breaker" && probe > before + chrono::Duration::seconds(50), "{state} {probe}");
    assert_eq!(book.paused(GROUP).await.unwrap(), [("ORDER.PAY".to_owned(), "breaker".to_owned(), Some(probe))]);
    let row = h.pause_row(GROUP, "ORDER.PAY").await.unwrap();
    assert_eq!(
        (row.changed_by.as_deref(), row.error_class.as_deref(), row.http_status, row.version),
        (Some("engine"), Some("HTTP_UNAVAILABLE"), Some(503), 2)
    );
    let again = book.pause(&pause("ORDER.PAY", "breaker")).await.unwrap();
    assert_eq!(again, Some(("breaker".to_owned(), Some(probe))), "a failed probe keeps the probe time");
    assert_eq!(h.pause_row(GROUP, "ORDER.PAY").await.unwrap().version, 2);

    assert!(book.resume_after_probe(GROUP, "ORDER.PAY").await.unwrap());
    assert_eq!(book.paused(GROUP).await.unwrap(), []);
    assert!(!book.resume_after_probe(GROUP, "ORDER.PAY").await.unwrap(), "running already");

    assert_eq!(book.pause(&pause("ORDER.PAY", "gone")).await.unwrap(), Some(("gone".to_owned(), None)));
    assert_eq!(book.pause(&pause("ORDER.PAY", "breaker")).await.unwrap(), None, "a 410's pause stands");
    assert!(!book.resume_after_probe(GROUP, "ORDER.PAY").await.unwrap(), "only an operator resumes a 410's");
    h.set_pause_state(GROUP, "ORDER.PAY", "operator").await;
    assert_eq!(book.pause(&pause("ORDER.PAY", "gone")).await.unwrap(), None, "an operator's pause stands");
    assert_eq!(h.pause_row(GROUP, "ORDER.PAY").await.unwrap().state, "operator");

    let refund = book.pause(&pause("ORDER.REFUND", "breaker")).await.unwrap();
    assert!(refund.is_some_and(|(s, p)| s == "breaker" && p.is_some()), "an unregistered handler gets its row");
}

/// An operator pauses and resumes a handler by a guarded compare-and-set audited in the same
/// transaction; a stale version, a state that does not allow it, an unknown handler or a missing
/// reason change nothing and are audited as refused; a hostile reason is kept as typed.
pub async fn an_operator_pauses_and_resumes_a_handler_by_compare_and_set_audited<H: Harness>() {
    use crate::actions::ActionError;
    use crate::actions::handlers::{HandlerControl, handler_control};
    use crate::console::console_store;
    use crate::audit::AuditFilter;

    let h = H::fresh().await;
    h.store().pause_book().register(GROUP, &[("ORDER.PAY".to_owned(), "http")]).await.unwrap();
    let pool = h.engine_pool();
    let store = console_store(&pool);
    let listed = store.handler_pauses().await.unwrap();
    assert_eq!(listed.len(), 1);
    let shown = &listed[0];
    assert_eq!((shown.consumer_group.as_str(), shown.message_type.as_str(), shown.state.as_str()), (GROUP, "ORDER.PAY", "running"));

    let reason = "drill <script>alert(1)</script> \u{1F6A7}";
    let control = |c, reason, version| handler_control(store, "user:olga", GROUP, "ORDER.PAY", c, reason, version);
    let stale = control(HandlerControl::Pause, Some(reason), Some(shown.version + 1)).await;
    assert!(matches!(stale, Err(ActionError::Refused(ref m)) if m.contains("changed since it was shown")), "{stale:?}");
    let paused = control(HandlerControl::Pause, Some(reason), Some(shown.version)).await.unwrap();
    assert_eq!((paused.state.as_str(), paused.version, paused.changed_by.as_deref()), ("operator", shown.version + 1, Some("user:olga")));
    assert_eq!(paused.reason.as_deref(), Some(reason));
    assert_eq!(h.pause_row(GROUP, "ORDER.PAY").await.unwrap().state, "operator");
    let again = control(HandlerControl::Pause, Some("again"), None).await;
    assert!(matches!(again, Err(ActionError::Refused(ref m)) if m.contains("is operator")), "{again:?}");
    assert!(matches!(control(HandlerControl::Resume, None, None).await, Err(ActionError::Invalid(_))));
    let unknown = handler_control(store, "user:olga", GROUP, "NO.SUCH", HandlerControl::Pause, Some("x"), None).await;
    assert!(matches!(unknown, Err(ActionError::UnknownHandler { .. })), "{unknown:?}");
    let resumed = control(HandlerControl::Resume, Some("drill over"), None).await.unwrap();
    assert_eq!((resumed.state.as_str(), resumed.version), ("running", shown.version + 2));

    let entries = store.list(&AuditFilter::default()).await.unwrap();
    let seen: Vec<(&str, &str)> = entries.iter().rev().map(|e| (e.action.as_str(), e.outcome.as_str())).collect();
    assert_eq!(
        seen,
        [
            ("handler.pause", "refused"),
            ("handler.pause", "ok"),
            ("handler.pause", "refused"),
            ("handler.resume", "refused"),
            ("handler.pause", "refused"),
            ("handler.resume", "ok"),
        ]
    );
    let ok = &entries[4];
    assert_eq!((ok.reason.as_deref(), ok.consumer_group.as_deref()), (Some(reason), Some(GROUP)));
    assert_eq!(ok.detail["from"], "running");

    // Two operators at once: the row lock lets one pass, the other finds it paused.
    let (a, b) = tokio::join!(control(HandlerControl::Pause, Some("a"), None), control(HandlerControl::Pause, Some("b"), None));
    assert!(a.is_ok() != b.is_ok(), "exactly one of two concurrent pauses: {a:?} {b:?}");
}
