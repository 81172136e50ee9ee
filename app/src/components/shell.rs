//! The console frame: header, navigation, and the page area.

use leptos::prelude::*;
use leptos_router::components::A;

use crate::base::href;
use crate::components::session::{UserBox, use_session};
use crate::wire::account::RoleView;

/// The pages in navigation order: (path, label).
pub const NAV_ITEMS: [(&str, &str); 9] = [
    ("/", "Overview"),
    ("/records", "Records"),
    ("/stuck", "Stuck"),
    ("/retries", "Retries"),
    ("/dead-letters", "Dead letters"),
    ("/requeue", "Requeues"),
    ("/handlers", "Handlers"),
    ("/cleanup", "Cleanup"),
    ("/audit", "Audit"),
];

/// Pages shown in the navigation only to a role: (path, label, role).
pub const ROLE_NAV_ITEMS: [(&str, &str, RoleView); 1] = [("/users", "Users", RoleView::Admin)];

/// Header with the product name, the navigation (for signed-in users; admin pages for admins),
/// the user box, and `children` as the page.
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
    let session = use_session();
    view! {
        <div class="console">
            <header class="topbar">
                <a class="brand" href=href("/")>
                    "dedup console"
                </a>
                <Transition fallback=|| ()>
                    {move || Suspend::new(async move {
                        let role = session.await.ok().and_then(|s| s.user).map(|u| u.role);
                        role.map(|role| view! { <Nav role /> })
                    })}
                </Transition>
                <UserBox />
            </header>
            <main class="page">{children()}</main>
        </div>
    }
}

#[component]
fn Nav(role: RoleView) -> impl IntoView {
    let items = NAV_ITEMS
        .into_iter()
        .chain(ROLE_NAV_ITEMS.into_iter().filter(|(_, _, needs)| role >= *needs).map(|(h, l, _)| (h, l)));
    view! {
        <nav aria-label="Console pages">
            <ul>
                {items
                    .map(|(path, label)| {
                        view! {
                            <li>
                                <A href=href(path) exact=true>
                                    {label}
                                </A>
                            </li>
                        }
                    })
                    .collect_view()}
            </ul>
        </nav>
    }
}
