//! The tasks page.

use leptos::prelude::*;

#[component]
pub fn TaskList() -> impl IntoView {
    view! { <p class="empty">"This page is being built."</p> }
}
