//! Handlers: the business code run for a claimed record, in one of the two modes of DESIGN.md.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde_json::Value;

use crate::message::InboundMessage;
use crate::record::{ConsumerGroup, LeaseExpiryPolicy, MessageId};

mod error;
mod guard;
mod transactional;
pub use error::{HandlerError, MAX_ERROR_CLASS_CHARS};
pub(crate) use guard::EffectStart;
pub use guard::{EffectAnswer, LeaseGuard};
pub(crate) use transactional::OnDatabase;
pub use transactional::{AnyTransactionalHandler, TransactionalHandler};

/// What a handler gets to see of a message.
#[derive(Debug, Clone, Copy)]
pub struct HandlerInput<'a> {
    /// The consumer group the record belongs to.
    pub group: &'a ConsumerGroup,
    /// The message id.
    pub message_id: &'a MessageId,
    /// The handler type the group's type policy found (e.g. `ORDER.PAY`).
    pub message_type: &'a str,
    /// The payload parsed as JSON (`None` for binary payloads).
    pub json: Option<&'a Value>,
    /// The raw payload.
    pub payload: &'a [u8],
    /// Broker headers as JSON.
    pub headers: &'a serde_json::Map<String, Value>,
    /// This attempt's number (1-based), from the dedup table.
    pub attempt: i32,
    /// Leased handlers: runs of the effect for this record so far, this one included — counted
    /// attempts, and also the ones not counted ([`HandlerError::in_progress`]) and the ones whose
    /// lease was lost. Transactional handlers: the attempt.
    pub calls: i32,
    /// Leased handlers: the status the previous run's far side answered
    /// ([`LeaseGuard::answered`]), if it reported one. `None` on the first run and for
    /// transactional handlers.
    pub previous_status: Option<u16>,
    /// The delivery as received: content type, broker, where it came from (exchange and routing
    /// key, or topic, partition and offset).
    pub message: &'a InboundMessage,
}

impl HandlerInput<'_> {
    /// A string field of the JSON payload, or a permanent error naming the field.
    pub fn str_field(&self, name: &str) -> Result<&str, HandlerError> {
        self.json.and_then(|j| j.get(name)).and_then(Value::as_str).ok_or_else(|| {
            HandlerError::permanent("INVALID_PAYLOAD", format!("payload field {name:?} is missing or not a string"))
        })
    }

    /// An integer field of the JSON payload, or a permanent error naming the field.
    pub fn i64_field(&self, name: &str) -> Result<i64, HandlerError> {
        self.json.and_then(|j| j.get(name)).and_then(Value::as_i64).ok_or_else(|| {
            HandlerError::permanent("INVALID_PAYLOAD", format!("payload field {name:?} is missing or not an integer"))
        })
    }
}

/// A handler with an external side effect (an SMS, an HTTP call): runs after its claim has
/// committed, under a lease that is extended while it runs; its completion is fenced by the
/// lease token.
#[async_trait]
pub trait LeasedHandler: Send + Sync + 'static {
    /// Performs the effect. Call [`LeaseGuard::check`] right before the effect (and before
    /// each step of one made of several): once the lease is lost another worker may run the
    /// effect too. The engine checks it before calling the handler, and extends the lease every
    /// third of its duration while the handler runs.
    async fn handle(&self, input: &HandlerInput<'_>, lease: &LeaseGuard) -> Result<(), HandlerError>;

    /// The longest one run of the effect may take (the HTTP handler's timeout), if it is
    /// bounded. The engine refuses to start a group whose lease is not longer: a worker that
    /// stops extending its lease (frozen, cut off from the database) has then finished its run
    /// before the lease can run out and another worker take the record over.
    fn longest_run(&self) -> Option<Duration> {
        None
    }

    /// The most runs of the effect at a time in this process, if the handler limits them (the
    /// HTTP handler's `concurrency`). Such a handler must call [`LeaseGuard::effect_starts`]
    /// right before each effect, when its run has its slot, and should call
    /// [`LeaseGuard::effect_due`] before it waits for the slot: the engine marks a record's
    /// effect started in its claim for the first `concurrency` records of a batch, and the
    /// others in waves from there, each wave's statement when the wave before it has started
    /// (without `effect_due`, when the wave's first run has its slot, which it then holds while
    /// the statement commits). Without a limit (`None`) every run starts at once: the claim marks them
    /// all, and the engine calls [`LeaseGuard::effect_starts`] itself before the handler.
    fn concurrency(&self) -> Option<usize> {
        None
    }
}

/// A handler in one of the two modes.
#[derive(Clone)]
pub enum Handler {
    /// See [`TransactionalHandler`]: any `Arc<H>` of a PostgreSQL handler `H` (or the
    /// handler of another database, made by [`crate::Group::transactional_on`]).
    Transactional(Arc<dyn AnyTransactionalHandler>),
    /// See [`LeasedHandler`].
    Leased {
        /// The effect.
        handler: Arc<dyn LeasedHandler>,
        /// What a redelivery of a stuck record may do.
        on_lease_expiry: LeaseExpiryPolicy,
    },
}

impl Handler {
    /// A transactional handler of database `DB` (`Handler::transactional_on::<sqlx::MySql,
    /// _>(PayOrder)`); a PostgreSQL one is also `Handler::Transactional(Arc::new(handler))`. See
    /// [`crate::Group::transactional_on`].
    pub fn transactional_on<DB: sqlx::Database, H: TransactionalHandler<DB>>(handler: H) -> Self {
        Handler::Transactional(Arc::new(OnDatabase::new(handler)))
    }

    /// The database a transactional handler writes in; `None` for a leased one.
    pub(crate) fn database(&self) -> Option<&'static str> {
        match self {
            Handler::Transactional(handler) => Some(handler.database()),
            Handler::Leased { .. } => None,
        }
    }

    /// Whether an expired lease may be claimed again automatically.
    pub(crate) fn reclaims_expired(&self) -> bool {
        matches!(self, Handler::Leased { on_lease_expiry: LeaseExpiryPolicy::Reclaim, .. })
    }

    /// [`LeasedHandler::concurrency`]; `None` for transactional handlers.
    pub(crate) fn concurrency(&self) -> Option<usize> {
        match self {
            Handler::Transactional(_) => None,
            Handler::Leased { handler, .. } => handler.concurrency(),
        }
    }

    /// [`LeasedHandler::longest_run`]; `None` for transactional handlers.
    pub(crate) fn longest_run(&self) -> Option<Duration> {
        match self {
            Handler::Transactional(_) => None,
            Handler::Leased { handler, .. } => handler.longest_run(),
        }
    }
}

/// The handlers of one consumer group, by message type.
#[derive(Clone, Default)]
pub struct HandlerRegistry {
    by_type: BTreeMap<String, Handler>,
    /// What is kept beside each HTTP handler, by type.
    http: BTreeMap<String, HttpParts>,
}

/// What a registry keeps beside an HTTP handler: its circuit breaker, and what the console
/// shows of it (its endpoint card).
#[derive(Clone)]
struct HttpParts {
    breaker: Arc<crate::pause::Breaker>,
    endpoint: crate::group::HttpEndpoint,
}

impl HandlerRegistry {
    /// An empty registry.
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers `handler` for `message_type` (`<entity>.<event>`), replacing any previous one.
    pub fn register(&mut self, message_type: impl Into<String>, handler: Handler) -> &mut Self {
        let message_type = message_type.into();
        self.http.remove(&message_type);
        self.by_type.insert(message_type, handler);
        self
    }

    /// Registers an HTTP handler for `message_type` (feature `http`), with its circuit breaker
    /// and its own `on_lease_expiry`, replacing any previous handler.
    #[cfg(feature = "http")]
    pub fn http(&mut self, message_type: impl Into<String>, handler: crate::http::HttpHandler) -> &mut Self {
        let message_type = message_type.into();
        let parts = HttpParts { breaker: handler.breaker().clone(), endpoint: handler.endpoint(&message_type) };
        let on_lease_expiry = handler.on_lease_expiry();
        self.register(message_type.clone(), Handler::Leased { handler: Arc::new(handler), on_lease_expiry });
        self.http.insert(message_type, parts);
        self
    }

    /// Registers every handler of `other` (with its circuit breaker), replacing those of the
    /// same types.
    pub(crate) fn extend(&mut self, other: &HandlerRegistry) {
        for (message_type, handler) in other.iter() {
            self.register(message_type, handler.clone());
            if let Some(parts) = other.http.get(message_type) {
                self.http.insert(message_type.to_owned(), parts.clone());
            }
        }
    }

    /// The circuit breaker of `message_type`'s handler, if it has one.
    pub(crate) fn breaker(&self, message_type: &str) -> Option<&Arc<crate::pause::Breaker>> {
        self.http.get(message_type).map(|p| &p.breaker)
    }

    /// Every (type, circuit breaker).
    pub(crate) fn breakers(&self) -> impl Iterator<Item = (&str, &Arc<crate::pause::Breaker>)> {
        self.http.iter().map(|(t, p)| (t.as_str(), &p.breaker))
    }

    /// The handler of a type.
    pub fn get(&self, message_type: &str) -> Option<&Handler> {
        self.by_type.get(message_type)
    }

    /// The HTTP handlers as the console shows them, sorted by type.
    pub(crate) fn http_endpoints(&self) -> Vec<crate::group::HttpEndpoint> {
        self.http.values().map(|p| p.endpoint.clone()).collect()
    }

    /// The registered types, sorted.
    pub(crate) fn types(&self) -> Vec<&str> {
        self.by_type.keys().map(String::as_str).collect()
    }

    /// Every (type, handler), sorted by type.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (&str, &Handler)> {
        self.by_type.iter().map(|(t, h)| (t.as_str(), h))
    }

    /// The handlers of `types` only.
    ///
    /// Errors: the first type without a handler here, with the types there are.
    pub fn only<S: AsRef<str>>(&self, types: &[S]) -> Result<HandlerRegistry, String> {
        let mut picked = HandlerRegistry::new();
        for t in types {
            let t = t.as_ref();
            let handler =
                self.get(t).ok_or_else(|| format!("no handler {t:?}; there are {}", self.types().join(", ")))?;
            picked.register(t, handler.clone());
            if let Some(parts) = self.http.get(t) {
                picked.http.insert(t.to_owned(), parts.clone());
            }
        }
        Ok(picked)
    }

    /// True when no handler is registered.
    pub(crate) fn is_empty(&self) -> bool {
        self.by_type.is_empty()
    }
}
