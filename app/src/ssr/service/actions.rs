//! The operator actions as the web layer calls them (server functions and the REST API): parse
//! the request, open a publisher when the action republishes, one engine call, convert.

use dedup_engine::console::RecordStatus;
use dedup_engine::console::actions::RecordActionKind as Kind;
use dedup_engine::console::actions::{self, ActionOutcome, RecordAction, conflicts};
use uuid::Uuid;

use super::state::ConsoleState;
use crate::error::ConsoleError;
use crate::wire::actions::{ActionResultView, RecordActionKind, RecordActionRequest};
use crate::wire::records::ConflictRequeuedView;

fn parse_status(text: Option<&str>) -> Result<Option<RecordStatus>, ConsoleError> {
    text.map(|s| s.parse::<RecordStatus>().map_err(|e| ConsoleError::BadRequest(format!("expected_status: {e}"))))
        .transpose()
}

fn parse_token(text: Option<&str>) -> Result<Option<Uuid>, ConsoleError> {
    text.map(|s| {
        Uuid::parse_str(s.trim()).map_err(|_| ConsoleError::BadRequest(format!("lease_token {s:?} is not a UUID")))
    })
    .transpose()
}

/// Runs `kind` on record `id` as `actor`.
///
/// Errors: 400 for a malformed request or a missing reason/lease token, 404 for an unknown
/// record, 409 when the record's state refuses it, 503 when the broker did not take the copy.
pub async fn act(
    state: &ConsoleState,
    actor: &str,
    id: i64,
    kind: RecordActionKind,
    request: &RecordActionRequest,
) -> Result<ActionResultView, ConsoleError> {
    let params = RecordAction {
        record_id: id,
        expected_status: parse_status(request.expected_status.as_deref())?,
        lease_token: parse_token(request.lease_token.as_deref())?,
        expected_version: match request.expected_version {
            Some(v) if v < 0 => {
                return Err(ConsoleError::BadRequest(format!("expected_version must be 0 or more, got {v}")));
            }
            v => v,
        },
        force: request.force,
        reason: request.reason.as_deref(),
        requeue: request.requeue,
    };
    let kind = match kind {
        RecordActionKind::Release => Kind::Release,
        RecordActionKind::MarkSucceeded => Kind::MarkSucceeded,
        RecordActionKind::DeadLetter => Kind::DeadLetter,
        RecordActionKind::Requeue => Kind::Requeue,
    };
    Ok(actions::record_action(state.store(), actor, kind, &params, state.publishers()).await?.into())
}

/// Requeues conflict `id` under a new message id, as `actor`.
///
/// Errors: 404 for an unknown conflict, 409 when it was requeued already, 503 when the broker did
/// not take the copy.
pub async fn requeue_conflict(
    state: &ConsoleState,
    actor: &str,
    id: i64,
) -> Result<ConflictRequeuedView, ConsoleError> {
    let requeued_as = conflicts::requeue_conflict(state.store(), actor, id, state.publishers()).await?;
    Ok(ConflictRequeuedView { conflict_id: id, requeued_as })
}

/// Dismisses conflict `id` as `actor` with `reason`.
///
/// Errors: 400 without a reason, 404 for an unknown conflict, 409 when it was settled already.
pub async fn dismiss_conflict(state: &ConsoleState, actor: &str, id: i64, reason: &str) -> Result<(), ConsoleError> {
    Ok(conflicts::dismiss_conflict(state.store(), actor, id, reason).await?)
}

impl From<ActionOutcome> for ActionResultView {
    fn from(o: ActionOutcome) -> Self {
        ActionResultView {
            record_id: o.record_id,
            consumer_group: o.consumer_group,
            message_id: o.message_id,
            from: o.from.as_str().to_owned(),
            status: o.status.as_str().to_owned(),
            republished: o.republished,
            audit_id: o.audit_id,
        }
    }
}
