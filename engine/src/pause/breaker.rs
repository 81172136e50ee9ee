//! A handler's circuit breaker: after `pause_after` consecutive transport failures or 5xx
//! answers (counted in this process, over all the group's workers), the handler is paused for
//! every process of the group; every `probe_interval` one delivery goes through as a probe, and
//! a success (of the probe, or of any call still in flight) resumes it. A `410 Gone` pauses the
//! handler at once, with or without a breaker, until an operator resumes it.

#[cfg(feature = "http")]
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

#[cfg(feature = "http")]
use super::PauseState;
use super::Pauses;

/// A circuit breaker's settings (`pause_after`, `probe_interval_ms` of an HTTP handler).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BreakerSettings {
    /// Consecutive transport failures or 5xx answers that pause the handler; 0: never.
    pub pause_after: u32,
    /// How often a paused handler lets one delivery through as a probe; also how long its held
    /// deliveries wait before they are judged again.
    pub probe_interval: Duration,
}

/// A failure that pauses, or keeps paused, a handler.
#[cfg(feature = "http")]
#[derive(Debug, Clone, Copy)]
pub struct Failure<'a> {
    /// Its class (`HTTP_UNAVAILABLE`, `HTTP_TIMEOUT`, `HTTP_GONE`, ...).
    pub class: &'a str,
    /// The HTTP status; `None` when there was no answer.
    pub status: Option<u16>,
    /// What happened (its first line is kept).
    pub text: &'a str,
}

/// What one call says about the far side.
#[cfg(feature = "http")]
pub(crate) enum Signal<'a> {
    /// It answered 2xx.
    Healthy,
    /// No answer, or a 5xx: counts towards the breaker.
    Unavailable(Failure<'a>),
    /// 410 Gone: pauses the handler until an operator resumes it.
    Gone(Failure<'a>),
    /// Any other answer: the far side is up; the run of failures is broken.
    Answered,
}

/// The breaker of one handler. Counts until the pipeline links it to its group's [`Pauses`];
/// pauses nothing before.
pub(crate) struct Breaker {
    settings: BreakerSettings,
    /// The current run of failures.
    #[cfg(feature = "http")]
    run: AtomicU32,
    link: OnceLock<(Arc<Pauses>, String)>,
}

impl Breaker {
    #[cfg(feature = "http")]
    pub(crate) fn new(settings: BreakerSettings) -> Self {
        Self { settings, run: AtomicU32::new(0), link: OnceLock::new() }
    }

    pub(crate) fn settings(&self) -> BreakerSettings {
        self.settings
    }

    /// Pauses through `pauses` as `message_type` from now on. A handler registered in a second
    /// pipeline (or under a second type) keeps its first link.
    pub(crate) fn link(&self, pauses: &Arc<Pauses>, message_type: &str) {
        if self.link.set((pauses.clone(), message_type.to_owned())).is_err() {
            tracing::debug!(message_type, "circuit breaker already linked; it pauses its first handler type");
        }
    }

    #[cfg(feature = "http")]
    /// Counts `signal`; pauses or resumes the handler when it says so. A database failure is
    /// logged (the next signal writes again).
    pub(crate) async fn observe(&self, signal: Signal<'_>) {
        let (pause, state) = match signal {
            Signal::Healthy => {
                self.run.store(0, Ordering::Relaxed);
                if let Some((pauses, message_type)) = self.link.get()
                    && pauses.breaker_paused(message_type)
                    && let Err(e) = pauses.resume_after_probe(message_type).await
                {
                    tracing::warn!(error = %e, message_type, "resuming the handler after a good answer failed");
                }
                return;
            }
            Signal::Answered => {
                self.run.store(0, Ordering::Relaxed);
                return;
            }
            Signal::Unavailable(failure) => {
                let run = self.run.fetch_add(1, Ordering::Relaxed).saturating_add(1);
                if self.settings.pause_after == 0 || run < self.settings.pause_after {
                    return;
                }
                (failure, PauseState::Breaker)
            }
            Signal::Gone(failure) => (failure, PauseState::Gone),
        };
        if let Some((pauses, message_type)) = self.link.get()
            && let Err(e) = pauses.pause(message_type, state, &pause, self.settings.probe_interval).await
        {
            tracing::warn!(error = %e, message_type, "pausing the handler failed");
        }
    }
}
