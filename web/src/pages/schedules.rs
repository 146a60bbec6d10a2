//! Schedules: the list, and one workflow's detail.

use leptos::prelude::*;

#[component]
pub fn ScheduleList() -> impl IntoView {
    view! { <p class="empty">"This page is being built."</p> }
}

#[component]
pub fn SchedulePage() -> impl IntoView {
    view! { <p class="empty">"This page is being built."</p> }
}
