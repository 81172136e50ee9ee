//! The synthetic rows, as `COPY` text: about 1 % failed, dead or stuck, the groups, message
//! types and errors of the run's [`SeedDomain`], duplicates with delays from 100 ms to weeks; the
//! attempt history of every record not succeeded; their aggregates ([`Totals`]).

use std::sync::Arc;

use chrono::{DateTime, TimeDelta, Utc};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use sha2::{Digest, Sha256};

use super::domain::{SeedDomain, SeedMessage, Shares};
use super::totals::{Outcome, Totals};
use crate::message::{IdPolicy, POISON_TYPE, PoisonReason};
use crate::record::HandlerMode;

/// The columns of [`Chunk::records`], in order. The ids are the run's reserved ones: COPY
/// writes given values into an identity column. Binary format: PostgreSQL parses it in three
/// quarters of the time of text (1 M rows: 3.7 s against 4.9 s measured), and it needs no
/// escaping or timestamp formatting on our side.
pub const COPY_SQL: &str = "COPY dedup_records (id, consumer_group, message_id, message_type, status, handler_mode, \
    attempts, max_attempts, reentries, lease_owner, lease_token, lease_expires_at, first_seen_at, updated_at, \
    completed_at, next_attempt_at, last_error, error_class, payload_hash, payload, headers, content_type, \
    source_broker, source_exchange, source_routing_key, source_queue, duplicate_count, last_duplicate_at, poison) \
    FROM STDIN (FORMAT binary)";
const RECORD_COLUMNS: i16 = 29;

/// The columns of [`Chunk::attempts`], in order.
pub const ATTEMPTS_COPY_SQL: &str = "COPY record_attempts (record_id, attempt, worker, started_at, ended_at, outcome, error) FROM STDIN (FORMAT binary)";
const ATTEMPT_COLUMNS: i16 = 7;

/// The rows of a run of consecutive ids, as COPY data.
#[derive(Debug)]
pub struct Chunk {
    /// Records in it.
    pub count: u64,
    /// The `dedup_records` rows ([`COPY_SQL`]).
    pub records: CopyData,
    /// The `record_attempts` rows of its records not succeeded ([`ATTEMPTS_COPY_SQL`]).
    pub attempts: CopyData,
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

/// One `COPY ... FROM STDIN (FORMAT binary)` stream: the signature and header, rows, and the
/// trailer ([`CopyData::finish`]). Layout: PostgreSQL's documentation, "COPY", "Binary Format".
#[derive(Debug)]
pub struct CopyData {
    bytes: Vec<u8>,
    rows: u64,
}

impl CopyData {
    fn with_capacity(bytes: usize) -> Self {
        let mut data = Vec::with_capacity(bytes + 21);
        data.extend_from_slice(b"PGCOPY\n\xff\r\n\0");
        data.extend_from_slice(&0i32.to_be_bytes()); // flags: no OIDs
        data.extend_from_slice(&0i32.to_be_bytes()); // no header extension
        Self { bytes: data, rows: 0 }
    }

    /// Starts a row of `fields` values.
    fn row(&mut self, fields: i16) -> Row<'_> {
        self.rows += 1;
        self.bytes.extend_from_slice(&fields.to_be_bytes());
        Row(&mut self.bytes)
    }

    /// Rows written.
    pub fn rows(&self) -> u64 {
        self.rows
    }

    /// The stream, with its trailer.
    pub fn finish(mut self) -> Vec<u8> {
        self.bytes.extend_from_slice(&(-1i16).to_be_bytes());
        self.bytes
    }
}

/// Microseconds between the Unix epoch and PostgreSQL's (2000-01-01 00:00:00 UTC).
const PG_EPOCH_MICROS: i64 = 946_684_800_000_000;

/// Writes the values of one row: each is its length (-1 for NULL) and its bytes in the type's
/// binary form.
struct Row<'a>(&'a mut Vec<u8>);

impl Row<'_> {
    fn value(&mut self, bytes: &[u8]) -> &mut Self {
        self.0.extend_from_slice(&(bytes.len() as i32).to_be_bytes());
        self.0.extend_from_slice(bytes);
        self
    }

    fn null(&mut self) -> &mut Self {
        self.0.extend_from_slice(&(-1i32).to_be_bytes());
        self
    }

    /// A `text` value.
    fn raw(&mut self, value: &str) -> &mut Self {
        self.value(value.as_bytes())
    }

    fn text(&mut self, value: Option<&str>) -> &mut Self {
        match value {
            Some(v) => self.raw(v),
            None => self.null(),
        }
    }

    fn int8(&mut self, value: i64) -> &mut Self {
        self.value(&value.to_be_bytes())
    }

    fn int4(&mut self, value: i32) -> &mut Self {
        self.value(&value.to_be_bytes())
    }

    fn bool(&mut self, value: bool) -> &mut Self {
        self.value(&[u8::from(value)])
    }

    /// A `timestamptz`: microseconds since PostgreSQL's epoch.
    fn time(&mut self, value: Option<DateTime<Utc>>) -> &mut Self {
        match value {
            Some(at) => self.value(&(at.timestamp_micros() - PG_EPOCH_MICROS).to_be_bytes()),
            None => self.null(),
        }
    }

    fn bytes(&mut self, value: Option<&[u8]>) -> &mut Self {
        match value {
            Some(v) => self.value(v),
            None => self.null(),
        }
    }

    fn uuid(&mut self, value: Option<&uuid::Uuid>) -> &mut Self {
        match value {
            Some(v) => self.value(v.as_bytes()),
            None => self.null(),
        }
    }

    /// A `jsonb`: format version 1, then the JSON text.
    fn jsonb(&mut self, value: Option<&str>) -> &mut Self {
        let Some(json) = value else { return self.null() };
        self.0.extend_from_slice(&(json.len() as i32 + 1).to_be_bytes());
        self.0.push(1);
        self.0.extend_from_slice(json.as_bytes());
        self
    }
}

impl Plan {
    /// The rows of ids `lo..=hi`, counted into `totals`.
    pub fn chunk(&self, lo: i64, hi: i64, totals: &mut Totals) -> Chunk {
        let mut rng = SmallRng::seed_from_u64(lo as u64 ^ 0x5eed_5eed);
        let count = (hi - lo + 1) as u64;
        let mut chunk = Chunk {
            count,
            records: CopyData::with_capacity(count as usize * 300),
            attempts: CopyData::with_capacity(count as usize * 4),
        };
        for g in lo..=hi {
            totals.add(&self.row(&mut chunk, g, &mut rng));
        }
        chunk
    }

    fn row(&self, chunk: &mut Chunk, g: i64, rng: &mut SmallRng) -> Outcome {
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
        chunk
            .records
            .row(RECORD_COLUMNS)
            .int8(g)
            .raw(&group.name)
            .raw(&message_id)
            .raw(message_type)
            .raw(status)
            .text(mode.map(HandlerMode::as_str))
            .int4(attempts)
            .int4(5)
            .int4(if processing { (r_dup * 4.0) as i32 } else { 0 })
            .text(lease.as_ref().map(|(owner, _)| owner.as_str()))
            .uuid(lease.as_ref().map(|(_, token)| token))
            .time(processing.then(|| seen + TimeDelta::seconds(30)))
            .time(Some(seen))
            .time(Some(seen + TimeDelta::seconds(2 * i64::from(attempts))))
            .time(succeeded.then(|| seen + TimeDelta::milliseconds(40)))
            .time((status == "failed").then(|| seen + TimeDelta::seconds(1 << attempts.clamp(0, 20))))
            .text(last_error)
            .text(error_class)
            .bytes(Some(&hash))
            .bytes(body.as_deref())
            .jsonb(headers.as_deref())
            .raw(if binary_poison { "application/octet-stream" } else { "application/json" })
            .raw("rabbitmq")
            .raw(&self.domain.exchange)
            .raw(&message_type.to_lowercase())
            .raw(&group.queue)
            .int4(dups)
            .time(dup_at)
            .bool(poison);
        if !succeeded {
            attempt_rows(&mut chunk.attempts, g, seen, status, attempts, last_error);
        }
        Outcome { group: group_index, seen, status, attempts, duplicates: dups, last_duplicate_at: dup_at }
    }
}

/// The attempt history of record `id`, two seconds apart, each failed in 150 ms but the last:
/// `dead` for a dead record, still running (no end, no outcome) for a stuck one, whose earlier
/// attempts lost their leases.
fn attempt_rows(out: &mut CopyData, id: i64, seen: DateTime<Utc>, status: &str, attempts: i32, error: Option<&str>) {
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
        out.row(ATTEMPT_COLUMNS)
            .int8(id)
            .int4(n)
            .raw(&worker)
            .time(Some(started))
            .time((!running).then(|| started + TimeDelta::milliseconds(150)))
            .text(outcome)
            .text(if processing { None } else { error });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Walks a binary COPY stream: checks its header and trailer, and returns its rows, each as
    /// its values (`None` for NULL).
    fn parse(data: &[u8]) -> Vec<Vec<Option<&[u8]>>> {
        assert_eq!(&data[..11], b"PGCOPY\n\xff\r\n\0", "signature");
        let mut at = 19;
        let mut rows = Vec::new();
        loop {
            let fields = i16::from_be_bytes([data[at], data[at + 1]]);
            at += 2;
            if fields == -1 {
                assert_eq!(at, data.len(), "nothing after the trailer");
                return rows;
            }
            let mut row = Vec::new();
            for _ in 0..fields {
                let len = i32::from_be_bytes(data[at..at + 4].try_into().unwrap());
                at += 4;
                if len < 0 {
                    row.push(None);
                } else {
                    row.push(Some(&data[at..at + len as usize]));
                    at += len as usize;
                }
            }
            rows.push(row);
        }
    }

    #[test]
    fn rows_have_every_column_in_binary_form() {
        let now = Utc::now();
        let domain = SeedDomain::new(&["g1", "g2"], &["THING.MADE", "THING.SOLD"]);
        let plan = Plan::new(1, now - TimeDelta::days(1), now, 1000.0, domain);
        let mut totals = Totals::default();
        let chunk = plan.chunk(1, 2000, &mut totals);
        let columns = |sql: &str| sql.split('(').nth(1).unwrap().split(')').next().unwrap().split(',').count();
        assert!(chunk.attempts.rows() > 0, "records not succeeded have attempts");
        let records = chunk.records.finish();
        let attempts = chunk.attempts.finish();
        let record_rows = parse(&records);
        assert_eq!((chunk.count, record_rows.len()), (2000, 2000));
        assert!(record_rows.iter().all(|r| r.len() == columns(COPY_SQL)));
        assert!(parse(&attempts).iter().all(|r| r.len() == columns(ATTEMPTS_COPY_SQL)));
        let text = |v: Option<&[u8]>| std::str::from_utf8(v.unwrap()).unwrap().to_owned();
        assert!(record_rows.iter().all(|r| ["g1", "g2"].contains(&text(r[1]).as_str())), "the domain's groups");
        assert!(
            record_rows.iter().all(|r| ["THING.MADE", "THING.SOLD", "POISON"].contains(&text(r[3]).as_str())),
            "the domain's types, and poison"
        );
        let first = &record_rows[0];
        assert_eq!(first[0], Some(&1i64.to_be_bytes()[..]), "the ids are given, as int8");
        assert_eq!(first[2].map(|id| std::str::from_utf8(id).unwrap().ends_with(":1")), Some(true), "message id");
        let seen = i64::from_be_bytes(first[12].unwrap().try_into().unwrap()) + PG_EPOCH_MICROS;
        let start = plan.start.timestamp_micros();
        assert!((start..start + 1000).contains(&seen), "first seen in the record's slot of the window: {seen}");
    }
}
