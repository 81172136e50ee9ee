//! The status badge.

use leptos::prelude::*;

/// A record status as a coloured badge.
#[component]
pub fn StatusBadge(#[prop(into)] status: String) -> impl IntoView {
    view! { <span class=format!("badge badge-{status}")>{status.clone()}</span> }
}
