//! The console's read queries against a real PostgreSQL: filters, keyset pages under concurrent
//! inserts, grouping by error class, and aggregates against brute-force counts.

use std::collections::BTreeMap;

use dedup_engine::console::QueryError;
use dedup_engine::console::failures::{FailureReads, retries};
use dedup_engine::console::filter::{FilterText, RecordListParams};
use dedup_engine::console::overview::{GrowthRange, OverviewReads, live_snapshot};
use dedup_engine::console::records::{
    MarkerState, SCAN_WINDOW, UNRECORDED_WORKER, record_detail, record_marker, records_list,
};
use dedup_engine::console::seed::{MAX_BATCH, MAX_DAYS, MAX_RECORDS, SeedDomain, SeedParams, seed_records};
use dedup_engine::fastpath::{FastPath, FastPathSettings};
use dedup_engine::record::RecordStatus;
use dedup_engine::testing::TestDatabase;
use sqlx::PgPool;

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
        let first = records_list(
            &p,
            &params(FilterText {
                sort: Some(sort),
                message_type: Some("ORDER.PAY"),
                limit: Some("10"),
                ..Default::default()
            }),
        )
        .await
        .unwrap();
        let mut pages = vec![first.clone()];
        let mut next = first.next;
        while let Some(cursor) = next {
            let after = cursor.encode();
            let page = records_list(
                &p,
                &params(FilterText {
                    sort: Some(sort),
                    message_type: Some("ORDER.PAY"),
                    limit: Some("10"),
                    after: Some(&after),
                    ..Default::default()
                }),
            )
            .await
            .unwrap();
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
            let page = records_list(
                &p,
                &params(FilterText {
                    sort: Some(sort),
                    message_type: Some("ORDER.PAY"),
                    limit: Some("10"),
                    before: Some(&before),
                    ..Default::default()
                }),
            )
            .await
            .unwrap();
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

/// The domain of the seeded tests: groups and types by name, the engine's generic errors.
fn seed_domain() -> SeedDomain {
    SeedDomain::new(&["alpha-service", "beta-service", "gamma-service"], &["THING.MADE", "THING.SOLD"])
}

/// Seeds a small data set and checks every aggregate the overview shows against a brute-force
/// count over the records themselves.
#[tokio::test]
async fn aggregates_match_brute_force_counts_on_seeded_data() {
    let db = TestDatabase::create().await;
    let p = &db.pool;
    let params = SeedParams { records: 20_000, days: 2, batch: 3_000 };
    let report = seed_records(p, &params, &seed_domain(), |_, _| {}).await.unwrap();
    assert_eq!(report.records, 20_000);
    let classes: Vec<(bool, String)> =
        sqlx::query_as("SELECT DISTINCT poison, error_class FROM dedup_records WHERE status = 'dead' ORDER BY 1, 2")
            .fetch_all(p)
            .await
            .unwrap();
    let classes: Vec<(bool, &str)> = classes.iter().map(|(poison, c)| (*poison, c.as_str())).collect();
    assert_eq!(
        classes,
        [(false, "TIMEOUT"), (false, "UNAVAILABLE"), (true, "NO_MESSAGE_ID"), (true, "UNPARSABLE_PAYLOAD")],
        "the domain's error classes as given, and the engine's poison"
    );
    // Into the empty table the UNIQUE key and the secondary indexes were dropped for the load
    // and built after it.
    dedup_engine::store::postgres::verify_schema(p, &db.schema).await.expect("the dedup key is back after the seed");
    let indexes: i64 = sqlx::query_scalar("SELECT count(*) FROM pg_indexes WHERE tablename = 'dedup_records'")
        .fetch_one(p)
        .await
        .unwrap();
    let fresh = TestDatabase::create().await;
    let expected: i64 = sqlx::query_scalar("SELECT count(*) FROM pg_indexes WHERE tablename = 'dedup_records'")
        .fetch_one(&fresh.pool)
        .await
        .unwrap();
    assert_eq!(indexes, expected, "every index of the migrations is there after the seed");
    insert(p, Rec { id: "ORDER.PAY.manual:1", status: "dead", error_class: Some("X: y"), ..Rec::default() }).await;

    let counted: BTreeMap<(String, String), i64> = sqlx::query_as::<_, (String, String, i64)>(
        "SELECT consumer_group, status, count(*) FROM dedup_records GROUP BY 1, 2",
    )
    .fetch_all(p)
    .await
    .unwrap()
    .into_iter()
    .map(|(g, s, n)| ((g, s), n))
    .collect();
    let aggregated: BTreeMap<(String, String), i64> = p
        .status_counts()
        .await
        .unwrap()
        .into_iter()
        .map(|c| ((c.consumer_group, c.status.to_string()), c.count))
        .collect();
    assert_eq!(aggregated, counted, "record_counts equal COUNT(*) by group and status");
    assert_eq!(p.consumer_groups().await.unwrap(), ["alpha-service", "beta-service", "g1", "gamma-service"]);

    let brute_stuck: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM dedup_records WHERE status = 'processing' AND lease_expires_at < now()",
    )
    .fetch_one(p)
    .await
    .unwrap();
    assert!(brute_stuck > 0, "the seed leaves stuck records");
    assert_eq!(p.stuck_count().await.unwrap(), brute_stuck);

    let created_in_stats: i64 =
        sqlx::query_scalar("SELECT sum(created)::bigint FROM stats_minute").fetch_one(p).await.unwrap();
    assert_eq!(created_in_stats, 20_000, "seeded stats count every seeded record");
    let hourly: i64 = sqlx::query_scalar("SELECT sum(created)::bigint FROM stats_hour").fetch_one(p).await.unwrap();
    assert_eq!(hourly, 20_000, "the hourly rollup follows the seeded minutes");
    sqlx::query(
        "INSERT INTO stats_minute (minute, consumer_group, created) VALUES (date_trunc('minute', now()), 'g1', 5)
         ON CONFLICT (minute, consumer_group) DO UPDATE SET created = stats_minute.created + 5",
    )
    .execute(p)
    .await
    .unwrap();
    let hourly: i64 = sqlx::query_scalar("SELECT sum(created)::bigint FROM stats_hour").fetch_one(p).await.unwrap();
    assert_eq!(hourly, 20_005, "and the engine's later flushes");
    sqlx::query("UPDATE stats_minute SET created = created - 5 WHERE consumer_group = 'g1'").execute(p).await.unwrap();
    let mismatched: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM
             (SELECT date_bin('1 hour', minute, 'epoch') AS hour, consumer_group, sum(created) AS created
              FROM stats_minute GROUP BY 1, 2 HAVING sum(created) <> 0) m
             FULL JOIN (SELECT * FROM stats_hour WHERE created <> 0) h USING (hour, consumer_group)
         WHERE m.created IS DISTINCT FROM h.created",
    )
    .fetch_one(p)
    .await
    .unwrap();
    assert_eq!(mismatched, 0, "every hour and group of stats_hour sums its minutes");
    let week = p.traffic(7 * 86_400).await.unwrap();
    assert_eq!(week.created, 20_000);
    assert!(week.duplicate_rate() > 0.0 && week.duplicate_rate() < 1.0);

    let points = p.growth(GrowthRange::Week).await.unwrap();
    assert!((84..=85).contains(&points.len()), "{} buckets of 2 h", points.len());
    assert_eq!(points.iter().map(|g| g.created).sum::<i64>(), 20_000);
    let last_total = points.iter().rev().find_map(|g| g.total_records).expect("table samples");
    assert!(last_total > 19_000, "{last_total}");

    let dead_brute: i64 =
        sqlx::query_scalar("SELECT count(*) FROM dedup_records WHERE status = 'dead'").fetch_one(p).await.unwrap();
    let groups = p.dead_letter_groups(1000).await.unwrap();
    assert_eq!(groups.iter().map(|g| g.records).sum::<i64>(), dead_brute);

    let failed_brute: Vec<(i32, i64)> =
        sqlx::query_as("SELECT attempts, count(*) FROM dedup_records WHERE status = 'failed' GROUP BY 1 ORDER BY 1")
            .fetch_all(p)
            .await
            .unwrap();
    let dist: Vec<(i32, i64)> =
        retries(p, p, 5).await.unwrap().distribution.into_iter().map(|b| (b.attempts, b.records)).collect();
    assert_eq!(dist, failed_brute);

    let types = p.message_types().await.unwrap();
    assert_eq!(types, ["ORDER.PAY", "POISON", "THING.MADE", "THING.SOLD"], "the domain's types, and poison");
    let live = live_snapshot(p).await.unwrap();
    assert_eq!(live.counts.iter().map(|c| c.count).sum::<i64>(), 20_001);

    let attempts_rows: i64 = sqlx::query_scalar("SELECT count(*) FROM record_attempts").fetch_one(p).await.unwrap();
    assert!(attempts_rows > 0, "non-succeeded seeded records carry their attempt history");
}

/// Absurd sizes are refused before any id is reserved: the sequence does not move.
#[tokio::test]
async fn seed_refuses_absurd_sizes_before_reserving_ids() {
    let db = TestDatabase::create().await;
    let ok = SeedParams { records: 10, days: 1, batch: 10 };
    for params in [
        SeedParams { records: MAX_RECORDS + 1, ..ok },
        SeedParams { days: MAX_DAYS + 1, ..ok },
        SeedParams { batch: MAX_BATCH + 1, ..ok },
        SeedParams { records: 0, ..ok },
    ] {
        let result = seed_records(&db.pool, &params, &seed_domain(), |_, _| {}).await;
        assert!(matches!(result, Err(QueryError::BadFilter(_))), "{params:?}: {result:?}");
    }
    let no_groups = SeedDomain { groups: Vec::new(), ..seed_domain() };
    let no_share = SeedDomain::new(&["g"], &["T.T"]);
    let no_share = SeedDomain {
        message_types: vec![dedup_engine::console::seed::SeedType { share: 0.0, ..no_share.message_types[0].clone() }],
        ..no_share
    };
    for domain in [no_groups, no_share] {
        let result = seed_records(&db.pool, &ok, &domain, |_, _| {}).await;
        assert!(matches!(result, Err(QueryError::BadFilter(_))), "{result:?}");
    }
    let called: bool =
        sqlx::query_scalar("SELECT is_called FROM dedup_records_id_seq").fetch_one(&db.pool).await.unwrap();
    assert!(!called, "no id was reserved");
    seed_records(&db.pool, &ok, &seed_domain(), |_, _| {}).await.unwrap();
    let hourly: i64 =
        sqlx::query_scalar("SELECT sum(created)::bigint FROM stats_hour").fetch_one(&db.pool).await.unwrap();
    assert_eq!(hourly, 10, "the seed writes its hours itself");
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
