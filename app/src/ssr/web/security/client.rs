//! Who the client is, by its connection.

use std::net::SocketAddr;

use axum::extract::ConnectInfo;
use axum::http::Extensions;

/// The client's IP address (from the connection; the server does not trust forwarded headers).
pub fn client_address(extensions: &Extensions) -> Option<String> {
    extensions.get::<ConnectInfo<SocketAddr>>().map(|ConnectInfo(addr)| addr.ip().to_string())
}

/// Whether the connection comes from a loopback address. Unknown (the host serves without
/// `into_make_service_with_connect_info`): no.
pub fn peer_is_loopback(extensions: &Extensions) -> bool {
    extensions.get::<ConnectInfo<SocketAddr>>().is_some_and(|ConnectInfo(addr)| addr.ip().is_loopback())
}
