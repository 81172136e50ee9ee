//! The lease a leased handler's run holds ([`LeaseGuard`]), what its far side answered
//! ([`EffectAnswer`]), and the engine's hook for the moment its effect starts.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use tokio_util::sync::CancellationToken;

use super::HandlerError;

/// What the engine does when a leased handler's effect starts ([`LeaseGuard::effect_starts`]):
/// holds it when its handler is paused, and makes sure its record is marked started.
#[async_trait]
pub(crate) trait EffectStart: Send + Sync + 'static {
    /// `Ok` when the record is marked started, or its mark is written now that its turn came
    /// ([`LeaseGuard::effect_due`]); waits for the turn. Errors as [`EffectStart::starts`].
    async fn due(&self) -> Result<(), HandlerError>;

    /// `Ok` when the effect may start, its mark committed. Errors: [`HandlerError::held`],
    /// [`HandlerError::lease_lost`] (the mark found the record no longer held), or a retryable
    /// failure when the mark could not be written (the effect must not start unmarked).
    async fn starts(&self) -> Result<(), HandlerError>;

    /// The call has returned, whether its effect started or not.
    fn finished(&self);
}

/// What the far side of a leased handler's effect answered (an HTTP status and body, an SMS
/// gateway's reply), kept on the attempt row: the record's history shows it, and a run whose
/// lease was lost meanwhile keeps its late answer there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EffectAnswer {
    /// A status code, when the far side has them (HTTP); `None` for a timeout or a connection
    /// error.
    pub status: Option<u16>,
    /// From the start of the call to its answer (or its failure).
    pub latency: Duration,
    /// What it said, for the operator: the body's first 2 KiB, or the transport error. No
    /// secrets: it is shown in the console and the API.
    pub summary: String,
}

/// The lease a leased handler runs under, as far as this worker can tell.
///
/// It is lost when the heartbeat finds the record taken over or released by an operator, and
/// also when the last confirmed extension is older than the lease itself (this worker may have
/// been frozen or cut off: the database may have handed the record to someone else meanwhile,
/// so this worker must not assume it still holds it). A lost lease never comes back.
///
/// It also carries what the effect's far side answered ([`LeaseGuard::answered`]) back to the
/// engine, which writes it on the attempt row.
#[derive(Clone)]
pub struct LeaseGuard {
    lost: CancellationToken,
    /// When the lease runs out unless extended again (local monotonic clock).
    valid_until: Arc<Mutex<Instant>>,
    answer: Arc<Mutex<Option<EffectAnswer>>>,
    /// The engine's part of [`LeaseGuard::effect_starts`]; `None` for a guard built outside the
    /// engine's leased path.
    start: Option<Arc<dyn EffectStart>>,
}

impl std::fmt::Debug for LeaseGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaseGuard")
            .field("lost", &self.lost.is_cancelled())
            .field("valid_until", &self.valid_until)
            .field("answer", &self.answer)
            .finish_non_exhaustive()
    }
}

impl LeaseGuard {
    /// A guard for a lease of `duration` confirmed (claimed or extended) at `confirmed_at`.
    pub fn new(duration: Duration, confirmed_at: Instant) -> Self {
        Self {
            lost: CancellationToken::new(),
            valid_until: Arc::new(Mutex::new(confirmed_at + duration)),
            answer: Arc::default(),
            start: None,
        }
    }

    /// The same guard, with what the engine does when the effect starts.
    pub(crate) fn with_start(mut self, start: Arc<dyn EffectStart>) -> Self {
        self.start = Some(start);
        self
    }

    /// For a handler that limits its runs ([`LeasedHandler::concurrency`](super::LeasedHandler::concurrency)):
    /// call before waiting for a slot of its own. Resolves when the engine's part of this run's
    /// start is done — its record is marked started, the mark written for the run's whole wave
    /// once the wave before it has started — so that no slot is held while a mark commits.
    /// [`LeaseGuard::effect_starts`] must still be called right before the effect (it holds a
    /// run of a handler paused meanwhile). Optional: `effect_starts` alone marks too, with the
    /// slot held. Errors as `effect_starts`.
    pub async fn effect_due(&self) -> Result<(), HandlerError> {
        self.check()?;
        if let Some(start) = &self.start {
            tokio::select! {
                due = start.due() => due?,
                () = self.lost() => return Err(HandlerError::lease_lost()),
            }
        }
        self.check()
    }

    /// Tells the engine the run has returned (its effect started or not): the next wave of
    /// marks may go on without it.
    pub(crate) fn finished(&self) {
        if let Some(start) = &self.start {
            start.finished();
        }
    }

    /// Call right before the effect, once it is really about to start (a handler that limits
    /// its runs: when the run has its slot, see [`LeasedHandler::concurrency`](super::LeasedHandler::concurrency)). `Ok` while the
    /// lease holds, the handler is not paused, and the record is marked as having its effect
    /// started — durably, before the effect: a record whose lease runs out unmarked (the
    /// process died while it waited) is taken over by the next delivery whatever its
    /// `on_lease_expiry`, since no effect was attempted; one marked is parked under `hold`.
    /// Marks are written one statement per wave of runs, not per run.
    ///
    /// Errors: [`HandlerError::lease_lost`]; a failure of the engine's own class
    /// `HANDLER_PAUSED` when the handler was paused (circuit breaker, 410, operator) since the
    /// batch was taken — return it as it is: the claim is given back without counting the
    /// attempt and the delivery waits with the held ones; a retryable failure when the mark
    /// could not be written.
    pub async fn effect_starts(&self) -> Result<(), HandlerError> {
        self.check()?;
        if let Some(start) = &self.start {
            start.starts().await?;
        }
        self.check()
    }

    /// Reports what the effect's far side answered (the last report of a run wins); the engine
    /// keeps it on the attempt row, whatever the run's outcome — a late answer after the lease
    /// was lost included.
    pub fn answered(&self, answer: EffectAnswer) {
        *self.answer.lock().unwrap_or_else(|e| e.into_inner()) = Some(answer);
    }

    /// The answer reported by the run, taken out.
    pub(crate) fn take_answer(&self) -> Option<EffectAnswer> {
        self.answer.lock().unwrap_or_else(|e| e.into_inner()).take()
    }

    /// Whether the lease is lost (see [`LeaseGuard`]).
    pub(crate) fn is_lost(&self) -> bool {
        if self.lost.is_cancelled() {
            return true;
        }
        let valid_until = *self.valid_until.lock().unwrap_or_else(|e| e.into_inner());
        if Instant::now() >= valid_until {
            self.lost.cancel();
            return true;
        }
        false
    }

    /// `Ok` while the lease holds; [`HandlerError::lease_lost`] once it is lost. Call it right
    /// before the effect.
    ///
    /// Errors: [`HandlerError::lease_lost`].
    pub fn check(&self) -> Result<(), HandlerError> {
        if self.is_lost() { Err(HandlerError::lease_lost()) } else { Ok(()) }
    }

    /// Resolves when the lease is found lost (by the heartbeat, or when it runs out without an
    /// extension): `select!` on it to abandon a long effect.
    pub async fn lost(&self) {
        loop {
            let valid_until = *self.valid_until.lock().unwrap_or_else(|e| e.into_inner());
            tokio::select! {
                () = self.lost.cancelled() => return,
                () = tokio::time::sleep_until(valid_until.into()) => {
                    if self.is_lost() {
                        return;
                    }
                }
            }
        }
    }

    /// Records an extension confirmed by the database at `confirmed_at` for `duration`.
    pub(crate) fn extended(&self, duration: Duration, confirmed_at: Instant) {
        *self.valid_until.lock().unwrap_or_else(|e| e.into_inner()) = confirmed_at + duration;
    }

    /// Marks the lease lost (the heartbeat found it taken over or released).
    pub(crate) fn lose(&self) {
        self.lost.cancel();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_lease_guard_is_lost_when_told_or_when_it_runs_out() {
        let guard = LeaseGuard::new(Duration::from_millis(200), Instant::now());
        assert!(guard.check().is_ok());
        guard.extended(Duration::from_millis(50), Instant::now());
        tokio::time::sleep(Duration::from_millis(60)).await;
        assert!(guard.check().unwrap_err().is_lease_lost(), "no extension within the lease");
        tokio::time::timeout(Duration::from_millis(10), guard.lost()).await.expect("lost() resolves at once");
        let told = LeaseGuard::new(Duration::from_secs(60), Instant::now());
        let waiter = tokio::spawn({
            let told = told.clone();
            async move { told.lost().await }
        });
        told.lose();
        tokio::time::timeout(Duration::from_secs(1), waiter).await.expect("woken").unwrap();
        assert!(told.is_lost());
    }
}
