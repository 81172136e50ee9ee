//! Pausing a handler (docs/DESIGN.md, "Pause and circuit breaker"): while the handler of a
//! (consumer group, message type) is paused, the group takes none of that type's deliveries —
//! no record is written, no attempt spent, nothing dead-lettered or discarded. They are held
//! in the broker on the retry path (RabbitMQ's delay queues, Kafka's retry topics: a copy,
//! confirmed before the original is acknowledged) and judged again when they come back. The
//! group's other types keep flowing.
//!
//! The state is a row of `handler_pauses` per (group, type), shared by every process of the
//! group; each process reads its group's paused rows at most [`FRESH_FOR`] old, at the routing
//! step, before anything is claimed. Three things pause a handler: its circuit breaker
//! ([`Breaker`]: a run of transport failures or 5xx), a `410 Gone` answer, and an operator
//! ([`crate::actions::handlers`]). Only the breaker's pauses end by themselves: every probe
//! interval one delivery is let through (one process wins it by a compare-and-set); its success
//! resumes the handler.

mod breaker;

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

pub(crate) use breaker::Breaker;
#[cfg(feature = "http")]
pub(crate) use breaker::Signal;
#[cfg(feature = "http")]
pub use breaker::{BreakerSettings, Failure};

use crate::handler::{Handler, HandlerRegistry};
use crate::store::PipelineStore;
use crate::store::roles::PauseBook;

/// Longest a process acts on its last reading of the pause states: a pause written by another
/// process (or an operator) holds this process's deliveries at most this much later.
pub const FRESH_FOR: Duration = Duration::from_secs(1);

/// How long a held delivery of a handler without a circuit breaker waits before it is judged
/// again (those of an HTTP handler wait its `probe_interval_ms`).
pub const DEFAULT_HOLD: Duration = Duration::from_secs(30);

/// Whether a handler takes deliveries. Stored as its snake-case name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PauseState {
    /// Takes deliveries.
    Running,
    /// Paused by its circuit breaker; probed every probe interval, resumed by a success.
    Breaker,
    /// Paused by a `410 Gone` answer, until an operator resumes it.
    Gone,
    /// Paused by an operator, until an operator resumes it.
    Operator,
}

impl PauseState {
    /// The stored name.
    pub fn as_str(self) -> &'static str {
        match self {
            PauseState::Running => "running",
            PauseState::Breaker => "breaker",
            PauseState::Gone => "gone",
            PauseState::Operator => "operator",
        }
    }

    /// The state stored as `name`; `None` for another name.
    pub fn parse(name: &str) -> Option<Self> {
        [PauseState::Running, PauseState::Breaker, PauseState::Gone, PauseState::Operator]
            .into_iter()
            .find(|s| s.as_str() == name)
    }
}

/// A paused handler as this process last read it.
#[derive(Debug, Clone, Copy)]
struct Paused {
    state: PauseState,
    /// `Breaker`: the next probe is due then.
    probe_at: Option<DateTime<Utc>>,
}

/// The last reading of a group's paused handlers.
#[derive(Default)]
struct Reading {
    at: Option<Instant>,
    /// The group's handlers have their rows.
    registered: bool,
    paused: HashMap<String, Paused>,
}

/// The pause states of one consumer group's handlers, as this process reads and writes them.
/// One per pipeline; its circuit breakers write through it.
pub(crate) struct Pauses {
    book: std::sync::Arc<dyn PauseBook>,
    group: String,
    /// (type, kind) of the group's handlers, registered on the first reading.
    handlers: Vec<(String, &'static str)>,
    /// How long a held delivery of each type waits (its breaker's probe interval).
    hold: HashMap<String, Duration>,
    reading: Mutex<Reading>,
    /// One reader at a time; the others use the reading it makes.
    reader: tokio::sync::Mutex<()>,
}


impl Pauses {
    /// The pauses of `group`'s `handlers`, on `store`'s database; links their circuit breakers.
    pub(crate) fn new<S: PipelineStore>(store: &S, group: &str, handlers: &HandlerRegistry) -> std::sync::Arc<Self> {
        let kinds = handlers.iter().map(|(t, h)| (t.to_owned(), kind(handlers, t, h))).collect();
        let hold = handlers.breakers().map(|(t, b)| (t.to_owned(), b.settings().probe_interval)).collect();
        let pauses = std::sync::Arc::new(Self {
            book: store.pause_book(),
            group: group.to_owned(),
            handlers: kinds,
            hold,
            reading: Mutex::default(),
            reader: tokio::sync::Mutex::new(()),
        });
        for (message_type, breaker) in handlers.breakers() {
            breaker.link(&pauses, message_type);
        }
        pauses
    }

    fn reading(&self) -> std::sync::MutexGuard<'_, Reading> {
        self.reading.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn fresh(&self) -> bool {
        self.reading().at.is_some_and(|at| at.elapsed() < FRESH_FOR)
    }

    /// Reads the paused handlers again when the last reading is older than [`FRESH_FOR`]. A
    /// failed reading keeps the last one (claims need the database too: they fail and redeliver).
    async fn refresh(&self) {
        if self.fresh() {
            return;
        }
        let _reader = self.reader.lock().await;
        if self.fresh() {
            return;
        }
        if !self.reading().registered {
            match self.book.register(&self.group, &self.handlers).await {
                Ok(_) => self.reading().registered = true,
                Err(e) => tracing::warn!(error = %e, group = %self.group, "registering the handlers' pause rows failed"),
            }
        }
        let rows = self.book.paused(&self.group).await;
        let mut reading = self.reading();
        reading.at = Some(Instant::now());
        match rows {
            Ok(rows) => {
                reading.paused = rows
                    .into_iter()
                    .filter_map(|(t, state, probe_at)| Some((t, Paused { state: PauseState::parse(&state)?, probe_at })))
                    .collect();
            }
            Err(e) => tracing::warn!(error = %e, group = %self.group, "reading the handlers' pause states failed"),
        }
    }

    /// A gate for one batch, on a reading at most [`FRESH_FOR`] old.
    pub(crate) async fn gate(&self) -> Gate<'_> {
        self.refresh().await;
        Gate { pauses: self, paused: self.reading().paused.clone(), probed: HashSet::new() }
    }

    #[cfg(feature = "http")]
    /// Whether `message_type` is paused by its breaker, as last read.
    pub(crate) fn breaker_paused(&self, message_type: &str) -> bool {
        self.reading().paused.get(message_type).is_some_and(|p| p.state == PauseState::Breaker)
    }

    #[cfg(feature = "http")]
    /// Pauses `message_type` (`state` is `Breaker` or `Gone`) for `failure`.
    pub(crate) async fn pause(
        &self,
        message_type: &str,
        state: PauseState,
        failure: &Failure<'_>,
        probe_interval: Duration,
    ) -> Result<(), sqlx::Error> {
        let reason: String = failure.text.lines().next().unwrap_or_default().chars().take(500).collect();
        let row = self
            .book
            .pause(&crate::store::roles::EnginePause {
                group: &self.group,
                message_type,
                state: state.as_str(),
                reason: &reason,
                error_class: failure.class,
                http_status: failure.status.and_then(|s| i16::try_from(s).ok()),
                probe_interval_ms: millis(probe_interval),
            })
            .await?;
        if let Some((stored, probe_at)) = row.and_then(|(s, p)| Some((PauseState::parse(&s)?, p))) {
            tracing::warn!(group = %self.group, message_type, state = stored.as_str(), class = failure.class,
                status = failure.status, reason, "handler paused; its deliveries wait in the broker");
            metrics::counter!("dedup_handler_pauses_total", "group" => self.group.clone(), "type" => message_type.to_owned(),
                "state" => stored.as_str()).increment(1);
            self.reading().paused.insert(message_type.to_owned(), Paused { state: stored, probe_at });
        }
        Ok(())
    }

    #[cfg(feature = "http")]
    /// A call of a breaker-paused `message_type` succeeded: resumes it.
    pub(crate) async fn resume_after_probe(&self, message_type: &str) -> Result<(), sqlx::Error> {
        if self.book.resume_after_probe(&self.group, message_type).await? {
            tracing::info!(group = %self.group, message_type, "probe succeeded; handler resumed");
            self.reading().paused.remove(message_type);
        }
        Ok(())
    }

    /// Whether `message_type` is paused, on a reading at most [`FRESH_FOR`] old (a pause this
    /// process wrote counts at once): asked right before each leased effect starts, so that a
    /// pause holds the calls of a batch that have not started yet.
    pub(crate) async fn is_paused(&self, message_type: &str) -> bool {
        self.refresh().await;
        self.reading().paused.contains_key(message_type)
    }

    /// How long a held delivery of `message_type` waits before it is judged again.
    pub(crate) fn hold_for(&self, message_type: &str) -> Duration {
        self.hold.get(message_type).copied().unwrap_or(DEFAULT_HOLD)
    }

    /// Counts `count` held deliveries of `message_type` (metric `dedup_held_total`).
    pub(crate) fn count_held(&self, message_type: &str, count: u64) {
        metrics::counter!("dedup_held_total", "group" => self.group.clone(), "type" => message_type.to_owned())
            .increment(count);
    }
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// A handler's kind as registered: `http` (it has a circuit breaker), `leased` or `transactional`.
fn kind(handlers: &HandlerRegistry, message_type: &str, handler: &Handler) -> &'static str {
    match handler {
        Handler::Transactional(_) => "transactional",
        Handler::Leased { .. } if handlers.breaker(message_type).is_some() => "http",
        Handler::Leased { .. } => "leased",
    }
}

/// Decides, for one batch, which deliveries are held.
pub(crate) struct Gate<'a> {
    pauses: &'a Pauses,
    paused: HashMap<String, Paused>,
    /// Types whose probe this batch tried to take.
    probed: HashSet<String>,
}

impl Gate<'_> {
    /// Whether no handler is paused (nothing to hold).
    pub(crate) fn is_open(&self) -> bool {
        self.paused.is_empty()
    }

    /// Whether a delivery of `message_type` goes on, as the probe, or is held. Of a
    /// breaker-paused type, the first delivery after its probe is due goes on as the probe when
    /// this process wins it.
    pub(crate) async fn pass(&mut self, message_type: &str) -> Passage {
        let Some(&paused) = self.paused.get(message_type) else { return Passage::Go };
        let due = paused.probe_at.is_none_or(|at| at <= Utc::now());
        if paused.state == PauseState::Breaker && due && self.probed.insert(message_type.to_owned()) {
            let interval = self.pauses.hold_for(message_type);
            let won = self.pauses.book.take_probe(&self.pauses.group, message_type, millis(interval)).await;
            match won {
                Ok(Some(next)) => {
                    if let Some(p) = self.pauses.reading().paused.get_mut(message_type) {
                        p.probe_at = Some(next);
                    }
                    tracing::info!(group = %self.pauses.group, message_type, "circuit breaker: one delivery goes through as the probe");
                    return Passage::Probe;
                }
                Ok(None) => {}
                Err(e) => tracing::warn!(error = %e, message_type, "taking the probe failed; held"),
            }
        }
        self.pauses.count_held(message_type, 1);
        Passage::Hold(self.pauses.hold_for(message_type))
    }
}

/// What the gate says of one delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Passage {
    /// Its handler is running: it goes on.
    Go,
    /// Its handler is paused by its circuit breaker and this delivery is the probe: it goes on,
    /// and its failure spends no attempt (DESIGN.md, "Pause and circuit breaker").
    Probe,
    /// Its handler is paused: held this long.
    Hold(Duration),
}
