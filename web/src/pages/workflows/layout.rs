//! The layout of a workflow's DAG, left to right: pure geometry, no DOM.
//!
//! 1. **Layers** by longest path from the roots: a task sits one layer right of its deepest
//!    parent, so every edge points right.
//! 2. **Virtual points** on edges that span several layers, one per layer crossed, so long
//!    edges take part in ordering and bend around the boxes instead of through them.
//! 3. **Order within layers** by barycenter sweeps (each item moves to the mean position of
//!    its neighbours in the layer before, then in the layer after), keeping the order with the
//!    fewest edge crossings seen.
//! 4. **Coordinates**: each item is pulled toward its neighbours' mean height, with the order
//!    and the spacing kept (the mean of a top-down and a bottom-up packing, both of which keep
//!    the spacing, so their mean does too).
//!
//! Edges are cubic curves from a parent's right side to a child's left side, through the
//! edge's virtual points.

/// Width of a task's box.
pub const NODE_W: f64 = 168.0;
/// Height of a task's box.
pub const NODE_H: f64 = 40.0;
/// Horizontal space between layers.
const GAP_X: f64 = 64.0;
/// Vertical space between boxes of a layer.
const GAP_Y: f64 = 14.0;
/// Height a virtual point takes in its layer.
const VIRTUAL_H: f64 = 8.0;
/// Space around the drawing.
const MARGIN: f64 = 12.0;
/// Barycenter sweeps (alternately from the left and from the right).
const SWEEPS: usize = 8;
/// Above this many virtual points, long edges are drawn straight across the layers they
/// span instead (a guard against graphs with many very long edges).
const MAX_VIRTUAL: usize = 20_000;

/// A task's box: its index in the input and its top-left corner.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeBox {
    pub index: usize,
    pub layer: usize,
    pub x: f64,
    pub y: f64,
}

/// An edge from a parent to a child (indices in the input) as an SVG path.
#[derive(Debug, Clone, PartialEq)]
pub struct EdgePath {
    pub parent: usize,
    pub child: usize,
    pub d: String,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Layout {
    /// One box per task, in input order.
    pub nodes: Vec<NodeBox>,
    pub edges: Vec<EdgePath>,
    pub width: f64,
    pub height: f64,
    /// Edge crossings left after ordering.
    pub crossings: usize,
}

/// Lays out `n` tasks and the edges `(parent, child)` between them. Repeated edges,
/// self-edges and indices out of range are ignored; a cycle (which a workflow cannot have)
/// does not stop the layout.
pub fn layout(n: usize, edges: &[(usize, usize)]) -> Layout {
    let mut pairs: Vec<(usize, usize)> = edges
        .iter()
        .copied()
        .filter(|&(p, c)| p < n && c < n && p != c)
        .collect();
    pairs.sort_unstable();
    pairs.dedup();

    let layer_of = layers(n, &pairs);
    let mut graph = Graph::new(n, &layer_of, &pairs);
    let crossings = graph.order();
    graph.place();

    let nodes = (0..n)
        .map(|i| NodeBox {
            index: i,
            layer: graph.layer[i],
            x: graph.x(i),
            y: graph.y[i] - NODE_H / 2.0,
        })
        .collect();
    let edges = graph
        .chains
        .iter()
        .map(|chain| EdgePath {
            parent: chain[0],
            child: chain[chain.len() - 1],
            d: graph.path(chain),
        })
        .collect();
    let layers = graph.rows.len().max(1) as f64;
    let height = graph
        .y
        .iter()
        .enumerate()
        .map(|(i, y)| y + graph.half(i))
        .fold(0.0, f64::max)
        + MARGIN;
    Layout {
        nodes,
        edges,
        width: 2.0 * MARGIN + layers * NODE_W + (layers - 1.0) * GAP_X,
        height: if n == 0 { 2.0 * MARGIN } else { height },
        crossings,
    }
}

/// The layer of every task: 0 for roots, else one more than its deepest parent.
fn layers(n: usize, pairs: &[(usize, usize)]) -> Vec<usize> {
    let mut children = vec![Vec::new(); n];
    let mut pending = vec![0usize; n];
    for &(p, c) in pairs {
        children[p].push(c);
        pending[c] += 1;
    }
    let mut layer = vec![0usize; n];
    let mut done = vec![false; n];
    let mut ready: Vec<usize> = (0..n).filter(|&i| pending[i] == 0).rev().collect();
    let mut left = n;
    loop {
        while let Some(v) = ready.pop() {
            done[v] = true;
            left -= 1;
            for &c in &children[v] {
                if done[c] {
                    // The edge closing a cycle that was broken at `c`.
                    continue;
                }
                layer[c] = layer[c].max(layer[v] + 1);
                pending[c] -= 1;
                if pending[c] == 0 {
                    ready.push(c);
                }
            }
        }
        if left == 0 {
            break;
        }
        // A cycle: release its first task as if its remaining parents were done.
        let v = (0..n).find(|&i| !done[i]).expect("a task is left");
        pending[v] = 0;
        ready.push(v);
    }
    layer
}

/// Tasks and virtual points, by layer.
struct Graph {
    /// Items `0..n` are tasks, the rest virtual points.
    n: usize,
    layer: Vec<usize>,
    /// Items of each layer, in order.
    rows: Vec<Vec<usize>>,
    /// Neighbours of each item in the layer before and the layer after.
    up: Vec<Vec<usize>>,
    down: Vec<Vec<usize>>,
    /// Position of each item in its layer.
    pos: Vec<usize>,
    /// Vertical centre of each item.
    y: Vec<f64>,
    /// Each input edge as the items it passes: parent, virtual points, child.
    chains: Vec<Vec<usize>>,
}

impl Graph {
    fn new(n: usize, layer_of: &[usize], pairs: &[(usize, usize)]) -> Graph {
        let virtual_points: usize = pairs
            .iter()
            .map(|&(p, c)| layer_of[c].saturating_sub(layer_of[p] + 1))
            .sum();
        let split = virtual_points <= MAX_VIRTUAL;
        let mut g = Graph {
            n,
            layer: layer_of.to_vec(),
            rows: Vec::new(),
            up: vec![Vec::new(); n],
            down: vec![Vec::new(); n],
            pos: Vec::new(),
            y: Vec::new(),
            chains: Vec::with_capacity(pairs.len()),
        };
        for &(p, c) in pairs {
            let mut chain = vec![p];
            if split {
                for l in layer_of[p] + 1..layer_of[c] {
                    let v = g.layer.len();
                    g.layer.push(l);
                    g.up.push(Vec::new());
                    g.down.push(Vec::new());
                    chain.push(v);
                }
            }
            chain.push(c);
            for w in chain.windows(2) {
                g.down[w[0]].push(w[1]);
                g.up[w[1]].push(w[0]);
            }
            g.chains.push(chain);
        }
        let layers = g.layer.iter().copied().max().map_or(0, |m| m + 1);
        g.rows = vec![Vec::new(); layers];
        // Tasks in input order, each virtual point after the tasks of its layer.
        for (item, &l) in g.layer.iter().enumerate() {
            g.rows[l].push(item);
        }
        g.pos = vec![0; g.layer.len()];
        g.renumber();
        g
    }

    fn renumber(&mut self) {
        for row in &self.rows {
            for (i, &item) in row.iter().enumerate() {
                self.pos[item] = i;
            }
        }
    }

    /// Barycenter sweeps; keeps the order with the fewest crossings. Returns that count.
    fn order(&mut self) -> usize {
        let mut best = self.rows.clone();
        let mut best_crossings = self.crossings();
        for sweep in 0..SWEEPS {
            if best_crossings == 0 {
                break;
            }
            let from_left = sweep % 2 == 0;
            for l in self.sweep(from_left) {
                let keys: Vec<(usize, f64)> = self.rows[l]
                    .iter()
                    .map(|&item| {
                        let key = self
                            .neighbours_mean(item, from_left, |v| self.pos[v] as f64)
                            .unwrap_or(self.pos[item] as f64);
                        (item, key)
                    })
                    .collect();
                let mut sorted = keys;
                // Stable: ties keep their current order.
                sorted.sort_by(|a, b| a.1.total_cmp(&b.1));
                self.rows[l] = sorted.into_iter().map(|(item, _)| item).collect();
                for (i, &item) in self.rows[l].iter().enumerate() {
                    self.pos[item] = i;
                }
            }
            let crossings = self.crossings();
            if crossings < best_crossings {
                best_crossings = crossings;
                best = self.rows.clone();
            }
        }
        self.rows = best;
        self.renumber();
        best_crossings
    }

    /// The layers a sweep visits, each after the layer it is placed against: left to right
    /// from the second, or right to left from the one before the last.
    fn sweep(&self, from_left: bool) -> Vec<usize> {
        if from_left {
            (1..self.rows.len()).collect()
        } else {
            (0..self.rows.len().saturating_sub(1)).rev().collect()
        }
    }

    /// The mean of `value` over an item's neighbours in the layer a sweep comes from (those
    /// before it when going right, after it when going left); `None` when it has none there.
    fn neighbours_mean(
        &self,
        item: usize,
        from_left: bool,
        value: impl Fn(usize) -> f64,
    ) -> Option<f64> {
        let near = if from_left {
            &self.up[item]
        } else {
            &self.down[item]
        };
        (!near.is_empty()).then(|| near.iter().map(|&v| value(v)).sum::<f64>() / near.len() as f64)
    }

    /// Edge crossings between all pairs of adjacent layers.
    fn crossings(&self) -> usize {
        let mut total = 0;
        for row in &self.rows {
            let mut pairs: Vec<(usize, usize)> = row
                .iter()
                .flat_map(|&u| self.down[u].iter().map(move |&v| (u, v)))
                .map(|(u, v)| (self.pos[u], self.pos[v]))
                .collect();
            pairs.sort_unstable();
            let mut lower: Vec<usize> = pairs.into_iter().map(|(_, b)| b).collect();
            total += inversions(&mut lower);
        }
        total
    }

    /// Half the height an item takes.
    fn half(&self, item: usize) -> f64 {
        if item < self.n {
            NODE_H / 2.0
        } else {
            VIRTUAL_H / 2.0
        }
    }

    /// The least distance between the centres of neighbouring items `a` above `b`.
    fn sep(&self, a: usize, b: usize) -> f64 {
        self.half(a) + self.half(b) + GAP_Y
    }

    fn x(&self, item: usize) -> f64 {
        MARGIN + self.layer[item] as f64 * (NODE_W + GAP_X)
    }

    /// Vertical centres: stacked, then pulled toward the neighbours' mean.
    fn place(&mut self) {
        self.y = vec![0.0; self.layer.len()];
        for row in &self.rows {
            let mut top = MARGIN;
            for &item in row {
                self.y[item] = top + self.half(item);
                top += 2.0 * self.half(item) + GAP_Y;
            }
        }
        for pass in 0..3 {
            let from_left = pass % 2 == 0;
            for l in self.sweep(from_left) {
                let row = self.rows[l].clone();
                let wanted: Vec<f64> = row
                    .iter()
                    .map(|&item| {
                        self.neighbours_mean(item, from_left, |v| self.y[v])
                            .unwrap_or(self.y[item])
                    })
                    .collect();
                let k = row.len();
                let mut down = wanted.clone();
                for i in 1..k {
                    down[i] = down[i].max(down[i - 1] + self.sep(row[i - 1], row[i]));
                }
                let mut up = wanted;
                for i in (0..k.saturating_sub(1)).rev() {
                    up[i] = up[i].min(up[i + 1] - self.sep(row[i], row[i + 1]));
                }
                for i in 0..k {
                    self.y[row[i]] = (down[i] + up[i]) / 2.0;
                }
            }
        }
        // Move the drawing to the top margin.
        let top = (0..self.y.len())
            .map(|i| self.y[i] - self.half(i))
            .fold(f64::INFINITY, f64::min);
        if top.is_finite() {
            for y in &mut self.y {
                *y += MARGIN - top;
            }
        }
    }

    /// The SVG path of an edge through its items.
    fn path(&self, chain: &[usize]) -> String {
        let mut d = String::new();
        let start = (self.x(chain[0]) + NODE_W, self.y[chain[0]]);
        d.push_str(&format!("M{:.1},{:.1}", start.0, start.1));
        let mut at = start;
        for &item in &chain[1..] {
            let to = (self.x(item), self.y[item]);
            let dx = (to.0 - at.0) / 2.0;
            d.push_str(&format!(
                " C{:.1},{:.1} {:.1},{:.1} {:.1},{:.1}",
                at.0 + dx,
                at.1,
                to.0 - dx,
                to.1,
                to.0,
                to.1
            ));
            at = to;
            if item >= self.n {
                // A virtual point: straight across its layer.
                at = (to.0 + NODE_W, to.1);
                d.push_str(&format!(" L{:.1},{:.1}", at.0, at.1));
            }
        }
        d
    }
}

/// Shards drawn in the graph one by one when their group is expanded; a group of more opens
/// the task list filtered by `shard_of` instead.
pub const INLINE_MAX: usize = 20;

/// What the graph draws once the shards of each sharded task (a map's instances, a sharded
/// task's shards) are folded into their parent's box.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Collapsed {
    /// The task each item of the graph draws, in input order.
    pub tasks: Vec<usize>,
    /// For each item, the shards of its task (empty for a task without shards), whether they
    /// are folded into it or drawn on their own.
    pub members: Vec<Vec<usize>>,
    /// Whether an item's shards are drawn on their own.
    pub expanded: Vec<bool>,
    /// The edges between items: each edge of the input from or to a folded shard becomes an
    /// edge from or to its parent's item; the ones left inside an item and repeats are dropped.
    pub edges: Vec<(usize, usize)>,
}

/// Folds every shard (`shard_of[i]`: the index of its parent) into its parent, unless
/// `expanded(parent)` and the parent has at most [`INLINE_MAX`] shards. A shard whose parent
/// is out of range, itself, or itself a shard, stays on its own.
pub fn collapse(
    shard_of: &[Option<usize>],
    edges: &[(usize, usize)],
    expanded: impl Fn(usize) -> bool,
) -> Collapsed {
    let n = shard_of.len();
    let parent_of = |i: usize| {
        shard_of[i].filter(|&p| p < n && p != i && shard_of[p].is_none_or(|q| q >= n || q == p))
    };
    let mut members = vec![Vec::new(); n];
    for i in 0..n {
        if let Some(p) = parent_of(i) {
            members[p].push(i);
        }
    }
    let open: Vec<bool> = (0..n)
        .map(|p| !members[p].is_empty() && members[p].len() <= INLINE_MAX && expanded(p))
        .collect();
    let folded = |i: usize| parent_of(i).is_some_and(|p| !open[p]);
    let mut out = Collapsed::default();
    let mut item = vec![usize::MAX; n];
    for i in (0..n).filter(|&i| !folded(i)) {
        item[i] = out.tasks.len();
        out.tasks.push(i);
        out.members.push(std::mem::take(&mut members[i]));
        out.expanded.push(open[i]);
    }
    for i in (0..n).filter(|&i| folded(i)) {
        item[i] = parent_of(i).map_or(usize::MAX, |p| item[p]);
    }
    let mut seen = std::collections::HashSet::new();
    for &(a, b) in edges {
        if a >= n || b >= n {
            continue;
        }
        let pair = (item[a], item[b]);
        if pair.0 != pair.1 && seen.insert(pair) {
            out.edges.push(pair);
        }
    }
    out
}

/// Pairs `i < j` with `v[i] > v[j]` (merge sort; sorts `v`).
fn inversions(v: &mut [usize]) -> usize {
    let n = v.len();
    if n < 2 {
        return 0;
    }
    let mid = n / 2;
    let mut count = inversions(&mut v[..mid]) + inversions(&mut v[mid..]);
    let mut merged = Vec::with_capacity(n);
    let (mut i, mut j) = (0, mid);
    while i < mid && j < n {
        if v[i] <= v[j] {
            merged.push(v[i]);
            i += 1;
        } else {
            count += mid - i;
            merged.push(v[j]);
            j += 1;
        }
    }
    merged.extend_from_slice(&v[i..mid]);
    merged.extend_from_slice(&v[j..]);
    v.copy_from_slice(&merged);
    count
}

#[cfg(test)]
mod tests {
    use super::*;

    fn overlaps(l: &Layout) -> bool {
        l.nodes.iter().enumerate().any(|(i, a)| {
            l.nodes[i + 1..].iter().any(|b| {
                a.x < b.x + NODE_W && b.x < a.x + NODE_W && a.y < b.y + NODE_H && b.y < a.y + NODE_H
            })
        })
    }

    #[test]
    fn every_edge_points_right_and_boxes_never_overlap() {
        // A diamond with a long edge from the root to the sink.
        let l = layout(5, &[(0, 1), (0, 2), (1, 3), (2, 3), (3, 4), (0, 4)]);
        let layers: Vec<usize> = l.nodes.iter().map(|b| b.layer).collect();
        assert_eq!(
            layers,
            vec![0, 1, 1, 2, 3],
            "a task sits one layer right of its deepest parent"
        );
        for e in &l.edges {
            assert!(
                l.nodes[e.parent].x < l.nodes[e.child].x,
                "edges point right"
            );
        }
        assert!(!overlaps(&l), "boxes never overlap: {:?}", l.nodes);
        assert_eq!(l.edges.len(), 6);
        assert!(l.width >= 4.0 * NODE_W && l.height >= 2.0 * NODE_H);
    }

    #[test]
    fn barycenter_sweeps_remove_avoidable_crossings() {
        // Two chains whose second layer is given crossed: a0->b1, a1->b0.
        // Input order: a0, a1, b0, b1, c0 (child of b0), c1 (child of b1).
        let l = layout(6, &[(0, 3), (1, 2), (2, 4), (3, 5)]);
        assert_eq!(l.crossings, 0, "the crossing is avoidable");
        let (a0, b1) = (&l.nodes[0], &l.nodes[3]);
        assert!(
            (a0.y - b1.y).abs() < 1.0,
            "a lone child is level with its parent"
        );
    }

    #[test]
    fn repeated_self_and_foreign_edges_are_ignored_and_cycles_end() {
        let l = layout(3, &[(0, 1), (0, 1), (1, 1), (2, 9), (1, 2), (2, 1)]);
        assert_eq!(l.nodes.len(), 3);
        assert!(l.edges.iter().all(|e| e.parent != e.child && e.child < 3));
        let empty = layout(0, &[]);
        assert!(empty.nodes.is_empty() && empty.edges.is_empty());
    }

    #[test]
    fn inversions_are_counted() {
        assert_eq!(inversions(&mut [0, 1, 2]), 0);
        assert_eq!(inversions(&mut [2, 1, 0]), 3);
        assert_eq!(inversions(&mut [1, 0, 1, 0]), 3);
    }

    #[test]
    fn a_wide_fan_out_and_fan_in_is_centred() {
        let n = 302;
        let mut edges = Vec::new();
        for i in 1..=300 {
            edges.push((0, i));
            edges.push((i, 301));
        }
        let l = layout(n, &edges);
        assert_eq!(l.crossings, 0);
        assert!(!overlaps(&l));
        let mid = (l.nodes[150].y + l.nodes[151].y) / 2.0;
        assert!(
            (l.nodes[0].y - mid).abs() < NODE_H,
            "the root is level with the middle of its children"
        );
    }

    /// root -> m (3 instances, each an edge instance -> m) -> sink.
    fn map_of_three() -> (Vec<Option<usize>>, Vec<(usize, usize)>) {
        // 0 root, 1 m, 2..=4 m[0..3], 5 sink.
        let shard_of = vec![None, None, Some(1), Some(1), Some(1), None];
        let edges = vec![(0, 1), (2, 1), (3, 1), (4, 1), (1, 5)];
        (shard_of, edges)
    }

    #[test]
    fn a_map_collapses_into_one_box_with_its_instances() {
        let (shard_of, edges) = map_of_three();
        let c = collapse(&shard_of, &edges, |_| false);
        assert_eq!(c.tasks, vec![0, 1, 5], "root, the map, the sink");
        assert_eq!(c.members, vec![vec![], vec![2, 3, 4], vec![]]);
        assert_eq!(c.expanded, vec![false, false, false]);
        assert_eq!(
            c.edges,
            vec![(0, 1), (1, 2)],
            "instance edges fold into the map"
        );
        let l = layout(c.tasks.len(), &c.edges);
        assert_eq!(l.nodes.len(), 3);
        assert_eq!(l.edges.len(), 2);
    }

    #[test]
    fn a_small_group_expands_inline_and_a_large_one_does_not() {
        let (shard_of, edges) = map_of_three();
        let c = collapse(&shard_of, &edges, |p| p == 1);
        assert_eq!(c.tasks, vec![0, 1, 2, 3, 4, 5], "the instances are drawn");
        assert_eq!(c.expanded, vec![false, true, false, false, false, false]);
        assert_eq!(c.members[1], vec![2, 3, 4]);
        assert_eq!(c.edges, vec![(0, 1), (2, 1), (3, 1), (4, 1), (1, 5)]);

        // 30 instances: expanding leaves them folded.
        let mut shard_of = vec![None, None];
        let mut edges = vec![(0, 1)];
        for i in 0..30 {
            shard_of.push(Some(1));
            edges.push((2 + i, 1));
        }
        let c = collapse(&shard_of, &edges, |_| true);
        assert_eq!(c.tasks, vec![0, 1]);
        assert_eq!(c.members[1].len(), 30);
        assert_eq!(c.expanded, vec![false, false]);
        assert_eq!(c.edges, vec![(0, 1)]);
    }

    #[test]
    fn shards_of_unknown_or_nested_parents_stay_on_their_own() {
        // 1 is a shard of a task not in the workflow, 2 of itself, 3 of the shard 4.
        let shard_of = vec![None, Some(9), Some(2), Some(4), Some(0)];
        let c = collapse(&shard_of, &[(3, 0)], |_| false);
        assert_eq!(c.tasks, vec![0, 1, 2, 3]);
        assert_eq!(c.members[0], vec![4]);
        assert_eq!(c.edges, vec![(3, 0)]);
    }
}
