//! Conformance cases of the endpoint cards' reads ([`crate::console::endpoints::EndpointReads`]).

use std::time::Duration;

use super::claims::{claimed, lease, msg};
use super::leases::{claim_leased, failure};
use super::{GROUP, Harness};
use crate::console::console_store;
use crate::console::endpoints::EndpointReads;
use crate::handler::EffectAnswer;
use crate::record::HandlerMode;
use crate::store::DedupStore;

/// An endpoint's calls are counted by the answer table, with their latencies' percentiles; an
/// endpoint without calls reads as zeros.
pub async fn endpoint_calls_are_summed_by_the_answer_table<H: Harness>() {
    let h = H::fresh().await;
    let pool = h.engine_pool();
    let reads: &dyn EndpointReads = console_store(&pool);
    let l = lease("worker-1");
    // (id, status, permanent, completed): latencies 10, 20, … ms in this order.
    let calls: [(&str, Option<u16>, bool, bool); 7] = [
        ("E.1", Some(503), false, false),
        ("E.2", None, false, false),
        ("E.3", Some(422), true, false),
        ("E.4", Some(409), false, false),
        ("E.5", Some(200), false, true),
        ("E.6", Some(302), false, false),
        ("E.7", Some(410), true, false),
    ];
    for (n, (id, status, permanent, completed)) in calls.into_iter().enumerate() {
        let m = msg(id, "HOOK", id);
        let claim = claimed(claim_leased(&h, &m, &l, false).await);
        let answer =
            EffectAnswer { status, latency: Duration::from_millis(10 * (n as u64 + 1)), summary: "answer".to_owned() };
        let mut conn = h.store().pool().acquire().await.unwrap();
        if completed {
            assert!(h.store().complete(&mut *conn, &claim, &l, HandlerMode::Leased, Some(&answer)).await.unwrap());
        } else {
            let mut report = failure(&claim, &m, &l, Some(&answer));
            report.permanent = permanent;
            h.store().fail_claimed(&mut *conn, &report).await.unwrap();
        }
    }
    let cards = reads.endpoint_calls(&[(GROUP, "HOOK"), (GROUP, "QUIET")]).await.unwrap();
    let c = &cards[0];
    assert_eq!((c.consumer_group.as_str(), c.message_type.as_str()), (GROUP, "HOOK"));
    let counts = [c.calls, c.succeeded, c.in_progress, c.conflict, c.refused, c.unavailable, c.transport, c.other];
    assert_eq!(counts, [7, 1, 1, 1, 1, 1, 1, 1], "calls, then each class once");
    assert_eq!((c.p50_ms, c.p95_ms), (Some(40), Some(70)));
    assert!(c.oldest_at.is_some());
    let quiet = &cards[1];
    assert_eq!((quiet.message_type.as_str(), quiet.calls, quiet.p50_ms, quiet.oldest_at), ("QUIET", 0, None, None));
    assert!(reads.endpoint_calls(&[]).await.unwrap().is_empty());
}
