//! The workers page.

use leptos::prelude::*;

#[component]
pub fn Workers() -> impl IntoView {
    view! { <p class="empty">"This page is being built."</p> }
}
