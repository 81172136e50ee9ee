//! The idempotent pipeline: what happens to a batch of deliveries between the broker and the
//! ack, whatever the broker.
//!
//! For each delivery: find its id (else it is poison), find its handler, hold it when that
//! handler is paused ([`crate::pause`]), ask the Redis fast path (a hit is a duplicate: skip),
//! look it up in the fingerprints cleanup kept (a late duplicate: `late.rs`), then claim its record in PostgreSQL and run the handler —
//! transactional handlers all in one transaction (one commit per batch; without savepoints, and
//! again with a savepoint per message if one of them fails), leased handlers with set-based
//! claims, one heartbeat and completions as their calls finish (`leased.rs`). After the commit, Redis markers are written for what succeeded. The result is one
//! [`Disposition`] per delivery; the source turns it into acks, retry copies, dead-letter copies
//! or offset commits. The pipeline itself never acks.

mod conflicts;
mod late;
mod leased;
mod spans;
mod starts;
mod tally;
mod transactional;

use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use tracing::{Instrument, Span};

use crate::actions::cleanup::late::RetentionWatch;
use crate::fastpath::{FastPath, Lookup, Marker};
use crate::handler::{Handler, HandlerInput, HandlerRegistry};
use crate::message::{IdPolicy, Identified, InboundMessage, Poison, PoisonReason, TypePolicy};
use crate::pause::{Passage, Pauses};
use crate::record::{ConsumerGroup, LateDuplicatePolicy, RecordStatus};
use crate::retry::Backoff;
use crate::stats::{Event, Stats};
use crate::store::{ClaimItem, ExistingRecord};
use crate::store::PipelineStore;
use crate::store::postgres::PgStore;
use spans::Outcomes;
use tally::Tally;

/// What the source must do with a delivery once the pipeline is done with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Disposition {
    /// Finished with: acknowledge it (RabbitMQ ack, Kafka offset may pass it).
    Ack(AckReason),
    /// Send a copy back after `delay` (the retry path: a delayed queue or retry topic), then
    /// acknowledge the original.
    Retry {
        /// How long until the copy should be delivered again.
        delay: Duration,
    },
    /// Send a copy to the dead-letter queue or topic with `reason`, then acknowledge the
    /// original. The record is already `dead` in the database either way — or, for a reused id
    /// (a delivery of another message type than its id's record), the copy is kept in
    /// `record_conflicts`.
    DeadLetter {
        /// Why it is dead, for the copy's headers.
        reason: String,
    },
    /// The pipeline could not judge it (database unavailable, transaction failed): give it
    /// back to the broker unacknowledged, to be judged again.
    Redeliver,
    /// Its handler is paused: nothing was claimed or recorded — or, for a leased handler paused
    /// while the delivery's call waited for its slot, the claim was given back unstarted,
    /// without counting the attempt. Held on the retry path like [`Disposition::Retry`] (a copy
    /// due after `delay`, confirmed before the original is acknowledged), to be judged again
    /// then.
    Held {
        /// How long until the copy comes back.
        delay: Duration,
    },
}

/// Why a delivery is acknowledged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AckReason {
    /// Its handler succeeded and the record is `succeeded`.
    Processed,
    /// A duplicate caught by the Redis marker.
    DuplicateRedis,
    /// A duplicate caught by the database (record `succeeded`, `dead`, or out of attempts).
    DuplicateDatabase,
    /// A redelivery of a stuck record under `hold`: kept in the record, waits for an operator.
    Parked,
    /// The worker's lease was taken over before it completed; the new holder settles it.
    LeaseLost,
}

/// Pipeline settings of one consumer group.
#[derive(Debug, Clone)]
pub struct PipelineSettings {
    /// The consumer group all records are scoped to.
    pub group: ConsumerGroup,
    /// Attempts before a record goes dead.
    pub max_attempts: i32,
    /// Lease written by every claim (raised to [`crate::store::MIN_LEASE`]).
    pub lease: Duration,
    /// Back-off between attempts.
    pub backoff: Backoff,
    /// How ids are found; what is poison.
    pub id_policy: IdPolicy,
    /// How message types are found and mapped to handler types.
    pub type_policy: TypePolicy,
    /// Largest part of a poison payload kept on its record, in bytes.
    pub keep_poison_payload_bytes: usize,
    /// What a late duplicate may do.
    pub late_duplicates: LateDuplicatePolicy,
}

/// Everything a pipeline needs. Cheap to clone; shared by a consumer's workers.
///
/// `S`: the store its records live in ([`PgStore`] by default; `MySqlStore` with the feature
/// `mysql`). Static: the hot path calls the store's methods directly, as before.
#[derive(Clone)]
pub struct Pipeline<S = PgStore> {
    store: S,
    fast_path: Arc<FastPath>,
    stats: Arc<Stats>,
    handlers: Arc<HandlerRegistry>,
    settings: Arc<PipelineSettings>,
    retention: Arc<RetentionWatch>,
    pauses: Arc<Pauses>,
}

/// A delivery with its id found and its handler chosen.
struct Routed<'a> {
    index: usize,
    message: &'a InboundMessage,
    identified: Identified,
    handler: Handler,
    payload_hash: Vec<u8>,
    /// The probe of its breaker-paused handler ([`Passage::Probe`]).
    probe: bool,
}

impl Routed<'_> {
    /// Its item in a batch claim; only a leased handler under `reclaim` takes an expired lease
    /// over (or any whose effect never started). `starts_at_once`: see
    /// [`ClaimItem::starts_at_once`].
    fn claim_item(&self, starts_at_once: bool) -> ClaimItem<'_> {
        ClaimItem {
            message_id: &self.identified.id,
            message_type: &self.identified.message_type,
            payload_hash: &self.payload_hash,
            message: self.message,
            id_source: self.identified.id_kind,
            reclaim_expired: self.handler.reclaims_expired(),
            starts_at_once,
        }
    }
}

/// A succeeded record whose Redis marker is due after the commit.
type DueMarker = (String, Marker);

/// A delivery's index in its batch, its disposition, and the marker due if it succeeded.
type Outcome = (usize, Disposition, Option<DueMarker>);

impl<S: PipelineStore> Pipeline<S> {
    /// A pipeline over a store, a fast path, shared stats and a group's handlers.
    pub fn new(
        store: S,
        fast_path: Arc<FastPath>,
        stats: Arc<Stats>,
        handlers: HandlerRegistry,
        settings: PipelineSettings,
    ) -> Self {
        let pauses = Pauses::new(&store, settings.group.as_str(), &handlers);
        Self {
            store,
            fast_path,
            stats,
            handlers: Arc::new(handlers),
            settings: Arc::new(settings),
            retention: Arc::default(),
            pauses,
        }
    }

    /// Flags first deliveries older than the retention `watch` knows
    /// ([`crate::actions::cleanup::late`]); without it none is flagged.
    pub fn with_retention(mut self, watch: Arc<RetentionWatch>) -> Self {
        self.retention = watch;
        self
    }

    /// A new record's delivery: when its own timestamp is older than the group's retention (and
    /// plausible), it is late (most likely a duplicate of a record cleanup deleted): counted in
    /// `tally`.
    fn check_late(&self, message: &InboundMessage, tally: &mut Tally) {
        let (Some(published), Some(retention_ms)) =
            (message.published_at, self.retention.retention_ms(self.settings.group.as_str()))
        else {
            return;
        };
        let age_ms = (Utc::now() - published).num_milliseconds();
        if age_ms > retention_ms && age_ms <= crate::actions::cleanup::late::MAX_PLAUSIBLE_AGE_MS {
            tally.late(age_ms);
        }
    }

    /// The consumer group.
    pub fn group(&self) -> &ConsumerGroup {
        &self.settings.group
    }

    /// The shared stats (the tests read the counters).
    #[cfg(feature = "testing")]
    pub fn stats(&self) -> &Arc<Stats> {
        &self.stats
    }

    /// Processes a batch and returns one disposition per delivery, in order. `worker` names the
    /// caller (`<host>:<pid>:<n>`); it becomes the lease owner. Runs in a `batch` span (see
    /// `pipeline/spans.rs`). The consumer calls [`Pipeline::process_in`]; the tests and the
    /// benchmarks drive the pipeline with this.
    #[cfg(feature = "testing")]
    pub async fn process(&self, worker: &str, batch: &[InboundMessage]) -> Vec<Disposition> {
        self.process_in(&self.batch_span(worker, batch.len()), worker, batch).await
    }

    /// [`Pipeline::process`] in `span` (from [`Pipeline::batch_span`]), which gets the batch's
    /// outcome counts at the end; the consumer settles the batch in the same span.
    pub(crate) async fn process_in(&self, span: &Span, worker: &str, batch: &[InboundMessage]) -> Vec<Disposition> {
        let (dispositions, poison) = self.judge(worker, batch).instrument(span.clone()).await;
        if !span.is_disabled() {
            Outcomes::of(&dispositions, &poison).record(span);
        }
        dispositions
    }

    /// The body of [`Pipeline::process`]; also returns the indexes of the poison deliveries.
    async fn judge(&self, worker: &str, batch: &[InboundMessage]) -> (Vec<Disposition>, Vec<usize>) {
        let group = self.settings.group.as_str();
        self.stats.count(group, Event::Delivery, batch.len() as i64);
        let mut dispositions: Vec<Option<Disposition>> = vec![None; batch.len()];
        let mut poison: Vec<(usize, &InboundMessage, Poison)> = Vec::new();
        let mut routed: Vec<Routed<'_>> = Vec::new();

        for (index, message) in batch.iter().enumerate() {
            match self.settings.id_policy.identify(message, &self.settings.type_policy) {
                Err(p) => poison.push((index, message, p)),
                Ok(identified) => match self.handlers.get(&identified.message_type) {
                    Some(handler) => routed.push(Routed {
                        index,
                        message,
                        payload_hash: message.payload_hash(),
                        handler: handler.clone(),
                        identified,
                        probe: false,
                    }),
                    None => {
                        let reason = PoisonReason::NoHandler {
                            message_type: identified.message_type.clone(),
                            raw: identified.raw_type,
                        };
                        let (message_type, id_source) = (identified.message_type, Some(identified.id_kind));
                        let record_id = identified.id;
                        poison.push((index, message, Poison { record_id, message_type, reason, id_source }));
                    }
                },
            }
        }

        let poison_indexes = poison.iter().filter(|p| p.2.reason.is_poison()).map(|p| p.0).collect();
        let routed = self.hold_paused(routed, &mut dispositions).await;
        // Copied only while fingerprints are kept: a database that never ran cleanup pays nothing.
        let deliveries = match self.retention.fingerprints_kept() {
            true => routed.iter().map(|r| (r.identified.id.as_str().to_owned(), r.identified.message_type.clone())).collect(),
            false => Vec::new(),
        };
        let (routed, lookup) =
            tokio::join!(self.check_fast_path(routed, &mut dispositions), self.lookup_fingerprints(deliveries));
        let (routed, late) = self.check_fingerprints(routed, lookup, &mut dispositions).await;
        let (tx_items, leased_items): (Vec<_>, Vec<_>) =
            routed.into_iter().partition(|r| matches!(r.handler, Handler::Transactional(_)));

        let (tx_results, leased_results) =
            tokio::join!(self.run_transaction(worker, tx_items, poison), self.run_leased(worker, leased_items));
        let mut markers = Vec::new();
        for (index, disposition, marker) in tx_results.into_iter().chain(leased_results) {
            dispositions[index] = Some(disposition);
            markers.extend(marker);
        }
        if !markers.is_empty() && !self.fast_path.mark_many(&markers).await {
            tracing::debug!(
                count = markers.len(),
                "Redis markers not written; the database still protects these records"
            );
        }
        if !late.is_empty() {
            self.note_late_duplicates(&late).await;
        }
        (dispositions.into_iter().map(|d| d.unwrap_or(Disposition::Redeliver)).collect(), poison_indexes)
    }

    /// Holds the deliveries whose handler is paused (nothing claimed, nothing written), returns
    /// the rest.
    async fn hold_paused<'a>(
        &self,
        routed: Vec<Routed<'a>>,
        dispositions: &mut [Option<Disposition>],
    ) -> Vec<Routed<'a>> {
        let mut gate = self.pauses.gate().await;
        if gate.is_open() {
            return routed;
        }
        let mut rest = Vec::with_capacity(routed.len());
        for r in routed {
            match gate.pass(&r.identified.message_type).await {
                Passage::Hold(delay) => dispositions[r.index] = Some(Disposition::Held { delay }),
                Passage::Probe => rest.push(Routed { probe: true, ..r }),
                Passage::Go => rest.push(r),
            }
        }
        rest
    }

    /// Drops deliveries whose Redis marker exists (duplicates), returns the rest.
    async fn check_fast_path<'a>(
        &self,
        routed: Vec<Routed<'a>>,
        dispositions: &mut [Option<Disposition>],
    ) -> Vec<Routed<'a>> {
        let group = self.settings.group.as_str();
        let keys: Vec<String> = routed.iter().map(|r| self.fast_path.key(group, r.identified.id.as_str())).collect();
        let lookups = self.fast_path.lookup_many(&keys).await;
        let now_ms = Utc::now().timestamp_millis();
        let mut rest = Vec::with_capacity(routed.len());
        for (r, lookup) in routed.into_iter().zip(lookups) {
            match lookup {
                Lookup::Hit(marker) if marker.matches(&r.payload_hash, &r.identified.message_type) => {
                    self.stats.count(group, Event::RedisHit, 1);
                    self.stats.count(group, Event::DuplicateRedis, 1);
                    self.stats.duplicate_delay(group, now_ms - marker.first_seen_ms);
                    self.stats.fast_path_duplicate(group, r.identified.id.as_str());
                    dispositions[r.index] = Some(Disposition::Ack(AckReason::DuplicateRedis));
                }
                Lookup::Hit(_) => {
                    // Same id, other payload or type: the database judges it (a payload conflict,
                    // a reused id).
                    self.stats.count(group, Event::RedisHit, 1);
                    rest.push(r);
                }
                Lookup::Miss => {
                    self.stats.count(group, Event::RedisMiss, 1);
                    rest.push(r);
                }
                Lookup::Unavailable => {
                    self.stats.count(group, Event::RedisFallback, 1);
                    rest.push(r);
                }
            }
        }
        rest
    }

    /// What to do with a delivery whose record exists and could not be claimed. What it counts
    /// and logs goes to `tally`, applied by the caller once the judgement is final (the
    /// transaction committed).
    fn judge_existing(&self, message_id: &str, existing: &ExistingRecord, tally: &mut Tally) -> Disposition {
        if !existing.same_type {
            tally.reused_id(message_id, existing.id);
            return Disposition::DeadLetter {
                reason: format!(
                    "message id {message_id:?} is the id of record {} of another message type: a reused id, not a \
                     duplicate; its copy is kept for an operator (records filter flag=conflict)",
                    existing.id
                ),
            };
        }
        if !existing.same_payload {
            tally.payload_conflict(message_id, existing.id);
        }
        match existing.status {
            RecordStatus::Processing if existing.parked => {
                tally.parked(message_id, existing.id);
                Disposition::Ack(AckReason::Parked)
            }
            RecordStatus::Processing => {
                // The holder may still fail or die: keep a copy with the broker and judge it
                // again when the lease has run out.
                tally.count(Event::Retry);
                let until_expiry = existing
                    .lease_expires_at
                    .map(|at| (at - Utc::now()).to_std().unwrap_or_default())
                    .unwrap_or_default();
                Disposition::Retry { delay: until_expiry.max(Duration::from_secs(1)) }
            }
            RecordStatus::Succeeded | RecordStatus::Dead | RecordStatus::Failed => {
                tally.count(Event::DuplicateDb);
                tally.duplicate_delay(existing.delay_ms);
                Disposition::Ack(AckReason::DuplicateDatabase)
            }
        }
    }

    fn input<'a>(&'a self, r: &'a Routed<'_>, attempt: i32) -> HandlerInput<'a> {
        HandlerInput {
            group: &self.settings.group,
            message_id: &r.identified.id,
            message_type: &r.identified.message_type,
            json: r.identified.json.as_ref(),
            payload: &r.message.payload,
            headers: &r.message.headers,
            attempt,
            calls: attempt,
            previous_status: None,
            message: r.message,
        }
    }

    fn marker(&self, r: &Routed<'_>, first_seen: chrono::DateTime<Utc>) -> DueMarker {
        (
            self.fast_path.key(self.settings.group.as_str(), r.identified.id.as_str()),
            Marker::new(first_seen.timestamp_millis(), &r.payload_hash, &r.identified.message_type),
        )
    }
}
