//! Conformance cases of the records list's pages against the whole list filtered by hand:
//! every filter, order and direction, forwards and back, through the windows a filter without
//! an index searches ([`crate::console::records::records_list`]).

use chrono::{DateTime, TimeDelta, Utc};

use super::claims::{claim_in, claim_one, claimed, fail, lease, msg};
use super::Harness;
use crate::console::console_store;
use crate::console::filter::{PageAt, RecordFilter, RecordListParams, SortKey, SortOrder};
use crate::console::records::{INDEX_SCAN_WINDOW, RecordPage, RecordReads, RecordRow, records_list};
use crate::console::seed::{SeedDomain, SeedParams, seed_records};
use crate::record::ConsumerGroup;
use crate::store::ClaimAs;

/// The other consumer group of the cases.
const OTHER: &str = "other-group";

/// A filter, and the same rule written out over a row.
struct Expect {
    name: &'static str,
    filter: RecordFilter,
    keep: Box<dyn Fn(&RecordRow) -> bool>,
}

impl Expect {
    fn new(name: &'static str, filter: RecordFilter, keep: impl Fn(&RecordRow) -> bool + 'static) -> Self {
        Self { name, filter, keep: Box::new(keep) }
    }
}

/// The pages of the list under `params` (its filter, order and limit), each from the one
/// before's `next`.
async fn every_page(reads: &dyn RecordReads, params: RecordListParams) -> Vec<RecordPage> {
    let mut pages: Vec<RecordPage> = Vec::new();
    let mut at = PageAt::First;
    loop {
        let page = records_list(reads, &RecordListParams { at, ..params.clone() }).await.unwrap();
        let next = page.next.clone();
        pages.push(page);
        match next {
            Some(next) => at = PageAt::After(next),
            None => return pages,
        }
    }
}

/// The rows of `pages`, in order.
fn rows(pages: Vec<RecordPage>) -> Vec<RecordRow> {
    pages.into_iter().flat_map(|p| p.rows).collect()
}

fn ids(rows: &[RecordRow]) -> Vec<i64> {
    rows.iter().map(|r| r.id).collect()
}

/// Records in two groups with equal message ids, retried, failed and untried ones around
/// `seeded` seeded records of two groups and two types.
async fn records_around_a_seed<H: Harness>(h: &H, seeded: u64) {
    let l = lease("worker-1");
    let other = ConsumerGroup::parse(OTHER).unwrap();
    for id in ["M.1", "M.2", "M.3", "zz"] {
        claim_in(h, &other, &[&msg(id, "RARE.EVENT", id)], ClaimAs::Succeeded, &l).await;
        let m = msg(id, "RARE.EVENT", id);
        fail(h, &claimed(claim_one(h, &m, &l).await), &m, &l, false).await;
    }
    let pool = h.engine_pool();
    let domain = SeedDomain::new(&["bulk-service", "bulk-two"], &["THING.MADE", "THING.GONE"]);
    let params = SeedParams { records: seeded, days: 1, batch: 15_000 };
    seed_records(console_store(&pool), &params, &domain, |_, _| {}).await.unwrap();
    for id in ["M.1", "M.4", "0"] {
        claim_in(h, &other, &[&msg(id, "RARE.EVENT", id)], ClaimAs::Succeeded, &l).await;
        claimed(claim_one(h, &msg(id, "RARE.EVENT", id), &l).await);
    }
}

/// Pages under each filter, forwards then back from the last page's `prev`, in every order both
/// ways, equal the unfiltered list (which no window bounds) filtered by `keep`: no row skipped
/// or repeated, whatever windows the pages searched.
async fn pages_equal_the_list_filtered(reads: &dyn RecordReads, expects: &[Expect], limit: impl Fn(&Expect) -> i64) {
    let mut failures = Vec::new();
    for sort in [SortKey::Time, SortKey::Attempts, SortKey::MessageId] {
        for order in [SortOrder::Desc, SortOrder::Asc] {
            let all: Vec<RecordRow> =
                rows(every_page(reads, RecordListParams { sort, order, limit: 500, ..Default::default() }).await);
            for e in expects {
                let truth: Vec<i64> = all.iter().filter(|r| (e.keep)(r)).map(|r| r.id).collect();
                let params = RecordListParams { filter: e.filter.clone(), sort, order, limit: limit(e), ..Default::default() };
                let pages = every_page(reads, params.clone()).await;
                let forward: Vec<i64> = pages.iter().flat_map(|p| ids(&p.rows)).collect();
                if forward != truth {
                    failures.push(format!("{sort:?} {order:?} {}: forward {} rows, truth {}", e.name, forward.len(), truth.len()));
                    continue;
                }
                // Back from the last page, each page's `prev` the one before it.
                let Some(last) = pages.last() else { continue };
                let Some(prev) = last.prev.clone() else { continue };
                let mut back = ids(&last.rows);
                let mut at = PageAt::Before(prev);
                loop {
                    let page = records_list(reads, &RecordListParams { at, ..params.clone() }).await.unwrap();
                    back.splice(0..0, ids(&page.rows));
                    match page.prev {
                        Some(prev) => at = PageAt::Before(prev),
                        None => break,
                    }
                }
                if back != truth {
                    failures.push(format!("{sort:?} {order:?} {}: back {} rows, truth {}", e.name, back.len(), truth.len()));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// 7 000 seeded records and a few around them: pages under a rare type, a common type, a group
/// and a group with a type equal the whole list filtered, 25 rows a page.
pub async fn filtered_pages_forwards_and_back_equal_the_whole_list_filtered<H: Harness>() {
    let h = H::fresh().await;
    records_around_a_seed(&h, 7_000).await;
    let pool = h.engine_pool();
    let expects = [
        Expect::new("rare type", RecordFilter { message_type: Some("RARE.EVENT".into()), ..Default::default() }, |r| {
            r.message_type == "RARE.EVENT"
        }),
        Expect::new("common type", RecordFilter { message_type: Some("THING.GONE".into()), ..Default::default() }, |r| {
            r.message_type == "THING.GONE"
        }),
        Expect::new("group", RecordFilter { group: Some(OTHER.into()), ..Default::default() }, |r| r.consumer_group == OTHER),
        Expect::new(
            "group and type",
            RecordFilter { group: Some("bulk-two".into()), message_type: Some("THING.MADE".into()), ..Default::default() },
            |r| r.consumer_group == "bulk-two" && r.message_type == "THING.MADE",
        ),
    ];
    pages_equal_the_list_filtered(console_store(&pool), &expects, |_| 25).await;
}

/// 45 000 seeded records, so that time order's 20 000-id window is crossed: pages under time
/// ranges alone and with a group or a type equal the whole list filtered.
pub async fn pages_under_time_ranges_across_the_time_window_equal_the_whole_list_filtered<H: Harness>() {
    let h = H::fresh().await;
    records_around_a_seed(&h, 45_000).await;
    let pool = h.engine_pool();
    let now = Utc::now();
    let (from, to) = (now - TimeDelta::hours(14), now - TimeDelta::hours(6));
    let recent = now - TimeDelta::minutes(30);
    let within = move |r: &RecordRow, from: Option<DateTime<Utc>>, to: Option<DateTime<Utc>>| {
        from.is_none_or(|f| r.first_seen_at >= f) && to.is_none_or(|t| r.first_seen_at < t)
    };
    let expects = [
        Expect::new("rare type", RecordFilter { message_type: Some("RARE.EVENT".into()), ..Default::default() }, |r| {
            r.message_type == "RARE.EVENT"
        }),
        Expect::new("group", RecordFilter { group: Some(OTHER.into()), ..Default::default() }, |r| r.consumer_group == OTHER),
        Expect::new("from, to", RecordFilter { from: Some(from), to: Some(to), ..Default::default() }, move |r| {
            within(r, Some(from), Some(to))
        }),
        Expect::new("to, group", RecordFilter { to: Some(to), group: Some("bulk-two".into()), ..Default::default() }, move |r| {
            within(r, None, Some(to)) && r.consumer_group == "bulk-two"
        }),
        Expect::new(
            "from, type",
            RecordFilter { from: Some(recent), message_type: Some("THING.GONE".into()), ..Default::default() },
            move |r| within(r, Some(recent), None) && r.message_type == "THING.GONE",
        ),
    ];
    pages_equal_the_list_filtered(console_store(&pool), &expects, |e| if e.name == "rare type" { 3 } else { 400 }).await;
}

/// A table of exactly [`INDEX_SCAN_WINDOW`] records and a filter matching none: the first page
/// searched every record, so it says nothing is left in every order, not "stopped at record
/// #…" before an empty page.
pub async fn a_window_that_reaches_the_last_record_says_nothing_is_left<H: Harness>() {
    let h = H::fresh().await;
    let pool = h.engine_pool();
    let reads = console_store(&pool);
    let domain = SeedDomain::new(&["bulk-service"], &["THING.MADE"]);
    let params = SeedParams { records: INDEX_SCAN_WINDOW as u64, days: 1, batch: 2_000 };
    seed_records(reads, &params, &domain, |_, _| {}).await.unwrap();
    for sort in [SortKey::Time, SortKey::Attempts, SortKey::MessageId] {
        let filter = RecordFilter { message_type: Some("NO.SUCH".into()), ..Default::default() };
        let page = records_list(reads, &RecordListParams { filter, sort, limit: 50, ..Default::default() }).await.unwrap();
        assert_eq!((page.rows.len(), page.searched_to, page.next), (0, None, None), "{sort:?}");
    }
}

/// Two seed runs, the second appended after the first's newest record (ids follow first
/// sightings, which a time range reads as ids): a time range lists every record first seen in
/// it, as the whole list filtered by hand does.
pub async fn a_time_range_over_two_seed_runs_lists_every_record_in_it<H: Harness>() {
    let h = H::fresh().await;
    let pool = h.engine_pool();
    let reads = console_store(&pool);
    let domain = SeedDomain::new(&["bulk-service"], &["THING.MADE"]);
    for _ in 0..2 {
        seed_records(reads, &SeedParams { records: 3_000, days: 1, batch: 3_000 }, &domain, |_, _| {}).await.unwrap();
    }
    let now = Utc::now();
    let (from, to) = (now - TimeDelta::hours(14), now - TimeDelta::hours(6));
    let all = rows(every_page(reads, RecordListParams { limit: 500, ..Default::default() }).await);
    let truth: Vec<i64> = all.iter().filter(|r| r.first_seen_at >= from && r.first_seen_at < to).map(|r| r.id).collect();
    let filter = RecordFilter { from: Some(from), to: Some(to), ..Default::default() };
    let listed = rows(every_page(reads, RecordListParams { filter, limit: 500, ..Default::default() }).await);
    assert!(!truth.is_empty());
    assert_eq!(ids(&listed), truth);
}
