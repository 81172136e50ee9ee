//! The console's aggregates on seeded data against brute-force counts over the records, and the
//! seed's refusals.

use std::collections::BTreeMap;

use dedup_engine::console::QueryError;
use dedup_engine::console::failures::{FailureReads, retries};
use dedup_engine::console::overview::{GrowthRange, OverviewReads, live_snapshot};
use dedup_engine::console::seed::{MAX_BATCH, MAX_DAYS, MAX_RECORDS, SeedDomain, SeedParams, seed_records};
use dedup_engine::testing::TestDatabase;

use super::{Rec, insert};

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
