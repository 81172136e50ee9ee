//! What a transaction counts, held back until it commits.

use crate::stats::{ALL_EVENTS, Counters, Event, Stats};

/// Stats events, duplicate delays, payload conflicts, parked copies and dead-lettered poison
/// seen while a transaction runs, applied to [`Stats`] (and the Prometheus counters and the log)
/// only once it has committed.
///
/// A transaction that does not commit counts and logs nothing: an optimistic attempt that is
/// rolled back and run again with savepoints would otherwise count its claims, duplicates and
/// conflicts twice, and a batch whose commit fails once more when it is redelivered. The leased
/// path, which has no such rollback, applies a tally at once.
#[derive(Default)]
pub(super) struct Tally {
    counters: Counters,
    delays_ms: Vec<i64>,
    /// (message id, record id) of deliveries whose payload differs from their record's.
    conflicts: Vec<(String, i64)>,
    /// (message id, record id) of redeliveries of stuck records parked under `hold`.
    parked: Vec<(String, i64)>,
    /// (record's message id, reason, whether it is poison) of messages recorded as dead at once:
    /// poison ones, and ones whose type has no handler (not poison: DESIGN.md, "Terms").
    dead_at_once: Vec<(String, String, bool)>,
    /// Ages (ms) of new records' deliveries older than the retention.
    late: Vec<i64>,
    /// (message id, record id) of deliveries of another message type than their id's record.
    reused_ids: Vec<(String, i64)>,
}

impl Tally {
    /// One occurrence of `event`.
    pub(super) fn count(&mut self, event: Event) {
        self.counters[event as usize] += 1;
    }

    /// A duplicate's arrival delay (see [`Stats::duplicate_delay`]).
    pub(super) fn duplicate_delay(&mut self, delay_ms: i64) {
        self.delays_ms.push(delay_ms);
    }

    /// A delivery whose payload differs from its record's (same message id): counted in the
    /// `dedup_payload_conflicts_total` metric and logged as a warning when applied.
    pub(super) fn payload_conflict(&mut self, message_id: &str, record: i64) {
        self.conflicts.push((message_id.to_owned(), record));
    }

    /// A delivery whose id is a record's of another message type (a reused id): counted in the
    /// `dedup_reused_ids_total` metric and logged as a warning when applied.
    pub(super) fn reused_id(&mut self, message_id: &str, record: i64) {
        self.reused_ids.push((message_id.to_owned(), record));
    }

    /// A redelivery of a stuck record parked (`on_lease_expiry = hold`): counted as
    /// [`Event::Parked`] and logged when applied.
    pub(super) fn parked(&mut self, message_id: &str, record: i64) {
        self.count(Event::Parked);
        self.parked.push((message_id.to_owned(), record));
    }

    /// A new record's delivery older than the retention (see [`Stats::late_delivery`]).
    pub(super) fn late(&mut self, age_ms: i64) {
        self.late.push(age_ms);
    }

    /// A message recorded as `dead` at once (`poison`, or without a handler): logged as a
    /// warning when applied.
    pub(super) fn dead_at_once(&mut self, message_id: &str, reason: &str, poison: bool) {
        self.dead_at_once.push((message_id.to_owned(), reason.to_owned(), poison));
    }

    /// Adds everything to `stats` for `group`.
    pub(super) fn apply(self, stats: &Stats, group: &str) {
        for (event, n) in ALL_EVENTS.into_iter().zip(self.counters) {
            stats.count(group, event, n);
        }
        for delay_ms in self.delays_ms {
            stats.duplicate_delay(group, delay_ms);
        }
        for (message_id, record) in self.conflicts {
            metrics::counter!("dedup_payload_conflicts_total", "group" => group.to_owned()).increment(1);
            tracing::warn!(message_id, record, "payload conflict: same message id, different payload");
        }
        for (message_id, record) in self.reused_ids {
            metrics::counter!("dedup_reused_ids_total", "group" => group.to_owned()).increment(1);
            tracing::warn!(
                message_id,
                record,
                "reused message id: a delivery of another message type than the record of its id; dead-lettered and kept \
                 in record_conflicts (is the id source right? see the README, \"Message ids\")"
            );
        }
        for (message_id, record) in self.parked {
            tracing::info!(message_id, record, "redelivery of a stuck record parked (on_lease_expiry = hold)");
        }
        for (message_id, reason, poison) in self.dead_at_once {
            if poison {
                tracing::warn!(message_id, reason, "poison message dead-lettered");
            } else {
                tracing::warn!(
                    message_id,
                    reason,
                    "no handler for the message's type: dead-lettered with its payload (requeue it once a handler \
                     or a type mapping is added)"
                );
            }
        }
        if let Some(oldest) = self.late.iter().max() {
            tracing::warn!(
                count = self.late.len(),
                oldest_ms = oldest,
                "deliveries older than the retention found no record: if they were duplicates of deleted records, \
                 their handlers ran again; lengthen the retention"
            );
        }
        for age_ms in self.late {
            stats.late_delivery(group, age_ms);
        }
    }
}
