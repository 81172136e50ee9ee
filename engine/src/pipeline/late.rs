//! Late duplicates (DESIGN.md, "Late duplicates"): deliveries whose message id matches a
//! fingerprint cleanup kept of a deleted record. The lookup runs beside the Redis fast path's
//! (for every delivery; applied to those Redis did not catch), and only while any fingerprint is
//! kept ([`crate::actions::cleanup::late::RetentionWatch::fingerprints_kept`]): one lookup per
//! batch. Under the group's `process` policy the batch goes on and the matches whose records
//! it created are noted once it is done; under `hold` each match becomes a parked record
//! instead of a handler call.

use crate::store::PipelineStore;
use std::collections::HashMap;

use chrono::{DateTime, Utc};

use super::{AckReason, Disposition, Pipeline, Routed};
use crate::handler::Handler;
use crate::record::{HandlerMode, LateDuplicatePolicy};
use crate::store::HeldDelivery;

/// A delivery's message id and when the deleted record of that id was first seen.
pub(super) type FingerprintMatch = (String, DateTime<Utc>);

/// What the lookup found: `None` when no fingerprint is kept (nothing was asked).
pub(super) type Lookup = Option<Result<Vec<FingerprintMatch>, crate::store::StoreError>>;

impl<S: PipelineStore> Pipeline<S> {
    /// Looks the deliveries `(message id, message type)` up in the kept fingerprints (none:
    /// nothing asked, as while no fingerprint is kept). It runs beside the Redis lookup (its round trip hidden behind that one), on
    /// every delivery; [`Pipeline::check_fingerprints`] applies it to those Redis left.
    pub(super) async fn lookup_fingerprints(&self, deliveries: Vec<(String, String)>) -> Lookup {
        if deliveries.is_empty() {
            return None;
        }
        let ids: Vec<&str> = deliveries.iter().map(|d| d.0.as_str()).collect();
        let types: Vec<&str> = deliveries.iter().map(|d| d.1.as_str()).collect();
        Some(self.store.fingerprint_matches(&self.settings.group, &ids, &types).await)
    }

    /// Applies `lookup` to `routed`. Under `process` returns them all with their matches, to be
    /// noted by [`Pipeline::note_late_duplicates`] once the batch is done. Under `hold` each
    /// match whose record does not exist is stored parked and acknowledged
    /// ([`AckReason::Parked`]) and the rest are returned; when the lookup failed, every delivery
    /// is redelivered rather than risk running a held one.
    pub(super) async fn check_fingerprints<'a>(
        &self,
        routed: Vec<Routed<'a>>,
        lookup: Lookup,
        dispositions: &mut [Option<Disposition>],
    ) -> (Vec<Routed<'a>>, Vec<FingerprintMatch>) {
        let Some(lookup) = lookup else { return (routed, Vec::new()) };
        let hold = self.settings.late_duplicates == LateDuplicatePolicy::Hold;
        let matches = match lookup {
            Ok(matches) => {
                let left: std::collections::HashSet<&str> = routed.iter().map(|r| r.identified.id.as_str()).collect();
                matches.into_iter().filter(|m| left.contains(m.0.as_str())).collect::<Vec<_>>()
            }
            Err(e) if hold => {
                tracing::warn!(error = %e, "looking up fingerprints failed; redelivering the batch (late_duplicates = hold)");
                for r in &routed {
                    dispositions[r.index] = Some(Disposition::Redeliver);
                }
                return (Vec::new(), Vec::new());
            }
            Err(e) => {
                tracing::warn!(error = %e, "looking up fingerprints failed; late duplicates in this batch go uncounted");
                return (routed, Vec::new());
            }
        };
        if matches.is_empty() || !hold {
            return (routed, matches);
        }
        let first_seen: HashMap<&str, DateTime<Utc>> = matches.iter().map(|(id, at)| (id.as_str(), *at)).collect();
        let mut rest = Vec::with_capacity(routed.len());
        for r in routed {
            let Some(&first_seen_at) = first_seen.get(r.identified.id.as_str()) else {
                rest.push(r);
                continue;
            };
            let held = HeldDelivery {
                group: &self.settings.group,
                message_id: &r.identified.id,
                message_type: &r.identified.message_type,
                handler_mode: match r.handler {
                    Handler::Transactional(_) => HandlerMode::Transactional,
                    Handler::Leased { .. } => HandlerMode::Leased,
                },
                max_attempts: self.settings.max_attempts,
                payload_hash: &r.payload_hash,
                message: r.message,
                id_source: r.identified.id_kind,
                first_seen_at,
            };
            match self.store.hold_late_duplicate(&held).await {
                Ok(Some((record, delay_ms))) => {
                    self.late_duplicates_counted(1, true);
                    tracing::warn!(
                        message_id = r.identified.id.as_str(),
                        record,
                        delay_ms,
                        "late duplicate held for an operator: its record was deleted by cleanup (late_duplicates = hold)"
                    );
                    dispositions[r.index] = Some(Disposition::Ack(AckReason::Parked));
                }
                // Its record exists (created since): an ordinary duplicate of it.
                Ok(None) => rest.push(r),
                Err(e) => {
                    tracing::warn!(error = %e, message_id = r.identified.id.as_str(), "holding a late duplicate failed; redelivering it");
                    dispositions[r.index] = Some(Disposition::Redeliver);
                }
            }
        }
        (rest, Vec::new())
    }

    /// Notes the late duplicates among `matches` whose records the batch created (after its
    /// commit; a crash before loses the note, never the message).
    pub(super) async fn note_late_duplicates(&self, matches: &[FingerprintMatch]) {
        match self.store.note_late_duplicates(&self.settings.group, matches).await {
            Ok(delays) if delays.is_empty() => {}
            Ok(delays) => {
                self.late_duplicates_counted(delays.len(), false);
                tracing::warn!(
                    count = delays.len(),
                    longest_delay_ms = delays.iter().max().copied().unwrap_or_default(),
                    "late duplicates processed again: their records were deleted by cleanup before these copies came \
                     back; lengthen the retention, or hold them (late_duplicates = \"hold\")"
                );
            }
            Err(e) => tracing::warn!(error = %e, "noting late duplicates failed; they go uncounted"),
        }
    }

    /// `dedup_late_duplicates_total{group, policy}`.
    fn late_duplicates_counted(&self, count: usize, held: bool) {
        let policy = if held { "hold" } else { "process" };
        metrics::counter!("dedup_late_duplicates_total", "group" => self.settings.group.as_str().to_owned(), "policy" => policy)
            .increment(count as u64);
    }
}
