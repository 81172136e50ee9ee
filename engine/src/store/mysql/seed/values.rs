//! The seeded rows as multi-row `INSERT` statements with their values written in ([`InsertRows`]):
//! no placeholders, so no limit of 65 535 binds a statement and no prepared statement cached per
//! statement text; a statement ends once it passes a size under `max_allowed_packet`. A value is
//! written so that no `sql_mode` and no connection character set reads it otherwise: text and
//! bytes of printable ASCII other than `'` and `\` as a quoted literal, anything else as a hex
//! literal (`_utf8mb4 X'…'` for text, `X'…'` for bytes); times as `'YYYY-MM-DD HH:MM:SS.ffffff'`
//! in UTC (the columns are `DATETIME(6)` in UTC).

use std::fmt::Write;

use chrono::{DateTime, Datelike, Timelike, Utc};

use crate::console::seed::{SeedAttempt, SeedRecord, SeedRows};

/// The start of a `dedup_records` statement: its columns, in [`SeedRecord`]'s order.
const RECORDS_INSERT: &str = "INSERT INTO dedup_records (id, consumer_group, message_id, message_type, status, \
    handler_mode, attempts, max_attempts, reentries, lease_owner, lease_token, lease_expires_at, first_seen_at, \
    updated_at, completed_at, next_attempt_at, last_error, error_class, payload_hash, payload, headers, content_type, \
    source_broker, source_exchange, source_routing_key, source_queue, duplicate_count, last_duplicate_at, poison) VALUES ";

/// The start of a `record_attempts` statement, in [`SeedAttempt`]'s order.
const ATTEMPTS_INSERT: &str =
    "INSERT INTO record_attempts (record_id, attempt, worker, started_at, ended_at, outcome, error) VALUES ";

/// A chunk's rows as statements: the records', then their attempts' (sent in that order, so the
/// attempts' foreign key finds its records).
#[derive(Debug)]
pub(super) struct InsertRows {
    /// The `dedup_records` statements.
    pub(super) records: Statements,
    /// The `record_attempts` statements.
    pub(super) attempts: Statements,
}

impl InsertRows {
    /// Rows in statements of about `limit` bytes.
    pub(super) fn new(limit: usize) -> Self {
        Self { records: Statements::new(RECORDS_INSERT, limit), attempts: Statements::new(ATTEMPTS_INSERT, limit) }
    }
}

impl SeedRows for InsertRows {
    fn record(&mut self, r: &SeedRecord<'_>) {
        let mut v = self.records.row();
        v.int(r.id).text(Some(r.consumer_group)).text(Some(r.message_id)).text(Some(r.message_type));
        v.text(Some(r.status)).text(r.handler_mode).int(r.attempts.into()).int(r.max_attempts.into());
        v.int(r.reentries.into()).text(r.lease_owner).bytes(r.lease_token.map(|t| &t.as_bytes()[..]));
        v.time(r.lease_expires_at).time(Some(r.first_seen_at)).time(Some(r.updated_at)).time(r.completed_at);
        v.time(r.next_attempt_at).text(r.last_error).text(r.error_class).bytes(Some(r.payload_hash));
        v.bytes(r.payload).text(r.headers).text(Some(r.content_type)).text(Some(r.source_broker));
        v.text(Some(r.source_exchange)).text(Some(r.source_routing_key)).text(Some(r.source_queue));
        v.int(r.duplicate_count.into()).time(r.last_duplicate_at).int(r.poison.into());
        self.records.end_row();
    }

    fn attempt(&mut self, a: &SeedAttempt<'_>) {
        let mut v = self.attempts.row();
        v.int(a.record_id).int(a.attempt.into()).text(Some(a.worker)).time(Some(a.started_at)).time(a.ended_at);
        v.text(a.outcome).text(a.error);
        self.attempts.end_row();
    }
}

/// Multi-row `INSERT` statements of one table, each ended once it passes its size limit.
#[derive(Debug)]
pub(super) struct Statements {
    head: &'static str,
    limit: usize,
    done: Vec<String>,
    current: String,
}

impl Statements {
    fn new(head: &'static str, limit: usize) -> Self {
        Self { head, limit, done: Vec::new(), current: String::new() }
    }

    /// Starts a row: the values written next are its.
    fn row(&mut self) -> Values<'_> {
        if self.current.is_empty() {
            self.current.reserve(self.limit + self.limit / 4);
            self.current.push_str(self.head);
        } else {
            self.current.push(',');
        }
        self.current.push('(');
        Values { out: &mut self.current, first: true }
    }

    fn end_row(&mut self) {
        self.current.push(')');
        if self.current.len() >= self.limit {
            self.done.push(std::mem::take(&mut self.current));
        }
    }

    /// The statements.
    pub(super) fn finish(mut self) -> Vec<String> {
        if !self.current.is_empty() {
            self.done.push(self.current);
        }
        self.done
    }
}

/// Writes one row's values, comma-separated.
struct Values<'a> {
    out: &'a mut String,
    first: bool,
}

impl Values<'_> {
    fn next(&mut self) -> &mut String {
        if !std::mem::take(&mut self.first) {
            self.out.push(',');
        }
        self.out
    }

    fn int(&mut self, value: i64) -> &mut Self {
        let _ = write!(self.next(), "{value}");
        self
    }

    fn text(&mut self, value: Option<&str>) -> &mut Self {
        self.literal(value.map(str::as_bytes), "_utf8mb4 ")
    }

    fn bytes(&mut self, value: Option<&[u8]>) -> &mut Self {
        self.literal(value, "")
    }

    /// A quoted literal when every byte is printable ASCII but `'` and `\`; else a hex literal
    /// after `introducer`.
    fn literal(&mut self, value: Option<&[u8]>, introducer: &str) -> &mut Self {
        let out = self.next();
        let Some(value) = value else {
            out.push_str("NULL");
            return self;
        };
        if value.iter().all(|b| (b' '..=b'~').contains(b) && *b != b'\'' && *b != b'\\') {
            out.push('\'');
            // Printable ASCII, so UTF-8.
            out.push_str(std::str::from_utf8(value).unwrap_or_default());
            out.push('\'');
        } else {
            out.push_str(introducer);
            out.push_str("X'");
            for b in value {
                let _ = write!(out, "{b:02X}");
            }
            out.push('\'');
        }
        self
    }

    fn time(&mut self, value: Option<DateTime<Utc>>) -> &mut Self {
        let out = self.next();
        match value {
            Some(t) => {
                let _ = write!(
                    out,
                    "'{:04}-{:02}-{:02} {:02}:{:02}:{:02}.{:06}'",
                    t.year(),
                    t.month(),
                    t.day(),
                    t.hour(),
                    t.minute(),
                    t.second(),
                    t.timestamp_subsec_micros()
                );
            }
            None => out.push_str("NULL"),
        }
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_quoted_when_plain_and_hex_otherwise() {
        let mut s = Statements::new("INSERT INTO t VALUES ", 1 << 20);
        let at = DateTime::from_timestamp(86_400 + 61, 5_000).unwrap();
        s.row().int(-3).text(Some("a b:1")).text(Some("l'é\\")).bytes(Some(&[0, 255])).text(None).time(Some(at));
        s.end_row();
        assert_eq!(
            s.finish(),
            ["INSERT INTO t VALUES (-3,'a b:1',_utf8mb4 X'6C27C3A95C',X'00FF',NULL,'1970-01-02 00:01:01.000005')"]
        );
    }

    #[test]
    fn a_statement_ends_past_its_limit() {
        let mut s = Statements::new("I ", 10);
        for n in 0..5 {
            s.row().int(n).int(n);
            s.end_row();
        }
        assert_eq!(s.finish(), ["I (0,0),(1,1)", "I (2,2),(3,3)", "I (4,4)"]);
    }
}
