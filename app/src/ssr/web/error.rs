//! Errors of the web layer's JSON endpoints: one body for all (`{ "error": code, "message":
//! text }`), a [`ConsoleError`] as a response. Below the REST API and sign-in alike.

use axum::Json;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};

use crate::error::ConsoleError;

/// The body of every API error.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ErrorBody {
    /// `bad_request`, `unauthorized`, `forbidden`, `not_found`, `conflict`, `too_many_requests`,
    /// `payload_too_large`, `unavailable` or `internal`.
    pub error: String,
    /// What went wrong, for a person.
    pub message: String,
}

/// A [`ConsoleError`] as an HTTP response.
pub struct ApiError(ConsoleError);

impl From<ConsoleError> for ApiError {
    fn from(e: ConsoleError) -> Self {
        ApiError(e)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let (status, code) = self.0.http_status();
        (status, Json(ErrorBody { error: code.to_owned(), message: self.0.to_string() })).into_response()
    }
}

/// A malformed query string, path or body is a bad request too.
pub(crate) fn rejected(e: impl std::fmt::Display) -> ApiError {
    ApiError(ConsoleError::BadRequest(e.to_string()))
}

pub(crate) type ApiResult<T> = Result<Json<T>, ApiError>;
