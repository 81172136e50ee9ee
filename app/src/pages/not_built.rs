//! Stand-in for pages whose issue has not landed yet.

use leptos::prelude::*;

/// A page heading with a note that the page is not built yet.
#[component]
pub fn NotBuilt(title: &'static str) -> impl IntoView {
    view! {
        <h1>{title}</h1>
        <p class="empty">"This page is not built yet."</p>
    }
}
