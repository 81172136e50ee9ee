//! The team's service for the HTTP handler tests: a real HTTP server on 127.0.0.1:0 that answers
//! as scripted and records every call.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use tokio::sync::Notify;

/// One answer of the service.
#[derive(Clone)]
pub struct Reply {
    pub status: u16,
    pub headers: Vec<(&'static str, String)>,
    pub body: String,
    /// Held this long before answering.
    pub delay: Duration,
    /// Held until [`Service::release`] is notified.
    pub gated: bool,
}

impl Reply {
    pub fn status(status: u16) -> Self {
        Self { status, headers: Vec::new(), body: String::new(), delay: Duration::ZERO, gated: false }
    }
    pub fn header(mut self, name: &'static str, value: impl Into<String>) -> Self {
        self.headers.push((name, value.into()));
        self
    }
    pub fn body(mut self, body: impl Into<String>) -> Self {
        self.body = body.into();
        self
    }
    pub fn delay(mut self, delay: Duration) -> Self {
        self.delay = delay;
        self
    }
    pub fn gated(mut self) -> Self {
        self.gated = true;
        self
    }
}

/// A call the service received.
#[derive(Clone)]
pub struct Call {
    pub headers: HeaderMap,
    pub body: Vec<u8>,
    pub at: Instant,
}

#[derive(Default)]
pub struct Inner {
    /// Answers in order; the last one repeats.
    pub replies: Mutex<VecDeque<Reply>>,
    pub calls: Mutex<Vec<Call>>,
    pub in_flight: AtomicUsize,
    pub most_in_flight: AtomicUsize,
    /// Notified when a gated call arrives.
    pub arrived: Notify,
    /// A gated call answers when notified.
    pub release: Notify,
}

/// The team's service: answers as scripted, records every call.
#[derive(Clone)]
pub struct Service {
    pub addr: SocketAddr,
    pub inner: Arc<Inner>,
}

impl Service {
    pub async fn start(replies: impl IntoIterator<Item = Reply>) -> Self {
        let inner = Arc::new(Inner { replies: Mutex::new(replies.into_iter().collect()), ..Inner::default() });
        let app = axum::Router::new().route("/hook", axum::routing::any(answer)).with_state(inner.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        Self { addr, inner }
    }

    pub fn url(&self) -> String {
        format!("http://{}/hook", self.addr)
    }

    pub fn calls(&self) -> Vec<Call> {
        self.inner.calls.lock().unwrap().clone()
    }
}

async fn answer(State(inner): State<Arc<Inner>>, headers: HeaderMap, body: Bytes) -> Response {
    inner.calls.lock().unwrap().push(Call { headers, body: body.to_vec(), at: Instant::now() });
    let now = inner.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
    inner.most_in_flight.fetch_max(now, Ordering::SeqCst);
    let reply = {
        let mut replies = inner.replies.lock().unwrap();
        if replies.len() > 1 { replies.pop_front().unwrap() } else { replies.front().cloned().unwrap() }
    };
    if reply.gated {
        inner.arrived.notify_one();
        inner.release.notified().await;
    }
    tokio::time::sleep(reply.delay).await;
    inner.in_flight.fetch_sub(1, Ordering::SeqCst);
    let mut response = (StatusCode::from_u16(reply.status).unwrap(), reply.body).into_response();
    for (name, value) in reply.headers {
        response.headers_mut().insert(name, value.parse().unwrap());
    }
    response
}
