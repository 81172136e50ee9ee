//! Security headers on every response.
//!
//! - `Content-Security-Policy`: scripts only from this site or with this response's nonce
//!   (Leptos's hydration scripts carry it), `'wasm-unsafe-eval'` for the wasm bundle, no inline
//!   script; styles from this site (inline `style` attributes allowed: the bar charts use them);
//!   `frame-ancestors 'none'`, `form-action 'self'`, `base-uri 'none'`, `object-src 'none'`.
//! - `X-Frame-Options: DENY`, `Referrer-Policy: same-origin` (not `no-referrer`: that makes
//!   browsers send `Origin: null` on same-origin posts, which the CSRF check refuses),
//!   `X-Content-Type-Options: nosniff` (tower-http `SetResponseHeader`).
//!
//! The nonce is made per request by [`csp`], put in the request's extensions as [`CspNonce`]
//! for the Leptos renderer, and written into the response's policy.

use axum::extract::Request;
use axum::http::{HeaderName, HeaderValue, header};
use axum::middleware::Next;
use axum::response::Response;
use tower_http::set_header::SetResponseHeaderLayer;

/// This request's CSP nonce.
#[derive(Debug, Clone)]
pub struct CspNonce(pub String);

/// The policy for `nonce`.
pub fn policy(nonce: &str) -> String {
    format!(
        "default-src 'self'; script-src 'self' 'nonce-{nonce}' 'wasm-unsafe-eval'; style-src 'self'; \
         style-src-attr 'unsafe-inline'; img-src 'self' data:; connect-src 'self'; object-src 'none'; \
         base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
    )
}

/// Middleware: a fresh nonce per request, and the CSP carrying it on the response.
pub async fn csp(mut req: Request, next: Next) -> Response {
    let nonce = leptos::nonce::Nonce::new().to_string();
    req.extensions_mut().insert(CspNonce(nonce.clone()));
    let mut response = next.run(req).await;
    if let Ok(value) = HeaderValue::from_str(&policy(&nonce)) {
        response.headers_mut().insert(header::CONTENT_SECURITY_POLICY, value);
    }
    response
}

/// The fixed headers, as tower-http layers.
pub fn fixed() -> [SetResponseHeaderLayer<HeaderValue>; 3] {
    let set = |name: HeaderName, value: &'static str| {
        SetResponseHeaderLayer::overriding(name, HeaderValue::from_static(value))
    };
    [
        set(header::X_FRAME_OPTIONS, "DENY"),
        set(header::REFERRER_POLICY, "same-origin"),
        set(header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
    ]
}
