//! The live feed: an `EventSource` on [`LIVE_EVENTS_PATH`] that replaces a signal's value with
//! each pushed [`LiveView`], opened while not paused and closed when paused or when the page
//! goes away. Browser only; on the server the signal keeps its first value.

use leptos::prelude::*;

use crate::wire::overview::LiveView;

/// The server-sent events endpoint: a `LiveView` as JSON in each `message` event, about every
/// second.
pub const LIVE_EVENTS_PATH: &str = "/api/v1/events";

/// Keeps `live` updated from the event stream while `paused` is false.
pub fn use_live_feed(live: RwSignal<Option<LiveView>>, paused: RwSignal<bool>) {
    #[cfg(feature = "hydrate")]
    browser::subscribe(live, paused);
    #[cfg(not(feature = "hydrate"))]
    let _ = (live, paused);
}

#[cfg(feature = "hydrate")]
mod browser {
    use leptos::prelude::*;
    use send_wrapper::SendWrapper;
    use wasm_bindgen::JsCast;
    use wasm_bindgen::closure::Closure;
    use web_sys::{EventSource, MessageEvent};

    use super::LIVE_EVENTS_PATH;
    use crate::wire::overview::LiveView;

    type Open = SendWrapper<(EventSource, Closure<dyn FnMut(MessageEvent)>)>;

    fn close(source: StoredValue<Option<Open>>) {
        source.try_update_value(|s| {
            if let Some(open) = s.take() {
                open.0.close();
            }
        });
    }

    pub fn subscribe(live: RwSignal<Option<LiveView>>, paused: RwSignal<bool>) {
        let source: StoredValue<Option<Open>> = StoredValue::new(None);
        Effect::new(move |_| {
            if paused.get() {
                close(source);
                return;
            }
            if source.with_value(Option::is_some) {
                return;
            }
            let Ok(events) = EventSource::new(&crate::base::href(LIVE_EVENTS_PATH)) else { return };
            let on_message = Closure::<dyn FnMut(MessageEvent)>::new(move |e: MessageEvent| {
                let view = e.data().as_string().and_then(|text| serde_json::from_str::<LiveView>(&text).ok());
                if let Some(view) = view {
                    live.try_set(Some(view));
                }
            });
            events.set_onmessage(Some(on_message.as_ref().unchecked_ref()));
            source.set_value(Some(SendWrapper::new((events, on_message))));
        });
        on_cleanup(move || close(source));
    }
}
