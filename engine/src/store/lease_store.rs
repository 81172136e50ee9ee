//! [`LeaseStore`]: the statements of leased handlers, beyond the claims and failures of
//! [`DedupStore`].

use std::time::Duration;

use async_trait::async_trait;

use super::{ClaimedRecord, DedupStore, FailureReport, Lease, StoreError};
use crate::handler::EffectAnswer;

/// The statements of leased handlers ([`crate::handler::LeasedHandler`]) beyond the claims and
/// failures of [`DedupStore`]: their completions with the effect's answer, deferrals, the
/// heartbeat, effect-start marks, releases of calls that never started, late effects. Each is
/// fenced by the record's own lease token and runs alone (autocommit): a leased claim commits
/// before its effect.
#[async_trait]
pub trait LeaseStore: DedupStore {
    /// Marks claimed leased records `succeeded` in one statement, each fenced by status and its
    /// own lease token, clears their leases and stored payloads, and closes their attempt rows
    /// with the effect's answer. `done`: the claims with their answers. Returns which ids were
    /// completed; the others were taken over or released meanwhile (their lease was lost).
    async fn complete_many_leased(
        &self,
        conn: &mut <Self::Db as sqlx::Database>::Connection,
        done: &[(&ClaimedRecord, Option<&EffectAnswer>)],
    ) -> Result<Vec<i64>, StoreError>;

    /// Gives a leased claim back without counting its attempt (the far side is still working on
    /// the message, [`crate::handler::HandlerError::in_progress`]), fenced by the lease token:
    /// `failed` with the retry due time, `attempts` one less, the attempt closed as `deferred`.
    /// Only while the run of such answers — the attempts marked in progress since the last one
    /// that was not — started less than `within` ago (database clock); `None`: in any case (a
    /// failed probe of a paused handler, see DESIGN.md "Pause and circuit breaker"). The
    /// attempt is marked in progress when [`FailureReport::in_progress`] says so. False when not
    /// done — the lease was lost, or the run is older: then the caller records an ordinary
    /// failure ([`DedupStore::fail_claimed`]).
    async fn defer_claimed(
        &self,
        conn: &mut <Self::Db as sqlx::Database>::Connection,
        failure: &FailureReport<'_>,
        within: Option<Duration>,
    ) -> Result<bool, StoreError>;

    /// A worker's heartbeat: extends the leases of all its in-flight `claims` in one statement
    /// by the duration of `lease` from now (database clock), each fenced by its own lease token.
    /// Returns the ids still held; the others are lost (taken over or released by an operator).
    async fn extend_leases(
        &self,
        conn: &mut <Self::Db as sqlx::Database>::Connection,
        claims: &[&ClaimedRecord],
        lease: &Lease,
    ) -> Result<Vec<i64>, StoreError>;

    /// Marks a wave of leased claims whose effects are about to start (`effect_started`), in one
    /// statement committed before any of them starts, each fenced by its own lease token. A
    /// record whose lease expires unmarked never had its effect attempted, and is taken over by
    /// the next claim whatever its `on_lease_expiry`. Returns the ids still held; the others'
    /// leases are lost.
    async fn mark_effects_started(
        &self,
        conn: &mut <Self::Db as sqlx::Database>::Connection,
        claims: &[&ClaimedRecord],
    ) -> Result<Vec<i64>, StoreError>;

    /// Gives back leased claims whose effect never started because their handler was paused
    /// meanwhile, in one statement, each fenced by its own lease token: `failed` with one
    /// attempt less, due again in `retry_delay_ms`, the attempt row the claim opened removed.
    /// Returns the ids given back; the others' leases were lost.
    async fn release_unstarted(
        &self,
        conn: &mut <Self::Db as sqlx::Database>::Connection,
        claims: &[&ClaimedRecord],
        retry_delay_ms: i64,
    ) -> Result<Vec<i64>, StoreError>;

    /// How attempt `attempt` of record `id` ended: its `outcome` (`failed`, `dead`, `deferred`,
    /// `lease_lost`, …), `None` while it is open or when there is none. Read after a failure was
    /// recorded only on a later try, which found the lease token gone: the attempt row says
    /// whether an earlier try, whose answer was lost, recorded it.
    async fn attempt_outcome(
        &self,
        conn: &mut <Self::Db as sqlx::Database>::Connection,
        id: i64,
        attempt: i32,
    ) -> Result<Option<String>, StoreError>;

    /// Flags the attempt of `claim` as a late effect: its effect ran, but the completion was
    /// refused (the lease was taken over or released meanwhile), so the effect may have run
    /// twice. The effect's late `answer` is kept on the attempt. An attempt that did succeed is
    /// left as it is: a completion whose answer was lost committed, and its retry completed
    /// nothing.
    async fn note_late_effect(
        &self,
        conn: &mut <Self::Db as sqlx::Database>::Connection,
        claim: &ClaimedRecord,
        answer: Option<&EffectAnswer>,
    ) -> Result<(), StoreError>;
}
