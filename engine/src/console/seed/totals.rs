//! The aggregates of the seeded records (`stats_minute`, `duplicate_delays`), counted in Rust as
//! the rows are generated, so no pass over the loaded table is needed; each store writes them
//! ([`Totals::into_counts`]). The values are those the
//! engine would have counted for the records' histories: a delivery per record and per
//! duplicate, 80 % of the duplicates caught by Redis, every attempt a claim.

use std::collections::HashMap;

use chrono::{DateTime, NaiveDate, Utc};

use crate::stats::{ALL_EVENTS, Counters, DelayCounts, Event, MinuteCounts, delay_bucket};

/// What the aggregates need to know of one generated record.
#[derive(Debug, Clone, Copy)]
pub struct Outcome {
    /// Its consumer group, by index into the run's groups ([`super::rows::Plan::group_names`]).
    pub group: usize,
    /// Its first-seen time (whole microseconds, as stored).
    pub seen: DateTime<Utc>,
    /// Its status.
    pub status: &'static str,
    /// Its attempts.
    pub attempts: i32,
    /// Its duplicate count.
    pub duplicates: i32,
    /// When its last duplicate arrived, if any.
    pub last_duplicate_at: Option<DateTime<Utc>>,
}

/// Per-(minute, group) counters and the duplicate-delay histogram of the records seen so far.
#[derive(Debug, Default)]
pub struct Totals {
    /// (minute since the epoch, group index) → counters.
    minutes: HashMap<(i64, usize), Counters>,
    /// (day, group index, bucket bound) → (duplicates, largest delay in ms).
    delays: HashMap<(NaiveDate, usize, i64), (i64, i64)>,
}

impl Totals {
    /// Counts one record.
    pub fn add(&mut self, r: &Outcome) {
        let minute = r.seen.timestamp().div_euclid(60);
        let c = self.minutes.entry((minute, r.group)).or_insert([0; ALL_EVENTS.len()]);
        let (attempts, duplicates) = (i64::from(r.attempts), i64::from(r.duplicates));
        c[Event::Delivery as usize] += 1 + duplicates;
        c[Event::Created as usize] += 1;
        c[Event::Claimed as usize] += attempts;
        c[Event::Succeeded as usize] += i64::from(r.status == "succeeded");
        if matches!(r.status, "failed" | "dead") {
            c[Event::Failed as usize] += attempts;
        }
        c[Event::Dead as usize] += i64::from(r.status == "dead");
        // All duplicates for now; [`split_duplicates`] shares them out per minute.
        c[Event::DuplicateDb as usize] += duplicates;
        c[Event::RedisMiss as usize] += 1;
        c[Event::Retry as usize] += (attempts - 1).max(0);
        if let Some(at) = r.last_duplicate_at.filter(|_| duplicates > 0) {
            // Rounded to the millisecond, half away from zero (delays are never negative).
            let delay_ms = ((at - r.seen).num_microseconds().unwrap_or(i64::MAX - 500).max(0) + 500) / 1000;
            let d = self.delays.entry((at.date_naive(), r.group, delay_bucket(delay_ms))).or_insert((0, 0));
            d.0 += duplicates;
            d.1 = d.1.max(delay_ms);
        }
    }

    /// The counts as the runtime's flush writes them: per (minute, group) with the duplicates
    /// shared out ([`split_duplicates`]), and per (day, group, bucket); `groups` names the groups
    /// by index.
    pub fn into_counts(self, groups: &[String]) -> (MinuteCounts, DelayCounts) {
        let minutes = self
            .minutes
            .into_iter()
            .filter_map(|((m, g), c)| {
                Some(((DateTime::from_timestamp(m * 60, 0)?, groups[g].clone()), split_duplicates(c)))
            })
            .collect();
        let delays = self.delays.into_iter().map(|((d, g, le), v)| ((d, groups[g].clone(), le), v)).collect();
        (minutes, delays)
    }
}

/// Shares a minute's duplicates (all counted under `DuplicateDb` by [`Totals::add`]) out: 80 %,
/// rounded as PostgreSQL rounds `(n * 0.8)::bigint`, caught by Redis (a Redis hit each), the rest
/// by the database.
fn split_duplicates(mut c: Counters) -> Counters {
    let duplicates = c[Event::DuplicateDb as usize];
    let by_redis = (duplicates * 8 + 5) / 10;
    c[Event::DuplicateRedis as usize] = by_redis;
    c[Event::RedisHit as usize] = by_redis;
    c[Event::DuplicateDb as usize] = duplicates - by_redis;
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_follow_the_records() {
        let seen = DateTime::from_timestamp(120, 0).unwrap();
        let mut totals = Totals::default();
        let base = Outcome { group: 0, seen, status: "succeeded", attempts: 1, duplicates: 0, last_duplicate_at: None };
        totals.add(&base);
        totals.add(&Outcome {
            status: "dead",
            attempts: 5,
            duplicates: 2,
            last_duplicate_at: Some(seen + chrono::TimeDelta::microseconds(1_500)),
            ..base
        });
        for _ in 0..2 {
            totals.add(&Outcome { duplicates: 1, last_duplicate_at: Some(seen), ..base });
        }
        let c = split_duplicates(totals.minutes[&(2, 0)]);
        assert_eq!(c[Event::Delivery as usize], 8);
        assert_eq!(c[Event::Created as usize], 4);
        assert_eq!(c[Event::Claimed as usize], 8);
        assert_eq!((c[Event::Succeeded as usize], c[Event::Failed as usize], c[Event::Dead as usize]), (3, 5, 1));
        // 80 % of the minute's 4, not the sum of each record's rounded share (2 + 1 + 1).
        assert_eq!((c[Event::DuplicateRedis as usize], c[Event::DuplicateDb as usize]), (3, 1));
        assert_eq!(c[Event::Retry as usize], 4);
        assert_eq!(totals.delays[&(seen.date_naive(), 0, 100)], (4, 2), "1.5 ms rounds to 2");
    }
}
