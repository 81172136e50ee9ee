//! [`HandlerError`]: how a handler says what went wrong, and what the engine makes of it.

use std::borrow::Cow;
use std::time::Duration;

use crate::store::DbErrorKind;

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
    /// Retry after this delay instead of the group's back-off (a service's `Retry-After`, already
    /// clamped by the handler). Leased handlers only; ignored for permanent errors.
    pub retry_after: Option<Duration>,
    /// Leased handlers: the far side is still working on this message (an HTTP 409 for its
    /// `Idempotency-Key`): the record is given back without counting the attempt while the run
    /// of such answers is younger than this; after that the attempt counts like any retryable
    /// failure. See [`HandlerError::in_progress`].
    pub uncounted_within: Option<Duration>,
    outcome_unknown: bool,
    /// What kind of database error it was, when it came from the database (`From<sqlx::Error>`).
    database: Option<DbErrorKind>,
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
            retry_after: None,
            uncounted_within: None,
            outcome_unknown: false,
            database: None,
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

    /// Whether the database chose its transaction as a deadlock victim (from a `sqlx::Error`).
    pub(crate) fn is_deadlock(&self) -> bool {
        self.database == Some(DbErrorKind::Deadlock)
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

    /// The lease was lost before the effect (see [`LeaseGuard::check`](super::LeaseGuard::check)): nothing was done; a
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
    /// retried away, with [`TransactionalHandler::lock_key`](super::TransactionalHandler::lock_key).
    pub fn is_transient(&self) -> bool {
        self.database.is_some_and(DbErrorKind::is_transient)
    }

    /// True for [`HandlerError::lease_lost`].
    pub fn is_lease_lost(&self) -> bool {
        self.class == LEASE_LOST
    }

    /// The handler was paused before this effect started ([`LeaseGuard::effect_starts`](super::LeaseGuard::effect_starts)):
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
        Self { database: Some(DbErrorKind::of(&e)), ..Self::unclassified("DATABASE", e.to_string()) }
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
