//! Aggregates kept as the engine works: per-minute counters, the duplicate-delay histogram,
//! fast-path duplicate counts, and table-size samples. Counted in memory on the hot path and
//! flushed to the database about once a second (a crash loses at most that second of counters;
//! record counts by status are exact, written with each transition). Every event also feeds a Prometheus
//! counter (`metrics` facade; the server installs the exporter).

use std::collections::HashMap;
use std::sync::Mutex;

use chrono::{DateTime, DurationRound, NaiveDate, TimeDelta, Utc};
use crate::runtime::books::RuntimeBooks;
#[cfg(feature = "testing")]
use crate::runtime::EnginePool;
use crate::store::{DedupStore, StoreError};

/// Something the engine counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Event {
    /// A delivery arrived.
    Delivery,
    /// A claim created a new record.
    Created,
    /// A record was claimed.
    Claimed,
    /// A record became `succeeded`.
    Succeeded,
    /// An attempt failed (the record is `failed`, or `dead` when counted under `Dead` too).
    Failed,
    /// A record became `dead` (attempts exhausted, permanent error, poison).
    Dead,
    /// A poison message.
    Poison,
    /// A redelivery of a stuck record was parked.
    Parked,
    /// A duplicate caught by the Redis marker.
    DuplicateRedis,
    /// A duplicate caught by the database.
    DuplicateDb,
    /// A Redis lookup found a marker.
    RedisHit,
    /// A Redis lookup found none.
    RedisMiss,
    /// Redis did not answer; the database was asked instead.
    RedisFallback,
    /// An expired lease was claimed by another worker.
    LeaseTakeover,
    /// A copy was sent back through the retry path.
    Retry,
}

/// The per-minute counters, indexed by `Event as usize` (the column order of `stats_minute`).
pub type Counters = [i64; ALL_EVENTS.len()];

/// Every event, in discriminant order.
pub const ALL_EVENTS: [Event; 15] = [
    Event::Delivery,
    Event::Created,
    Event::Claimed,
    Event::Succeeded,
    Event::Failed,
    Event::Dead,
    Event::Poison,
    Event::Parked,
    Event::DuplicateRedis,
    Event::DuplicateDb,
    Event::RedisHit,
    Event::RedisMiss,
    Event::RedisFallback,
    Event::LeaseTakeover,
    Event::Retry,
];

/// Upper bounds (ms) of the duplicate-delay histogram buckets; the last one catches the rest.
pub const DELAY_BUCKETS_MS: [i64; 13] = [
    100,
    1_000,
    5_000,
    30_000,
    60_000,
    300_000,
    1_800_000,
    3_600_000,
    21_600_000,
    86_400_000,
    604_800_000,
    2_592_000_000,
    i64::MAX,
];

/// The bucket bound for a delay.
pub fn delay_bucket(delay_ms: i64) -> i64 {
    DELAY_BUCKETS_MS.into_iter().find(|le| delay_ms <= *le).unwrap_or(i64::MAX)
}

/// (minute, group) → counters.
pub(crate) type MinuteCounts = HashMap<(DateTime<Utc>, String), Counters>;
/// (day, group, bucket) → (count, max delay ms).
pub(crate) type DelayCounts = HashMap<(NaiveDate, String, i64), (i64, i64)>;
/// (day, group) → (count, max age ms) of late first deliveries.
pub(crate) type LateCounts = HashMap<(NaiveDate, String), (i64, i64)>;

#[derive(Default)]
struct Pending {
    minutes: MinuteCounts,
    delays: DelayCounts,
    /// (group, message id) → (copies, latest arrival)
    fast_path_duplicates: HashMap<(String, String), (i32, DateTime<Utc>)>,
    late: LateCounts,
}

/// The in-memory side of the aggregates. Shared by all workers.
#[derive(Default)]
pub struct Stats {
    pending: Mutex<Pending>,
}

fn metric_name(event: Event) -> (&'static str, Option<(&'static str, &'static str)>) {
    match event {
        Event::Delivery => ("dedup_deliveries_total", None),
        Event::Created => ("dedup_records_created_total", None),
        Event::Claimed => ("dedup_claims_total", None),
        Event::Succeeded => ("dedup_succeeded_total", None),
        Event::Failed => ("dedup_failures_total", None),
        Event::Dead => ("dedup_dead_letters_total", None),
        Event::Poison => ("dedup_poison_total", None),
        Event::Parked => ("dedup_parked_total", None),
        Event::DuplicateRedis => ("dedup_duplicates_total", Some(("layer", "redis"))),
        Event::DuplicateDb => ("dedup_duplicates_total", Some(("layer", "database"))),
        Event::RedisHit => ("dedup_redis_lookups_total", Some(("result", "hit"))),
        Event::RedisMiss => ("dedup_redis_lookups_total", Some(("result", "miss"))),
        Event::RedisFallback => ("dedup_redis_fallbacks_total", None),
        Event::LeaseTakeover => ("dedup_lease_takeovers_total", None),
        Event::Retry => ("dedup_retries_total", None),
    }
}

impl Stats {
    /// Counts `n` occurrences of `event` for `group` in the current minute.
    pub fn count(&self, group: &str, event: Event, n: i64) {
        if n == 0 {
            return;
        }
        let (name, label) = metric_name(event);
        let group_label = group.to_owned();
        match label {
            Some((k, v)) => metrics::counter!(name, "group" => group_label, k => v).increment(n.unsigned_abs()),
            None => metrics::counter!(name, "group" => group_label).increment(n.unsigned_abs()),
        }
        let minute = Utc::now().duration_trunc(TimeDelta::minutes(1)).unwrap_or_else(|_| Utc::now());
        let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        pending.minutes.entry((minute, group.to_owned())).or_insert([0; ALL_EVENTS.len()])[event as usize] += n;
    }

    /// Records a duplicate's arrival delay (arrival minus the record's first seen).
    pub fn duplicate_delay(&self, group: &str, delay_ms: i64) {
        let delay_ms = delay_ms.max(0);
        metrics::histogram!("dedup_duplicate_delay_seconds", "group" => group.to_owned())
            .record(delay_ms as f64 / 1000.0);
        let day = Utc::now().date_naive();
        let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        let entry = pending.delays.entry((day, group.to_owned(), delay_bucket(delay_ms))).or_insert((0, 0));
        entry.0 += 1;
        entry.1 = entry.1.max(delay_ms);
    }

    /// Records a first delivery older than its group's retention
    /// ([`crate::actions::cleanup::late`]): counted per day, with the oldest age.
    pub fn late_delivery(&self, group: &str, age_ms: i64) {
        metrics::counter!("dedup_late_deliveries_total", "group" => group.to_owned()).increment(1);
        let day = Utc::now().date_naive();
        let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        let entry = pending.late.entry((day, group.to_owned())).or_insert((0, 0));
        entry.0 += 1;
        entry.1 = entry.1.max(age_ms);
    }

    /// Notes a duplicate caught by Redis, to be added to its record's `duplicate_count`.
    pub fn fast_path_duplicate(&self, group: &str, message_id: &str) {
        let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        let entry =
            pending.fast_path_duplicates.entry((group.to_owned(), message_id.to_owned())).or_insert((0, Utc::now()));
        entry.0 += 1;
        entry.1 = Utc::now();
    }

    /// Writes everything counted since the last flush to the engine's pool `pool`, on any of
    /// its databases (the engine's flusher does it every second). On failure the counts are
    /// kept for the next flush. For tests: the engine's flusher writes through its books.
    #[cfg(feature = "testing")]
    pub async fn flush<S: DedupStore>(&self, pool: impl Into<EnginePool>, store: &S) -> Result<(), StoreError> {
        self.flush_to(pool.into().runtime_books().as_ref(), store).await
    }

    /// Writes everything counted since the last flush through `books`, then the fast path's
    /// duplicate counts through `store`. What a failure left unwritten is kept for the next
    /// flush; what committed before it is not (the aggregates commit before the duplicate
    /// counts are tried, so keeping them would count them twice).
    pub(crate) async fn flush_to<S: DedupStore>(&self, books: &dyn RuntimeBooks, store: &S) -> Result<(), StoreError> {
        let taken = std::mem::take(&mut *self.pending.lock().unwrap_or_else(|e| e.into_inner()));
        if let Err(e) = books.write_stats(&taken.minutes, &taken.delays, &taken.late).await {
            self.keep(taken);
            return Err(e.into());
        }
        if let Err(e) = add_fast_path_duplicates(store, &taken.fast_path_duplicates).await {
            self.keep(Pending { fast_path_duplicates: taken.fast_path_duplicates, ..Pending::default() });
            return Err(e);
        }
        Ok(())
    }

    /// Adds `unwritten` back to what waits for the next flush.
    fn keep(&self, unwritten: Pending) {
        let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        for (k, v) in unwritten.minutes {
            let counters = pending.minutes.entry(k).or_insert([0; ALL_EVENTS.len()]);
            counters.iter_mut().zip(v).for_each(|(a, b)| *a += b);
        }
        for (k, (n, max)) in unwritten.delays {
            let e = pending.delays.entry(k).or_insert((0, 0));
            e.0 += n;
            e.1 = e.1.max(max);
        }
        for (k, (n, max)) in unwritten.late {
            let e = pending.late.entry(k).or_insert((0, 0));
            e.0 += n;
            e.1 = e.1.max(max);
        }
        for (k, (n, at)) in unwritten.fast_path_duplicates {
            let e = pending.fast_path_duplicates.entry(k).or_insert((0, at));
            e.0 += n;
            e.1 = e.1.max(at);
        }
    }
}

/// Adds the fast path's duplicate counts, (group, message id) → (copies, latest arrival), to
/// their records (one transaction: all or none).
async fn add_fast_path_duplicates<S: DedupStore>(
    store: &S,
    counts: &HashMap<(String, String), (i32, DateTime<Utc>)>,
) -> Result<(), StoreError> {
    if counts.is_empty() {
        return Ok(());
    }
    let entries: Vec<(String, String, i32, DateTime<Utc>)> =
        counts.iter().map(|((g, id), (n, at))| (g.clone(), id.clone(), *n, *at)).collect();
    store.add_fast_path_duplicates(&entries).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_fall_into_the_smallest_bucket_that_holds_them() {
        assert_eq!(delay_bucket(0), 100);
        assert_eq!(delay_bucket(100), 100);
        assert_eq!(delay_bucket(101), 1_000);
        assert_eq!(delay_bucket(3_000_000_000), i64::MAX);
    }

    #[test]
    fn counts_accumulate_per_minute_and_group() {
        let stats = Stats::default();
        stats.count("g", Event::Claimed, 2);
        stats.count("g", Event::Claimed, 3);
        stats.count("h", Event::DuplicateRedis, 1);
        let pending = stats.pending.lock().unwrap();
        let g: i64 =
            pending.minutes.iter().filter(|((_, grp), _)| grp == "g").map(|(_, c)| c[Event::Claimed as usize]).sum();
        assert_eq!(g, 5);
        assert_eq!(pending.minutes.len(), 2);
    }
}
