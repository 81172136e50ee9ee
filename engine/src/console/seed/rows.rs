//! The synthetic rows, database-neutral: about 1 % failed, dead or stuck, the groups, message
//! types and errors of the run's [`SeedDomain`], duplicates with delays from 100 ms to weeks; the
//! attempt history of every record not succeeded; their aggregates ([`Totals`]). Each store
//! writes them in its own form ([`SeedRows`]).

use std::sync::Arc;

use chrono::{DateTime, TimeDelta, Utc};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use sha2::{Digest, Sha256};

use super::domain::{SeedDomain, SeedMessage, Shares};
use super::totals::{Outcome, Totals};
use crate::message::{IdPolicy, POISON_TYPE, PoisonReason};
use crate::record::HandlerMode;

/// How a database writes the generated rows: the PostgreSQL store as binary `COPY` data, the
/// MySQL store as multi-row `INSERT` statements. The generator calls it on a blocking thread, one
/// value per [`Chunk`], so the encoding runs beside the database's load of the previous chunk.
pub trait SeedRows: Send + 'static {
    /// Adds one `dedup_records` row.
    fn record(&mut self, r: &SeedRecord<'_>);
    /// Adds one `record_attempts` row.
    fn attempt(&mut self, a: &SeedAttempt<'_>);
}

/// One generated `dedup_records` row: every column a seed writes, in the order the stores'
/// statements list them. The id is the run's reserved one.
#[derive(Debug, Clone, Copy)]
pub struct SeedRecord<'a> {
    pub id: i64,
    pub consumer_group: &'a str,
    pub message_id: &'a str,
    pub message_type: &'a str,
    pub status: &'a str,
    pub handler_mode: Option<&'a str>,
    pub attempts: i32,
    pub max_attempts: i32,
    pub reentries: i32,
    pub lease_owner: Option<&'a str>,
    pub lease_token: Option<&'a uuid::Uuid>,
    pub lease_expires_at: Option<DateTime<Utc>>,
    pub first_seen_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    pub completed_at: Option<DateTime<Utc>>,
    pub next_attempt_at: Option<DateTime<Utc>>,
    pub last_error: Option<&'a str>,
    pub error_class: Option<&'a str>,
    pub payload_hash: &'a [u8],
    pub payload: Option<&'a [u8]>,
    /// JSON text.
    pub headers: Option<&'a str>,
    pub content_type: &'a str,
    pub source_broker: &'a str,
    pub source_exchange: &'a str,
    pub source_routing_key: &'a str,
    pub source_queue: &'a str,
    pub duplicate_count: i32,
    pub last_duplicate_at: Option<DateTime<Utc>>,
    pub poison: bool,
}

/// One generated `record_attempts` row, in the order the stores' statements list its columns.
#[derive(Debug, Clone, Copy)]
pub struct SeedAttempt<'a> {
    pub record_id: i64,
    pub attempt: i32,
    pub worker: &'a str,
    pub started_at: DateTime<Utc>,
    pub ended_at: Option<DateTime<Utc>>,
    pub outcome: Option<&'a str>,
    pub error: Option<&'a str>,
}

/// The rows of a run of consecutive ids, encoded by a store's [`SeedRows`].
#[derive(Debug)]
pub struct Chunk<E> {
    /// Records in it.
    pub count: u64,
    /// Its records and the attempts of those not succeeded.
    pub rows: E,
}

/// Where the ids of a run fall in time, and what its records are made of. A record's id is also
/// the number in its message id, so message ids never repeat.
#[derive(Debug, Clone)]
pub struct Plan {
    /// The run's first id.
    pub first: i64,
    /// The window's start.
    pub start: DateTime<Utc>,
    /// The window's end, in whole microseconds (as stored, so the aggregates counted from the
    /// generated times match the stored ones).
    pub now: DateTime<Utc>,
    /// Microseconds of window per record.
    pub micros_per_record: f64,
    /// The groups, types, errors and payloads.
    domain: Arc<SeedDomain>,
    groups: Arc<Shares>,
    types: Arc<Shares>,
    /// (class, last error) of the two kinds of poison: no message id, a payload not JSON.
    poison: Arc<[(String, String); 2]>,
}

impl Plan {
    /// A plan of records `first..` spread over `start..now`, `micros_per_record` apart, drawn
    /// from `domain` (checked by the caller).
    pub fn new(
        first: i64,
        start: DateTime<Utc>,
        now: DateTime<Utc>,
        micros_per_record: f64,
        domain: SeedDomain,
    ) -> Self {
        let reason = |r: PoisonReason| (r.error_class(), r.to_string());
        let poison = [
            reason(PoisonReason::NoMessageId { looked_at: IdPolicy::default().from }),
            reason(PoisonReason::UnparsablePayload("expected value at line 1 column 1".to_owned())),
        ];
        Self {
            first,
            start,
            now,
            micros_per_record,
            groups: Arc::new(Shares::new(domain.groups.iter().map(|g| g.share))),
            types: Arc::new(Shares::new(domain.message_types.iter().map(|t| t.share))),
            domain: Arc::new(domain),
            poison: Arc::new(poison),
        }
    }

    /// The run's groups' names, by index (as [`Outcome::group`] counts them).
    pub fn group_names(&self) -> Vec<String> {
        self.domain.groups.iter().map(|g| g.name.clone()).collect()
    }
}

impl Plan {
    /// The rows of ids `lo..=hi`, written into `rows` and counted into `totals`.
    pub fn chunk<E: SeedRows>(&self, lo: i64, hi: i64, mut rows: E, totals: &mut Totals) -> Chunk<E> {
        let mut rng = SmallRng::seed_from_u64(lo as u64 ^ 0x5eed_5eed);
        for g in lo..=hi {
            totals.add(&self.row(&mut rows, g, &mut rng));
        }
        Chunk { count: (hi - lo + 1) as u64, rows }
    }

    fn row(&self, out: &mut impl SeedRows, g: i64, rng: &mut SmallRng) -> Outcome {
        let [r_status, r_group, r_type, r_attempt, r_dup, r_error, r_time]: [f64; 7] = rng.random();
        let seen =
            self.start + TimeDelta::microseconds((((g - self.first) as f64 + r_time) * self.micros_per_record) as i64);
        let status = match r_status {
            r if r < 0.004 => "dead",
            r if r < 0.010 => "failed",
            r if r < 0.0106 => "processing",
            _ => "succeeded",
        };
        let group_index = self.groups.pick(r_group);
        let group = &self.domain.groups[group_index];
        let seed_type = &self.domain.message_types[self.types.pick(r_type)];
        let number = format!("{g:014}");
        let poison = status == "dead" && r_error < 0.15;
        let tries = match status {
            "succeeded" if r_attempt < 0.95 => 1,
            "succeeded" if r_attempt < 0.99 => 2,
            "succeeded" => 3,
            "failed" => 1 + (r_attempt * 4.0) as i32,
            "dead" => 5,
            _ => 1 + (r_attempt * 3.0) as i32,
        };
        let attempts = if poison { 0 } else { tries };
        let dups = if r_dup < 0.15 { 1 + (r_dup * 20.0) as i32 } else { 0 };
        let dup_at = (dups > 0).then(|| {
            let delay_ms = 10f64.powf(2.0 + r_dup * 45.0) * (1.0 + r_attempt);
            (seen + TimeDelta::milliseconds(delay_ms.min(4e12) as i64)).min(self.now)
        });
        let message_type = if poison { POISON_TYPE } else { seed_type.name.as_str() };
        let message_id =
            if poison { format!("{POISON_TYPE}.{number}") } else { format!("{}.{number}:1", seed_type.name) };
        let unsettled = matches!(status, "failed" | "dead");
        let binary_poison = poison && r_error < 0.07;
        let handler_error;
        let (error_class, last_error): (Option<&str>, Option<&str>) = if !unsettled {
            (None, None)
        } else if poison {
            let (class, text) = &self.poison[usize::from(binary_poison)];
            (Some(class), Some(text))
        } else {
            let errors = &self.domain.errors;
            let error = &errors[((r_error * errors.len() as f64) as usize).min(errors.len() - 1)];
            handler_error = format!("{}: {}", error.class, (error.detail)(g));
            (Some(&error.class), Some(&handler_error))
        };
        let body: Option<Vec<u8>> = if status == "succeeded" {
            None
        } else if binary_poison {
            Some(Sha256::digest(number.as_bytes()).to_vec())
        } else {
            let message = SeedMessage { number: g, message_id: &message_id, message_type, group: &group.name };
            Some((self.domain.payload)(&message).to_string().into_bytes())
        };
        // A succeeded record's payload is gone; its hash only has to be 32 bytes.
        let hash: [u8; 32] = match &body {
            Some(body) => Sha256::digest(body).into(),
            None => rng.random(),
        };
        let processing = status == "processing";
        let mode = if poison {
            None
        } else if processing {
            Some(HandlerMode::Leased)
        } else {
            Some(seed_type.mode)
        };
        let succeeded = status == "succeeded";
        let lease = processing.then(|| {
            let owner = format!("seed-{}:{}:worker-{}", g % 3, 1000 + g % 7, g % 4);
            (owner, uuid::Uuid::from_u128(rng.random()))
        });
        let headers = (!succeeded).then(|| format!(r#"{{"x-seeded": true, "x-message-id": "{message_id}"}}"#));
        out.record(&SeedRecord {
            id: g,
            consumer_group: &group.name,
            message_id: &message_id,
            message_type,
            status,
            handler_mode: mode.map(HandlerMode::as_str),
            attempts,
            max_attempts: 5,
            reentries: if processing { (r_dup * 4.0) as i32 } else { 0 },
            lease_owner: lease.as_ref().map(|(owner, _)| owner.as_str()),
            lease_token: lease.as_ref().map(|(_, token)| token),
            lease_expires_at: processing.then(|| seen + TimeDelta::seconds(30)),
            first_seen_at: seen,
            updated_at: seen + TimeDelta::seconds(2 * i64::from(attempts)),
            completed_at: succeeded.then(|| seen + TimeDelta::milliseconds(40)),
            next_attempt_at: (status == "failed").then(|| seen + TimeDelta::seconds(1 << attempts.clamp(0, 20))),
            last_error,
            error_class,
            payload_hash: &hash,
            payload: body.as_deref(),
            headers: headers.as_deref(),
            content_type: if binary_poison { "application/octet-stream" } else { "application/json" },
            source_broker: "rabbitmq",
            source_exchange: &self.domain.exchange,
            source_routing_key: &message_type.to_lowercase(),
            source_queue: &group.queue,
            duplicate_count: dups,
            last_duplicate_at: dup_at,
            poison,
        });
        if !succeeded {
            attempt_rows(out, g, seen, status, attempts, last_error);
        }
        Outcome { group: group_index, seen, status, attempts, duplicates: dups, last_duplicate_at: dup_at }
    }
}

/// The attempt history of record `id`, two seconds apart, each failed in 150 ms but the last:
/// `dead` for a dead record, still running (no end, no outcome) for a stuck one, whose earlier
/// attempts lost their leases.
fn attempt_rows(
    out: &mut impl SeedRows,
    id: i64,
    seen: DateTime<Utc>,
    status: &str,
    attempts: i32,
    error: Option<&str>,
) {
    let processing = status == "processing";
    let worker = format!("seed-host:{}:worker-{}", 1000 + id % 7, id % 4);
    for n in 1..=attempts {
        let started = seen + TimeDelta::seconds(2 * i64::from(n - 1));
        let running = processing && n == attempts;
        let outcome = match status {
            _ if running => None,
            "processing" => Some("lease_lost"),
            "dead" if n == attempts => Some("dead"),
            _ => Some("failed"),
        };
        out.attempt(&SeedAttempt {
            record_id: id,
            attempt: n,
            worker: &worker,
            started_at: started,
            ended_at: (!running).then(|| started + TimeDelta::milliseconds(150)),
            outcome,
            error: if processing { None } else { error },
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Keeps what the test looks at of each row.
    #[derive(Default)]
    struct Kept {
        records: Vec<(i64, String, String, String, DateTime<Utc>)>,
        attempts: usize,
    }

    impl SeedRows for Kept {
        fn record(&mut self, r: &SeedRecord<'_>) {
            let row = (
                r.id,
                r.consumer_group.to_owned(),
                r.message_id.to_owned(),
                r.message_type.to_owned(),
                r.first_seen_at,
            );
            self.records.push(row);
        }

        fn attempt(&mut self, _: &SeedAttempt<'_>) {
            self.attempts += 1;
        }
    }

    #[test]
    fn rows_follow_the_domain_and_the_window() {
        let now = Utc::now();
        let domain = SeedDomain::new(&["g1", "g2"], &["THING.MADE", "THING.SOLD"]);
        let plan = Plan::new(1, now - TimeDelta::days(1), now, 1000.0, domain);
        let mut totals = Totals::default();
        let chunk = plan.chunk(1, 2000, Kept::default(), &mut totals);
        let records = &chunk.rows.records;
        assert_eq!((chunk.count, records.len()), (2000, 2000));
        assert!(chunk.rows.attempts > 0, "records not succeeded have attempts");
        assert!(records.iter().all(|r| ["g1", "g2"].contains(&r.1.as_str())), "the domain's groups");
        assert!(
            records.iter().all(|r| ["THING.MADE", "THING.SOLD", "POISON"].contains(&r.3.as_str())),
            "the domain's types, and poison"
        );
        assert_eq!(records.iter().map(|r| r.0).collect::<Vec<_>>(), (1..=2000).collect::<Vec<_>>(), "the ids given");
        assert!(records[0].2.ends_with(":1"), "message id {}", records[0].2);
        let (seen, start) = (records[0].4.timestamp_micros(), plan.start.timestamp_micros());
        assert!((start..start + 1000).contains(&seen), "first seen in the record's slot of the window: {seen}");
    }
}
