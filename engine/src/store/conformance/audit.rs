//! Conformance cases of the audit log ([`crate::audit::AuditLog`]).

use serde_json::json;

use super::Harness;
use crate::audit::{AuditFilter, AuditOutcome, NewAuditEntry};
use crate::console::console_store;

fn entry<'a>(actor: &'a str, action: &'a str, group: Option<&'a str>, ids: &'a [String]) -> NewAuditEntry<'a> {
    NewAuditEntry {
        actor,
        action,
        outcome: AuditOutcome::Ok,
        reason: None,
        consumer_group: group,
        message_ids: ids,
        detail: json!({}),
        source: Some("10.0.0.1"),
    }
}

/// Entries are kept as written (a NUL as U+FFFD), listed newest first by every filter and
/// page, and found by the records they name, of their group or of none.
pub async fn audit_entries_are_kept_listed_by_filter_and_found_by_message_id<H: Harness>() {
    let h = H::fresh().await;
    let pool = h.engine_pool();
    let log = console_store(&pool);
    let one = ["ORDER.PAY.1".to_owned()];
    let both = ["ORDER.PAY.1".to_owned(), "ORDER.PAY.2".to_owned(), "ORDER.PAY.1".to_owned()];
    let hostile = format!("<script>alert(1)</script> \u{1F600} nul:\0 {}", "x".repeat(10_000));
    let mut first = entry("user:alice", "record.release", Some("g"), &one);
    first.reason = Some(&hostile);
    first.detail = json!({ "counts": { "done": 3 }, "text": "a\0b", "ids": [1, 2] });
    let a = log.record(&first).await.unwrap();
    let b = log.record(&entry("user:bob", "record.requeue", Some("g"), &both)).await.unwrap();
    let c = log.record(&entry("user:alice", "record%x", Some("other"), &one)).await.unwrap();
    let mut refused = entry("anonymous", "auth.login_failed", None, &one);
    refused.outcome = AuditOutcome::Refused;
    let d = log.record(&refused).await.unwrap();
    assert!(a < b && b < c && c < d);

    let all = log.list(&AuditFilter::default()).await.unwrap();
    assert_eq!(all.iter().map(|e| e.id).collect::<Vec<_>>(), [d, c, b, a], "newest first");
    let kept = &all[3];
    assert_eq!(kept.reason.as_deref(), Some(hostile.replace('\0', "\u{FFFD}").as_str()));
    assert_eq!(kept.detail, json!({ "counts": { "done": 3 }, "text": "a\u{FFFD}b", "ids": [1, 2] }));
    assert_eq!((kept.actor.as_str(), kept.outcome.as_str(), kept.source.as_deref()), ("user:alice", "ok", Some("10.0.0.1")));
    assert_eq!(all[2].message_ids, both, "as written");
    assert!(all[0].consumer_group.is_none() && all[0].outcome == "refused");

    let ids = |f: AuditFilter| async move { log.list(&f).await.unwrap().into_iter().map(|e| e.id).collect::<Vec<_>>() };
    assert_eq!(ids(AuditFilter { actor: Some("user:alice".into()), ..Default::default() }).await, [c, a]);
    assert_eq!(ids(AuditFilter { actor: Some("USER:ALICE".into()), ..Default::default() }).await, [0i64; 0], "exact");
    assert_eq!(ids(AuditFilter { action_prefix: Some("record.".into()), ..Default::default() }).await, [b, a]);
    assert_eq!(ids(AuditFilter { action_prefix: Some("record%".into()), ..Default::default() }).await, [c], "literal %");
    assert_eq!(ids(AuditFilter { outcome: Some(AuditOutcome::Refused), ..Default::default() }).await, [d]);
    assert_eq!(ids(AuditFilter { before_id: Some(c), limit: Some(1), ..Default::default() }).await, [b], "keyset page");
    let at = all[1].at;
    assert_eq!(ids(AuditFilter { since: Some(at), until: Some(at + chrono::TimeDelta::microseconds(1)), ..Default::default() }).await, [c]);

    let found = |group: &'static str, id: &'static str| async move {
        log.for_message(group, id).await.unwrap().into_iter().map(|e| e.id).collect::<Vec<_>>()
    };
    assert_eq!(found("g", "ORDER.PAY.1").await, [d, b, a], "of its group or of none");
    assert_eq!(found("g", "ORDER.PAY.2").await, [b]);
    assert_eq!(found("other", "ORDER.PAY.1").await, [d, c]);
    assert_eq!(found("g", "order.pay.1").await, [0i64; 0], "ids compare exactly");
}
