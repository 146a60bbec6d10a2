//! The submit page.

use leptos::prelude::*;

#[component]
pub fn Submit() -> impl IntoView {
    view! { <p class="empty">"This page is being built."</p> }
}
