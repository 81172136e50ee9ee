//! Noticing a group membership that the broker left stale, so that the member leaves the group
//! and joins it again as a new member (which makes the broker form a new generation).
//!
//! A real Kafka broker never needs this: every rebalance of the eager protocol bumps the
//! generation. The local test broker (tansu 0.6) does, when a member dies without leaving
//! (SIGKILL) and its session expires: the survivor's heartbeat is told to rebalance, but the
//! group keeps its generation with the dead member as leader, and the survivor is handed back
//! its own partitions; the dead member's partitions (retry topics included) are fetched by no
//! one. So an assignment in the generation of the revocation before it is stale.
//!
//! Not covered: when the dead member was the leader of a generation still forming (killed
//! between its JoinGroup and its SyncGroup), tansu takes a survivor's empty SyncGroup for the
//! leader's and the group settles with no partition assigned and no generation change, which no
//! member can tell from its side; it recovers when a member joins or leaves.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use rdkafka::bindings as rdsys;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};

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

/// The state of the check: kept by the rebalance callbacks, read by the member's thread.
#[derive(Debug, Default)]
pub(super) struct StaleWatch {
    /// The generation of the last revocation, until the assignment after it.
    revoked_in: Mutex<Option<i32>>,
    stale: AtomicBool,
}

impl StaleWatch {
    /// A revocation is starting.
    pub fn revoked<C: ConsumerContext>(&self, consumer: &BaseConsumer<C>) {
        *lock(&self.revoked_in) = generation(consumer);
    }

    /// An assignment arrived: stale when in the generation of the revocation before it.
    pub fn assigned<C: ConsumerContext>(&self, consumer: &BaseConsumer<C>) {
        let current = generation(consumer).filter(|g| *g >= 0);
        if let Some(current) = current
            && lock(&self.revoked_in).take() == Some(current)
        {
            tracing::warn!(generation = current, "Kafka assignment in the generation of its revocation; joining again");
            self.stale.store(true, Ordering::Relaxed);
        }
    }

    /// Whether the member must leave and join again.
    pub fn is_stale(&self) -> bool {
        self.stale.load(Ordering::Relaxed)
    }
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
