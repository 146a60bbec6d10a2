//! The graph of a workflow's tasks: the boxes and curves of a [`Layout`] as a scrollable
//! SVG with zoom buttons. Each box follows its task's state (class `state-…`, `data-state`)
//! and opens the task when clicked or on Enter. A branch's box carries a "branch" tag and,
//! once it has succeeded, the children it chose after its state; the edges to the children it
//! did not choose are faint (`edge-unchosen`).

use std::sync::Arc;

use leptos::html;
use leptos::prelude::*;
use leptos_router::hooks::use_navigate;
use sked_types::TaskState;

use super::layout::{Layout, NODE_H, NODE_W};
use super::{Node, Nodes};

/// Characters of a task's name that fit in its box.
const NAME_CHARS: usize = 22;
/// Characters of a branch's name that fit beside its "branch" tag.
const BRANCH_NAME_CHARS: usize = 16;
/// Characters of a caption that fit in a box.
const CAPTION_CHARS: usize = 26;
/// The smallest and largest zoom of the graph.
const MIN_ZOOM: f64 = 0.2;
const MAX_ZOOM: f64 = 2.5;
/// In "fit" mode the graph shrinks to the page's width, but not below this scale (narrower
/// screens scroll).
const FIT_MIN_ZOOM: f64 = 0.55;

/// The graph: a scrollable SVG with zoom buttons.
#[component]
pub(super) fn Graph(layout: Arc<Layout>, nodes: RwSignal<Nodes>) -> impl IntoView {
    let navigate = use_navigate();
    // `None`: fit the page's width (within [FIT_MIN_ZOOM, 1]); else a fixed scale.
    let zoom = RwSignal::new(None::<f64>);
    let wrap = NodeRef::<html::Div>::new();
    let (w, h) = (layout.width, layout.height);
    let current = move || {
        zoom.get_untracked().unwrap_or_else(|| {
            let room = wrap
                .get_untracked()
                .map(|el| f64::from(el.client_width()))
                .unwrap_or(w);
            (room / w).clamp(FIT_MIN_ZOOM, 1.0)
        })
    };
    let set_zoom = move |factor: f64| {
        let z = (current() * factor).clamp(MIN_ZOOM, MAX_ZOOM);
        zoom.set(Some(z));
    };
    let svg_width = move || match zoom.get() {
        None => "100%".to_owned(),
        Some(z) => format!("{:.0}", w * z),
    };
    let svg_style = move || match zoom.get() {
        None => format!(
            "max-width:{w:.0}px;min-width:{:.0}px;aspect-ratio:{w:.0}/{h:.0};height:auto",
            w * FIT_MIN_ZOOM
        ),
        Some(z) => format!("width:{:.0}px;height:{:.0}px", w * z, h * z),
    };
    let zoom_label = move || match zoom.get() {
        None => String::new(),
        Some(z) => format!("{:.0} %", z * 100.0),
    };

    let edges = layout
        .edges
        .iter()
        .map(|e| {
            let (parent, child) = (e.parent, e.child);
            let class = move || {
                nodes.with(|ns| {
                    if ns.unchosen(parent, child) {
                        return "edge edge-unchosen";
                    }
                    let p = ns.list.get(parent).map(|n| n.state);
                    let c = ns.list.get(child).map(|n| n.state);
                    match (p, c) {
                        (
                            Some(
                                TaskState::Failed
                                | TaskState::UpstreamFailed
                                | TaskState::Cancelled,
                            ),
                            _,
                        ) => "edge edge-bad",
                        (Some(TaskState::Succeeded), Some(s)) if s != TaskState::Blocked => {
                            "edge edge-done"
                        }
                        _ => "edge",
                    }
                })
            };
            view! { <path class=class d=e.d.clone() marker-end="url(#dag-arrow)"></path> }
        })
        .collect_view();
    let boxes = layout
        .nodes
        .iter()
        .map(|b| {
            let i = b.index;
            let node = move || nodes.with(|ns| ns.list.get(i).cloned());
            let Some(first) = nodes.with_untracked(|ns| ns.list.get(i).cloned()) else {
                return ().into_any();
            };
            let id = first.id;
            let state = move || {
                nodes
                    .with(|ns| ns.list.get(i).map_or(TaskState::Waiting, |n| n.state))
                    .as_str()
            };
            let caption = move || {
                nodes.with(|ns| {
                    ns.list
                        .get(i)
                        .map(|n| shorten(&box_caption(n), CAPTION_CHARS))
                        .unwrap_or_default()
                })
            };
            let title = move || {
                node().map(|n| {
                    let mut t = format!("{} — {}", n.name, n.caption());
                    if let Some(branch) = n.branch_label() {
                        t.push_str(&format!("\n{branch}"));
                    }
                    if let Some(rule) = n.rule_label() {
                        t.push_str(&format!("\nruns when {rule}"));
                    }
                    if let Some(err) = n.error {
                        t.push_str(&format!("\n{err}"));
                    }
                    t
                })
            };
            let branch = first.branch;
            let label = shorten(
                &first.name,
                if branch {
                    BRANCH_NAME_CHARS
                } else {
                    NAME_CHARS
                },
            );
            let open = {
                let navigate = navigate.clone();
                move || navigate(&format!("/tasks/{id}"), Default::default())
            };
            let open_key = open.clone();
            view! {
                <g
                    class=move || {
                        if branch {
                            format!("node branch state-{}", state())
                        } else {
                            format!("node state-{}", state())
                        }
                    }
                    data-task-id=id.to_string()
                    data-state=state
                    transform=format!("translate({:.1},{:.1})", b.x, b.y)
                    tabindex="0"
                    role="link"
                    on:click=move |_| open()
                    on:keydown=move |ev| {
                        if ev.key() == "Enter" {
                            open_key()
                        }
                    }
                >
                    <title>{title}</title>
                    <rect width=NODE_W height=NODE_H rx="7"></rect>
                    <text class="name" x="10" y="17">{label}</text>
                    {branch.then(|| view! {
                        <text class="tag" x=NODE_W - 8.0 y="16" text-anchor="end">"branch"</text>
                    })}
                    <text class="caption" x="10" y="32">{caption}</text>
                </g>
            }
            .into_any()
        })
        .collect_view();

    view! {
        <div class="actions graph-tools">
            <button type="button" data-action="zoom-out" title="Zoom out" on:click=move |_| set_zoom(0.8)>"−"</button>
            <button type="button" data-action="zoom-in" title="Zoom in" on:click=move |_| set_zoom(1.25)>"+"</button>
            <button type="button" data-action="zoom-fit" title="Fit the width" on:click=move |_| zoom.set(None)>"Fit"</button>
            <span class="hint">{zoom_label}</span>
            <span class="hint">"Click a task to open it."</span>
        </div>
        <div class="dag-wrap" node_ref=wrap>
            <svg
                class="dag"
                viewBox=format!("0 0 {w:.0} {h:.0}")
                width=svg_width
                style=svg_style
                role="img"
                aria-label="The workflow's tasks and their dependencies"
            >
                <defs>
                    <marker id="dag-arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" markerHeight="7" orient="auto">
                        <path class="arrow" d="M0,1 L9,5 L0,9 z"></path>
                    </marker>
                </defs>
                <g class="edges">{edges}</g>
                <g class="nodes">{boxes}</g>
            </svg>
        </div>
    }
}

/// `text`, cut to `max` characters with an ellipsis when longer.
fn shorten(text: &str, max: usize) -> String {
    if text.chars().count() > max {
        let mut s: String = text.chars().take(max - 1).collect();
        s.push('…');
        s
    } else {
        text.to_owned()
    }
}

/// The second line of a task's box: its caption, and after it the children a branch chose
/// (`succeeded → load_full`).
fn box_caption(n: &Node) -> String {
    match n.chosen_label() {
        Some(chosen) => format!("{} → {chosen}", n.caption()),
        None => n.caption(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_branch_box_names_its_choice_after_its_state() {
        let mut n = Node {
            id: uuid::Uuid::from_u128(1),
            name: "route".into(),
            state: TaskState::Succeeded,
            attempt: 1,
            max_attempts: 3,
            started_at: None,
            finished_at: None,
            exit_code: None,
            error: None,
            trigger_rule: "all_success".into(),
            branch: true,
            chosen: Some(vec!["load_full".into()]),
            cancel_requested: false,
            parents: Vec::new(),
        };
        assert_eq!(box_caption(&n), "succeeded → load_full");
        n.branch = false;
        assert_eq!(box_caption(&n), "succeeded", "a plain task shows its state");
        assert_eq!(
            shorten("succeeded → load_everything_again", CAPTION_CHARS),
            "succeeded → load_everythi…"
        );
        assert_eq!(shorten("short", CAPTION_CHARS), "short");
    }
}
