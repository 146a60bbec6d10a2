//! The graph of a workflow's tasks: the boxes and curves of a [`Layout`] as a scrollable
//! SVG with zoom buttons. Each box follows its task's state (class `state-…`, `data-state`)
//! and opens the task when clicked or on Enter. A branch's box carries a "branch" tag and,
//! once it has succeeded, the children it chose after its state; the edges to the children it
//! did not choose are faint (`edge-unchosen`).
//!
//! A sharded task is one box tagged "shards" (a map, whose instances are its shards: "map")
//! with the count of its shards by state (`data-node`, `data-instances`); its control draws
//! up to [`INLINE_MAX`] shards in the graph ("show"/"hide"), or opens the task list filtered
//! by `shard_of` when there are more ("list").
//!
//! A sub-workflow task is one box tagged "sub-workflow" whose caption is the state of its
//! latest sub-workflow, or "not started" (`data-subworkflow`); its "open" control leads to
//! that sub-workflow's page (`data-href`), while a click elsewhere on the box opens the task.

use std::collections::HashSet;
use std::sync::Arc;

use leptos::html;
use leptos::prelude::*;
use leptos_router::hooks::use_navigate;
use sked_types::TaskState;
use uuid::Uuid;

use super::layout::{Collapsed, INLINE_MAX, Layout, NODE_H, NODE_W};
use super::{Node, Nodes};

/// Characters of a task's name that fit in its box.
const NAME_CHARS: usize = 22;
/// Characters of a branch's name that fit beside its "branch" tag.
const BRANCH_NAME_CHARS: usize = 16;
/// Characters of a sub-workflow task's name that fit beside its "sub-workflow" tag.
const SUBWORKFLOW_NAME_CHARS: usize = 10;
/// Characters of a caption that fit in a box.
const CAPTION_CHARS: usize = 26;
/// Characters of a sharded task's counts that fit beside its control.
const COUNTS_CHARS: usize = 19;
/// The smallest and largest zoom of the graph.
const MIN_ZOOM: f64 = 0.2;
const MAX_ZOOM: f64 = 2.5;
/// In "fit" mode the graph shrinks to the page's width, but not below this scale (narrower
/// screens scroll).
const FIT_MIN_ZOOM: f64 = 0.55;

/// The graph: a scrollable SVG with zoom buttons.
#[component]
pub(super) fn Graph(
    drawn: Arc<(Collapsed, Layout)>,
    nodes: RwSignal<Nodes>,
    expanded: RwSignal<HashSet<Uuid>>,
) -> impl IntoView {
    let navigate = use_navigate();
    let (collapsed, layout) = (&drawn.0, &drawn.1);
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
            let (parent, child) = (collapsed.tasks[e.parent], collapsed.tasks[e.child]);
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
            let i = collapsed.tasks[b.index];
            let members = Arc::new(collapsed.members[b.index].clone());
            let is_open = collapsed.expanded[b.index];
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
            let sharded = !members.is_empty();
            let total = members.len();
            let counts = {
                let members = members.clone();
                move || {
                    nodes.with(|ns| {
                        let states = members
                            .iter()
                            .filter_map(|&m| ns.list.get(m).map(|n| n.state));
                        counts_label(total, &count_states(states))
                    })
                }
            };
            let counts_title = counts.clone();
            let counts_data = counts.clone();
            let title = move || {
                node().map(|n| {
                    let mut t = format!("{} — {}", n.name, n.caption());
                    if sharded {
                        t.push_str(&format!("\n{}", counts_title()));
                    }
                    if let Some(run) = n.run_label() {
                        t.push_str(&format!("\n{run}"));
                    }
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
            let subworkflow = first.subworkflow && !sharded;
            let label = shorten(
                &first.name,
                if subworkflow {
                    SUBWORKFLOW_NAME_CHARS
                } else if branch || sharded {
                    BRANCH_NAME_CHARS
                } else {
                    NAME_CHARS
                },
            );
            let run_state = move || {
                nodes.with(|ns| ns.list.get(i).and_then(Node::run_state))
            };
            // "open ↗": the page of the sub-workflow, once the task has started one.
            let run_control = subworkflow.then(|| {
                let navigate = navigate.clone();
                move || {
                    let href = nodes.with(|ns| ns.list.get(i).and_then(Node::run_href))?;
                    let navigate = navigate.clone();
                    let go = {
                        let href = href.clone();
                        move || navigate(&href, Default::default())
                    };
                    Some(node_control(
                        "open-subworkflow",
                        "link",
                        Some(href),
                        "Open the sub-workflow".to_owned(),
                        "open ↗",
                        go,
                    ))
                }
            });
            let open = {
                let navigate = navigate.clone();
                move || navigate(&format!("/tasks/{id}"), Default::default())
            };
            let open_key = open.clone();
            let list_href = format!("/tasks?shard_of={id}");
            let control = sharded.then(|| {
                let navigate = navigate.clone();
                let href = list_href.clone();
                let go = move || {
                    if total > INLINE_MAX {
                        navigate(&href, Default::default());
                    } else {
                        expanded.update(|open| {
                            if !open.remove(&id) {
                                open.insert(id);
                            }
                        });
                    }
                };
                let (action, text, role, href, title) = if total > INLINE_MAX {
                    let title = "List the shards".to_owned();
                    ("shards-list", "list ↗", "link", Some(list_href.clone()), title)
                } else if is_open {
                    let title = "Fold the shards into this box".to_owned();
                    ("shards-hide", "hide", "button", None, title)
                } else {
                    let title = format!("Draw the {total} shards");
                    ("shards-show", "show", "button", None, title)
                };
                node_control(action, role, href, title, text, go)
            });
            let caption_line = move || {
                if sharded {
                    // `30 · 28 succeeded · 2 failed`: the tag says they are shards.
                    let unit = if total == 1 { " shard" } else { " shards" };
                    shorten(&counts().replacen(unit, "", 1), COUNTS_CHARS)
                } else if subworkflow {
                    // `failed`, `not started`: the tag says it is the sub-workflow's.
                    run_state().unwrap_or_default().to_owned()
                } else {
                    caption()
                }
            };
            view! {
                <g
                    class=move || {
                        if branch {
                            format!("node branch state-{}", state())
                        } else if subworkflow {
                            format!("node subworkflow state-{}", state())
                        } else if sharded {
                            format!("node sharded state-{}", state())
                        } else {
                            format!("node state-{}", state())
                        }
                    }
                    data-task-id=id.to_string()
                    data-node=first.name.clone()
                    data-instances=sharded.then(|| total.to_string())
                    data-counts=move || sharded.then(&counts_data)
                    data-subworkflow=run_state
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
                    {sharded.then(|| view! {
                        <text class="tag" x=NODE_W - 8.0 y="16" text-anchor="end">
                            {if first.map { "map" } else { "shards" }}
                        </text>
                    })}
                    {subworkflow.then(|| view! {
                        <text class="tag" x=NODE_W - 8.0 y="16" text-anchor="end">"sub-workflow"</text>
                    })}
                    <text class="caption" x="10" y="32">{caption_line}</text>
                    {control}
                    {run_control}
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
/// A box's control at its top right (a sub-workflow's "open ↗", a sharded task's "list ↗",
/// "show" or "hide"): `act` on a click or Enter, without opening the box's task.
fn node_control(
    action: &'static str,
    role: &'static str,
    href: Option<String>,
    title: String,
    text: &'static str,
    act: impl Fn() + Clone + 'static,
) -> impl IntoView {
    let act_key = act.clone();
    view! {
        <text
            class="node-control"
            x=NODE_W - 8.0
            y="32"
            text-anchor="end"
            tabindex="0"
            role=role
            data-action=action
            data-href=href
            on:click=move |ev| {
                ev.stop_propagation();
                act()
            }
            on:keydown=move |ev| {
                if ev.key() == "Enter" {
                    ev.stop_propagation();
                    act_key()
                }
            }
        >
            <title>{title}</title>
            {text}
        </text>
    }
}

fn shorten(text: &str, max: usize) -> String {
    if text.chars().count() > max {
        let mut s: String = text.chars().take(max - 1).collect();
        s.push('…');
        s
    } else {
        text.to_owned()
    }
}

/// The count of each state among `states`, most first (ties in the order of [`TaskState`]).
fn count_states(states: impl Iterator<Item = TaskState>) -> Vec<(TaskState, usize)> {
    let mut counts: Vec<(TaskState, usize)> = Vec::new();
    for s in states {
        match counts.iter_mut().find(|(t, _)| *t == s) {
            Some((_, n)) => *n += 1,
            None => counts.push((s, 1)),
        }
    }
    counts.sort_by(|a, b| b.1.cmp(&a.1).then((a.0 as u8).cmp(&(b.0 as u8))));
    counts
}

/// `30 shards · 28 succeeded · 2 failed`.
fn counts_label(total: usize, counts: &[(TaskState, usize)]) -> String {
    let mut label = format!(
        "{} {}",
        crate::ui::count(total as i64),
        if total == 1 { "shard" } else { "shards" }
    );
    for (state, n) in counts {
        label.push_str(&format!(
            " · {} {}",
            crate::ui::count(*n as i64),
            state.as_str().replace('_', " ")
        ));
    }
    label
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
            map: false,
            subworkflow: false,
            run: None,
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

    #[test]
    fn a_sharded_box_counts_its_shards_by_state() {
        use TaskState::*;
        let mut states = vec![Succeeded; 9_990];
        states.extend([Failed; 10]);
        states.push(Running);
        let counts = count_states(states.into_iter());
        assert_eq!(counts, vec![(Succeeded, 9_990), (Failed, 10), (Running, 1)]);
        assert_eq!(
            counts_label(10_001, &counts),
            "10,001 shards · 9,990 succeeded · 10 failed · 1 running"
        );
        let ties = count_states([Failed, Succeeded, UpstreamFailed].into_iter());
        assert_eq!(
            counts_label(3, &ties),
            "3 shards · 1 succeeded · 1 failed · 1 upstream failed"
        );
        assert_eq!(counts_label(1, &[]), "1 shard");
    }
}
