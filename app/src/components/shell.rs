//! The console frame: header, navigation, and the page area.

use leptos::prelude::*;
use leptos_router::components::A;

/// The pages in navigation order: (path, label).
pub const NAV_ITEMS: [(&str, &str); 8] = [
    ("/", "Overview"),
    ("/records", "Records"),
    ("/stuck", "Stuck"),
    ("/retries", "Retries"),
    ("/dead-letters", "Dead letters"),
    ("/requeue", "Requeues"),
    ("/cleanup", "Cleanup"),
    ("/audit", "Audit"),
];

/// Header with the product name, the navigation, and `children` as the page.
///
/// Sets `data-hydrated="true"` on `<body>` once the wasm bundle has taken over, so browser tests
/// (and curious operators) can tell a hydrated page from a server-rendered one.
#[component]
pub fn ConsoleLayout(children: Children) -> impl IntoView {
    Effect::new(move |_| {
        if let Some(body) = document().body() {
            let _ = body.set_attribute("data-hydrated", "true");
        }
    });
    view! {
        <div class="console">
            <header class="topbar">
                <a class="brand" href="/">
                    "dedup console"
                </a>
                <nav aria-label="Console pages">
                    <ul>
                        {NAV_ITEMS
                            .into_iter()
                            .map(|(href, label)| {
                                view! {
                                    <li>
                                        <A href=href exact=true>
                                            {label}
                                        </A>
                                    </li>
                                }
                            })
                            .collect_view()}
                    </ul>
                </nav>
            </header>
            <main class="page">{children()}</main>
        </div>
    }
}
