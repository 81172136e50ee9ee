//! A counter that the browser bumps every `every` while `active`: key a `Resource` on it to poll
//! progress (bulk requeue jobs, cleanup runs, drills). On the server it never moves.

use std::time::Duration;

use leptos::prelude::*;

/// A signal incremented every `every` while `active` is true (browser only).
pub fn use_ticker(every: Duration, active: Signal<bool>) -> ReadSignal<u64> {
    let (tick, set_tick) = signal(0u64);
    #[cfg(feature = "hydrate")]
    {
        let handle: StoredValue<Option<leptos::prelude::IntervalHandle>> = StoredValue::new(None);
        Effect::new(move |_| {
            let on = active.get();
            handle.update_value(|h| {
                if let Some(old) = h.take() {
                    old.clear();
                }
                if on {
                    *h = set_interval_with_handle(move || set_tick.update(|n| *n += 1), every).ok();
                }
            });
        });
        on_cleanup(move || {
            handle.try_update_value(|h| {
                if let Some(old) = h.take() {
                    old.clear();
                }
            });
        });
    }
    #[cfg(not(feature = "hydrate"))]
    let _ = (every, active, set_tick);
    tick
}
