//! MySQL's console reads read no whole table (issue 25: "no full-table count"): each list,
//! count and page the console reads touches a small share of the records, whatever their number.
//! Measured rather than read from `EXPLAIN`, whose plan text differs between MySQL 8 and MariaDB
//! and cannot be asked of the store's statements (built inside it): the session's handler
//! counters (`Handler_read_*`, every row and index entry the storage engine handed the server,
//! scans of temporary tables included), read before and after each call on a pool of one
//! connection. PostgreSQL's plans are in BENCHMARKS.md ("Plans relied on").

use sqlx::mysql::MySqlPool;

use super::conformance::MySqlHarness;
use crate::store::conformance::Harness;
use crate::console::QueryError;
use crate::console::console_store;
use crate::console::failures::retries;
use crate::console::filter::{FilterText, RecordListParams};
use crate::console::records::{SCAN_WINDOW, record_detail, records_list};
use crate::console::seed::{SeedDomain, SeedParams, seed_records};
use crate::runtime::EnginePool;

/// Records seeded: enough that MariaDB's optimizer costs a scan of `dedup_records` above its
/// indexes (on a few thousand rows a scan is the right plan), small enough to seed in seconds.
const RECORDS: u64 = 100_000;

/// Rows a read may touch: a twentieth of the table (a page of 50 rows through an index and its
/// merge of parts touch a few hundred; the retries' and dead letters' cells read each failed or
/// dead record's index entry, about 1 % of the records).
const BOUND: u64 = RECORDS / 20;

/// Rows a page may touch whose filter matches nothing and an index answers exactly: a few probes.
const NOTHING_BOUND: u64 = 10;

/// Rows and index entries the storage engine has handed this session so far.
async fn handler_reads(conn: &MySqlPool) -> u64 {
    let rows: Vec<(String, String)> = sqlx::query_as("SHOW SESSION STATUS LIKE 'Handler\\_read\\_%'")
        .fetch_all(conn)
        .await
        .expect("SHOW SESSION STATUS");
    rows.iter().map(|(_, value)| value.parse::<u64>().expect("a counter")).sum()
}

/// The rows `read` touches on `conn` (a pool of one connection), less what reading the counters
/// touches (`overhead`).
async fn touched<T>(conn: &MySqlPool, overhead: u64, read: impl Future<Output = Result<T, QueryError>>) -> u64 {
    let before = handler_reads(conn).await;
    read.await.expect("the read");
    (handler_reads(conn).await - before).saturating_sub(overhead)
}

fn list(text: FilterText<'_>) -> RecordListParams {
    RecordListParams::parse(&text).expect("a valid filter")
}

/// Seeds 100 000 records (`ANALYZE`d), then reads each list, count and page of the console on
/// one connection (and checks that an hour's page, read as an id range, holds that hour's
/// records): none touches more than a twentieth of the records (a time-ordered page whose
/// filter has no index reads at most [`SCAN_WINDOW`] records, by design, and a little more), and
/// a dead-letter drill-down on a class no record has touches almost none.
pub async fn console_reads_on_mysql_touch_no_whole_table() {
    let h = MySqlHarness::fresh().await;
    let pool = h.engine_pool().mysql().expect("the MySQL harness").clone();
    let domain = SeedDomain::new(&["alpha-service", "beta-service"], &["THING.MADE", "THING.SOLD", "THING.SENT"]);
    let params = SeedParams { records: RECORDS, days: 30, batch: 20_000 };
    seed_records(&pool, &params, &domain, |_, _| {}).await.expect("seed");
    sqlx::raw_sql("ANALYZE TABLE dedup_records, record_attempts").execute(&pool).await.expect("ANALYZE");

    let conn = pool.options().clone().max_connections(1).connect_lazy_with((*pool.connect_options()).clone());
    let one = EnginePool::from(conn.clone());
    let store = console_store(&one);
    let overhead = touched(&conn, 0, async { Ok(()) }).await;
    let (min, max) = store.id_bounds().await.unwrap().expect("seeded");
    let mid = store.record_fields(min + (max - min) / 2).await.unwrap().expect("seeded ids follow one another").row;
    let deep = format!("t{}.{}", mid.first_seen_at.timestamp_micros(), mid.id);
    let prefix = &mid.message_id[..mid.message_id.len() - 4];
    let (from, to) = ((mid.first_seen_at - chrono::TimeDelta::hours(1)).to_rfc3339(), mid.first_seen_at.to_rfc3339());
    let dead_class = store.dead_letter_groups(1).await.unwrap().remove(0).error_class.expect("a class");

    // The hour before `mid`, read as an id range (its records 26 s apart, ids in arrival order):
    // the newest first, none outside the hour.
    let hour = list(FilterText { from: Some(&from), to: Some(&to), ..Default::default() });
    let hour = records_list(store, &hour).await.unwrap().rows;
    assert_eq!(hour.first().map(|r| r.id), Some(mid.id - 1), "the newest record of the hour first");
    let bounds = mid.first_seen_at - chrono::TimeDelta::hours(1)..mid.first_seen_at;
    assert!(hour.len() == 50 && hour.iter().all(|r| bounds.contains(&r.first_seen_at)), "{hour:?}");

    let mut over = Vec::new();
    let mut check = |what: &str, rows: u64, bound: u64| {
        eprintln!("{what}: {rows} rows touched");
        if rows > bound {
            over.push(format!("{what}: {rows} rows (at most {bound})"));
        }
    };
    check("status counts", touched(&conn, overhead, store.status_counts()).await, BOUND);
    check("stuck count", touched(&conn, overhead, store.stuck_count()).await, BOUND);
    check("double effect count", touched(&conn, overhead, store.double_effect_count()).await, BOUND);
    check("late duplicate count", touched(&conn, overhead, store.late_duplicate_count()).await, BOUND);
    check("conflict count", touched(&conn, overhead, store.conflict_count()).await, BOUND);
    check("consumer groups", touched(&conn, overhead, store.consumer_groups()).await, BOUND);
    check("message types", touched(&conn, overhead, store.message_types()).await, BOUND);
    check("stuck list", touched(&conn, overhead, store.stuck_records(50)).await, BOUND);
    check("retries", touched(&conn, overhead, retries(store, store, 50)).await, BOUND);
    check("dead letters", touched(&conn, overhead, store.dead_letter_groups(200)).await, BOUND);
    check("record detail", touched(&conn, overhead, record_detail(store, mid.id)).await, BOUND);
    let lists = [
        ("newest first", FilterText::default()),
        ("a page at half depth", FilterText { after: Some(&deep), ..Default::default() }),
        ("the page before it", FilterText { before: Some(&deep), ..Default::default() }),
        ("oldest first", FilterText { order: Some("asc"), ..Default::default() }),
        ("dead", FilterText { status: Some("dead"), ..Default::default() }),
        ("processing", FilterText { status: Some("processing"), ..Default::default() }),
        ("failed by attempts", FilterText { status: Some("failed"), sort: Some("attempts"), ..Default::default() }),
        ("by attempts", FilterText { sort: Some("attempts"), ..Default::default() }),
        ("by attempts, ascending", FilterText { sort: Some("attempts"), order: Some("asc"), ..Default::default() }),
        ("by message id", FilterText { sort: Some("message_id"), ..Default::default() }),
        ("attempts >= 3", FilterText { min_attempts: Some("3"), ..Default::default() }),
        ("message id", FilterText { message_id: Some(&mid.message_id), ..Default::default() }),
        ("message id prefix", FilterText { id_prefix: Some(prefix), ..Default::default() }),
        ("dead of a class", FilterText { status: Some("dead"), error_class: Some(&dead_class), ..Default::default() }),
        ("one hour at half depth", FilterText { from: Some(&from), to: Some(&to), ..Default::default() }),
    ];
    for (what, text) in lists {
        let rows = touched(&conn, overhead, records_list(store, &list(text))).await;
        check(&format!("records list, {what}"), rows, BOUND);
    }
    // A dead-letter drill-down on a class no record has reads the empty range of
    // `dedup_records_dead_class_idx` (before it, every dead record, each looked up).
    let absent = FilterText { status: Some("dead"), error_class: Some("NO SUCH CLASS"), ..Default::default() };
    let rows = touched(&conn, overhead, records_list(store, &list(absent))).await;
    check("records list, dead of a class no record has", rows, NOTHING_BOUND);
    // A group or a type alone has no index: a bounded stretch of the primary key, by design.
    let windowed = SCAN_WINDOW as u64 + BOUND / 10;
    for (what, text) in [
        ("one group", FilterText { group: Some("beta-service"), ..Default::default() }),
        ("one type", FilterText { message_type: Some("THING.SENT"), ..Default::default() }),
    ] {
        let rows = touched(&conn, overhead, records_list(store, &list(text))).await;
        check(&format!("records list, {what}"), rows, windowed);
    }
    assert!(over.is_empty(), "console reads touching a large share of {RECORDS} records: {over:#?}");
}
