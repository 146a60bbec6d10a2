//! Workflows: the list, and one workflow's DAG.

use leptos::prelude::*;

#[component]
pub fn WorkflowList() -> impl IntoView {
    view! { <p class="empty">"This page is being built."</p> }
}

#[component]
pub fn WorkflowPage() -> impl IntoView {
    view! { <p class="empty">"This page is being built."</p> }
}
