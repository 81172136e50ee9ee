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

/// A JSON request body that must be an object, read into `T`. serde reads a struct from a JSON
/// array as well (its fields in order), so with `Json<T>` a body of `[]` passed as an empty
/// filter; here anything but an object is a 400 `bad_request`, as is malformed JSON.
pub struct JsonObject<T>(pub T);

impl<S, T> axum::extract::FromRequest<S> for JsonObject<T>
where
    S: Send + Sync,
    T: serde::de::DeserializeOwned,
{
    type Rejection = ApiError;

    async fn from_request(request: axum::extract::Request, state: &S) -> Result<Self, ApiError> {
        let Json(value) = Json::<serde_json::Value>::from_request(request, state).await.map_err(rejected)?;
        if !value.is_object() {
            return Err(rejected("the request body must be a JSON object"));
        }
        serde_json::from_value(value).map(JsonObject).map_err(rejected)
    }
}
