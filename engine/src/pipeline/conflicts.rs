//! Conflicting deliveries (DESIGN.md, "Reused ids and payload conflicts"): a delivery whose
//! message id is an existing record's, judged a duplicate of it although its payload differs,
//! or dead-lettered because its message type differs (a reused id), keeps its copy for an
//! operator.

use crate::store::PipelineStore;
use super::{AckReason, Disposition, Outcome, Pipeline, Routed};
use crate::store::ExistingRecord;
use crate::store::{ConflictCopy, ConflictKind};

impl<S: PipelineStore> Pipeline<S> {
    /// The copy to keep of `item`, judged `disposition` against `existing`: none for a
    /// duplicate with the record's payload, nor for one sent back to be judged again later.
    pub(super) fn conflict_copy<'a>(
        &self,
        item: &'a Routed<'_>,
        existing: &ExistingRecord,
        disposition: &Disposition,
    ) -> Option<ConflictCopy<'a>> {
        let kind = match disposition {
            Disposition::DeadLetter { .. } if !existing.same_type => ConflictKind::Type,
            Disposition::Ack(AckReason::DuplicateDatabase | AckReason::Parked) if !existing.same_payload => {
                ConflictKind::Payload
            }
            _ => return None,
        };
        Some(ConflictCopy {
            record_id: existing.id,
            message_id: item.identified.id.as_str(),
            kind,
            message_type: &item.identified.message_type,
            id_source: self.settings.id_policy.from.get(item.identified.id_source).map(ToString::to_string).unwrap_or_default(),
            payload_hash: &item.payload_hash,
            message: item.message,
        })
    }
}

impl<S: PipelineStore> Pipeline<S> {
    /// Keeps the copies of a leased batch's conflicting deliveries (index, copy) on a connection
    /// of their own; when that fails, their deliveries in `outcomes` go back to the broker
    /// instead of being acknowledged without a copy.
    pub(super) async fn keep_conflicts(&self, copies: &[(usize, ConflictCopy<'_>)], outcomes: &mut [Outcome]) {
        if copies.is_empty() {
            return;
        }
        let only: Vec<ConflictCopy<'_>> = copies.iter().map(|(_, c)| c.clone()).collect();
        let kept = match self.store.pool().acquire().await {
            Ok(mut conn) => self.store.keep_conflicts(&mut conn, &self.settings.group, &only).await,
            Err(e) => Err(e.into()),
        };
        if let Err(e) = kept {
            tracing::warn!(error = %e, count = copies.len(), "keeping conflicting copies failed; redelivering them");
            for outcome in outcomes.iter_mut().filter(|o| copies.iter().any(|(i, _)| *i == o.0)) {
                outcome.1 = Disposition::Redeliver;
            }
        }
    }
}
