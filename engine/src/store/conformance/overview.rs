//! Conformance cases of the overview's reads ([`crate::console::overview::OverviewReads`]):
//! what they count is what the store and the runtime's books wrote.

use super::claims::{claim, claim_in, claim_one, claim_uncommitted, claimed, complete, fail, group, lease, msg};
use super::roles::{copy, keep};
use super::{GROUP, Harness, sorted};
use crate::console::console_store;
use crate::console::overview::{DelayBucket, GrowthRange, OverviewReads, live_snapshot};
use crate::record::{ConsumerGroup, RecordStatus};
use crate::stats::{Event, Stats};
use crate::store::ClaimAs;
use crate::store::ConflictKind;

/// The overview's counts, traffic, delays and growth points on an empty database and after a
/// record of each status, a stuck one, a conflicting copy and a flush of aggregates.
pub async fn the_overview_reads_what_the_store_and_the_runtime_wrote<H: Harness>() {
    let h = H::fresh().await;
    let pool = h.engine_pool();
    let reads: &dyn OverviewReads = console_store(&pool);
    assert!(reads.status_counts().await.unwrap().is_empty());
    assert_eq!(reads.traffic(3600).await.unwrap(), Default::default());
    let empty = reads.growth(GrowthRange::Hour).await.unwrap();
    assert!((60..=61).contains(&empty.len()), "one point a minute: {}", empty.len());
    assert!(empty.windows(2).all(|w| (w[1].at - w[0].at).num_seconds() == 60), "every bucket, oldest first");
    assert!(empty.iter().all(|p| p.created == 0 && p.total_records.is_none()));
    assert_eq!(empty[0].at.timestamp() % 60, 0, "buckets start on the epoch's minutes");

    let l = lease("worker-1");
    let (paid, dead, stuck) =
        (msg("ORDER.PAY.1", "ORDER.PAY", "a"), msg("ORDER.PAY.2", "ORDER.PAY", "b"), msg("SMS.1", "SMS.SEND", "c"));
    let paid_claim = claimed(claim_one(&h, &paid, &l).await);
    complete(&h, &[&paid_claim], &l).await;
    let dead_claim = claimed(claim_one(&h, &dead, &l).await);
    fail(&h, &dead_claim, &dead, &l, true).await;
    let stuck_claim = claimed(claim_one(&h, &stuck, &l).await);
    h.expire_lease(stuck_claim.id).await;
    let other = msg("ORDER.PAY.1", "ORDER.PAY", "another payload");
    keep(&h, &[copy(paid_claim.id, &other, ConflictKind::Payload)], true).await;

    let stats = Stats::default();
    stats.count(GROUP, Event::Delivery, 5);
    stats.count(GROUP, Event::Created, 3);
    stats.count(GROUP, Event::DuplicateDb, 2);
    stats.duplicate_delay(GROUP, 250);
    stats.duplicate_delay(GROUP, 40);
    let books = pool.runtime_books();
    stats.flush_to(&*books, h.store()).await.unwrap();
    books.sample_table().await.unwrap();

    let counts: Vec<(String, &str, i64)> = reads
        .status_counts()
        .await
        .unwrap()
        .into_iter()
        .map(|c| (c.consumer_group, c.status.as_str(), c.count))
        .collect();
    let expected = [RecordStatus::Dead, RecordStatus::Processing, RecordStatus::Succeeded]
        .map(|s| (GROUP.to_owned(), s.as_str(), 1));
    assert_eq!(sorted(counts), expected.to_vec());
    assert_eq!(reads.stuck_count().await.unwrap(), 1);
    assert_eq!(reads.conflict_count().await.unwrap(), 1);
    assert_eq!(reads.double_effect_count().await.unwrap(), 0);
    assert_eq!(reads.late_duplicate_count().await.unwrap(), 0);
    assert_eq!(reads.consumer_groups().await.unwrap(), [GROUP]);

    // A group whose name differs only in case: each group's counts stay together (the
    // overview folds them per group as they come).
    let shouting = GROUP.to_uppercase();
    let loud = ConsumerGroup::parse(&shouting).unwrap();
    claim_in(&h, &loud, &[&msg("LOUD.1", "ORDER.PAY", "l")], ClaimAs::Succeeded, &l).await;
    let mut groups: Vec<String> = reads.status_counts().await.unwrap().into_iter().map(|c| c.consumer_group).collect();
    groups.dedup();
    assert_eq!(sorted(groups), [shouting.clone(), GROUP.to_owned()], "each group once, its rows together");
    assert_eq!(sorted(reads.consumer_groups().await.unwrap()), [shouting, GROUP.to_owned()]);
    assert_eq!(reads.message_types().await.unwrap(), ["ORDER.PAY", "SMS.SEND"]);

    let hour = reads.traffic(3600).await.unwrap();
    assert_eq!((hour.deliveries, hour.created, hour.duplicates_db, hour.duplicates_redis), (5, 3, 2, 0));
    assert!((hour.duplicate_rate() - 0.4).abs() < 1e-9);
    assert_eq!(
        reads.duplicate_delays(30).await.unwrap(),
        [DelayBucket { le_ms: 100, count: 1, max_delay_ms: 40 }, DelayBucket { le_ms: 1_000, count: 1, max_delay_ms: 250 }]
    );
    for range in [GrowthRange::Hour, GrowthRange::Week] {
        let points = reads.growth(range).await.unwrap();
        assert_eq!(points.iter().map(|p| p.created).sum::<i64>(), 3, "{range:?}: from stats_minute or stats_hour");
        let sampled: Vec<_> = points.iter().filter_map(|p| p.total_records).collect();
        assert_eq!(sampled, [3], "{range:?}: the one sample, in its bucket");
    }

    let live = live_snapshot(reads).await.unwrap();
    assert_eq!((live.stuck, live.conflicts, live.last_minute.deliveries), (1, 1, 5));
    assert_eq!(live.counts.len(), 4);
    assert!((live.at - reads.now().await.unwrap()).num_seconds().abs() < 5, "the database's clock");
}

/// The record counts' fold sums the committed delta rows into one and leaves a claim in
/// flight alone: it neither waits for the claim's transaction nor loses its row.
pub async fn the_record_counts_fold_waits_for_no_claim_in_flight<H: Harness>() {
    let h = H::fresh().await;
    let books = h.engine_pool().runtime_books();
    let l = lease("w1");
    for n in 0..3 {
        claim(&h, &[&msg(&format!("FOLD.{n}"), "ORDER.PAY", "f")], ClaimAs::Succeeded, &l).await;
    }
    let succeeded = |n: i64| vec![(GROUP.to_owned(), "succeeded".to_owned(), n)];
    let (_, in_flight) = claim_uncommitted(&h, &group(), &[&msg("FOLD.3", "ORDER.PAY", "f")], ClaimAs::Succeeded, &l).await;

    let fold = tokio::time::timeout(std::time::Duration::from_secs(5), books.fold_record_counts());
    fold.await.expect("the fold waits for no claim in flight").unwrap();
    assert_eq!(h.counted().await, succeeded(3), "the committed rows, folded");

    in_flight.commit().await.unwrap();
    books.fold_record_counts().await.unwrap();
    assert_eq!(h.counted().await, succeeded(4), "the claim's row, counted once");
    assert_eq!(h.counted().await, h.actual().await);
}
