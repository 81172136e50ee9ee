//! The workaround itself (see [`super`]): the generation check and the progress check. Reads
//! librdkafka's serialized group metadata through its C API (`unsafe`), which is why it is
//! compiled only with the `kafka-test-broker` feature.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use rdkafka::bindings as rdsys;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};

use super::super::admin;

/// How many `check_every`s without a commit, while the same records wait, make a stall: long
/// enough for a slow record (an SMS gateway taking seconds), short enough to recover well
/// within a minute of the session timeout.
const STALL_CHECKS: u32 = 3;

/// Longest wait for each metadata, offset or watermark request of the progress check.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// Per partition of the source topics: the group's committed offset and the high watermark
/// ([`admin::positions`]).
type Progress = Vec<(i64, i64)>;

/// The consumer's group generation id (-1 between generations), or `None` outside a group.
///
/// rust-rdkafka keeps the group metadata opaque and librdkafka has no getter for its
/// generation, so it is read from the metadata's serialized form, whose layout librdkafka
/// versions by a magic (`rd_kafka_consumer_group_metadata_write`, rdkafka_cgrp.c).
fn generation<C: ConsumerContext>(consumer: &BaseConsumer<C>) -> Option<i32> {
    let rk = consumer.client().native_ptr();
    // SAFETY: `rk` is the live client `consumer` owns. librdkafka hands out a metadata copy
    // (NULL outside a group) and, on success, a buffer of `size` bytes; both are freed here
    // with their own destructors and nothing of them outlives this block.
    unsafe {
        let metadata = rdsys::rd_kafka_consumer_group_metadata(rk);
        if metadata.is_null() {
            return None;
        }
        let mut buffer: *mut std::ffi::c_void = std::ptr::null_mut();
        let mut size = 0usize;
        let error = rdsys::rd_kafka_consumer_group_metadata_write(metadata, &mut buffer, &mut size);
        rdsys::rd_kafka_consumer_group_metadata_destroy(metadata);
        if !error.is_null() {
            rdsys::rd_kafka_error_destroy(error);
            return None;
        }
        let generation = parse_generation(std::slice::from_raw_parts(buffer.cast::<u8>(), size));
        rdsys::rd_kafka_mem_free(rk, buffer);
        generation
    }
}

/// The generation id in version 2 of the serialized form: `"CGMDv2:"`, then the generation id
/// (native-endian `int32`), then the group id, member id and group instance id, not read.
/// `None` for another version or a short buffer.
fn parse_generation(bytes: &[u8]) -> Option<i32> {
    let id = bytes.strip_prefix(b"CGMDv2:")?.get(..4)?;
    Some(i32::from_ne_bytes(id.try_into().ok()?))
}

/// The state of both checks: kept by the rebalance callbacks, read by the member's thread
/// (callbacks run inside its `poll`, so the lock is never contended).
#[derive(Debug, Default)]
pub(in crate::source::kafka) struct StaleWatch(Mutex<WatchState>);

#[derive(Debug, Default)]
struct WatchState {
    /// The generation of the last revocation, until the assignment after it.
    revoked_in: Option<i32>,
    /// When the progress check is due next (`None`: the assignment is not empty).
    idle_check_at: Option<Instant>,
    /// The reading the stall is measured from, and how many checks after it have found nothing
    /// committed.
    since: Option<(Progress, u32)>,
    /// The member must leave and join again.
    stale: bool,
}

impl StaleWatch {
    /// A revocation is starting.
    pub fn revoked<C: ConsumerContext>(&self, consumer: &BaseConsumer<C>) {
        let revoked_in = generation(consumer);
        let mut state = lock(&self.0);
        *state = WatchState { revoked_in, stale: state.stale, ..WatchState::default() };
    }

    /// `partitions` were assigned: stale when in the generation of the revocation before it.
    /// An empty assignment starts the progress checks, the first after `check_every`.
    pub fn assigned<C: ConsumerContext>(&self, consumer: &BaseConsumer<C>, partitions: usize, check_every: Duration) {
        let current = generation(consumer).filter(|g| *g >= 0);
        let mut state = lock(&self.0);
        state.idle_check_at = (partitions == 0).then(|| Instant::now() + check_every);
        state.since = None;
        if current.is_some() && state.revoked_in.take() == current {
            tracing::warn!(generation = current, "Kafka assignment in the generation of its revocation; joining again");
            state.stale = true;
        }
    }

    /// Whether the member must leave and join again.
    pub fn is_stale(&self) -> bool {
        lock(&self.0).stale
    }

    /// While the assignment is empty, every `check_every`: reads the group's progress on
    /// `topics` (blocking, a few requests of up to 5 s each) and marks the membership stale when
    /// records waited at a reading [`STALL_CHECKS`] checks ago and no committed offset moved
    /// since.
    pub fn check_progress<C: ConsumerContext>(
        &self,
        consumer: &BaseConsumer<C>,
        topics: &[String],
        check_every: Duration,
    ) {
        match lock(&self.0).idle_check_at.as_mut() {
            Some(due) if Instant::now() >= *due => *due = Instant::now() + check_every,
            _ => return,
        }
        let now = match admin::positions(consumer, topics, REQUEST_TIMEOUT) {
            Ok(now) => now,
            Err(e) => {
                tracing::debug!(error = %e, "cannot read the Kafka group's progress");
                return;
            }
        };
        let mut state = lock(&self.0);
        match state.since.as_mut() {
            Some((before, checks)) if unmoved(before, &now) => {
                *checks += 1;
                if *checks >= STALL_CHECKS {
                    tracing::warn!(
                        "Kafka group commits nothing while records wait, and this member has no partitions; joining again"
                    );
                    state.stale = true;
                }
            }
            _ => state.since = Some((now, 0)),
        }
    }
}

/// Records waited at the reading `before` (`committed < high` somewhere) and no committed
/// offset has moved since.
fn unmoved(before: &Progress, now: &Progress) -> bool {
    before.len() == now.len()
        && before.iter().zip(now).all(|(b, n)| b.0 == n.0)
        && before.iter().any(|(committed, high)| committed < high)
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn serialized(generation: i32, group: &str, member: &str) -> Vec<u8> {
        let mut bytes = b"CGMDv2:".to_vec();
        bytes.extend_from_slice(&generation.to_ne_bytes());
        for s in [group, member] {
            bytes.extend_from_slice(s.as_bytes());
            bytes.push(0);
        }
        bytes.push(1); // no group instance id
        bytes
    }

    #[test]
    fn progress_is_unmoved_when_records_waited_before_and_no_commit_moved() {
        let before = vec![(10, 50), (7, 7)];
        assert!(unmoved(&before, &vec![(10, 60), (7, 7)]), "records waited, nothing committed");
        assert!(!unmoved(&before, &vec![(11, 60), (7, 7)]), "a commit moved");
        assert!(!unmoved(&vec![(50, 50)], &vec![(50, 60)]), "records arrived only after the first reading");
        assert!(!unmoved(&before, &vec![(10, 50)]), "partitions changed");
    }

    #[test]
    fn the_serialized_group_metadata_gives_the_generation() {
        assert_eq!(parse_generation(&serialized(7, "orders", "rdkafka-1")), Some(7));
        assert_eq!(parse_generation(&serialized(-1, "g", "")), Some(-1));
    }

    #[test]
    fn another_version_or_a_short_buffer_reads_as_nothing() {
        let mut other = serialized(7, "g", "m");
        other[5] = b'3';
        assert_eq!(parse_generation(&other), None);
        let whole = serialized(7, "g", "m");
        for cut in [0, 6, 7, 10] {
            assert_eq!(parse_generation(&whole[..cut]), None, "cut at {cut}");
        }
    }
}
