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
use crate::store::postgres::ConflictKind;
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

/// Breaker: every filtered page sequence, forwards and back, in every order both ways, equals
/// the unfiltered list (no window) filtered by hand: no row skipped or repeated across pages.
pub async fn breaker_windowed_pages_equal_the_filtered_unwindowed_list<H: Harness>() {
    let h = H::fresh().await;
    let pool = h.engine_pool();
    let reads = console_store(&pool);
    let l = lease("worker-1");
    // Equal message ids in two groups, retried ones, untried ones.
    let other = ConsumerGroup::parse(OTHER).unwrap();
    for id in ["M.1", "M.2", "M.3", "zz"] {
        claim_in(&h, &other, &[&msg(id, "RARE.EVENT", id)], ClaimAs::Succeeded, &l).await;
        let a = msg(id, "RARE.EVENT", id);
        fail(&h, &claimed(claim_one(&h, &a, &l).await), &a, &l, false).await;
    }
    let domain = SeedDomain::new(&["bulk-service", "bulk-two"], &["THING.MADE", "THING.GONE"]);
    seed_records(reads, &SeedParams { records: 7_000, days: 1, batch: 3_500 }, &domain, |_, _| {}).await.unwrap();
    for id in ["M.1", "M.4", "0"] {
        claim_in(&h, &other, &[&msg(id, "RARE.EVENT", id)], ClaimAs::Succeeded, &l).await;
        claimed(claim_one(&h, &msg(id, "RARE.EVENT", id), &l).await);
    }
    let filters: Vec<(&str, RecordFilter, Box<dyn Fn(&crate::console::records::RecordRow) -> bool>)> = vec![
        ("rare", RecordFilter { message_type: Some("RARE.EVENT".into()), ..Default::default() }, Box::new(|r| r.message_type == "RARE.EVENT")),
        ("gone", RecordFilter { message_type: Some("THING.GONE".into()), ..Default::default() }, Box::new(|r| r.message_type == "THING.GONE")),
        ("other group", RecordFilter { group: Some(OTHER.into()), ..Default::default() }, Box::new(|r| r.consumer_group == OTHER)),
        ("group+type", RecordFilter { group: Some("bulk-two".into()), message_type: Some("THING.MADE".into()), ..Default::default() }, Box::new(|r| r.consumer_group == "bulk-two" && r.message_type == "THING.MADE")),
    ];
    let mut failures = Vec::new();
    for sort in [SortKey::Time, SortKey::Attempts, SortKey::MessageId] {
        for order in [SortOrder::Desc, SortOrder::Asc] {
            // Ground truth: the unfiltered list, which no window bounds.
            let mut all = Vec::new();
            let mut at = PageAt::First;
            loop {
                let p = records_list(reads, &RecordListParams { sort, order, at, limit: 500, ..Default::default() }).await.unwrap();
                assert_eq!(p.searched_to, None);
                all.extend(p.rows);
                match p.next { Some(n) => at = PageAt::After(n), None => break }
            }
            for (name, filter, keep) in &filters {
                let truth: Vec<i64> = all.iter().filter(|r| keep(r)).map(|r| r.id).collect();
                for limit in [7, 50] {
                    let params = |at| RecordListParams { filter: filter.clone(), sort, order, at, limit };
                    let mut got = Vec::new();
                    let mut at = PageAt::First;
                    let mut pages = Vec::new();
                    for _ in 0..2000 {
                        let p = records_list(reads, &params(at.clone())).await.unwrap();
                        got.extend(p.rows.iter().map(|r| r.id));
                        pages.push((p.rows.iter().map(|r| r.id).collect::<Vec<_>>(), p.prev.clone(), p.next.clone(), p.searched_to));
                        match p.next { Some(n) => at = PageAt::After(n), None => break }
                    }
                    if got != truth {
                        failures.push(format!("{sort:?} {order:?} {name} limit {limit} forward: got {} rows {:?}.. truth {} rows {:?}..", got.len(), &got[..got.len().min(12)], truth.len(), &truth[..truth.len().min(12)]));
                        continue;
                    }
                    // Back: from each page's prev, the rows before it.
                    let mut back = Vec::new();
                    let mut at = match pages.last().and_then(|p| p.1.clone()) { Some(c) => PageAt::Before(c), None => continue };
                    let last_rows = pages.last().unwrap().0.clone();
                    for _ in 0..2000 {
                        let p = records_list(reads, &params(at.clone())).await.unwrap();
                        let mut ids: Vec<i64> = p.rows.iter().map(|r| r.id).collect();
                        ids.extend(back);
                        back = ids;
                        match p.prev { Some(c) => at = PageAt::Before(c), None => break }
                    }
                    back.extend(last_rows);
                    if back != truth {
                        failures.push(format!("{sort:?} {order:?} {name} limit {limit} backward: got {} rows {:?} truth {} rows {:?}", back.len(), &back[..back.len().min(12)], truth.len(), &truth[..truth.len().min(12)]));
                    }
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Breaker: every filtered page sequence, forwards and back, in every order both ways, equals
/// the unfiltered list (no window) filtered by hand: no row skipped or repeated across pages.
pub async fn breaker_windowed_pages_over_time_ranges_and_the_time_window<H: Harness>() {
    let h = H::fresh().await;
    let pool = h.engine_pool();
    let reads = console_store(&pool);
    let l = lease("worker-1");
    // Equal message ids in two groups, retried ones, untried ones.
    let other = ConsumerGroup::parse(OTHER).unwrap();
    for id in ["M.1", "M.2", "M.3", "zz"] {
        claim_in(&h, &other, &[&msg(id, "RARE.EVENT", id)], ClaimAs::Succeeded, &l).await;
        let a = msg(id, "RARE.EVENT", id);
        fail(&h, &claimed(claim_one(&h, &a, &l).await), &a, &l, false).await;
    }
    let domain = SeedDomain::new(&["bulk-service", "bulk-two"], &["THING.MADE", "THING.GONE"]);
    seed_records(reads, &SeedParams { records: 45_000, days: 1, batch: 15_000 }, &domain, |_, _| {}).await.unwrap();
    for id in ["M.1", "M.4", "0"] {
        claim_in(&h, &other, &[&msg(id, "RARE.EVENT", id)], ClaimAs::Succeeded, &l).await;
        claimed(claim_one(&h, &msg(id, "RARE.EVENT", id), &l).await);
    }
    let now = Utc::now();
    let (from, to) = (now - TimeDelta::hours(14), now - TimeDelta::hours(6));
    let filters: Vec<(&str, RecordFilter, Box<dyn Fn(&crate::console::records::RecordRow) -> bool>)> = vec![
        ("rare", RecordFilter { message_type: Some("RARE.EVENT".into()), ..Default::default() }, Box::new(|r| r.message_type == "RARE.EVENT")),
        ("other group", RecordFilter { group: Some(OTHER.into()), ..Default::default() }, Box::new(|r| r.consumer_group == OTHER)),
        ("from-to", RecordFilter { from: Some(from), to: Some(to), ..Default::default() }, Box::new(move |r| r.first_seen_at >= from && r.first_seen_at < to)),
        ("to+group", RecordFilter { to: Some(to), group: Some("bulk-two".into()), ..Default::default() }, Box::new(move |r| r.first_seen_at < to && r.consumer_group == "bulk-two")),
        ("from+type", RecordFilter { from: Some(now - TimeDelta::minutes(30)), message_type: Some("THING.GONE".into()), ..Default::default() }, Box::new(move |r| r.first_seen_at >= now - TimeDelta::minutes(30) && r.message_type == "THING.GONE")),
    ];
    let mut failures = Vec::new();
    for sort in [SortKey::Time, SortKey::Attempts, SortKey::MessageId] {
        for order in [SortOrder::Desc, SortOrder::Asc] {
            // Ground truth: the unfiltered list, which no window bounds.
            let mut all = Vec::new();
            let mut at = PageAt::First;
            loop {
                let p = records_list(reads, &RecordListParams { sort, order, at, limit: 500, ..Default::default() }).await.unwrap();
                assert_eq!(p.searched_to, None);
                all.extend(p.rows);
                match p.next { Some(n) => at = PageAt::After(n), None => break }
            }
            for (name, filter, keep) in &filters {
                let truth: Vec<i64> = all.iter().filter(|r| keep(r)).map(|r| r.id).collect();
                for limit in [if *name == "rare" { 3 } else { 400 }] {
                    let params = |at| RecordListParams { filter: filter.clone(), sort, order, at, limit };
                    let mut got = Vec::new();
                    let mut at = PageAt::First;
                    let mut pages = Vec::new();
                    for _ in 0..2000 {
                        let p = records_list(reads, &params(at.clone())).await.unwrap();
                        got.extend(p.rows.iter().map(|r| r.id));
                        pages.push((p.rows.iter().map(|r| r.id).collect::<Vec<_>>(), p.prev.clone(), p.next.clone(), p.searched_to));
                        match p.next { Some(n) => at = PageAt::After(n), None => break }
                    }
                    if got != truth {
                        failures.push(format!("{sort:?} {order:?} {name} limit {limit} forward: got {} rows {:?}.. truth {} rows {:?}..", got.len(), &got[..got.len().min(12)], truth.len(), &truth[..truth.len().min(12)]));
                        continue;
                    }
                    // Back: from each page's prev, the rows before it.
                    let mut back = Vec::new();
                    let mut at = match pages.last().and_then(|p| p.1.clone()) { Some(c) => PageAt::Before(c), None => continue };
                    let last_rows = pages.last().unwrap().0.clone();
                    for _ in 0..2000 {
                        let p = records_list(reads, &params(at.clone())).await.unwrap();
                        let mut ids: Vec<i64> = p.rows.iter().map(|r| r.id).collect();
                        ids.extend(back);
                        back = ids;
                        match p.prev { Some(c) => at = PageAt::Before(c), None => break }
                    }
                    back.extend(last_rows);
                    if back != truth {
                        failures.push(format!("{sort:?} {order:?} {name} limit {limit} backward: got {} rows {:?} truth {} rows {:?}", back.len(), &back[..back.len().min(12)], truth.len(), &truth[..truth.len().min(12)]));
                    }
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Breaker: a table of exactly [`INDEX_SCAN_WINDOW`] records, a filter matching none: the first
/// page has searched every record, so it should say nothing is left (as time order does), not
/// "stopped at record #…, the next page searches further" and lead to an empty page.
pub async fn breaker_a_window_that_reaches_the_last_record_is_not_short<H: Harness>() {
    let h = H::fresh().await;
    let pool = h.engine_pool();
    let reads = console_store(&pool);
    let domain = SeedDomain::new(&["bulk-service"], &["THING.MADE"]);
    seed_records(reads, &SeedParams { records: INDEX_SCAN_WINDOW as u64, days: 1, batch: 2_000 }, &domain, |_, _| {}).await.unwrap();
    let mut seen = Vec::new();
    for sort in [SortKey::Time, SortKey::Attempts, SortKey::MessageId] {
        let params = RecordListParams {
            filter: RecordFilter { message_type: Some("NO.SUCH".into()), ..Default::default() },
            sort,
            limit: 50,
            ..Default::default()
        };
        let p = records_list(reads, &params).await.unwrap();
        seen.push(format!("{sort:?}: rows {} searched_to {:?} next {:?}", p.rows.len(), p.searched_to, p.next));
    }
    let expected: Vec<String> = ["Time", "Attempts", "MessageId"].iter().map(|s| format!("{s}: rows 0 searched_to None next None")).collect();
    assert_eq!(seen, expected);
}

/// Breaker: two seed runs (the second "appends": new ids, first-seen times over the same day),
/// then a time range: the list should hold every record first seen in it, as a brute-force
/// filter of the whole list does.
pub async fn breaker_a_time_range_over_two_seed_runs_lists_every_record_in_it<H: Harness>() {
    let h = H::fresh().await;
    let pool = h.engine_pool();
    let reads = console_store(&pool);
    let domain = SeedDomain::new(&["bulk-service"], &["THING.MADE"]);
    for _ in 0..2 {
        seed_records(reads, &SeedParams { records: 3_000, days: 1, batch: 3_000 }, &domain, |_, _| {}).await.unwrap();
    }
    let now = Utc::now();
    let (from, to) = (now - TimeDelta::hours(14), now - TimeDelta::hours(6));
    let mut all = Vec::new();
    let mut at = PageAt::First;
    loop {
        let p = records_list(reads, &RecordListParams { at, limit: 500, ..Default::default() }).await.unwrap();
        all.extend(p.rows);
        match p.next { Some(n) => at = PageAt::After(n), None => break }
    }
    let truth: Vec<i64> = all.iter().filter(|r| r.first_seen_at >= from && r.first_seen_at < to).map(|r| r.id).collect();
    let mut got = Vec::new();
    let mut at = PageAt::First;
    loop {
        let params = RecordListParams { filter: RecordFilter { from: Some(from), to: Some(to), ..Default::default() }, at, limit: 500, ..Default::default() };
        let p = records_list(reads, &params).await.unwrap();
        got.extend(p.rows.iter().map(|r| r.id));
        match p.next { Some(n) => at = PageAt::After(n), None => break }
    }
    assert_eq!((got.len(), truth.len()), (truth.len(), truth.len()), "records first seen in the range listed vs present");
}
