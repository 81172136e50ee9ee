//! HTTP handlers (feature `http`): a leased handler that calls a team's service, in any
//! language, for each claimed message — the product as an idempotent delivery gateway
//! (docs/DESIGN.md, "HTTP handlers").
//!
//! The claim commits with a lease longer than the call's timeout; then the call, with the
//! message id as its `Idempotency-Key`; then the completion, fenced by the lease token. The
//! answer decides the outcome ([`answer`]); retries, back-off and dead letters are the
//! engine's own. One pooled keep-alive client per handler, TLS by rustls; at most
//! `concurrency` calls in flight, optionally `rate_per_sec` started per second. A run of
//! transport failures or 5xx answers trips its circuit breaker, and a `410 Gone` pauses it:
//! its deliveries then wait in the broker (docs/DESIGN.md, "Pause and circuit breaker").
//!
//! ```no_run
//! # fn group(g: dedup_engine::Group) -> Result<dedup_engine::Group, dedup_engine::http::HttpSettingsError> {
//! use dedup_engine::http::{HttpHandler, HttpSettings, SecretSetting};
//! let mut charge = HttpSettings::new("http://127.0.0.1:8080/charge");
//! charge.timeout_ms = 5_000;
//! charge.headers.insert("Authorization".into(), SecretSetting::Env { env: "BILLING_TOKEN".into() });
//! Ok(g.http("ORDER.PAID", HttpHandler::new(&charge)?))
//! # }
//! ```

pub mod answer;
pub mod request;
mod settings;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use reqwest::{Client, Method, Url};
use tokio::sync::Semaphore;

pub use settings::{HttpSettings, HttpSettingsError, SecretSetting};

use crate::handler::{EffectAnswer, HandlerError, HandlerInput, LeaseGuard, LeasedHandler};
use crate::pause::{Breaker, BreakerSettings, Failure, Signal};
use crate::record::LeaseExpiryPolicy;

/// A leased handler calling a team's service over HTTP. Build it with [`HttpHandler::new`];
/// register it with [`crate::group::Group::http`].
pub struct HttpHandler {
    client: Client,
    method: Method,
    url: Url,
    timeout: Duration,
    /// The team's extra headers, marked sensitive.
    extra: HeaderMap,
    /// Broker headers passed on.
    forward: Vec<HeaderName>,
    signing_key: Option<SigningKey>,
    permits: Semaphore,
    /// The most calls in flight (`concurrency`).
    concurrency: usize,
    pace: Option<Pace>,
    limits: answer::Limits,
    on_lease_expiry: LeaseExpiryPolicy,
    breaker: Arc<Breaker>,
}

/// A Standard Webhooks key; never printed.
struct SigningKey(Vec<u8>);

impl std::fmt::Debug for HttpHandler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpHandler")
            .field("method", &self.method.as_str())
            .field("url", &self.url.as_str())
            .field("timeout", &self.timeout)
            .field("headers", &self.extra.keys().map(HeaderName::as_str).collect::<Vec<_>>())
            .field("forward_headers", &self.forward)
            .field("signed", &self.signing_key.is_some())
            .field("concurrency", &self.concurrency)
            .finish_non_exhaustive()
    }
}

/// Evenly spaced call starts: `every` apart at the most.
struct Pace {
    every: Duration,
    next: Mutex<Instant>,
}

impl Pace {
    async fn wait(&self) {
        let at = {
            let mut next = self.next.lock().unwrap_or_else(|e| e.into_inner());
            let at = (*next).max(Instant::now());
            *next = at + self.every;
            at
        };
        tokio::time::sleep_until(at.into()).await;
    }
}

fn refuse(text: impl Into<String>) -> HttpSettingsError {
    HttpSettingsError(text.into())
}

impl HttpHandler {
    /// Checks `settings`, reads the environment variables they name, and builds the client.
    ///
    /// Errors: the key that is wrong and why — a URL that is not `http(s)://` or carries
    /// credentials, another method than POST, PUT or PATCH, a zero timeout or concurrency, a
    /// rate that is not positive, a header name that is invalid or the gateway's own, a header
    /// value that is not one, an environment variable that is not set, a signing secret that
    /// is not `whsec_` + base64. Never a secret's value.
    pub fn new(settings: &HttpSettings) -> Result<Self, HttpSettingsError> {
        let url = Url::parse(&settings.url).map_err(|e| refuse(format!("url {:?}: {e}", settings.url)))?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err(refuse(format!("url {:?}: only http:// and https:// are called", settings.url)));
        }
        if !url.username().is_empty() || url.password().is_some() {
            return Err(refuse(
                "url: put credentials in `headers` (e.g. Authorization), not in the URL, which is printed",
            ));
        }
        let method = match settings.method.to_ascii_uppercase().as_str() {
            "POST" => Method::POST,
            "PUT" => Method::PUT,
            "PATCH" => Method::PATCH,
            other => return Err(refuse(format!("method {other:?}: POST, PUT or PATCH"))),
        };
        if settings.timeout_ms == 0 {
            return Err(refuse("timeout_ms must be at least 1"));
        }
        if settings.concurrency == 0 {
            return Err(refuse("concurrency must be at least 1"));
        }
        let pace = match settings.rate_per_sec {
            None => None,
            Some(rate) if rate.is_finite() && rate > 0.0 => {
                Some(Pace { every: Duration::from_secs_f64(1.0 / rate), next: Mutex::new(Instant::now()) })
            }
            Some(rate) => return Err(refuse(format!("rate_per_sec {rate}: a positive number of calls per second"))),
        };
        if settings.probe_interval_ms < 100 {
            return Err(refuse("probe_interval_ms must be at least 100"));
        }
        if settings.retry_after_min_ms > settings.retry_after_max_ms {
            return Err(refuse("retry_after_min_ms is above retry_after_max_ms"));
        }
        let header_name = |name: &str, key: &str| {
            let parsed = HeaderName::from_bytes(name.as_bytes())
                .map_err(|_| refuse(format!("{key}: {name:?} is not a header name")))?;
            if request::reserved(&parsed) {
                return Err(refuse(format!("{key}: {name:?} is set by the gateway itself")));
            }
            Ok(parsed)
        };
        let mut extra = HeaderMap::new();
        for (name, value) in &settings.headers {
            let parsed = header_name(name, "headers")?;
            let secret = value.resolve().map_err(|e| refuse(format!("headers.{name}: {e}")))?;
            let mut value = HeaderValue::from_str(settings::expose(&secret))
                .map_err(|_| refuse(format!("headers.{name}: the value is not a valid header value")))?;
            value.set_sensitive(true);
            extra.insert(parsed, value);
        }
        let mut forward = Vec::new();
        for name in &settings.forward_headers {
            let parsed = header_name(name, "forward_headers")?;
            if extra.contains_key(&parsed) {
                return Err(refuse(format!("forward_headers: {name:?} is also in `headers`")));
            }
            forward.push(parsed);
        }
        let signing_key = match &settings.signing_secret {
            None => None,
            Some(secret) => {
                let secret = secret.resolve().map_err(|e| refuse(format!("signing_secret: {e}")))?;
                Some(SigningKey(request::signing_key(settings::expose(&secret)).map_err(refuse)?))
            }
        };
        let timeout = Duration::from_millis(settings.timeout_ms);
        let client = Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .connect_timeout(timeout)
            .pool_idle_timeout(Duration::from_secs(90))
            .pool_max_idle_per_host(settings.concurrency)
            .tcp_keepalive(Duration::from_secs(60))
            .tcp_nodelay(true)
            .user_agent(concat!("dedup-console/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| refuse(format!("the HTTP client could not be built: {e}")))?;
        Ok(Self {
            client,
            method,
            url,
            timeout,
            extra,
            forward,
            signing_key,
            permits: Semaphore::new(settings.concurrency),
            concurrency: settings.concurrency,
            pace,
            limits: answer::Limits {
                in_progress_within: Duration::from_millis(settings.in_progress_limit_ms),
                retry_after_min: Duration::from_millis(settings.retry_after_min_ms),
                retry_after_max: Duration::from_millis(settings.retry_after_max_ms),
                paused_for: Duration::from_millis(settings.probe_interval_ms),
            },
            on_lease_expiry: settings.on_lease_expiry,
            breaker: Arc::new(Breaker::new(BreakerSettings {
                pause_after: settings.pause_after,
                probe_interval: Duration::from_millis(settings.probe_interval_ms),
            })),
        })
    }

    /// Its circuit breaker, which the registry links to the group's pause states.
    pub(crate) fn breaker(&self) -> &Arc<Breaker> {
        &self.breaker
    }

    /// What a redelivery of a record whose call was cut off may do.
    pub fn on_lease_expiry(&self) -> LeaseExpiryPolicy {
        self.on_lease_expiry
    }

    /// What the console shows of this handler for `message_type`: method and URL, a query
    /// string as `?…` (DESIGN.md, "HTTP handlers": texts never hold one).
    pub(crate) fn endpoint(&self, message_type: &str) -> crate::group::HttpEndpoint {
        let mut url = self.url.clone();
        let query = url.query().is_some();
        url.set_query(None);
        url.set_fragment(None);
        crate::group::HttpEndpoint {
            message_type: message_type.to_owned(),
            method: self.method.as_str().to_owned(),
            url: if query { format!("{url}?…") } else { url.into() },
        }
    }

    /// The request for `input`.
    fn request(&self, input: &HandlerInput<'_>) -> reqwest::Request {
        let mut headers = request::gateway_headers(input, &self.forward);
        for (name, value) in &self.extra {
            headers.insert(name.clone(), value.clone());
        }
        if let Some(SigningKey(key)) = &self.signing_key {
            let id = input.message_id.as_str();
            let timestamp = chrono::Utc::now().timestamp();
            let signature = request::webhook_signature(key, id, timestamp, input.payload);
            // Message ids have no control characters: always a header value.
            if let Ok(id) = HeaderValue::from_bytes(id.as_bytes()) {
                headers.insert(request::WEBHOOK_ID, id);
            }
            headers.insert(request::WEBHOOK_TIMESTAMP, HeaderValue::from(timestamp));
            if let Ok(mut signature) = HeaderValue::from_str(&signature) {
                signature.set_sensitive(true);
                headers.insert(request::WEBHOOK_SIGNATURE, signature);
            }
        }
        let mut request = reqwest::Request::new(self.method.clone(), self.url.clone());
        *request.headers_mut() = headers;
        *request.timeout_mut() = Some(self.timeout);
        *request.body_mut() = Some(input.payload.to_vec().into());
        request
    }

    /// Sends `request` and reads the answer (the body up to [`answer::MAX_BODY_BYTES`]), all
    /// within the timeout.
    async fn send(
        &self,
        request: reqwest::Request,
    ) -> Result<(reqwest::StatusCode, HeaderMap, Vec<u8>, bool), reqwest::Error> {
        let mut response = self.client.execute(request).await?;
        let status = response.status();
        let headers = std::mem::take(response.headers_mut());
        let mut body = Vec::new();
        while let Some(chunk) = response.chunk().await? {
            body.extend_from_slice(&chunk);
            if body.len() > answer::MAX_BODY_BYTES {
                return Ok((status, headers, body, true));
            }
        }
        Ok((status, headers, body, false))
    }
}

/// What a call's `status` (`None`: no answer) and verdict tell the circuit breaker: only a 2xx
/// is healthy, whatever its override says (the service answered); 5xx and no answer count.
fn signal(status: Option<u16>, verdict: &Result<(), HandlerError>) -> Signal<'_> {
    fn failure(error: &HandlerError, status: Option<u16>) -> Failure<'_> {
        Failure { class: error.class(), status, text: error.detail() }
    }
    match (status, verdict) {
        (Some(200..=299), _) => Signal::Healthy,
        (Some(410), Err(error)) => Signal::Gone(failure(error, status)),
        (None | Some(500..=599), Err(error)) => Signal::Unavailable(failure(error, status)),
        _ => Signal::Answered,
    }
}

#[async_trait]
impl LeasedHandler for HttpHandler {
    async fn handle(&self, input: &HandlerInput<'_>, lease: &LeaseGuard) -> Result<(), HandlerError> {
        // Marked started before it waits for a slot: no slot is held while a mark commits.
        lease.effect_due().await?;
        let _permit = tokio::select! {
            permit = self.permits.acquire() => permit.map_err(|_| HandlerError::retryable("HTTP_CLOSED", "the handler is shut down"))?,
            () = lease.lost() => return Err(HandlerError::lease_lost()),
        };
        if let Some(pace) = &self.pace {
            pace.wait().await;
        }
        // Not made when the handler was paused while this call waited (the claim is given back
        // uncounted).
        lease.effect_starts().await?;
        let request = self.request(input);
        let started = Instant::now();
        let sent = self.send(request).await;
        let latency = started.elapsed();
        match sent {
            Ok((status, headers, body, body_cut)) => {
                lease.answered(EffectAnswer {
                    status: Some(status.as_u16()),
                    latency,
                    summary: answer::excerpt(&body),
                });
                let verdict =
                    answer::judge(&answer::Answer { status, headers: &headers, body: &body, body_cut }, &self.limits);
                self.breaker.observe(signal(Some(status.as_u16()), &verdict)).await;
                verdict
            }
            Err(e) => {
                let error = answer::transport(e, self.timeout);
                lease.answered(EffectAnswer { status: None, latency, summary: error.detail().to_owned() });
                let verdict = Err(error);
                self.breaker.observe(signal(None, &verdict)).await;
                verdict
            }
        }
    }

    fn longest_run(&self) -> Option<Duration> {
        Some(self.timeout)
    }

    fn concurrency(&self) -> Option<usize> {
        Some(self.concurrency)
    }
}
