//! Handlers: the business code run for a claimed record, in one of the two modes of DESIGN.md.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde_json::Value;
use sqlx::PgConnection;

use crate::message::InboundMessage;
use crate::record::{ConsumerGroup, LeaseExpiryPolicy, MessageId};

mod guard;
pub(crate) use guard::EffectStart;
pub use guard::{EffectAnswer, LeaseGuard};

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

/// A handler failure: its **class**, the dead-letter grouping key, and its **detail**, the
/// free text of this one failure (DESIGN.md, "Retries and dead letters").
///
/// The class is stored as the record's `error_class`: the Dead letters page groups `dead`
/// records by it, and a bulk requeue picks them by it. Keep it a short stable code naming the
/// cause (`MEMBER_NOT_FOUND`, `SMS_GATEWAY_UNAVAILABLE`), with no member id, amount or time in
/// it, which belong in the detail: one cause is then one group, however many members it hit.
/// The record's `last_error` is both, `<class>: <detail>` (this type's `Display`).
///
/// ```
/// use dedup_engine::HandlerError;
/// let member = 4711;
/// let error = HandlerError::permanent("MEMBER_NOT_FOUND", format!("member {member} has no account"));
/// assert_eq!(error.class(), "MEMBER_NOT_FOUND");
/// assert_eq!(error.to_string(), "MEMBER_NOT_FOUND: member 4711 has no account");
/// ```
#[derive(Debug, Clone, thiserror::Error)]
#[error("{class}: {detail}")]
pub struct HandlerError {
    class: Cow<'static, str>,
    detail: String,
    permanent: bool,
    transient: bool,
    /// Retry after this delay instead of the group's back-off (a service's `Retry-After`, already
    /// clamped by the handler). Leased handlers only; ignored for permanent errors.
    pub retry_after: Option<Duration>,
    /// Leased handlers: the far side is still working on this message (an HTTP 409 for its
    /// `Idempotency-Key`): the record is given back without counting the attempt while the run
    /// of such answers is younger than this; after that the attempt counts like any retryable
    /// failure. See [`HandlerError::in_progress`].
    pub uncounted_within: Option<Duration>,
    outcome_unknown: bool,
}

/// Longest error class kept, in characters; a longer one is cut.
pub const MAX_ERROR_CLASS_CHARS: usize = 200;

impl HandlerError {
    /// A failure worth retrying after a back-off, of class `class` (cut to
    /// [`MAX_ERROR_CLASS_CHARS`]) with `detail`.
    pub fn retryable(class: impl Into<Cow<'static, str>>, detail: impl Into<String>) -> Self {
        Self::new(class, detail, false)
    }

    /// A failure that retrying cannot fix (bad payload, business rule violated): the record goes
    /// dead at once. Class and detail as for [`HandlerError::retryable`].
    pub fn permanent(class: impl Into<Cow<'static, str>>, detail: impl Into<String>) -> Self {
        Self::new(class, detail, true)
    }

    fn new(class: impl Into<Cow<'static, str>>, detail: impl Into<String>, permanent: bool) -> Self {
        Self {
            class: cut_class(class.into()),
            detail: detail.into(),
            permanent,
            transient: false,
            retry_after: None,
            uncounted_within: None,
            outcome_unknown: false,
        }
    }

    /// A retryable failure whose text comes from outside the handler's own code (a driver, a
    /// client library), so no class was chosen for it: the class is `kind`, a colon and the
    /// text's first line with its numbers and long hex runs replaced by `#`, so that
    /// "connection to 10.0.0.7 refused" and "connection to 10.0.0.8 refused" group together;
    /// the detail is the whole text. Database errors become such failures of kind `DATABASE`
    /// (`From<sqlx::Error>`). Prefer [`HandlerError::retryable`] with a class of your own where
    /// you know the cause.
    ///
    /// ```
    /// use dedup_engine::HandlerError;
    /// let error = HandlerError::unclassified("LOYALTY_API", "status 503 from 10.0.0.7:8080\nretry later");
    /// assert_eq!(error.class(), "LOYALTY_API: status # from #");
    /// ```
    pub fn unclassified(kind: &str, text: impl Into<String>) -> Self {
        let text = text.into();
        Self::retryable(class_from_text(kind, &text), text)
    }

    /// The far side is still working on this message (leased handlers): try again later
    /// without counting the attempt, as long as the first of an unbroken run of such answers
    /// (no counted attempt between them) is younger than `within`, by the database clock.
    /// After that each one counts as a retryable failure, so a service that always answers so
    /// still ends in a dead letter. Class and detail as for [`HandlerError::retryable`].
    pub fn in_progress(class: impl Into<Cow<'static, str>>, detail: impl Into<String>, within: Duration) -> Self {
        Self { uncounted_within: Some(within), ..Self::new(class, detail, false) }
    }

    /// Leased handlers: the effect may or may not have happened — its answer was lost (the
    /// connection to the far side broke after the request went out). Under
    /// [`crate::LeaseExpiryPolicy::Hold`] nothing is recorded: the record keeps its claim, a
    /// copy of the delivery is sent back due when the lease expires (the original is acked once
    /// the copy is confirmed), and that copy is parked for an operator to check the effect, as
    /// after a crash. Under `Reclaim`, which allows running the effect again, it is a retryable
    /// failure. Prefer it to a retryable failure wherever retrying could do the effect twice. A
    /// transactional handler's failure rolls its effect back, so there it is a retryable
    /// failure. Class and detail as for [`HandlerError::retryable`].
    pub fn outcome_unknown(class: impl Into<Cow<'static, str>>, detail: impl Into<String>) -> Self {
        Self { outcome_unknown: true, ..Self::new(class, detail, false) }
    }

    /// True for [`HandlerError::outcome_unknown`].
    pub fn is_outcome_unknown(&self) -> bool {
        self.outcome_unknown
    }

    /// The same failure, retried after `delay` instead of the group's back-off (leased
    /// handlers). On RabbitMQ the retry copy waits in the back-off level queue not shorter than
    /// `delay` (the longest one when none is).
    #[must_use]
    pub fn retry_after(mut self, delay: Duration) -> Self {
        self.retry_after = Some(delay);
        self
    }

    /// The lease was lost before the effect (see [`LeaseGuard::check`]): nothing was done; a
    /// worker that took the record over settles it, else it is retried.
    pub fn lease_lost() -> Self {
        Self::retryable(
            LEASE_LOST,
            "the lease was lost before the effect, which did not run; a worker that took the record over settles it, \
             else it is retried",
        )
    }

    /// The class: the dead-letter grouping key, stored as `error_class`.
    pub fn class(&self) -> &str {
        &self.class
    }

    /// The free text of this failure.
    pub fn detail(&self) -> &str {
        &self.detail
    }

    /// True when retrying cannot help: the record goes dead at once.
    pub fn is_permanent(&self) -> bool {
        self.permanent
    }

    /// True for a database conflict (deadlock, serialization failure, lost connection). A
    /// transactional handler's conflict is retried at once in its transaction (rolled back to
    /// its savepoint), up to 3 tries in all, without counting an attempt; one that persists
    /// counts as a retryable failure. Deadlocks between concurrent batches are avoided, not
    /// retried away, with [`TransactionalHandler::lock_key`].
    pub fn is_transient(&self) -> bool {
        self.transient
    }

    /// True for [`HandlerError::lease_lost`].
    pub fn is_lease_lost(&self) -> bool {
        self.class == LEASE_LOST
    }

    /// The handler was paused before this effect started ([`LeaseGuard::effect_starts`]):
    /// nothing was done; the claim is given back without counting and the delivery held.
    pub(crate) fn held() -> Self {
        Self::retryable(HELD, "the handler was paused before the effect started; held, not counted")
    }

    /// True for [`HandlerError::held`].
    pub(crate) fn is_held(&self) -> bool {
        self.class == HELD
    }
}

/// Class of [`HandlerError::lease_lost`].
const LEASE_LOST: &str = "LEASE_LOST";

/// Class of [`HandlerError::held`].
const HELD: &str = "HANDLER_PAUSED";

fn cut_class(class: Cow<'static, str>) -> Cow<'static, str> {
    match class.char_indices().nth(MAX_ERROR_CLASS_CHARS) {
        Some((end, _)) => Cow::Owned(class[..end].to_owned()),
        None => class,
    }
}

/// See [`HandlerError::unclassified`].
fn class_from_text(kind: &str, text: &str) -> String {
    let first_line = text.lines().next().unwrap_or_default();
    let mut normalised = String::with_capacity(first_line.len());
    let mut in_number = false;
    for token in first_line.split_inclusive(|c: char| !c.is_ascii_alphanumeric()) {
        let (word, sep) = token.split_at(token.trim_end_matches(|c: char| !c.is_ascii_alphanumeric()).len());
        let numeric = !word.is_empty()
            && (word.chars().all(|c| c.is_ascii_digit())
                || (word.len() >= 8
                    && word.chars().all(|c| c.is_ascii_hexdigit())
                    && word.chars().any(|c| c.is_ascii_digit())));
        if numeric {
            if !in_number {
                normalised.push('#');
            }
            in_number = sep.is_empty() || matches!(sep, "-" | "." | ":");
            if !in_number {
                normalised.push_str(sep);
            }
        } else {
            in_number = false;
            normalised.push_str(word);
            normalised.push_str(sep);
        }
    }
    format!("{kind}: {normalised}")
}

impl From<sqlx::Error> for HandlerError {
    /// A retryable [`HandlerError::unclassified`] failure of kind `DATABASE`; transient for a
    /// deadlock, a serialization failure or a lost connection.
    fn from(e: sqlx::Error) -> Self {
        let transient = crate::store::DbErrorKind::of(&e).is_transient();
        Self { transient, ..Self::unclassified("DATABASE", e.to_string()) }
    }
}

/// A handler whose effects live in the dedup store's database: it runs inside the transaction
/// that claimed the record, and the record is marked `succeeded` in the same transaction.
///
/// It may run more than once for one attempt: after a deadlock or serialization failure, and
/// when its batch's transaction is rolled back because another message of it failed (the batch
/// then runs again with a savepoint per message). Only the run that commits counts, so its
/// effects must live in `tx` alone.
#[async_trait]
pub trait TransactionalHandler: Send + Sync + 'static {
    /// Applies the message's business changes on `tx`. Returning an error rolls them back.
    async fn handle(&self, input: &HandlerInput<'_>, tx: &mut PgConnection) -> Result<(), HandlerError>;

    /// Most messages [`TransactionalHandler::handle_batch`] takes in one call; 1 (the default):
    /// the pipeline calls [`TransactionalHandler::handle`] once per message. A handler that can
    /// write many messages' business rows in one statement (`INSERT … SELECT * FROM unnest($1,
    /// $2)`) says how many it takes, and saves a round trip per message. 0 counts as 1. A run
    /// is also bounded by the delivery batch (the group's batch size) and 500 per transaction.
    fn max_batch(&self) -> usize {
        1
    }

    /// Applies the business changes of several claimed messages of this handler's type on `tx`,
    /// as [`TransactionalHandler::handle`] would one after the other, in `inputs`' order (the
    /// batch's lock order: [`TransactionalHandler::lock_key`], then the message id). A call takes
    /// a run of consecutive messages of this handler in that order. Called only when
    /// [`TransactionalHandler::max_batch`] is above 1, with at most that many inputs, and only in
    /// a batch's optimistic transaction (DESIGN.md, "Batch handlers"): an error rolls the whole
    /// transaction back, and its messages run again one by one through `handle`, each in a
    /// savepoint, so a failure is pinned on its own message and the others commit. Its effects
    /// must therefore live in `tx` alone, as `handle`'s do. The default calls `handle` for each
    /// input in turn.
    async fn handle_batch(&self, inputs: &[HandlerInput<'_>], tx: &mut PgConnection) -> Result<(), HandlerError> {
        for input in inputs {
            self.handle(input, tx).await?;
        }
        Ok(())
    }

    /// The shared business row this message will lock, if any (e.g. the SKU whose stock it
    /// reserves, the card whose balance it debits). A batch runs its messages ordered by this
    /// key, so concurrent batches lock hot rows in one order and wait for each other instead of
    /// deadlocking. Without it, workers whose batches touch the same rows deadlock, and each
    /// deadlock that persists through the in-transaction retries costs the message an attempt
    /// ([`HandlerError::is_transient`]).
    ///
    /// ```
    /// # use dedup_engine::prelude::*;
    /// # use dedup_engine::sqlx::PgConnection;
    /// struct RedeemGiftCard; // debits `cards.balance`: many messages per card
    ///
    /// #[async_trait]
    /// impl TransactionalHandler for RedeemGiftCard {
    ///     async fn handle(&self, input: &HandlerInput<'_>, tx: &mut PgConnection) -> Result<(), HandlerError> {
    ///         # let _ = (input, tx);
    ///         // UPDATE cards SET balance = balance - $2 WHERE card_no = $1 …
    ///         Ok(())
    ///     }
    ///
    ///     fn lock_key(&self, input: &HandlerInput<'_>) -> Option<String> {
    ///         input.str_field("cardNo").ok().map(|card| format!("card:{card}"))
    ///     }
    /// }
    /// ```
    fn lock_key(&self, _input: &HandlerInput<'_>) -> Option<String> {
        None
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
    /// See [`TransactionalHandler`].
    Transactional(Arc<dyn TransactionalHandler>),
    /// See [`LeasedHandler`].
    Leased {
        /// The effect.
        handler: Arc<dyn LeasedHandler>,
        /// What a redelivery of a stuck record may do.
        on_lease_expiry: LeaseExpiryPolicy,
    },
}

impl Handler {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_class_is_kept_as_given_and_only_unclassified_text_is_masked() {
        let a = HandlerError::permanent("ORDER_NOT_FOUND", "order 202501281000001 not found");
        let b = HandlerError::retryable("ORDER_NOT_FOUND", "order 202501281000002 not found");
        assert_eq!((a.class(), b.class()), ("ORDER_NOT_FOUND", "ORDER_NOT_FOUND"));
        assert!(a.is_permanent() && !b.is_permanent());
        assert_eq!(a.detail(), "order 202501281000001 not found");
        assert_eq!(HandlerError::retryable("N 1", "x").class(), "N 1", "a given class is not masked");
        let class = |text: &str| HandlerError::unclassified("X", text).class().to_owned();
        assert_eq!(class("order 202501281000001 not found\nat line 3"), "X: order # not found");
        assert_eq!(class("order 202501281000001 not found"), class("order 202501281000002 not found"));
        assert_eq!(class("timeout after 1.5 s"), "X: timeout after # s");
        assert_eq!(class("id 3f2a9c1e7b not known"), "X: id # not known");
        assert_eq!(class("abc"), "X: abc");
        assert_eq!(class(&"y".repeat(500)).chars().count(), MAX_ERROR_CLASS_CHARS);
        assert_eq!(HandlerError::retryable("é".repeat(300), "").class().chars().count(), MAX_ERROR_CLASS_CHARS);
    }
}
