//! Conformance cases of the records list ([`crate::console::records::RecordReads`] under
//! [`crate::console::records::records_list`]).

use chrono::{TimeDelta, Utc};

use super::claims::{claim_in, claim_one, claimed, complete, fail, lease, msg};
use super::roles::{copy, keep};
use super::{GROUP, Harness};
use crate::console::filter::{PageAt, RecordFilter, RecordFlag, RecordListParams, SortKey, SortOrder};
use crate::console::console_store;
use crate::console::records::{INDEX_SCAN_WINDOW, RecordReads, record_detail, records_list};
use crate::console::seed::{SeedDomain, SeedParams, seed_records};
use crate::record::{ConsumerGroup, RecordStatus};
use crate::store::ConflictKind;
use crate::store::ClaimAs;

/// The other consumer group of the case.
const OTHER: &str = "other-group";

/// Message ids of a page.
async fn ids(reads: &dyn RecordReads, params: &RecordListParams) -> Vec<String> {
    records_list(reads, params).await.unwrap().rows.into_iter().map(|r| r.message_id).collect()
}

fn filtered(filter: RecordFilter) -> RecordListParams {
    RecordListParams { filter, limit: 50, ..Default::default() }
}

/// Every filter, the three orders both ways, and keyset pages forwards and back, over records of
/// every status in two groups: the same rows on every database, ids ordered by their bytes.
pub async fn the_records_list_filters_orders_and_pages_alike<H: Harness>() {
    let h = H::fresh().await;
    let pool = h.engine_pool();
    let reads = console_store(&pool);
    assert!(records_list(reads, &filtered(RecordFilter::default())).await.unwrap().rows.is_empty());

    let l = lease("worker-1");
    let m = |id: &str| msg(id, "ORDER.PAY", id);
    let (a1, a2, a3, a4, a5) = (m("A.1"), m("A.2"), m("A.3"), m("A.4"), m("A.5"));
    let c1 = claimed(claim_one(&h, &a1, &l).await);
    let c2 = claimed(claim_one(&h, &a2, &l).await);
    complete(&h, &[&c1, &c2], &l).await;
    fail(&h, &claimed(claim_one(&h, &a3, &l).await), &a3, &l, false).await;
    fail(&h, &claimed(claim_one(&h, &a3, &l).await), &a3, &l, false).await;
    fail(&h, &claimed(claim_one(&h, &a4, &l).await), &a4, &l, true).await;
    claimed(claim_one(&h, &a5, &l).await);
    // Another group, straight into succeeded; "a.1" sorts after "B.1" by bytes, and "A.5" is
    // also a message id of the first group (the id breaks the tie).
    let other = ConsumerGroup::parse(OTHER).unwrap();
    for id in ["B.1", "a.1", "A.5"] {
        claim_in(&h, &other, &[&msg(id, "ORDER.SHIP", id)], ClaimAs::Succeeded, &l).await;
    }
    keep(&h, &[copy(c1.id, &msg("A.1", "ORDER.PAY", "another payload"), ConflictKind::Payload)], true).await;

    let newest_first = ["A.5", "a.1", "B.1", "A.5", "A.4", "A.3", "A.2", "A.1"];
    assert_eq!(ids(reads, &filtered(RecordFilter::default())).await, newest_first);
    let by = |f: fn(&mut RecordFilter)| {
        let mut filter = RecordFilter::default();
        f(&mut filter);
        filtered(filter)
    };
    let cases: [(RecordListParams, &[&str]); 12] = [
        (by(|f| f.status = Some(RecordStatus::Failed)), &["A.3"]),
        (by(|f| f.status = Some(RecordStatus::Dead)), &["A.4"]),
        (by(|f| f.status = Some(RecordStatus::Processing)), &["A.5"]),
        (by(|f| f.status = Some(RecordStatus::Succeeded)), &["A.5", "a.1", "B.1", "A.2", "A.1"]),
        (by(|f| f.group = Some(OTHER.into())), &["A.5", "a.1", "B.1"]),
        (by(|f| f.message_type = Some("ORDER.SHIP".into())), &["A.5", "a.1", "B.1"]),
        (by(|f| f.error_class = Some("BOOM".into())), &["A.4", "A.3"]),
        (by(|f| f.message_id = Some("a.1".into())), &["a.1"]),
        (by(|f| f.id_prefix = Some("A.".into())), &["A.5", "A.5", "A.4", "A.3", "A.2", "A.1"]),
        (by(|f| f.min_attempts = Some(2)), &["A.3"]),
        (by(|f| f.flag = Some(RecordFlag::Conflict)), &["A.1"]),
        (by(|f| f.to = Some(Utc::now() - TimeDelta::hours(1))), &[]),
    ];
    for (params, expected) in cases {
        assert_eq!(ids(reads, &params).await, expected, "{:?}", params.filter);
    }
    let recent = filtered(RecordFilter { from: Some(Utc::now() - TimeDelta::hours(1)), group: Some(GROUP.into()), ..Default::default() });
    assert_eq!(ids(reads, &recent).await.len(), 5);

    // Pages of three, forwards then back, in each order.
    for (sort, order, expected) in [
        (SortKey::Time, SortOrder::Desc, newest_first.to_vec()),
        (SortKey::MessageId, SortOrder::Asc, vec!["A.1", "A.2", "A.3", "A.4", "A.5", "A.5", "B.1", "a.1"]),
        (SortKey::MessageId, SortOrder::Desc, vec!["a.1", "B.1", "A.5", "A.5", "A.4", "A.3", "A.2", "A.1"]),
    ] {
        let params = |at| RecordListParams { sort, order, at, limit: 3, ..Default::default() };
        let first = records_list(reads, &params(PageAt::First)).await.unwrap();
        let second = records_list(reads, &params(PageAt::After(first.next.clone().unwrap()))).await.unwrap();
        let third = records_list(reads, &params(PageAt::After(second.next.clone().unwrap()))).await.unwrap();
        let all: Vec<String> = [&first, &second, &third].iter().flat_map(|p| p.rows.iter().map(|r| r.message_id.clone())).collect();
        assert_eq!(all, expected, "{sort:?} {order:?}");
        assert!(third.next.is_none(), "{sort:?} {order:?}: the last page");
        let back = records_list(reads, &params(PageAt::Before(second.prev.clone().unwrap()))).await.unwrap();
        assert_eq!(back.rows, first.rows, "{sort:?} {order:?}: back to the first page");
    }
    let most_tried = RecordListParams { sort: SortKey::Attempts, limit: 50, ..Default::default() };
    let rows = records_list(reads, &most_tried).await.unwrap().rows;
    assert_eq!((rows.len(), rows[0].message_id.as_str(), rows[0].attempts), (8, "A.3", 2));
    assert!(rows.windows(2).all(|w| (w[0].attempts, w[0].id) > (w[1].attempts, w[1].id)), "attempts, then id, descending");
    let row = rows.iter().find(|r| r.message_id == "A.4").unwrap();
    assert_eq!((row.consumer_group.as_str(), row.status, row.error_class.as_deref()), (GROUP, RecordStatus::Dead, Some("BOOM")));

    // One record in full.
    let id_of = |message_id: &str| rows.iter().find(|r| r.message_id == message_id && r.consumer_group == GROUP).unwrap().id;
    let failed = record_detail(reads, id_of("A.3")).await.unwrap().expect("a record");
    let hex: String = a3.hash.iter().map(|b| format!("{b:02x}")).collect();
    assert_eq!((failed.payload_hash.as_str(), failed.payload.as_deref()), (hex.as_str(), Some("A.3".as_bytes())));
    assert_eq!((failed.source_broker.as_str(), failed.lease_token, failed.lease_expired), ("rabbitmq", None, false));
    assert_eq!((failed.last_error.as_deref(), failed.version > 0, failed.id_source().is_some()), (Some("boom"), true, true));
    let history: Vec<(i32, Option<&str>, &str)> =
        failed.attempt_history.iter().map(|a| (a.attempt, a.outcome.as_deref(), a.worker.as_str())).collect();
    assert_eq!(history, [(1, Some("failed"), "worker-1"), (2, Some("failed"), "worker-1")]);
    let running = record_detail(reads, id_of("A.5")).await.unwrap().unwrap();
    assert!(running.lease_token.is_some() && !running.lease_expired && running.lease_owner.as_deref() == Some("worker-1"));
    let paid = record_detail(reads, id_of("A.1")).await.unwrap().unwrap();
    assert!(paid.completed_at.is_some() && paid.payload_conflicts == 0 && paid.last_duplicate_delay_ms.is_none());
    assert!(record_detail(reads, -1).await.unwrap().is_none());
}

/// A time range reads the records first seen in it, on a table whose ids a store may turn the
/// range into (PostgreSQL's `dedup_records_id_at`, MySQL's binary search over the primary key):
/// records a day apart, each time range's ends between two of them, in every order.
pub async fn a_time_range_lists_the_records_first_seen_in_it<H: Harness>() {
    let h = H::fresh().await;
    let pool = h.engine_pool();
    let reads = console_store(&pool);
    let l = lease("worker-1");
    let names = ["D.6", "D.5", "D.4", "D.3", "D.2", "D.1", "D.0"];
    for (days, name) in (0..).zip(names) {
        let c = claimed(claim_one(&h, &msg(name, "ORDER.PAY", name), &l).await);
        complete(&h, &[&c], &l).await;
        // D.6 first, six days ago: ids follow first sightings, as arrivals make them.
        h.age_record(c.id, 6 - days).await;
    }
    let now = Utc::now();
    let days_ago = |d: i64| Some(now - TimeDelta::hours(d * 24 + 12));
    for sort in [SortKey::Time, SortKey::Attempts, SortKey::MessageId] {
        let list = |from, to| RecordListParams {
            filter: RecordFilter { from, to, ..Default::default() },
            sort,
            order: SortOrder::Asc,
            limit: 50,
            ..Default::default()
        };
        let found = async |from, to| {
            let mut found = ids(reads, &list(from, to)).await;
            found.sort();
            found
        };
        assert_eq!(found(days_ago(4), days_ago(1)).await, ["D.2", "D.3", "D.4"], "{sort:?}");
        assert_eq!(found(days_ago(2), None).await, ["D.0", "D.1", "D.2"], "{sort:?}");
        assert_eq!(found(None, days_ago(5)).await, ["D.6"], "{sort:?}");
        assert!(found(days_ago(9), days_ago(7)).await.is_empty(), "{sort:?}");
    }
}

/// A filter no index narrows in an order searches a window of that order per page
/// ([`crate::console::records::SCAN_WINDOW`] ids, [`INDEX_SCAN_WINDOW`] positions), says where it
/// stopped, and the next page goes on from there, in every order: one rare record behind 25 000
/// seeded ones is found a few pages on, not by reading them all on the first. A group alone in message-id order is the dedup key's own: no window.
pub async fn a_filter_without_an_index_searches_a_bounded_window_in_every_order<H: Harness>() {
    let h = H::fresh().await;
    let pool = h.engine_pool();
    let reads = console_store(&pool);
    let l = lease("worker-1");
    let rare = claimed(claim_one(&h, &msg("0-RARE", "RARE.EVENT", "rare"), &l).await);
    complete(&h, &[&rare], &l).await;
    let domain = SeedDomain::new(&["bulk-service"], &["THING.MADE"]);
    seed_records(reads, &SeedParams { records: 25_000, days: 1, batch: 5_000 }, &domain, |_, _| {}).await.unwrap();

    for sort in [SortKey::Time, SortKey::Attempts, SortKey::MessageId] {
        let page = |at| RecordListParams {
            filter: RecordFilter { message_type: Some("RARE.EVENT".into()), ..Default::default() },
            sort,
            at,
            limit: 50,
            ..Default::default()
        };
        // Each page searches one window and says where it stopped; the next goes on from there.
        let mut at = PageAt::First;
        let mut searched = 0;
        let found = loop {
            let page = records_list(reads, &page(at)).await.unwrap();
            if !page.rows.is_empty() {
                assert_eq!((page.searched_to, page.next), (None, None), "{sort:?}: the search reached the end");
                break page.rows.iter().map(|r| r.id).collect::<Vec<i64>>();
            }
            let stopped = page.searched_to.unwrap_or_else(|| panic!("{sort:?}: an empty page says where it stopped"));
            let next = page.next.expect("the search goes on");
            assert_eq!(next.id, stopped, "{sort:?}");
            searched += 1;
            assert!(searched <= 25_000 / INDEX_SCAN_WINDOW + 1, "{sort:?}: each page searches a whole window");
            at = PageAt::After(next);
        };
        assert_eq!(found, [rare.id], "{sort:?}");
        assert!(searched >= 1, "{sort:?}: the rare record lies past the first window");
    }
    let by_key = RecordListParams {
        filter: RecordFilter { group: Some("bulk-service".into()), ..Default::default() },
        sort: SortKey::MessageId,
        limit: 50,
        ..Default::default()
    };
    let grouped = records_list(reads, &by_key).await.unwrap();
    assert_eq!((grouped.rows.len(), grouped.searched_to), (50, None));
}
