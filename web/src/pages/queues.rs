//! The queues page.

use leptos::prelude::*;

#[component]
pub fn Queues() -> impl IntoView {
    view! { <p class="empty">"This page is being built."</p> }
}
