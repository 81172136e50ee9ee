//! The console's read queries against a real PostgreSQL: filters, keyset pages under concurrent
//! inserts, grouping by error class, and (`seeded.rs`) aggregates against brute-force counts.

use dedup_engine::console::QueryError;
use dedup_engine::console::failures::{FailureReads, retries};
use dedup_engine::console::filter::{FilterText, RecordListParams};
use dedup_engine::console::overview::GrowthRange;
use dedup_engine::console::records::{
    MarkerState, RecordPage, SCAN_WINDOW, UNRECORDED_WORKER, record_detail, record_marker, records_list,
};
use dedup_engine::fastpath::{FastPath, FastPathSettings};
use dedup_engine::record::RecordStatus;
use dedup_engine::testing::TestDatabase;
use sqlx::PgPool;

mod seeded;

/// A record to insert by hand.
struct Rec<'a> {
    group: &'a str,
    id: &'a str,
    status: &'a str,
    attempts: i32,
    /// Seconds before now.
    age_secs: i64,
    error_class: Option<&'a str>,
}

impl Default for Rec<'_> {
    fn default() -> Self {
        Rec { group: "g1", id: "ORDER.PAY.1:1", status: "succeeded", attempts: 1, age_secs: 60, error_class: None }
    }
}

async fn insert(pool: &PgPool, r: Rec<'_>) -> i64 {
    let message_type = r.id.rsplit_once('.').map(|(t, _)| t).unwrap_or("UNKNOWN");
    let processing = r.status == "processing";
    let id: i64 = sqlx::query_scalar(
        "INSERT INTO dedup_records (consumer_group, message_id, message_type, status, handler_mode, attempts,
             max_attempts, lease_owner, lease_token, lease_expires_at, first_seen_at, error_class, last_error,
             payload_hash, payload, headers, source_broker)
         VALUES ($1, $2, $3, $4, 'leased', $5, 5,
                 CASE WHEN $6 THEN 'host:1:worker-0' END, CASE WHEN $6 THEN gen_random_uuid() END,
                 CASE WHEN $6 THEN now() - interval '5 seconds' END,
                 now() - $7 * interval '1 second', $8, $8, '\\x00', convert_to('<script>alert(1)</script>', 'UTF8'),
                 '{\"x-message-id\": \"m\"}', 'rabbitmq')
         RETURNING id",
    )
    .bind(r.group)
    .bind(r.id)
    .bind(message_type)
    .bind(r.status)
    .bind(r.attempts)
    .bind(processing)
    .bind(r.age_secs)
    .bind(r.error_class)
    .fetch_one(pool)
    .await
    .expect("insert record");
    // Inserted by hand, not by the engine's statements, which count what they insert.
    sqlx::query("SELECT record_counts_rebuild()").execute(pool).await.expect("count records");
    id
}

fn params(text: FilterText<'_>) -> RecordListParams {
    RecordListParams::parse(&text).expect("valid filter")
}

async fn ids(pool: &PgPool, text: FilterText<'_>) -> Vec<String> {
    records_list(pool, &params(text)).await.unwrap().rows.into_iter().map(|r| r.message_id).collect()
}

#[tokio::test]
async fn every_filter_narrows_the_list() {
    let db = TestDatabase::create().await;
    let p = &db.pool;
    // In arrival order, as the engine inserts them: time order is id order.
    insert(p, Rec { id: "ORDER.PAY.200:1", status: "processing", attempts: 2, age_secs: 7200, ..Rec::default() }).await;
    insert(p, Rec { id: "ORDER.PAY.100:1", age_secs: 50, ..Rec::default() }).await;
    insert(
        p,
        Rec { id: "ORDER.PAY.101:1", group: "g2", status: "failed", attempts: 3, age_secs: 40, ..Rec::default() },
    )
    .await;
    insert(p, Rec { id: "ORDER.CREATE.100:1", status: "dead", attempts: 5, age_secs: 30, ..Rec::default() }).await;

    let all = ids(p, FilterText::default()).await;
    assert_eq!(all, ["ORDER.CREATE.100:1", "ORDER.PAY.101:1", "ORDER.PAY.100:1", "ORDER.PAY.200:1"], "newest first");
    assert_eq!(ids(p, FilterText { group: Some("g2"), ..Default::default() }).await, ["ORDER.PAY.101:1"]);
    assert_eq!(ids(p, FilterText { status: Some("dead"), ..Default::default() }).await, ["ORDER.CREATE.100:1"]);
    assert_eq!(
        ids(p, FilterText { message_type: Some("ORDER.PAY"), order: Some("asc"), ..Default::default() }).await,
        ["ORDER.PAY.200:1", "ORDER.PAY.100:1", "ORDER.PAY.101:1"]
    );
    assert_eq!(
        ids(p, FilterText { min_attempts: Some("3"), ..Default::default() }).await,
        ["ORDER.CREATE.100:1", "ORDER.PAY.101:1"]
    );
    assert_eq!(
        ids(p, FilterText { message_id: Some("ORDER.PAY.100:1"), ..Default::default() }).await,
        ["ORDER.PAY.100:1"]
    );
    assert_eq!(
        ids(p, FilterText { id_prefix: Some("ORDER.PAY.10"), ..Default::default() }).await,
        ["ORDER.PAY.101:1", "ORDER.PAY.100:1"],
        "a prefix search lists in message-id order, descending by default"
    );
    assert_eq!(
        ids(p, FilterText { id_prefix: Some("ORDER.PAY.10"), order: Some("asc"), ..Default::default() }).await,
        ["ORDER.PAY.100:1", "ORDER.PAY.101:1"]
    );
    let from = (chrono::Utc::now() - chrono::TimeDelta::hours(1)).to_rfc3339();
    let to = (chrono::Utc::now() - chrono::TimeDelta::seconds(35)).to_rfc3339();
    assert_eq!(
        ids(p, FilterText { from: Some(&from), to: Some(&to), ..Default::default() }).await,
        ["ORDER.PAY.101:1", "ORDER.PAY.100:1"]
    );
    assert_eq!(
        ids(p, FilterText { sort: Some("attempts"), ..Default::default() }).await,
        ["ORDER.CREATE.100:1", "ORDER.PAY.101:1", "ORDER.PAY.200:1", "ORDER.PAY.100:1"]
    );
    assert!(ids(p, FilterText { group: Some("nobody"), ..Default::default() }).await.is_empty());
}

#[tokio::test]
async fn bad_filters_are_refused_with_a_reason() {
    for text in [
        FilterText { status: Some("done"), ..Default::default() },
        FilterText { message_id: Some(&"x".repeat(600)), ..Default::default() },
        FilterText { after: Some("t1.2"), sort: Some("attempts"), ..Default::default() },
    ] {
        assert!(matches!(RecordListParams::parse(&text), Err(QueryError::BadFilter(_))));
    }
    assert!(matches!(GrowthRange::parse(Some("2y")), Err(QueryError::BadFilter(_))));
}

/// Walks every page forward, then every page back, while another task keeps inserting newer
/// records: each original record appears exactly once, in order, both ways.
/// A page of ten `ORDER.PAY` records in `sort` order: the first, or after or before a cursor.
async fn pay_page(pool: &PgPool, sort: &str, after: Option<&str>, before: Option<&str>) -> RecordPage {
    let text = FilterText {
        sort: Some(sort),
        message_type: Some("ORDER.PAY"),
        limit: Some("10"),
        after,
        before,
        ..Default::default()
    };
    records_list(pool, &params(text)).await.unwrap()
}

#[tokio::test]
async fn keyset_pages_are_stable_under_concurrent_inserts() {
    let db = TestDatabase::create().await;
    let p = db.pool.clone();
    for n in 0..95 {
        let id = format!("ORDER.PAY.{n:04}:1");
        // Several records share a first-seen second: ties are broken by id.
        insert(&p, Rec { id: &id, age_secs: 1000 + (n / 3) * 10, attempts: 1 + (n % 4) as i32, ..Rec::default() })
            .await;
    }
    let writer = tokio::spawn({
        let p = p.clone();
        async move {
            for n in 0..60 {
                let id = format!("ORDER.CREATE.{n:04}:1");
                insert(&p, Rec { id: &id, age_secs: 0, ..Rec::default() }).await;
                tokio::task::yield_now().await;
            }
        }
    });
    for sort in ["time", "attempts", "message_id"] {
        // Start below the newest records, so concurrent inserts land "before" the walk.
        let first = pay_page(&p, sort, None, None).await;
        let mut pages = vec![first.clone()];
        let mut next = first.next;
        while let Some(cursor) = next {
            let after = cursor.encode();
            let page = pay_page(&p, sort, Some(&after), None).await;
            next = page.next.clone();
            pages.push(page);
        }
        let forward: Vec<i64> = pages.iter().flat_map(|pg| pg.rows.iter().map(|r| r.id)).collect();
        assert_eq!(forward.len(), 95, "{sort}: every record once");
        let mut unique = forward.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(unique.len(), 95, "{sort}: no record twice");
        assert_eq!(pages.len(), 10);
        assert!(pages.last().unwrap().next.is_none());
        assert!(pages[0].prev.is_none(), "the first page has no previous page");

        // Back from the last page: each previous page equals the one seen going forward.
        let mut back = pages.last().unwrap().prev.clone();
        for expected in pages.iter().rev().skip(1) {
            let before = back.expect("a previous page").encode();
            let page = pay_page(&p, sort, None, Some(&before)).await;
            assert_eq!(page.rows, expected.rows, "{sort}: same page back as forward");
            back = page.prev;
        }
        assert!(back.is_none(), "{sort}: back at the first page");
    }
    writer.await.unwrap();
}

#[tokio::test]
async fn dead_letters_group_by_error_class_and_drill_down() {
    let db = TestDatabase::create().await;
    let p = &db.pool;
    let timeout = "TIMEOUT: gateway did not answer within # ms";
    for (n, class) in [timeout, timeout, timeout, "NOT_FOUND: order # not found"].into_iter().enumerate() {
        let id = format!("ORDER.PAY.{n}:1");
        insert(p, Rec { id: &id, status: "dead", attempts: 5, error_class: Some(class), ..Rec::default() }).await;
    }
    insert(p, Rec { id: "ORDER.NOTIFY.9:1", status: "dead", error_class: Some(timeout), ..Rec::default() }).await;
    insert(p, Rec { id: "ORDER.PAY.9:1", status: "failed", error_class: Some(timeout), ..Rec::default() }).await;

    let groups = p.dead_letter_groups(50).await.unwrap();
    assert_eq!(groups.len(), 2);
    assert_eq!(groups[0].error_class.as_deref(), Some(timeout));
    assert_eq!(groups[0].records, 4, "failed records are not dead letters");
    assert_eq!(groups[0].message_types, ["ORDER.NOTIFY", "ORDER.PAY"]);
    assert!(groups[0].first_seen_at <= groups[0].last_seen_at);
    assert_eq!(groups[1].records, 1);

    let drill = ids(p, FilterText { status: Some("dead"), error_class: Some(timeout), ..Default::default() }).await;
    assert_eq!(drill.len(), 4);
}

#[tokio::test]
async fn stuck_and_retries_pages_read_what_needs_an_operator() {
    let db = TestDatabase::create().await;
    let p = &db.pool;
    let stuck = insert(p, Rec { id: "ORDER.NOTIFY.1:1", status: "processing", attempts: 2, ..Rec::default() }).await;
    sqlx::query("UPDATE dedup_records SET reentries = 3 WHERE id = $1").bind(stuck).execute(p).await.unwrap();
    // A live lease is not stuck.
    let live = insert(p, Rec { id: "ORDER.NOTIFY.2:1", status: "processing", ..Rec::default() }).await;
    sqlx::query("UPDATE dedup_records SET lease_expires_at = now() + interval '1 minute' WHERE id = $1")
        .bind(live)
        .execute(p)
        .await
        .unwrap();
    for (n, attempts) in [1, 3, 3, 4].into_iter().enumerate() {
        let id = format!("ORDER.PAY.{n}:1");
        insert(p, Rec { id: &id, status: "failed", attempts, ..Rec::default() }).await;
    }
    sqlx::query("UPDATE dedup_records SET next_attempt_at = now() + interval '5 minutes' WHERE status = 'failed'")
        .execute(p)
        .await
        .unwrap();

    let list = p.stuck_records(10).await.unwrap();
    assert_eq!(list.total, 1);
    assert_eq!(list.rows[0].id, stuck);
    assert!(list.rows[0].crash_loop, "3 re-entries flag a crash loop");
    assert!(list.rows[0].stuck_secs >= 4);
    assert_eq!(list.rows[0].lease_owner.as_deref(), Some("host:1:worker-0"));

    let r = retries(p, p, 10).await.unwrap();
    let dist: Vec<(i32, i64)> = r.distribution.iter().map(|b| (b.attempts, b.records)).collect();
    assert_eq!(dist, [(1, 1), (3, 2), (4, 1)]);
    assert_eq!(r.top_types[0].message_type, "ORDER.PAY");
    assert_eq!((r.top_types[0].records, r.top_types[0].attempts, r.top_types[0].max_attempts), (4, 11, 4));
    assert_eq!(r.most_retried[0].attempts, 4);
    assert!(r.next_retry_at.is_some());
}

#[tokio::test]
async fn record_detail_has_history_payload_and_marker_state() {
    let db = TestDatabase::create().await;
    let p = &db.pool;
    let id = insert(p, Rec { id: "ORDER.PAY.7:1", status: "failed", attempts: 2, ..Rec::default() }).await;
    sqlx::query(
        "INSERT INTO record_attempts (record_id, attempt, worker, started_at, ended_at, outcome, error)
         VALUES ($1, 2, 'w', now(), now(), 'failed', 'boom'), ($1, 1, 'w', now(), now(), 'failed', 'bang')",
    )
    .bind(id)
    .execute(p)
    .await
    .unwrap();
    let detail = record_detail(p, id).await.unwrap().expect("record exists");
    assert_eq!(detail.row.status, RecordStatus::Failed);
    assert_eq!(detail.payload.as_deref(), Some(&b"<script>alert(1)</script>"[..]));
    assert_eq!(detail.payload_hash, "00");
    assert_eq!(detail.attempt_history.iter().map(|a| a.attempt).collect::<Vec<_>>(), [1, 2]);
    assert_eq!(detail.attempt_history[1].error.as_deref(), Some("boom"));
    assert!(record_detail(p, id + 1000).await.unwrap().is_none());

    let prefix = format!("dct-{}", uuid::Uuid::new_v4().simple());
    let redis_url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned());
    let fast_path = FastPath::new(&redis_url, FastPathSettings { prefix, ttl_secs: 600, ..Default::default() });
    // The first use connects; give it a moment.
    let mut state = record_marker(&fast_path, "g1", "ORDER.PAY.7:1").await;
    for _ in 0..20 {
        if !matches!(state, MarkerState::Unknown(_)) {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        state = record_marker(&fast_path, "g1", "ORDER.PAY.7:1").await;
    }
    assert_eq!(state, MarkerState::Absent);
    assert!(
        fast_path
            .mark_many(&[(
                fast_path.key("g1", "ORDER.PAY.7:1"),
                dedup_engine::fastpath::Marker::new(1, &[0], "ORDER.PAY")
            )])
            .await
    );
    match record_marker(&fast_path, "g1", "ORDER.PAY.7:1").await {
        MarkerState::Present { ttl_secs: Some(ttl) } => assert!((590..=600).contains(&ttl), "{ttl}"),
        other => panic!("marker expected, got {other:?}"),
    }
}

/// A transactional handler's first-try success has no attempt row: the record page shows its
/// attempt from the record (attempt 1, succeeded, first seen to completion); a leased record
/// shows only its rows.
#[tokio::test]
async fn a_first_try_success_is_shown_from_its_record() {
    let db = TestDatabase::create().await;
    let p = &db.pool;
    let (id, first_seen, completed): (i64, chrono::DateTime<chrono::Utc>, chrono::DateTime<chrono::Utc>) =
        sqlx::query_as(
            "INSERT INTO dedup_records (consumer_group, message_id, message_type, status, handler_mode, attempts,
                 max_attempts, completed_at, payload_hash, source_broker)
             VALUES ('g1', 'ORDER.PAY.1:9', 'ORDER.PAY', 'succeeded', 'transactional', 1, 5,
                     now() + interval '3 ms', '\\x00', 'rabbitmq')
             RETURNING id, first_seen_at, completed_at",
        )
        .fetch_one(p)
        .await
        .unwrap();
    let detail = record_detail(p, id).await.unwrap().expect("record exists");
    let shown: Vec<_> = detail
        .attempt_history
        .iter()
        .map(|a| (a.attempt, a.worker.as_str(), a.started_at, a.ended_at, a.outcome.as_deref()))
        .collect();
    assert_eq!(shown, [(1, UNRECORDED_WORKER, first_seen, Some(completed), Some("succeeded"))]);

    let leased = insert(p, Rec { id: "ORDER.NOTIFY.1:9", ..Rec::default() }).await;
    assert!(record_detail(p, leased).await.unwrap().unwrap().attempt_history.is_empty());
}

/// A filter no index narrows (a rare type among the succeeded bulk) searches SCAN_WINDOW
/// records per page, says how far it got, and the next page continues from there until the
/// matches, far back, are found; every match comes exactly once.
#[tokio::test]
async fn a_filter_without_an_index_searches_a_bounded_window_per_page() {
    let db = TestDatabase::create().await;
    let p = &db.pool;
    let bulk = SCAN_WINDOW + 5_000;
    // Three rare records first (the oldest), then the bulk.
    sqlx::query(
        "INSERT INTO dedup_records (consumer_group, message_id, message_type, status, handler_mode, attempts,
             max_attempts, completed_at, payload_hash, source_broker)
         SELECT 'g1', CASE WHEN i <= 3 THEN 'RARE.EVENT.' ELSE 'ORDER.PAY.' END || i || ':1',
                CASE WHEN i <= 3 THEN 'RARE.EVENT' ELSE 'ORDER.PAY' END, 'succeeded', 'transactional', 1, 5,
                now(), '\\x00', 'rabbitmq'
         FROM generate_series(1, $1) AS i",
    )
    .bind(bulk + 3)
    .execute(p)
    .await
    .unwrap();
    let (min, max): (i64, i64) =
        sqlx::query_as("SELECT min(id), max(id) FROM dedup_records").fetch_one(p).await.unwrap();
    let rare = |after: Option<String>| {
        params(FilterText { message_type: Some("RARE.EVENT"), after: after.as_deref(), ..Default::default() })
    };
    let first = records_list(p, &rare(None)).await.unwrap();
    assert!(first.rows.is_empty(), "no match among the newest {SCAN_WINDOW}");
    assert_eq!(first.searched_to, Some(max + 1 - SCAN_WINDOW));
    let next = first.next.expect("the search continues");
    let second = records_list(p, &rare(Some(next.encode()))).await.unwrap();
    assert_eq!(second.rows.iter().map(|r| r.id).collect::<Vec<_>>(), [min + 2, min + 1, min]);
    assert_eq!((second.searched_to, second.next), (None, None), "the window reached the oldest record");
    assert_eq!(second.prev.map(|c| c.id), Some(min + 2), "back: the records after the first match");

    let common =
        records_list(p, &params(FilterText { message_type: Some("ORDER.PAY"), ..Default::default() })).await.unwrap();
    assert_eq!((common.rows.len(), common.searched_to), (50, None), "a full page needs no notice");
}
