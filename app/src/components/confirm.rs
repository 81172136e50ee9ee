//! The foot of a confirmation dialog: the reason field, then the confirm and close buttons.

use leptos::prelude::*;

/// The reason field (labelled `reason_label`) and the buttons: `submit_label` (disabled while
/// `blocked`) runs `on_submit`, Close runs `on_close`.
#[component]
pub fn ReasonAndButtons(
    #[prop(into)] reason_label: String,
    reason: RwSignal<String>,
    #[prop(into)] submit_label: String,
    #[prop(into)] blocked: Signal<bool>,
    #[prop(into)] on_submit: Callback<()>,
    #[prop(into)] on_close: Callback<()>,
) -> impl IntoView {
    view! {
        <label class="reason">
            {reason_label}
            <textarea
                data-testid="confirm-reason"
                prop:value=move || reason.get()
                on:input=move |ev| reason.set(event_target_value(&ev))
            ></textarea>
        </label>
        <p class="dialog-buttons">
            <button class="primary" data-testid="confirm-submit" disabled=blocked on:click=move |_| on_submit.run(())>
                {submit_label}
            </button>
            <button data-testid="confirm-cancel" on:click=move |_| on_close.run(())>
                "Close"
            </button>
        </p>
    }
}
