//! Conformance case of the seed ([`crate::console::seed::seed_records`] through
//! [`crate::console::seed::SeedBooks`]): the records loaded are counted as the engine counts its
//! own, with their attempts and aggregates, and a second seed appends.

use std::collections::BTreeSet;

use super::claims::{claim_one, claimed, lease, msg};
use super::Harness;
use crate::console::console_store;
use crate::console::filter::{RecordFilter, RecordListParams};
use crate::console::overview::GrowthRange;
use crate::console::records::records_list;
use crate::console::seed::{SeedDomain, SeedError, SeedParams, seed_records};
use crate::record::RecordStatus;

/// Two groups, one with a quote in its name, two types, and an error whose text needs escaping
/// on every database (a quote, a backslash, a NUL-free non-ASCII letter).
fn domain() -> SeedDomain {
    let mut domain = SeedDomain::new(&["alpha-service", "o'brien-service"], &["THING.MADE", "THING.SOLD"]);
    domain.errors.push(SeedError { class: "QUOTED".to_owned(), detail: |n| format!("l'erreur \\ «{n}»") });
    domain
}

/// Seeds 4 000 records into an empty store in chunks of 700, then 1 000 more: `record_counts`
/// equals the rows after each (the MySQL store writes delta rows, PostgreSQL's statement counts
/// them), every status, the domain's groups and types are there, each failed or
/// dead record has one attempt row per attempt with its error text as generated, the
/// aggregates count every record, the second run's ids follow the first's, and a consumer's
/// claim after them takes an id past both.
pub async fn seeded_records_are_counted_with_their_attempts_and_a_second_seed_appends<H: Harness>() {
    let h = H::fresh().await;
    let pool = h.engine_pool();
    let store = console_store(&pool);
    let two_days = chrono::TimeDelta::days(2);
    let started = chrono::Utc::now();
    let report = seed_records(store, &SeedParams { records: 4_000, days: 2, batch: 700 }, &domain(), |_, _| {})
        .await
        .unwrap();
    assert_eq!(report.records, 4_000);
    let whole_span = started - two_days - chrono::TimeDelta::seconds(1)..=chrono::Utc::now() - two_days;
    assert!(whole_span.contains(&report.from), "an empty table gets the whole span: {report:?}");
    let counted = h.counted().await;
    assert_eq!(counted, h.actual().await, "record_counts equal the rows");
    assert_eq!(counted.iter().map(|(_, _, n)| n).sum::<i64>(), 4_000);
    let statuses: BTreeSet<&str> = counted.iter().map(|(_, s, _)| s.as_str()).collect();
    assert_eq!(statuses, BTreeSet::from(["dead", "failed", "processing", "succeeded"]));
    let groups = store.consumer_groups().await.unwrap();
    assert_eq!(groups, ["alpha-service", "o'brien-service"]);
    let types = store.message_types().await.unwrap();
    let named: Vec<&str> = types.iter().map(String::as_str).collect();
    assert!(named.ends_with(&["THING.MADE", "THING.SOLD"]) && named.len() <= 3, "the domain's, and poison: {named:?}");
    assert_eq!(h.message_types().await, types);

    let mut failures = 0;
    for status in [RecordStatus::Failed, RecordStatus::Dead] {
        let filter = RecordFilter { status: Some(status), ..RecordFilter::default() };
        let page = records_list(store, &RecordListParams { filter, limit: 100, ..Default::default() }).await.unwrap();
        assert!(!page.rows.is_empty(), "{status:?} records");
        for row in &page.rows {
            let attempts = h.attempt_rows(row.id).await;
            assert_eq!(attempts.len(), row.attempts as usize, "one attempt row per attempt of {}", row.id);
            let last = if status == RecordStatus::Dead { "dead" } else { "failed" };
            assert!(attempts.last().is_none_or(|(_, outcome)| outcome.as_deref() == Some(last)), "{attempts:?}");
            let stored = h.record(&row.consumer_group, &row.message_id).await.unwrap();
            if stored.error_class.as_deref() == Some("QUOTED") {
                assert_eq!(stored.last_error, Some(format!("QUOTED: l'erreur \\ «{}»", row.id)), "as generated");
                failures += 1;
            }
        }
    }
    assert!(failures > 0, "the quoted error is among the failures");
    let traffic = store.traffic(3 * 86_400).await.unwrap();
    assert_eq!(traffic.created, 4_000, "stats_minute counts every record");
    let growth = store.growth(GrowthRange::Week).await.unwrap();
    assert_eq!(growth.iter().map(|p| p.created).sum::<i64>(), 4_000);
    let sampled = growth.iter().rev().find_map(|p| p.total_records).expect("table samples");
    assert!((3_900..=4_000).contains(&sampled), "{sampled}");

    let params = SeedParams { records: 1_000, days: 1, batch: 1_000 };
    let second = seed_records(store, &params, &domain(), |_, _| {}).await.unwrap();
    assert!(second.from > chrono::Utc::now() - chrono::TimeDelta::minutes(5), "it starts after the newest: {second:?}");
    let counted = h.counted().await;
    assert_eq!(counted, h.actual().await, "record_counts equal the rows after a second seed");
    assert_eq!(counted.iter().map(|(_, _, n)| n).sum::<i64>(), 5_000);
    assert_eq!(store.id_bounds().await.unwrap(), Some((1, 5_000)), "the second seed's ids follow the first's");
    let claim = claimed(claim_one(&h, &msg("AFTER.SEED.1", "THING.MADE", "{}"), &lease("w1")).await);
    assert!(claim.id > 5_000, "a claim takes an id past the seeds': {}", claim.id);
    assert_eq!(h.counted().await, h.actual().await);
}
