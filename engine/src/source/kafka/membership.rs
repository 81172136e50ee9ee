//! Noticing a group membership that the broker left stale, so that the member leaves the group
//! and joins it again as a new member (which makes the broker form a new generation).
//!
//! A real Kafka broker does not need this; the local test broker (tansu 0.6) does, when a member
//! dies without leaving (SIGKILL) and its session expires. So it is compiled only with the
//! engine's `kafka-test-broker` feature (off by default; the tests turn it on); without it
//! [`StaleWatch`] never finds a membership stale:
//!
//! - **the same generation again**: the survivor's heartbeat is told to rebalance, but the group
//!   keeps its generation with the dead member as leader, and the survivor is handed back its own
//!   partitions; the dead member's partitions (retry topics included) are fetched by no one. A
//!   real broker bumps the generation on every rebalance of the eager protocol, so an assignment
//!   in the generation of the revocation before it is stale.
//! - **nothing assigned to anyone**: when the dead member led a generation still forming (a new
//!   member joined before the dead one's session expired), tansu takes a survivor's empty
//!   SyncGroup for the leader's, and the group settles with no partition assigned; heartbeats
//!   succeed from then on. No member can see that from its own assignment, and tansu's
//!   DescribeGroups tells no assignments, so a member whose assignment stays empty watches the
//!   group's progress instead, every `check_every`: when records that waited in the source
//!   topics at one reading still wait three readings later and not one commit moved
//!   meanwhile, the group is stuck, and the member rejoins. Records that just arrived, or an
//!   owner busy with a slow record while others commit, do not count. On a real broker it
//!   takes every owner being stuck that long, where a rebalance is what helps.

#[cfg(feature = "kafka-test-broker")]
mod test_broker;

#[cfg(feature = "kafka-test-broker")]
pub(super) use test_broker::StaleWatch;

/// Without the `kafka-test-broker` feature: a watch that never finds the membership stale.
/// (Braced, so that `StaleWatch::default()` serves both kinds of watch.)
#[cfg(not(feature = "kafka-test-broker"))]
#[derive(Debug, Default)]
pub(super) struct StaleWatch {}

#[cfg(not(feature = "kafka-test-broker"))]
impl StaleWatch {
    /// A revocation is starting.
    pub fn revoked<C: rdkafka::consumer::ConsumerContext>(&self, _: &rdkafka::consumer::BaseConsumer<C>) {}

    /// Partitions were assigned.
    pub fn assigned<C: rdkafka::consumer::ConsumerContext>(
        &self,
        _: &rdkafka::consumer::BaseConsumer<C>,
        _: usize,
        _: std::time::Duration,
    ) {
    }

    /// Never: a real broker keeps memberships right.
    pub fn is_stale(&self) -> bool {
        false
    }

    /// Nothing to check.
    pub fn check_progress<C: rdkafka::consumer::ConsumerContext>(
        &self,
        _: &rdkafka::consumer::BaseConsumer<C>,
        _: &[String],
        _: std::time::Duration,
    ) {
    }
}
