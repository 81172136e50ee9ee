//! Operators pause and resume a handler by hand (docs/DESIGN.md, "Pause and circuit breaker"):
//! a guarded compare-and-set on its `handler_pauses` row, audited in the same transaction as
//! `handler.pause` / `handler.resume`; a refusal changes nothing and is audited as `refused`.
//! The rules are here; each database's statements are behind [`HandlerBooks`]
//! (`store/postgres/handler_books.rs`, `store/mysql/handler_books.rs`).

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::json;
use sqlx::FromRow;

use super::{ActionError, OperatorTx, end_action, required_reason};
use crate::audit::{AuditOutcome, NewAuditEntry};
use crate::console::ConsoleStore;
use crate::pause::PauseState;

/// Most handlers listed (one row per consumer group and message type: a handful in practice).
pub const MAX_HANDLERS: i64 = 1000;

/// A handler's pause state, as the Handlers page and `GET /api/v1/handlers` show it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, FromRow)]
pub struct HandlerPause {
    pub consumer_group: String,
    pub message_type: String,
    /// `running`, `breaker`, `gone` or `operator` ([`PauseState`]).
    pub state: String,
    /// When the state began.
    pub since: DateTime<Utc>,
    /// Who set it: `user:<name>`, `cli:<os user>`, or `engine` (the circuit breaker, a 410).
    pub changed_by: Option<String>,
    /// Why: the operator's reason, or the first line of the failure that paused it.
    pub reason: Option<String>,
    /// The last failure that paused it or kept it paused: class, HTTP status (none: no answer),
    /// when.
    pub error_class: Option<String>,
    pub http_status: Option<i16>,
    pub failed_at: Option<DateTime<Utc>>,
    /// `breaker`: the next probe is due then.
    pub probe_at: Option<DateTime<Utc>>,
    /// Raised by every change of state; a pause or resume may name the version shown.
    pub version: i64,
    /// `http`, `leased` or `transactional`, as a running engine last registered it.
    pub kind: Option<String>,
    /// When a running engine last registered it.
    pub seen_at: DateTime<Utc>,
}

/// The handlers' pause rows on one database: the list, and the transaction an operator's
/// change runs in. Errors are the database's.
#[async_trait]
pub trait HandlerBooks: Send + Sync {
    /// Every handler's pause state, by group and type (at most [`MAX_HANDLERS`], in the
    /// primary key's order).
    async fn handler_pauses(&self) -> Result<Vec<HandlerPause>, sqlx::Error>;

    /// A transaction for one operator's change.
    async fn begin_change(&self) -> Result<Box<dyn HandlerChange>, sqlx::Error>;
}

/// One operator's change of a handler's state, in one transaction: nothing is kept unless it
/// commits.
#[async_trait]
pub trait HandlerChange: OperatorTx {
    /// The state and version of the handler of (`group`, `message_type`), its row locked until
    /// the transaction ends; `None` for a handler never registered.
    async fn lock(&mut self, group: &str, message_type: &str) -> Result<Option<(String, i64)>, sqlx::Error>;

    /// Sets the locked row's state to `to` as `actor` for `reason` (since now, no probe due,
    /// version raised); returns the row.
    async fn set_state(
        &mut self,
        group: &str,
        message_type: &str,
        to: PauseState,
        actor: &str,
        reason: &str,
    ) -> Result<HandlerPause, sqlx::Error>;

}

/// What an operator does to a handler.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HandlerControl {
    /// `running` or `breaker` → `operator`: its deliveries wait until an operator resumes it.
    Pause,
    /// `breaker`, `gone` or `operator` → `running`.
    Resume,
}

impl HandlerControl {
    fn verb(self) -> &'static str {
        match self {
            HandlerControl::Pause => "handler.pause",
            HandlerControl::Resume => "handler.resume",
        }
    }

    /// The states it applies to, and the one it sets.
    fn transition(self) -> (&'static [PauseState], PauseState) {
        match self {
            HandlerControl::Pause => (&[PauseState::Running, PauseState::Breaker], PauseState::Operator),
            HandlerControl::Resume => (&[PauseState::Breaker, PauseState::Gone, PauseState::Operator], PauseState::Running),
        }
    }
}

/// Pauses or resumes the handler of (`group`, `message_type`) as `actor`, for `reason`
/// (required); when `expected_version` is given, only if the state is still the one shown.
/// Every process of the group follows within [`crate::pause::FRESH_FOR`].
///
/// Errors: [`ActionError::Invalid`] (no reason); [`ActionError::UnknownHandler`];
/// [`ActionError::Refused`] when its state does not allow it (already paused, already running)
/// or changed since it was shown.
#[tracing::instrument(skip_all, fields(actor, group, message_type), err(level = "warn"))]
pub async fn handler_control(
    store: &dyn ConsoleStore,
    actor: &str,
    group: &str,
    message_type: &str,
    control: HandlerControl,
    reason: Option<&str>,
    expected_version: Option<i64>,
) -> Result<HandlerPause, ActionError> {
    let (from, to) = control.transition();
    let from_names: Vec<&str> = from.iter().map(|s| s.as_str()).collect();
    let detail = || json!({ "message_type": message_type, "to": to.as_str(), "expected_version": expected_version });
    // A reason too long to accept is not stored either.
    let stored_reason = super::optional_reason(reason).ok().flatten();
    let mut tx = store.begin_change().await?;
    let result: Result<HandlerPause, ActionError> = async {
        let what = match control {
            HandlerControl::Pause => "pause a handler",
            HandlerControl::Resume => "resume a handler",
        };
        let reason = required_reason(reason, what)?;
        let Some((state, version)) = tx.lock(group, message_type).await? else {
            return Err(ActionError::UnknownHandler { group: group.to_owned(), message_type: message_type.to_owned() });
        };
        if let Some(shown) = expected_version.filter(|v| *v != version) {
            return Err(ActionError::Refused(format!(
                "the handler of {message_type} in {group} changed since it was shown (version {version}, not {shown}); reload and decide again"
            )));
        }
        if !from_names.contains(&state.as_str()) {
            return Err(ActionError::Refused(format!(
                "the handler of {message_type} in {group} is {state}; it can be {}d only when {}",
                control.verb().trim_start_matches("handler."),
                from_names.join(" or ")
            )));
        }
        let row = tx.set_state(group, message_type, to, actor, &crate::db::storable::text(reason)).await?;
        let mut detail = detail();
        detail["from"] = json!(state);
        detail["version"] = json!(row.version);
        let entry = NewAuditEntry {
            actor,
            action: control.verb(),
            outcome: AuditOutcome::Ok,
            reason: stored_reason,
            consumer_group: Some(group),
            message_ids: &[],
            detail,
            source: None,
        };
        tx.audit(&entry).await?;
        Ok(row)
    }
    .await;
    let mut refused = detail();
    refused["consumer_group"] = json!(group);
    let row = end_action(store, tx, actor, control.verb(), stored_reason, refused, result).await?;
    tracing::info!(actor, group, message_type, action = control.verb(), state = to.as_str(), "operator action on a handler");
    Ok(row)
}
