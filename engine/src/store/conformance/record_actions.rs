//! Conformance cases of the operator actions on one record ([`crate::actions::record_action`]
//! through [`crate::actions::RecordBooks`]: release, mark succeeded, dead-letter and requeue)
//! and on one kept copy ([`crate::actions::conflicts::ConflictBooks`]: requeue, dismiss), as
//! guarded compare-and-sets, the status counts following each, every outcome audited; the
//! duplicate drill ([`crate::actions::drill::DrillBooks`]).

use uuid::Uuid;

use super::claims::{claim_one, claimed, complete, existing, fail, lease, msg, record};
use super::roles::{copy, keep};
use super::{GROUP, Harness};
use crate::actions::RecordActionKind::{DeadLetter, MarkSucceeded, Release, Requeue};
use crate::actions::conflicts::{dismiss_conflict, open_conflicts, record_conflicts, requeue_conflict};
use crate::actions::drill::{DrillTarget, drill_report, drill_start};
use crate::actions::{ActionError, HAND_DEAD_LETTER_CLASS, Publishers, RecordAction, record_action};
use crate::audit::AuditFilter;
use crate::console::console_store;
use crate::fastpath::{FastPath, FastPathSettings};
use crate::record::RecordStatus::{Dead, Failed, Processing, Succeeded};
use crate::retry::Backoff;
use crate::store::ConflictKind;
use crate::testing::{TestBroker, amqp_url, redis_url};

/// A test broker, and publishers whose group [`GROUP`] publishes to its exchange (its work
/// queue gets everything published there).
pub(super) fn broker() -> (TestBroker, Publishers) {
    let broker = TestBroker::new(&amqp_url(), Backoff { initial_ms: 1000, max_ms: 1000 });
    let mut publishers = Publishers::default();
    publishers.add(GROUP, broker.connector());
    (broker, publishers)
}

/// A stuck record is released (a stale lease token refused), then marked succeeded (a stale
/// version refused); a failed one is dead-lettered, then requeued through the broker (shown
/// dead a second time: refused, no second copy); two operators at once on one stuck record:
/// one passes. The counts match the rows after each, and the audit log holds every outcome.
pub async fn operators_release_mark_dead_letter_and_requeue_records_by_compare_and_set<H: Harness>() {
    let h = H::fresh().await;
    let pool = h.engine_pool();
    let store = console_store(&pool);
    let (broker, publishers) = broker();
    let l = lease("w1");
    let reason = Some("drill <b>\u{1F6A7}</b>");
    let shown = |record_id, status, lease_token, expected_version| RecordAction {
        record_id,
        expected_status: Some(status),
        lease_token,
        expected_version,
        reason,
        ..RecordAction::default()
    };

    // A stuck record: its worker's lease ran out.
    let stuck_msg = msg("ACT.1", "ORDER.PAY", r#"{"n":1}"#);
    let stuck = claimed(claim_one(&h, &stuck_msg, &l).await);
    h.expire_lease(stuck.id).await;
    let token = record(&h, &stuck_msg).await.lease_token;
    let stale = record_action(store, "user:ann", Release, &shown(stuck.id, Processing, Some(Uuid::new_v4()), None), &publishers).await;
    assert!(matches!(stale, Err(ActionError::StaleLease { .. })), "{stale:?}");
    let released = record_action(store, "user:ann", Release, &shown(stuck.id, Processing, token, None), &publishers).await.unwrap();
    assert_eq!((released.from, released.status, released.republished), (Processing, Failed, false));
    assert_eq!((released.consumer_group.as_str(), released.message_id.as_str()), (GROUP, "ACT.1"));
    let row = record(&h, &stuck_msg).await;
    assert_eq!((row.status.as_str(), row.leased, row.retry_due, row.max_attempts), ("failed", false, false, 3));
    assert_eq!(h.counted().await, h.actual().await);

    let version = row.version;
    let changed = record_action(store, "user:ann", MarkSucceeded, &shown(stuck.id, Failed, None, Some(version - 1)), &publishers).await;
    assert!(matches!(changed, Err(ActionError::Changed { .. })), "{changed:?}");
    let marked = record_action(store, "user:ann", MarkSucceeded, &shown(stuck.id, Failed, None, Some(version)), &publishers).await.unwrap();
    assert_eq!((marked.from, marked.status), (Failed, Succeeded));
    let row = record(&h, &stuck_msg).await;
    assert_eq!((row.status.as_str(), row.has_payload, row.completed, row.version), ("succeeded", false, true, version + 1));
    assert_eq!(h.counted().await, h.actual().await);

    // A failed record, dead-lettered by hand, then requeued through the broker.
    let mut failed_msg = msg("ACT.2", "ORDER.PAY", r#"{"n":2}"#);
    failed_msg.message.source.exchange = Some(broker.settings.exchange.clone());
    let failing = claimed(claim_one(&h, &failed_msg, &l).await);
    fail(&h, &failing, &failed_msg, &l, false).await;
    let dead = record_action(store, "user:ann", DeadLetter, &shown(failing.id, Failed, None, None), &publishers).await.unwrap();
    assert_eq!((dead.from, dead.status), (Failed, Dead));
    let row = record(&h, &failed_msg).await;
    assert_eq!((row.status.as_str(), row.error_class.as_deref(), row.has_payload), ("dead", Some(HAND_DEAD_LETTER_CLASS), true));
    assert!(row.last_error.unwrap_or_default().starts_with("dead-lettered by user:ann: drill"));
    assert_eq!(h.counted().await, h.actual().await);
    let requeued = record_action(store, "user:bob", Requeue, &shown(failing.id, Dead, None, None), &publishers).await.unwrap();
    assert_eq!((requeued.from, requeued.status, requeued.republished), (Dead, Failed, true));
    let row = record(&h, &failed_msg).await;
    assert_eq!((row.status.as_str(), row.retry_due, row.attempts, row.max_attempts), ("failed", true, 1, 3));
    let again = record_action(store, "user:bob", Requeue, &shown(failing.id, Dead, None, None), &publishers).await;
    assert!(matches!(again, Err(ActionError::WrongStatus { actual: Failed, .. })), "{again:?}");
    assert_eq!(broker.depth(&broker.settings.queue).await, 1, "one copy");
    assert_eq!(h.counted().await, h.actual().await);
    let unknown = record_action(store, "user:bob", Requeue, &shown(i64::MAX, Dead, None, None), &publishers).await;
    assert!(matches!(unknown, Err(ActionError::UnknownRecord(i64::MAX))), "{unknown:?}");

    // Two operators at once on one stuck record: the row lock lets one pass.
    let raced_msg = msg("ACT.3", "ORDER.PAY", r#"{"n":3}"#);
    let raced = claimed(claim_one(&h, &raced_msg, &l).await);
    h.expire_lease(raced.id).await;
    let token = record(&h, &raced_msg).await.lease_token;
    let p = shown(raced.id, Processing, token, None);
    let (a, b) = tokio::join!(
        record_action(store, "user:a", Release, &p, &publishers),
        record_action(store, "user:b", DeadLetter, &p, &publishers)
    );
    assert!(a.is_ok() != b.is_ok(), "exactly one of two: {a:?} / {b:?}");
    assert_eq!(h.counted().await, h.actual().await);

    let entries = store.list(&AuditFilter::default()).await.unwrap();
    let mut seen: Vec<(&str, &str)> = entries.iter().rev().map(|e| (e.action.as_str(), e.outcome.as_str())).collect();
    seen.truncate(8); // the race's two entries come in either order
    assert_eq!(
        seen,
        [
            ("record.release", "refused"),
            ("record.release", "ok"),
            ("record.mark_succeeded", "refused"),
            ("record.mark_succeeded", "ok"),
            ("record.dead_letter", "ok"),
            ("record.requeue", "ok"),
            ("record.requeue", "refused"),
            ("record.requeue", "refused"),
        ]
    );
    let ok = entries.iter().rev().find(|e| e.action == "record.release" && e.outcome == "ok").unwrap();
    assert_eq!((ok.reason.as_deref(), ok.consumer_group.as_deref()), (reason, Some(GROUP)));
    assert_eq!(ok.message_ids, ["ACT.1"]);
}

/// Kept copies are listed; a reused id's copy is requeued once under its new id through the
/// broker, a payload copy dismissed with a reason; a settled copy, an unknown one and a
/// dismissal without a reason are refused; the open reused-id copies are found per group.
pub async fn operators_requeue_and_dismiss_kept_copies_once<H: Harness>() {
    let h = H::fresh().await;
    let pool = h.engine_pool();
    let store = console_store(&pool);
    let (broker, publishers) = broker();
    let l = lease("w1");
    let m = msg("COPY.1", "ORDER.PAY", r#"{"n":1}"#);
    let c = claimed(claim_one(&h, &m, &l).await);
    complete(&h, &[&c], &l).await;
    let mut reused = msg("COPY.1", "ORDER.REFUND", r#"{"n":2}"#);
    reused.message.source.exchange = Some(broker.settings.exchange.clone());
    let other = msg("COPY.1", "ORDER.PAY", r#"{"n":3}"#);
    keep(&h, &[copy(c.id, &reused, ConflictKind::Type), copy(c.id, &other, ConflictKind::Payload)], true).await;

    // Oldest first: the order the store kept the batch in (each store sorts it its own way).
    let mut copies = record_conflicts(store, c.id).await.unwrap();
    assert!(copies.windows(2).all(|w| w[0].id < w[1].id));
    copies.sort_by(|a, b| b.kind.cmp(&a.kind));
    let listed: Vec<_> = copies
        .iter()
        .map(|k| (k.kind.as_str(), k.message_type.as_str(), k.payload_excerpt.0.as_str(), k.payload_bytes, k.settled_at))
        .collect();
    assert_eq!(listed, [("type", "ORDER.REFUND", r#"{"n":2}"#, 7, None), ("payload", "ORDER.PAY", r#"{"n":3}"#, 7, None)]);
    assert_eq!((copies[0].consumer_group.as_str(), copies[0].message_id.as_str(), copies[0].copies), (GROUP, "COPY.1", 1));
    let (type_id, payload_id) = (copies[0].id, copies[1].id);
    assert_eq!(open_conflicts(store, Some(GROUP)).await.unwrap(), [type_id], "reused ids only");
    assert_eq!(open_conflicts(store, Some("another-group")).await.unwrap(), Vec::<i64>::new());
    assert_eq!(open_conflicts(store, None).await.unwrap(), [type_id]);

    let new_id = requeue_conflict(store, "user:ann", type_id, &publishers).await.unwrap();
    assert_eq!(new_id, format!("COPY.1#conflict-{type_id}"));
    let again = requeue_conflict(store, "user:ann", type_id, &publishers).await;
    assert!(matches!(again, Err(ActionError::Refused(_))), "{again:?}");
    assert_eq!(broker.depth(&broker.settings.queue).await, 1, "one copy");
    let blank = dismiss_conflict(store, "user:bob", payload_id, "  ").await;
    assert!(matches!(blank, Err(ActionError::Invalid(_))), "{blank:?}");
    dismiss_conflict(store, "user:bob", payload_id, "a producer's retry").await.unwrap();
    let twice = dismiss_conflict(store, "user:bob", payload_id, "again").await;
    assert!(matches!(twice, Err(ActionError::Refused(_))), "{twice:?}");
    let unknown = dismiss_conflict(store, "user:bob", i64::MAX, "x").await;
    assert!(matches!(unknown, Err(ActionError::UnknownJob { .. })), "{unknown:?}");

    let mut copies = record_conflicts(store, c.id).await.unwrap();
    copies.sort_by(|a, b| b.kind.cmp(&a.kind));
    let settled: Vec<_> =
        copies.iter().map(|k| (k.requeued_as.as_deref(), k.settled_by.as_deref(), k.settled_at.is_some())).collect();
    assert_eq!(settled, [(Some(new_id.as_str()), Some("user:ann"), true), (None, Some("user:bob"), true)]);
    assert_eq!(open_conflicts(store, None).await.unwrap(), Vec::<i64>::new());

    let entries = store.list(&AuditFilter::default()).await.unwrap();
    let seen: Vec<(&str, &str)> = entries.iter().rev().map(|e| (e.action.as_str(), e.outcome.as_str())).collect();
    assert_eq!(
        seen,
        [
            ("conflict.requeue", "ok"),
            ("conflict.requeue", "refused"),
            ("conflict.dismiss", "refused"),
            ("conflict.dismiss", "ok"),
            ("conflict.dismiss", "refused"),
            ("conflict.dismiss", "refused"),
        ]
    );
    assert_eq!(entries.last().unwrap().message_ids, ["COPY.1".to_owned(), new_id]);
}

/// A duplicate drill of a succeeded record publishes its copy through the broker and is
/// recorded with the record's counters; once the database catches the copy (a drill payload:
/// a payload conflict too) it passes. A record not succeeded, a type with none and a payload
/// that is not the original are refused.
pub async fn a_duplicate_drill_is_recorded_and_judged_by_its_records_counters<H: Harness>() {
    let h = H::fresh().await;
    let pool = h.engine_pool();
    let store = console_store(&pool);
    let (broker, publishers) = broker();
    let prefix = format!("drill-{}", Uuid::new_v4().simple());
    let fast_path = FastPath::new(&redis_url(), FastPathSettings { prefix, ..FastPathSettings::default() });
    let l = lease("w1");
    let mut m = msg("DRILL.1", "ORDER.PAY", r#"{"n":1}"#);
    m.message.source.exchange = Some(broker.settings.exchange.clone());
    let c = claimed(claim_one(&h, &m, &l).await);
    complete(&h, &[&c], &l).await;
    let failing_msg = msg("DRILL.2", "ORDER.PAY", "x");
    let failing = claimed(claim_one(&h, &failing_msg, &l).await);
    fail(&h, &failing, &failing_msg, &l, false).await;

    let by_ann = |target: DrillTarget, original: Option<&'static [u8]>| {
        let (fast_path, publishers) = (&fast_path, &publishers);
        async move { drill_start(store, fast_path, publishers, "user:ann", &target, original).await }
    };
    let failed = by_ann(DrillTarget::Record(failing.id), None).await;
    assert!(matches!(failed, Err(ActionError::WrongStatus { .. })), "{failed:?}");
    let none = by_ann(DrillTarget::LatestOfType("NO.SUCH".to_owned()), None).await;
    assert!(matches!(none, Err(ActionError::Refused(_))), "{none:?}");
    let not_original = by_ann(DrillTarget::Record(c.id), Some(br#"{"n":2}"#)).await;
    assert!(matches!(not_original, Err(ActionError::Invalid(_))), "{not_original:?}");

    let started = by_ann(DrillTarget::LatestOfType("ORDER.PAY".to_owned()), None).await.unwrap();
    assert_eq!((started.record_id, started.consumer_group.as_str(), started.message_id.as_str()), (c.id, GROUP, "DRILL.1"));
    assert_eq!((started.actor.as_str(), started.status.as_deref(), started.marker_present), ("user:ann", Some("succeeded"), false));
    assert_eq!((started.caught_by.as_deref(), started.duplicates_added, started.attempts_added, started.passed), (None, 0, 0, false));
    assert_eq!(broker.depth(&broker.settings.queue).await, 1, "the copy, once");

    // The copy comes back with the drill payload: the database catches it.
    let copy = msg("DRILL.1", "ORDER.PAY", &format!(r#"{{"messageId":"DRILL.1","drill":{}}}"#, started.id));
    existing(claim_one(&h, &copy, &l).await);
    let report = drill_report(store, started.id).await.unwrap();
    assert_eq!((report.caught_by.as_deref(), report.duplicates_added, report.attempts_added, report.passed), (Some("database"), 1, 0, true));
    let unknown = drill_report(store, i64::MAX).await;
    assert!(matches!(unknown, Err(ActionError::UnknownJob { .. })), "{unknown:?}");

    let entries = store.list(&AuditFilter::default()).await.unwrap();
    let seen: Vec<(&str, &str)> = entries.iter().rev().map(|e| (e.action.as_str(), e.outcome.as_str())).collect();
    let refused = ("record.drill", "refused");
    assert_eq!(seen, [refused, refused, refused, ("record.drill", "ok")]);
}
