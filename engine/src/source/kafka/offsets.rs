//! Which offset of each partition may be committed.
//!
//! A Kafka commit says "every record before this offset is done". Records of one partition are
//! processed by several workers and finish in any order, so the committable offset of a
//! partition is its lowest unfinished offset — or, when none is unfinished, the one after the
//! last record taken from Kafka. It never passes an unfinished record: a crash or a rebalance
//! redelivers from there, and the dedup table skips what had already finished.
//!
//! Each assignment of a partition gets a new **epoch**. Records carry the epoch they were
//! fetched under; once the partition is revoked (or revoked and assigned again), what they
//! report no longer moves its offsets — the next owner fetches them again from the last commit.

use std::collections::{BTreeMap, HashMap};

/// A partition of a topic.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct TopicPartition {
    /// The topic.
    pub topic: String,
    /// The partition number.
    pub partition: i32,
}

/// Where an unfinished record is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stage {
    /// A retry copy waiting in memory for its due time.
    Held,
    /// In the queue the workers take from.
    Queued,
    /// Taken by a worker, not yet settled.
    Taken,
}

#[derive(Debug)]
struct PartitionState {
    epoch: u64,
    /// Revocation under way: nothing new is dispatched or taken.
    closing: bool,
    unfinished: BTreeMap<i64, Stage>,
    /// The offset after the last record dispatched.
    next: Option<i64>,
    /// The last offset handed to a commit.
    committed: Option<i64>,
}

impl PartitionState {
    fn committable(&self) -> Option<i64> {
        self.unfinished.keys().next().copied().or(self.next)
    }
}

/// Unfinished records and commit positions of the partitions assigned to one group member.
#[derive(Debug, Default)]
pub(crate) struct Offsets {
    partitions: HashMap<TopicPartition, PartitionState>,
    last_epoch: u64,
    in_flight: usize,
    generation: u64,
    recommit: bool,
}

impl Offsets {
    /// Starts tracking `tp` under a new epoch (an assignment).
    pub fn assign(&mut self, tp: TopicPartition) {
        self.last_epoch += 1;
        let state = PartitionState {
            epoch: self.last_epoch,
            closing: false,
            unfinished: BTreeMap::new(),
            next: None,
            committed: None,
        };
        if let Some(old) = self.partitions.insert(tp, state) {
            self.in_flight -= old.unfinished.len();
        }
        self.generation += 1;
    }

    /// Marks `tps` as being revoked: nothing more of them is dispatched or taken.
    pub fn close(&mut self, tps: &[TopicPartition]) {
        for tp in tps {
            if let Some(state) = self.partitions.get_mut(tp) {
                state.closing = true;
            }
        }
    }

    /// Records of `tps` held by workers and not yet settled.
    pub fn taken(&self, tps: &[TopicPartition]) -> usize {
        tps.iter()
            .filter_map(|tp| self.partitions.get(tp))
            .map(|s| s.unfinished.values().filter(|stage| **stage == Stage::Taken).count())
            .sum()
    }

    /// The committable offset of each of `tps` that has one.
    pub fn positions(&self, tps: &[TopicPartition]) -> Vec<(TopicPartition, i64)> {
        tps.iter().filter_map(|tp| Some((tp.clone(), self.partitions.get(tp)?.committable()?))).collect()
    }

    /// Stops tracking `tps`; returns how many unfinished records were abandoned.
    pub fn remove(&mut self, tps: &[TopicPartition]) -> usize {
        let mut abandoned = 0;
        for tp in tps {
            if let Some(state) = self.partitions.remove(tp) {
                abandoned += state.unfinished.len();
            }
        }
        self.in_flight -= abandoned;
        self.generation += 1;
        abandoned
    }

    /// Registers a record fetched from Kafka at `stage` (`Held` or `Queued`) and returns the
    /// epoch it belongs to; `None` when its partition is not assigned, is being revoked, or
    /// already has this offset unfinished (then the record must be dropped).
    pub fn dispatch(&mut self, tp: &TopicPartition, offset: i64, stage: Stage) -> Option<u64> {
        let state = self.partitions.get_mut(tp).filter(|s| !s.closing)?;
        if state.unfinished.contains_key(&offset) {
            return None;
        }
        state.unfinished.insert(offset, stage);
        state.next = Some(state.next.map_or(offset + 1, |n| n.max(offset + 1)));
        self.in_flight += 1;
        Some(state.epoch)
    }

    /// Moves a record from stage `from` to `to`; false when it is stale (its partition was
    /// revoked or reassigned since), being revoked, or not at `from`.
    fn advance(&mut self, tp: &TopicPartition, offset: i64, epoch: u64, from: Stage, to: Stage) -> bool {
        let Some(state) = self.partitions.get_mut(tp).filter(|s| s.epoch == epoch && !s.closing) else {
            return false;
        };
        match state.unfinished.get_mut(&offset) {
            Some(stage) if *stage == from => {
                *stage = to;
                true
            }
            _ => false,
        }
    }

    /// A worker takes a queued record; false: drop it (stale).
    pub fn take(&mut self, tp: &TopicPartition, offset: i64, epoch: u64) -> bool {
        self.advance(tp, offset, epoch, Stage::Queued, Stage::Taken)
    }

    /// A held retry copy is due and goes to the queue; false: drop it (stale).
    pub fn release(&mut self, tp: &TopicPartition, offset: i64, epoch: u64) -> bool {
        self.advance(tp, offset, epoch, Stage::Held, Stage::Queued)
    }

    /// A taken record must be judged again: it is no longer taken and goes back to the queue.
    /// False: drop it instead (stale, or being revoked: the next owner fetches it again).
    pub fn requeue(&mut self, tp: &TopicPartition, offset: i64, epoch: u64) -> bool {
        let Some(state) = self.partitions.get_mut(tp).filter(|s| s.epoch == epoch) else { return false };
        match state.unfinished.get_mut(&offset) {
            Some(stage) if *stage == Stage::Taken => {
                *stage = Stage::Queued;
                !state.closing
            }
            _ => false,
        }
    }

    /// A record is settled (acknowledged, or its retry or dead-letter copy confirmed). Stale
    /// records change nothing.
    pub fn finish(&mut self, tp: &TopicPartition, offset: i64, epoch: u64) {
        if let Some(state) = self.partitions.get_mut(tp).filter(|s| s.epoch == epoch)
            && state.unfinished.remove(&offset).is_some()
        {
            self.in_flight -= 1;
        }
    }

    /// Whether records of `tp` fetched under `epoch` still count: their partition is assigned
    /// under that epoch, being revoked included. Settling such a record with
    /// [`Offsets::finish`] moves the commit past it — the revocation's commit too — so whatever
    /// must exist before that (a retry copy) must be published first.
    pub fn is_current(&self, tp: &TopicPartition, epoch: u64) -> bool {
        self.partitions.get(tp).is_some_and(|s| s.epoch == epoch)
    }

    /// The committable offsets that moved since the last call (all of them after
    /// [`Offsets::commit_failed`]), marked as committed.
    pub fn due_commits(&mut self) -> Vec<(TopicPartition, i64)> {
        let all = std::mem::take(&mut self.recommit);
        let mut due = Vec::new();
        for (tp, state) in &mut self.partitions {
            if state.closing {
                continue;
            }
            if let Some(offset) = state.committable()
                && (all || state.committed.is_none_or(|c| offset > c))
            {
                state.committed = Some(offset);
                due.push((tp.clone(), offset));
            }
        }
        due
    }

    /// An asynchronous commit failed: the next [`Offsets::due_commits`] repeats every position.
    pub fn commit_failed(&mut self) {
        self.recommit = true;
    }

    /// Records fetched and not yet settled (held, queued or taken): what back-pressure bounds.
    pub fn in_flight(&self) -> usize {
        self.in_flight
    }

    /// The partitions tracked.
    pub fn assigned(&self) -> impl Iterator<Item = &TopicPartition> {
        self.partitions.keys()
    }

    /// Changes on every assignment and removal (a new assignment starts unpaused).
    pub fn generation(&self) -> u64 {
        self.generation
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tp() -> TopicPartition {
        TopicPartition { topic: "orders".into(), partition: 0 }
    }

    /// Assigns `tp()` and dispatches and takes offsets `1..=7`; returns the epoch.
    fn seven_taken(offsets: &mut Offsets) -> u64 {
        offsets.assign(tp());
        let mut epoch = 0;
        for o in 1..=7 {
            epoch = offsets.dispatch(&tp(), o, Stage::Queued).unwrap();
            assert!(offsets.take(&tp(), o, epoch));
        }
        epoch
    }

    #[test]
    fn the_commit_never_passes_an_unfinished_record() {
        let mut offsets = Offsets::default();
        let epoch = seven_taken(&mut offsets);
        for o in [1, 2, 3, 5, 6, 7] {
            offsets.finish(&tp(), o, epoch);
        }
        assert_eq!(offsets.due_commits(), vec![(tp(), 4)], "4 is slow: 5-7 done but not committable");
        assert_eq!(offsets.due_commits(), vec![], "nothing moved");
        assert_eq!(offsets.in_flight(), 1);
        offsets.finish(&tp(), 4, epoch);
        assert_eq!(offsets.due_commits(), vec![(tp(), 8)]);
        assert_eq!(offsets.in_flight(), 0);
    }

    #[test]
    fn a_revoked_partition_commits_up_to_its_first_unfinished_record_and_ignores_late_settlements() {
        let mut offsets = Offsets::default();
        let epoch = seven_taken(&mut offsets);
        for o in [1, 2, 3, 5, 6, 7] {
            offsets.finish(&tp(), o, epoch);
        }
        offsets.close(&[tp()]);
        assert_eq!(offsets.taken(&[tp()]), 1);
        assert!(!offsets.requeue(&tp(), 4, epoch), "nothing goes back to the queue while revoking");
        assert_eq!(offsets.taken(&[tp()]), 0, "but it is no longer waited for");
        assert_eq!(offsets.positions(&[tp()]), vec![(tp(), 4)]);
        assert_eq!(offsets.remove(&[tp()]), 1, "4 is abandoned");
        assert_eq!(offsets.in_flight(), 0);

        offsets.assign(tp());
        offsets.finish(&tp(), 4, epoch);
        assert!(!offsets.is_current(&tp(), epoch), "the old epoch is stale");
        assert_eq!(offsets.dispatch(&tp(), 4, Stage::Queued), Some(epoch + 1));
        assert!(!offsets.take(&tp(), 4, epoch), "a stale copy in the queue is dropped");
        assert!(offsets.take(&tp(), 4, epoch + 1));
    }

    #[test]
    fn records_settled_while_their_partition_is_revoked_still_move_its_commit() {
        let mut offsets = Offsets::default();
        let epoch = seven_taken(&mut offsets);
        offsets.close(&[tp()]);
        assert!(offsets.is_current(&tp(), epoch), "settling still counts: a retry copy must be sent first");
        for o in 1..=7 {
            offsets.finish(&tp(), o, epoch);
        }
        assert_eq!(offsets.taken(&[tp()]), 0);
        assert_eq!(offsets.positions(&[tp()]), vec![(tp(), 8)], "the revocation commits past them");
        assert_eq!(offsets.remove(&[tp()]), 0);
        assert!(!offsets.is_current(&tp(), epoch), "once revoked, nothing of that epoch counts");
    }

    #[test]
    fn held_and_requeued_records_stay_unfinished() {
        let mut offsets = Offsets::default();
        offsets.assign(tp());
        let epoch = offsets.dispatch(&tp(), 10, Stage::Held).unwrap();
        assert!(!offsets.take(&tp(), 10, epoch), "held: not in the queue yet");
        assert_eq!(offsets.dispatch(&tp(), 10, Stage::Queued), None, "no double dispatch");
        assert!(offsets.release(&tp(), 10, epoch));
        assert!(offsets.take(&tp(), 10, epoch));
        assert!(offsets.requeue(&tp(), 10, epoch));
        assert_eq!(offsets.due_commits(), vec![(tp(), 10)]);
        assert!(offsets.take(&tp(), 10, epoch));
        offsets.finish(&tp(), 10, epoch);
        assert_eq!(offsets.due_commits(), vec![(tp(), 11)]);
    }

    #[test]
    fn a_failed_commit_is_repeated() {
        let mut offsets = Offsets::default();
        offsets.assign(tp());
        let epoch = offsets.dispatch(&tp(), 0, Stage::Queued).unwrap();
        assert!(offsets.take(&tp(), 0, epoch));
        offsets.finish(&tp(), 0, epoch);
        assert_eq!(offsets.due_commits(), vec![(tp(), 1)]);
        offsets.commit_failed();
        assert_eq!(offsets.due_commits(), vec![(tp(), 1)]);
        assert_eq!(offsets.due_commits(), vec![]);
        assert_eq!(offsets.dispatch(&TopicPartition { topic: "other".into(), partition: 0 }, 0, Stage::Queued), None);
    }
}
