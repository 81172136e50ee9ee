//! `GET /api/v1/events`: server-sent events carrying the live numbers of the overview.
//!
//! Each `message` event is a `LiveView` as JSON (counts by status, stuck, last-minute traffic,
//! database time), read every [`PERIOD`]. A stream ends after [`STREAM_LIFETIME`] and the
//! browser's `EventSource` reconnects (told to wait [`RECONNECT`]), and at once when the
//! console's shutdown token is cancelled: so a server shutting down does not wait for open
//! console tabs.

use std::convert::Infallible;
use std::time::Duration;

use axum::extract::State;
use axum::response::sse::{Event, KeepAlive, Sse};
use futures::Stream;
use tokio::time::{Instant, MissedTickBehavior};

use crate::ssr::web::state::AppState;

/// Time between two snapshots.
pub const PERIOD: Duration = Duration::from_millis(1000);
/// How long one stream lasts before the client reconnects.
pub const STREAM_LIFETIME: Duration = Duration::from_secs(30);
/// The reconnection delay sent to the browser.
pub const RECONNECT: Duration = Duration::from_millis(500);

/// Live aggregates as server-sent events (`text/event-stream`), one `LiveView` per event.
#[utoipa::path(get, path = "/api/v1/events", tag = "aggregates",
    responses((status = 200, content_type = "text/event-stream",
        description = "A `LiveView` (JSON) per `message` event, about every second")))]
pub async fn events(State(state): State<AppState>) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    let console = state.console.clone();
    let shutdown = state.config.shutdown.clone();
    let ends = Instant::now() + STREAM_LIFETIME;
    let mut ticker = tokio::time::interval(PERIOD);
    ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let stream = futures::stream::unfold(
        (console, ticker, true, shutdown),
        move |(console, mut ticker, first, shutdown)| async move {
            loop {
                tokio::select! {
                    () = shutdown.cancelled() => return None,
                    _ = ticker.tick() => {}
                }
                if Instant::now() >= ends {
                    return None;
                }
                // A failed read is logged by the conversion; the next tick tries again.
                let Ok(view) = crate::ssr::service::console::live(&console).await else { continue };
                let Ok(mut event) = Event::default().json_data(&view) else { continue };
                if first {
                    event = event.retry(RECONNECT);
                }
                return Some((Ok(event), (console, ticker, false, shutdown)));
            }
        },
    );
    Sse::new(stream).keep_alive(KeepAlive::default())
}
