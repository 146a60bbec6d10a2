//! The overview page.

use leptos::prelude::*;

#[component]
pub fn Overview() -> impl IntoView {
    view! { <p class="empty">"This page is being built."</p> }
}
