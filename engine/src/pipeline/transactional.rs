//! Transactional handlers and poison messages of a batch: one database transaction (per up to
//! [`MAX_PER_OPTIMISTIC_TRANSACTION`] messages), claims and completions each one set-based
//! statement, one commit. Nothing is acknowledged before the commit; if the commit fails, every
//! delivery of the transaction is redelivered and judged again.
//!
//! A transaction is first attempted **optimistically**: the handlers run one after the other
//! without savepoints, which halves the round trips to PostgreSQL, and the claim writes the
//! records as `succeeded` right away (no completion statement: the attempt commits only if
//! every handler succeeded, see [`crate::store::ClaimAs::Succeeded`]). The first failure — a
//! handler's error or a failed statement — abandons that attempt: it is rolled back, and the
//! same messages run again in a new transaction with a savepoint around each handler
//! ([`Isolation::Savepoints`], see `round.rs`), where a failing message fails alone and the
//! others commit. A transactional handler may therefore run twice for one attempt (its effects
//! live only in the rolled-back transaction); stats are counted only for the attempt that
//! commits ([`Tally`]).

mod round;

use crate::store::PipelineStore;
use sqlx::Connection;

use crate::store::roles::Conn;
use tracing::Instrument;
use tracing::field::Empty;

use super::tally::Tally;
use super::{AckReason, Disposition, Outcome, Pipeline, Routed};
use crate::handler::Handler;
use crate::message::{InboundMessage, Poison};
use crate::stats::Event;
use crate::store::{ConflictCopy, ConflictKind};
use crate::store::PoisonRecord;

/// Most messages in one transaction with savepoints. Every handler runs in a savepoint, and a
/// savepoint that writes takes a subtransaction id; past 64 of them in one transaction
/// PostgreSQL's per-backend subtransaction cache overflows and every concurrent snapshot has
/// to consult `pg_subtrans`, which slows the whole server. A failed optimistic attempt is run
/// again with savepoints in transactions of at most this size.
pub const MAX_PER_TRANSACTION: usize = 50;

/// Most times a transaction with savepoints runs again after a deadlock rolled it back as a
/// whole (MySQL), and a leased claim after a deadlock; after that the deliveries are
/// redelivered.
pub(super) const DEADLOCK_RERUNS: u32 = 5;

/// Most messages in one optimistic transaction (it takes no subtransactions). One commit, and
/// its WAL flush, for a whole batch; a larger batch is split into transactions of this size.
pub const MAX_PER_OPTIMISTIC_TRANSACTION: usize = 500;


/// A poison message of the batch: its index, the delivery, and why it is poison.
type PoisonItem<'a> = (usize, &'a InboundMessage, Poison);

/// How the messages of one transaction are kept apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Isolation {
    /// No savepoints at all (claim, handlers, poison records): the first failure abandons the
    /// attempt (it is rolled back and run again with [`Isolation::Savepoints`]).
    Optimistic,
    /// A savepoint around the claim, each handler and each poison record: a failing message is
    /// rolled back to its savepoint and recorded as failed alone.
    Savepoints,
}

/// The attempt cannot go on. Optimistic: it is rolled back and run again with savepoints.
/// With savepoints: the transaction is unusable (a statement outside a handler's savepoint
/// failed) and every delivery in it is redelivered.
struct Abort;

/// One attempt at a transaction: how it keeps its messages apart, and what it has counted so
/// far (applied only if it commits).
struct Attempt {
    isolation: Isolation,
    tally: Tally,
    /// A statement or handler of it was chosen as a deadlock victim.
    deadlocked: bool,
}

/// How one attempt at a transaction ended.
enum AttemptEnd {
    /// Committed, with one outcome per delivery.
    Committed(Vec<Outcome>),
    /// An optimistic attempt failed and was rolled back cleanly: run it again with savepoints.
    RolledBack,
    /// The transaction is lost (no connection, failed commit or rollback, or it failed with
    /// savepoints): every delivery is redelivered.
    Lost,
    /// A deadlock rolled the whole transaction back (a store whose deadlock loses it, MySQL):
    /// run it again from its start, at most [`DEADLOCK_RERUNS`] times.
    Deadlocked,
}

impl AttemptEnd {
    /// Its name in the `transaction` span.
    fn as_str(&self) -> &'static str {
        match self {
            AttemptEnd::Committed(_) => "committed",
            AttemptEnd::RolledBack => "rolled_back",
            AttemptEnd::Lost => "lost",
            AttemptEnd::Deadlocked => "deadlocked",
        }
    }
}

impl Isolation {
    /// Its name in the `transaction` span.
    fn as_str(self) -> &'static str {
        match self {
            Isolation::Optimistic => "optimistic",
            Isolation::Savepoints => "savepoints",
        }
    }

    /// Logs why an attempt is aborted — a warning when the batch will be redelivered, a debug
    /// line when it will only run again with savepoints — and returns the [`Abort`].
    fn abort(self, what: &str, error: &dyn std::fmt::Display) -> Abort {
        match self {
            Isolation::Optimistic => {
                tracing::debug!(error = %error, "{what}; running the batch again with savepoints");
            }
            Isolation::Savepoints => tracing::warn!(error = %error, "{what}; redelivering the batch"),
        }
        Abort
    }
}

impl<S: PipelineStore> Pipeline<S> {
    /// Runs a batch's transactional messages and poison messages: sorted into one lock order,
    /// split into transactions of at most [`MAX_PER_OPTIMISTIC_TRANSACTION`] messages (the
    /// poison ones go with the first); one outcome per delivery.
    pub(super) async fn run_transaction(
        &self,
        worker: &str,
        mut items: Vec<Routed<'_>>,
        poison: Vec<PoisonItem<'_>>,
    ) -> Vec<Outcome> {
        if items.is_empty() && poison.is_empty() {
            return Vec::new();
        }
        // One lock order for every batch — the handler's lock key (a hot business row), then
        // the message id (its dedup record): concurrent batches touching the same rows wait for
        // each other instead of deadlocking. Messages without a lock key go last: they tend to
        // act on what keyed ones create (an order's payment after the order, whose creation
        // reserves stock), and in this order they find it in the same transaction instead of
        // failing once and waiting for a retry.
        items.sort_by_cached_key(|r| {
            let key = match &r.handler {
                Handler::Transactional(h) => h.lock_key_any(&self.input(r, 0)),
                Handler::Leased { .. } => None,
            };
            (key.is_none(), key, r.identified.id.clone())
        });
        let mut poison = Some(poison);
        let mut outcomes = Vec::new();
        let mut chunks: Vec<Vec<Routed<'_>>> = Vec::new();
        let mut rest = items.into_iter().peekable();
        while rest.peek().is_some() {
            chunks.push(rest.by_ref().take(MAX_PER_OPTIMISTIC_TRANSACTION).collect());
        }
        if chunks.is_empty() {
            chunks.push(Vec::new());
        }
        for chunk in chunks {
            outcomes.extend(self.transaction(worker, &chunk, &poison.take().unwrap_or_default()).await);
        }
        outcomes
    }

    /// One optimistic transaction over `items` (and the poison messages); if that attempt
    /// fails, the same messages again with savepoints, in transactions of at most
    /// [`MAX_PER_TRANSACTION`] messages.
    async fn transaction(&self, worker: &str, items: &[Routed<'_>], poison: &[PoisonItem<'_>]) -> Vec<Outcome> {
        match self.attempt(Isolation::Optimistic, worker, &Self::rounds(items), poison).await {
            AttemptEnd::Committed(outcomes) => return outcomes,
            AttemptEnd::Lost => return Self::redeliver(items, poison),
            AttemptEnd::RolledBack => {}
            AttemptEnd::Deadlocked => self.count_deadlock(),
        }
        let mut poison = Some(poison);
        let mut outcomes = Vec::with_capacity(items.len() + poison.map_or(0, <[_]>::len));
        let chunks: Vec<&[Routed<'_>]> =
            if items.is_empty() { vec![items] } else { items.chunks(MAX_PER_TRANSACTION).collect() };
        for chunk in chunks {
            let poison = poison.take().unwrap_or_default();
            let mut reruns = 0;
            loop {
                match self.attempt(Isolation::Savepoints, worker, &Self::rounds(chunk), poison).await {
                    AttemptEnd::Committed(done) => outcomes.extend(done),
                    AttemptEnd::Deadlocked if reruns < DEADLOCK_RERUNS => {
                        reruns += 1;
                        self.count_deadlock();
                        continue;
                    }
                    AttemptEnd::Deadlocked => {
                        tracing::warn!(reruns, "the transaction deadlocked at each run; redelivering the batch");
                        outcomes.extend(Self::redeliver(chunk, poison));
                    }
                    AttemptEnd::RolledBack | AttemptEnd::Lost => outcomes.extend(Self::redeliver(chunk, poison)),
                }
                break;
            }
        }
        outcomes
    }

    /// Counts a transaction (or leased claim) a deadlock rolled back as a whole, run again:
    /// `dedup_store_retries_total{group, reason="deadlock"}`.
    pub(super) fn count_deadlock(&self) {
        crate::store::count_deadlock_rerun(self.settings.group.as_str());
    }

    /// `items` in rounds of distinct message ids: a message id twice in one transaction is
    /// judged the second time after the first settled.
    pub(super) fn rounds<'r, 'a>(items: &'r [Routed<'a>]) -> Vec<Vec<&'r Routed<'a>>> {
        let mut rounds: Vec<Vec<&Routed<'_>>> = Vec::new();
        for item in items {
            let round = rounds.iter().position(|r| r.iter().all(|o| o.identified.id != item.identified.id));
            match round {
                Some(r) => rounds[r].push(item),
                None => rounds.push(vec![item]),
            }
        }
        rounds
    }

    /// Every delivery of a lost transaction goes back to the broker.
    fn redeliver(items: &[Routed<'_>], poison: &[PoisonItem<'_>]) -> Vec<Outcome> {
        items
            .iter()
            .map(|r| r.index)
            .chain(poison.iter().map(|p| p.0))
            .map(|i| (i, Disposition::Redeliver, None))
            .collect()
    }

    /// One attempt at the transaction, in a `DEBUG` span `transaction` (`isolation`: optimistic
    /// or savepoints; `messages`, `poison`; `end`: committed, rolled back or lost).
    async fn attempt(
        &self,
        isolation: Isolation,
        worker: &str,
        rounds: &[Vec<&Routed<'_>>],
        poison: &[PoisonItem<'_>],
    ) -> AttemptEnd {
        let span = tracing::debug_span!(
            "transaction",
            isolation = isolation.as_str(),
            messages = rounds.iter().map(Vec::len).sum::<usize>(),
            poison = poison.len(),
            end = Empty,
        );
        let end = self.attempt_in_transaction(isolation, worker, rounds, poison).instrument(span.clone()).await;
        span.record("end", end.as_str());
        end
    }

    /// One attempt at the transaction: begin, poison records, the rounds, commit. Its stats are
    /// counted only if it commits.
    async fn attempt_in_transaction(
        &self,
        isolation: Isolation,
        worker: &str,
        rounds: &[Vec<&Routed<'_>>],
        poison: &[PoisonItem<'_>],
    ) -> AttemptEnd {
        let mut tx = match self.store.pool().begin().await {
            Ok(tx) => tx,
            Err(e) => {
                tracing::warn!(error = %e, "cannot begin a transaction; redelivering the batch");
                return AttemptEnd::Lost;
            }
        };
        let mut attempt = Attempt { isolation, tally: Tally::default(), deadlocked: false };
        match (self.run_attempt(&mut tx, &mut attempt, worker, rounds, poison).await, isolation) {
            (Ok(outcomes), _) => match tx.commit().await {
                Ok(()) => {
                    attempt.tally.apply(&self.stats, self.settings.group.as_str());
                    AttemptEnd::Committed(outcomes)
                }
                Err(e) => {
                    tracing::warn!(error = %e, "batch commit failed; redelivering the batch");
                    AttemptEnd::Lost
                }
            },
            // The deadlock rolled it all back already; the ROLLBACK only ends it on our side.
            (Err(Abort), _) if attempt.deadlocked && S::DEADLOCK_LOSES_TRANSACTION => {
                let _ = tx.rollback().await;
                AttemptEnd::Deadlocked
            }
            // A lost connection fails the rollback too: redelivered, as with savepoints.
            (Err(Abort), Isolation::Optimistic) => match tx.rollback().await {
                Ok(()) => AttemptEnd::RolledBack,
                Err(e) => {
                    tracing::warn!(error = %e, "rolling back an optimistic batch failed; redelivering the batch");
                    AttemptEnd::Lost
                }
            },
            (Err(Abort), Isolation::Savepoints) => AttemptEnd::Lost,
        }
    }

    /// The statements of one attempt: the poison records, then the rounds.
    async fn run_attempt(
        &self,
        tx: &mut Conn<S>,
        attempt: &mut Attempt,
        worker: &str,
        rounds: &[Vec<&Routed<'_>>],
        poison: &[PoisonItem<'_>],
    ) -> Result<Vec<Outcome>, Abort> {
        let mut outcomes = Vec::with_capacity(poison.len() + rounds.iter().map(Vec::len).sum::<usize>());
        for (index, message, p) in poison {
            outcomes.push((*index, self.store_poison(tx, attempt, message, p).await?, None));
        }
        for round in rounds {
            outcomes.extend(self.round(tx, attempt, worker, round).await?);
        }
        Ok(outcomes)
    }

    /// Records a poison message as `dead` (or counts a copy of one already recorded). With
    /// savepoints a failure here redelivers only this message.
    async fn store_poison(
        &self,
        tx: &mut Conn<S>,
        attempt: &mut Attempt,
        message: &InboundMessage,
        p: &Poison,
    ) -> Result<Disposition, Abort> {
        let reason = p.reason.to_string();
        let error_class: String = p.reason.error_class().chars().take(crate::handler::MAX_ERROR_CLASS_CHARS).collect();
        let record = PoisonRecord {
            group: &self.settings.group,
            message_id: &p.record_id,
            message_type: &p.message_type,
            reason: &reason,
            reason_kind: &error_class,
            message,
            payload_hash: &message.payload_hash(),
            keep_payload_bytes: self.settings.keep_poison_payload_bytes,
            max_attempts: self.settings.max_attempts,
            poison: p.reason.is_poison(),
            id_source: p.id_source,
        };
        let stored = match attempt.isolation {
            Isolation::Optimistic => {
                let stored = self.store.record_poison(tx, &record).await;
                stored.map_err(|e| attempt.isolation.abort("storing a poison record failed", &e))?
            }
            Isolation::Savepoints => {
                let Ok(mut savepoint) = tx.begin().await else { return Ok(Disposition::Redeliver) };
                match self.store.record_poison(&mut savepoint, &record).await {
                    Ok(stored) => match savepoint.commit().await {
                        Ok(()) => stored,
                        Err(_) => return Ok(Disposition::Redeliver),
                    },
                    Err(e) => {
                        tracing::warn!(error = %e, "storing a poison record failed");
                        let _ = savepoint.rollback().await;
                        return Ok(Disposition::Redeliver);
                    }
                }
            }
        };
        if let Some(record_type) = &stored.reused_of {
            return self.reused_without_handler(tx, attempt, message, p, stored.id, record_type).await;
        }
        let tally = &mut attempt.tally;
        if stored.dead_lettered {
            if p.reason.is_poison() {
                tally.count(Event::Poison);
            }
            tally.count(Event::Dead);
            tally.dead_at_once(p.record_id.as_str(), &reason, p.reason.is_poison());
            Ok(Disposition::DeadLetter { reason })
        } else {
            // The same poison again: its record and dead-letter copy exist already.
            tally.count(Event::DuplicateDb);
            Ok(Disposition::Ack(AckReason::DuplicateDatabase))
        }
    }

    /// A delivery without a handler that carries the id of record `record` of another type
    /// (`record_type`): a reused id, never its duplicate. Its copy is kept in the batch's
    /// transaction (a failure aborts the batch, which is redelivered) and it is dead-lettered.
    async fn reused_without_handler(
        &self,
        tx: &mut Conn<S>,
        attempt: &mut Attempt,
        message: &InboundMessage,
        p: &Poison,
        record: i64,
        record_type: &str,
    ) -> Result<Disposition, Abort> {
        let copy = ConflictCopy {
            record_id: record,
            message_id: p.record_id.as_str(),
            kind: ConflictKind::Type,
            message_type: &p.message_type,
            id_source: p.id_source.map(|k| k.as_str().to_owned()).unwrap_or_default(),
            payload_hash: &message.payload_hash(),
            message,
        };
        let kept = self.store.keep_conflicts(tx, &self.settings.group, std::slice::from_ref(&copy)).await;
        kept.map_err(|e| attempt.isolation.abort("keeping a conflicting copy failed", &e))?;
        attempt.tally.reused_id(p.record_id.as_str(), record);
        attempt.tally.count(Event::Dead);
        Ok(Disposition::DeadLetter {
            reason: format!(
                "message id {:?} is the id of record {record} of message type {record_type}: a reused id, not a \
                 duplicate (and {} has no handler); its copy is kept for an operator (records filter flag=conflict)",
                p.record_id.as_str(),
                p.message_type
            ),
        })
    }
}
