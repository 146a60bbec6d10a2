//! The task page.

use leptos::prelude::*;

#[component]
pub fn TaskPage() -> impl IntoView {
    view! { <p class="empty">"This page is being built."</p> }
}
