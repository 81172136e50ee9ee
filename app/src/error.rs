//! The one error type of the console's server functions.

use leptos::server_fn::codec::JsonEncoding;
use leptos::server_fn::error::{FromServerFnError, ServerFnErrorErr};
use serde::{Deserialize, Serialize};

/// What a server function returns on failure. Safe to show: internal details (database texts,
/// URLs) are logged on the server and never put in here.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, thiserror::Error)]
pub enum ConsoleError {
    /// The request was malformed or failed validation; the text says what to change.
    #[error("{0}")]
    BadRequest(String),
    /// The thing asked for does not exist (a record id no record has).
    #[error("{0}")]
    NotFound(String),
    /// Not signed in (or the session expired): sign in again.
    #[error("{0}")]
    Unauthorized(String),
    /// Signed in, but the role does not allow this (or the CSRF check failed).
    #[error("{0}")]
    Forbidden(String),
    /// The record's state does not allow the action (wrong status, stale lease token, live
    /// lease, nothing to republish); nothing changed. The text says what to do.
    #[error("{0}")]
    Conflict(String),
    /// A dependency failed the request (the broker, or the database did not answer within the
    /// console's bound); nothing changed. Try again later.
    #[error("{0}")]
    Unavailable(String),
    /// Something failed on the server; details are in the server log under this request.
    #[error("internal error; see the server log")]
    Internal,
    /// Transport or encoding failure reported by the server-function machinery.
    #[error("request failed: {0}")]
    ServerFn(ServerFnErrorErr),
}

impl FromServerFnError for ConsoleError {
    type Encoder = JsonEncoding;

    fn from_server_fn_error(value: ServerFnErrorErr) -> Self {
        ConsoleError::ServerFn(value)
    }

    /// The JSON of the error, as the default does; on the server it also sets the response's
    /// status to [`ConsoleError::http_status`] (through leptos_axum's `ResponseOptions`, which
    /// it applies to server-function responses), so a refused action answers 409, not 500.
    /// The client decodes any 4xx/5xx body as the error.
    fn ser(&self) -> leptos::server_fn::Bytes {
        #[cfg(feature = "ssr")]
        if let Some(options) = leptos::prelude::use_context::<leptos_axum::ResponseOptions>() {
            options.set_status(self.http_status().0);
        }
        use leptos::server_fn::Encodes;
        <JsonEncoding as Encodes<Self>>::encode(self).unwrap_or_else(|e| {
            let fallback = ConsoleError::ServerFn(ServerFnErrorErr::Serialization(e.to_string()));
            <JsonEncoding as Encodes<Self>>::encode(&fallback).unwrap_or_default()
        })
    }
}

#[cfg(feature = "ssr")]
impl ConsoleError {
    /// The HTTP status and the REST API's error code (`bad_request`, `not_found`,
    /// `unauthorized`, `forbidden`, `conflict`, `unavailable`, `internal`) of this error; the
    /// REST API and the server functions answer with the same status.
    pub fn http_status(&self) -> (leptos::server_fn::http_export::StatusCode, &'static str) {
        use leptos::server_fn::http_export::StatusCode;
        match self {
            ConsoleError::BadRequest(_) => (StatusCode::BAD_REQUEST, "bad_request"),
            ConsoleError::NotFound(_) => (StatusCode::NOT_FOUND, "not_found"),
            ConsoleError::Unauthorized(_) => (StatusCode::UNAUTHORIZED, "unauthorized"),
            ConsoleError::Forbidden(_) => (StatusCode::FORBIDDEN, "forbidden"),
            ConsoleError::Conflict(_) => (StatusCode::CONFLICT, "conflict"),
            ConsoleError::Unavailable(_) => (StatusCode::SERVICE_UNAVAILABLE, "unavailable"),
            // The request could not be decoded into the function's arguments: the caller's fault.
            ConsoleError::ServerFn(
                ServerFnErrorErr::Args(_) | ServerFnErrorErr::MissingArg(_) | ServerFnErrorErr::Deserialization(_),
            ) => (StatusCode::BAD_REQUEST, "bad_request"),
            ConsoleError::ServerFn(ServerFnErrorErr::Registration(_)) => (StatusCode::NOT_FOUND, "not_found"),
            ConsoleError::Internal | ConsoleError::ServerFn(_) => (StatusCode::INTERNAL_SERVER_ERROR, "internal"),
        }
    }

    /// Logs `error` on the server (with its cause chain, `{:#}`) and returns the opaque
    /// [`ConsoleError::Internal`].
    pub fn internal(error: impl std::fmt::Display) -> Self {
        tracing::error!(error = %format_args!("{error:#}"), "server function failed");
        ConsoleError::Internal
    }

    /// A failed database call: [`ConsoleError::Unavailable`] when a wait hit the console's bound
    /// (PostgreSQL cancelled the statement at the console's `statement_timeout`, SQLSTATE 57014
    /// `query_canceled`, or no connection of its pool came in time), logged as a warning; else
    /// [`ConsoleError::internal`]. A cancelled statement changed nothing: its transaction rolls
    /// back.
    fn database<E: std::error::Error + 'static>(error: E) -> Self {
        if !database_timed_out(&error) {
            return ConsoleError::internal(error);
        }
        tracing::warn!(error = %format_args!("{error:#}"), "the database did not answer within the console's bound");
        ConsoleError::Unavailable(DATABASE_TIMED_OUT.to_owned())
    }
}

/// What a request is told when the database did not answer within the console's bound.
#[cfg(feature = "ssr")]
pub(crate) const DATABASE_TIMED_OUT: &str =
    "the database did not answer in time (a long lock or an overload); nothing was changed, try again";

/// Whether `error` (or a cause of it) is a database wait cut by the console's bounds:
/// the database cancelled the statement at its statement timeout
/// ([`dedup_engine::console::DbErrorKind::StatementTimeout`]), or no connection of the pool came
/// in time.
#[cfg(feature = "ssr")]
pub(crate) fn database_timed_out(error: &(dyn std::error::Error + 'static)) -> bool {
    use dedup_engine::console::DbErrorKind;
    std::iter::successors(Some(error), |e| e.source())
        .filter_map(|e| e.downcast_ref::<sqlx::Error>())
        .any(|e| matches!(DbErrorKind::of(e), DbErrorKind::PoolTimedOut | DbErrorKind::StatementTimeout))
}

#[cfg(feature = "ssr")]
impl From<dedup_engine::console::QueryError> for ConsoleError {
    /// A bad filter keeps its message (it is about the request); a database error is
    /// [`ConsoleError::Unavailable`] when it hit the console's bound, else logged and the opaque
    /// [`ConsoleError::Internal`].
    fn from(error: dedup_engine::console::QueryError) -> Self {
        match error {
            dedup_engine::console::QueryError::BadFilter(message) => ConsoleError::BadRequest(message),
            other => ConsoleError::database(other),
        }
    }
}

#[cfg(feature = "ssr")]
impl From<dedup_engine::console::accounts::AccountError> for ConsoleError {
    /// Invalid input, a taken name, a missing user and the last-admin guard keep their message;
    /// a database error is [`ConsoleError::Unavailable`] when it hit the console's bound, else
    /// logged and the opaque [`ConsoleError::Internal`].
    fn from(error: dedup_engine::console::accounts::AccountError) -> Self {
        use dedup_engine::console::accounts::AccountError as E;
        match error {
            E::Invalid(_) | E::NameTaken(_) | E::LastAdmin => ConsoleError::BadRequest(error.to_string()),
            E::NotFound(_) => ConsoleError::NotFound(error.to_string()),
            E::Unexpected(_) => ConsoleError::database(error),
        }
    }
}

#[cfg(feature = "ssr")]
impl From<dedup_engine::console::actions::ActionError> for ConsoleError {
    /// Refusals keep their message (it is about the record and safe to show); a database wait
    /// that hit the console's bound is [`ConsoleError::Unavailable`]; other internal errors are
    /// logged and become the opaque [`ConsoleError::Internal`].
    fn from(error: dedup_engine::console::actions::ActionError) -> Self {
        use dedup_engine::console::actions::ErrorKind;
        match error.kind() {
            ErrorKind::Invalid => ConsoleError::BadRequest(error.to_string()),
            ErrorKind::NotFound => ConsoleError::NotFound(error.to_string()),
            ErrorKind::Conflict => ConsoleError::Conflict(error.to_string()),
            ErrorKind::Unavailable => ConsoleError::Unavailable(error.to_string()),
            ErrorKind::Internal => ConsoleError::database(error),
        }
    }
}
