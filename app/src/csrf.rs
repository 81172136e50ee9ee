//! CSRF protection of server functions, browser side: [`CsrfClient`] sends every server-function
//! call with the session's token in the [`CSRF_HEADER`] header, read from the
//! `<meta name="csrf-token">` the server renders into the page (see [`crate::shell`]). The
//! server refuses state-changing requests made with the session cookie whose token is missing
//! or wrong.
//!
//! Use it on every server function: `#[server(prefix = "/api/fn", client = crate::csrf::CsrfClient)]`.

use std::future::Future;

use futures::{Sink, Stream};
use leptos::server_fn::Bytes;
use leptos::server_fn::client::Client;
use leptos::server_fn::client::browser::BrowserClient;
use leptos::server_fn::error::FromServerFnError;
use leptos::server_fn::request::browser::BrowserRequest;
use leptos::server_fn::response::browser::BrowserResponse;

/// The request header carrying the CSRF token.
pub const CSRF_HEADER: &str = "x-csrf-token";
/// The form field carrying the CSRF token in plain HTML form posts (the sign-out button).
pub const CSRF_FIELD: &str = "csrf_token";
/// The `name` of the `<meta>` element holding the token.
pub const CSRF_META: &str = "csrf-token";

/// The browser's `fetch` client plus the CSRF token header.
pub struct CsrfClient;

/// The token in the page's `<meta name="csrf-token">`, if any (signed out: none).
#[cfg(feature = "hydrate")]
fn page_token() -> Option<String> {
    leptos::prelude::document()
        .query_selector(&format!("meta[name=\"{CSRF_META}\"]"))
        .ok()
        .flatten()
        .and_then(|meta| meta.get_attribute("content"))
        .filter(|t| !t.is_empty())
}

impl<E, IS, OS> Client<E, IS, OS> for CsrfClient
where
    E: FromServerFnError,
    IS: FromServerFnError,
    OS: FromServerFnError,
{
    type Request = BrowserRequest;
    type Response = BrowserResponse;

    fn send(req: Self::Request) -> impl Future<Output = Result<Self::Response, E>> + Send {
        #[cfg(feature = "hydrate")]
        if let Some(token) = page_token() {
            req.headers().set(CSRF_HEADER, &token);
        }
        <BrowserClient as Client<E, IS, OS>>::send(req)
    }

    #[allow(clippy::type_complexity)]
    fn open_websocket(
        path: &str,
    ) -> impl Future<
        Output = Result<
            (impl Stream<Item = Result<Bytes, Bytes>> + Send + 'static, impl Sink<Bytes> + Send + 'static),
            E,
        >,
    > + Send {
        <BrowserClient as Client<E, IS, OS>>::open_websocket(path)
    }

    fn spawn(future: impl Future<Output = ()> + Send + 'static) {
        <BrowserClient as Client<E, IS, OS>>::spawn(future)
    }
}
