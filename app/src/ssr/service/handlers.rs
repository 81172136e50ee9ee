//! Handlers' pause states (the Handlers page, `/api/v1/handlers`) and pausing and resuming them.

use dedup_engine::console::actions::handlers::{self, HandlerControl, HandlerPause};

use super::convert::{opt_time, time};
use super::state::ConsoleState;
use crate::error::ConsoleError;
use crate::wire::handlers::{HandlerControlKind, HandlerControlRequest, HandlerView};

fn view(p: HandlerPause) -> HandlerView {
    HandlerView {
        consumer_group: p.consumer_group,
        message_type: p.message_type,
        kind: p.kind,
        state: p.state,
        since: time(p.since),
        changed_by: p.changed_by,
        reason: p.reason,
        error_class: p.error_class,
        http_status: p.http_status,
        failed_at: opt_time(p.failed_at),
        probe_at: opt_time(p.probe_at),
        version: p.version,
    }
}

/// Every handler with its pause state, by group and type.
///
/// Errors: 500 when the database fails.
pub async fn handler_list(state: &ConsoleState) -> Result<Vec<HandlerView>, ConsoleError> {
    Ok(state.store().handler_pauses().await.map_err(ConsoleError::internal)?.into_iter().map(view).collect())
}

/// Pauses or resumes the handler of `message_type` in `group` as `actor`.
///
/// Errors: 400 without a reason, 404 for an unknown handler, 409 when its state refuses it or
/// changed since `expected_version`.
pub async fn handler_control(
    state: &ConsoleState,
    actor: &str,
    group: &str,
    message_type: &str,
    kind: HandlerControlKind,
    request: &HandlerControlRequest,
) -> Result<HandlerView, ConsoleError> {
    let control = match kind {
        HandlerControlKind::Pause => HandlerControl::Pause,
        HandlerControlKind::Resume => HandlerControl::Resume,
    };
    let row = handlers::handler_control(
        state.store(),
        actor,
        group,
        message_type,
        control,
        request.reason.as_deref(),
        request.expected_version,
    )
    .await?;
    Ok(view(row))
}
