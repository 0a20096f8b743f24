//! The two rules over a crate's module graph, each violation worded for
//! someone who has never seen this test: what rule, where, what to do.
//!
//! 1. No circles among siblings: inside every module, its child modules
//!    depend on each other one way only (a DAG). Child `a` depends on its
//!    sibling `b` when any code in `a`'s subtree names anything in `b`'s.
//!    References between a module and its own ancestors or descendants do
//!    not count: a parent composes its children.
//! 2. Layers (the server): a top-level module may use only modules of its
//!    own layer or a lower one, and every top-level module has a layer.

use std::collections::{BTreeMap, BTreeSet};

use super::graph::{Crate, ModPath, Reference};

/// A crate's layers, bottom first: a name for messages and its top-level
/// modules.
pub type Layers = &'static [(&'static str, &'static [&'static str])];

/// Every violation of the sibling rule, one message per circle.
pub fn circles(krate: &Crate) -> Vec<String> {
    // For each parent, child -> sibling -> the first reference that makes it.
    let mut edges: BTreeMap<ModPath, BTreeMap<String, BTreeMap<String, &Reference>>> = BTreeMap::new();
    for reference in &krate.references {
        let (from, to) = (&reference.from, &reference.to);
        let common = from.iter().zip(to).take_while(|(a, b)| a == b).count();
        if common == from.len() || common == to.len() {
            continue; // the same module, an ancestor or a descendant
        }
        let first = edges
            .entry(from[..common].to_vec())
            .or_default()
            .entry(from[common].clone())
            .or_default()
            .entry(to[common].clone())
            .or_insert(reference);
        if sort_key(reference) < sort_key(first) {
            *first = reference;
        }
    }
    let mut messages = Vec::new();
    for (parent, graph) in &edges {
        for component in strongly_connected(graph) {
            let inside: BTreeSet<&String> = component.iter().collect();
            let mut lines = Vec::new();
            for from in &component {
                for (to, reference) in graph.get(from).into_iter().flatten() {
                    if inside.contains(to) {
                        lines.push(format!(
                            "    {from} -> {to}: {} `{}`",
                            reference.at, reference.written
                        ));
                    }
                }
            }
            messages.push(format!(
                "circle among the modules inside {}: {}\n\
                 The child modules of one module must depend on each other one way only.\n\
                 The shortest circle: {}\n\
                 Each line is one dependency with one example reference (file:line, the path as written):\n\
                 {}\n\
                 To fix it, pick the direction that should stay and move what the other side uses\n\
                 (into the lower module, into the parent, or into a new module both can use).",
                describe(krate, parent),
                component.join(", "),
                shortest_circle(graph, &inside).join(" -> "),
                lines.join("\n"),
            ));
        }
    }
    messages
}

/// Every violation of the layer rule: upward references, and top-level
/// modules that have no layer.
pub fn layers(krate: &Crate, layers: Layers) -> Vec<String> {
    let rank = |name: &str| layers.iter().position(|(_, modules)| modules.contains(&name));
    let table = layers
        .iter()
        .enumerate()
        .map(|(i, (name, modules))| format!("    {i} {name}: {}", modules.join(", ")))
        .collect::<Vec<_>>()
        .join("\n");
    let mut messages = Vec::new();
    let root = krate.modules.get(&Vec::new());
    for name in root.into_iter().flat_map(|m| &m.children) {
        if rank(name).is_none() {
            let file = krate
                .modules
                .get(&vec![name.clone()])
                .map(|m| m.file.as_str())
                .unwrap_or("?");
            messages.push(format!(
                "top-level module `{name}` of {} ({file}) has no layer.\n\
                 Every top-level module sits in one layer, and may use only its own layer and those below:\n\
                 {table}\n\
                 Decide where `{name}` belongs and add it to the table in tests/tests/layers.rs,\n\
                 or fold it into a module that already has a layer.",
                krate.name
            ));
        }
    }
    // One message per pair of modules, listing every reference.
    let mut upward: BTreeMap<(&str, &str), Vec<&Reference>> = BTreeMap::new();
    for reference in &krate.references {
        if let (Some(from), Some(to)) = (reference.from.first(), reference.to.first())
            && let (Some(low), Some(high)) = (rank(from), rank(to))
            && high > low
        {
            upward.entry((from, to)).or_default().push(reference);
        }
    }
    let name_of = |module: &str| {
        rank(module)
            .map(|i| format!("layer {i} {}", layers[i].0))
            .unwrap_or_default()
    };
    for ((from, to), mut references) in upward {
        references.sort_by_key(|r| sort_key(r));
        let lines: Vec<String> = references
            .iter()
            .map(|r| format!("    {} `{}`", r.at, r.written))
            .collect();
        messages.push(format!(
            "upward references from `{from}` ({}) to `{to}` ({}) in {}:\n\
             {}\n\
             A top-level module may use only its own layer and those below:\n\
             {table}\n\
             To fix it, move what `{from}` needs down to a layer it may use, or have the upper layer\n\
             pass it in (a parameter, a trait the lower module defines, a value `app` builds).",
            name_of(from),
            name_of(to),
            krate.name,
            lines.join("\n"),
        ));
    }
    messages
}

/// `server::identity` for a module, `server (the crate root)` for the root.
fn describe(krate: &Crate, module: &ModPath) -> String {
    if module.is_empty() {
        format!("{} (the crate root)", krate.name)
    } else {
        format!("{}::{}", krate.name, module.join("::"))
    }
}

/// Messages are stable from run to run: file, then line as a number.
fn sort_key(reference: &Reference) -> (String, usize, String) {
    let (file, line) = reference
        .at
        .rsplit_once(':')
        .map(|(f, l)| (f.to_string(), l.parse().unwrap_or(0)))
        .unwrap_or_default();
    (file, line, reference.written.clone())
}

/// The shortest circle through the modules of one component, as the
/// names along it (the first again at the end): where to start cutting.
fn shortest_circle<T>(
    graph: &BTreeMap<String, BTreeMap<String, T>>,
    inside: &BTreeSet<&String>,
) -> Vec<String> {
    let mut best: Vec<String> = Vec::new();
    for &start in inside {
        // Breadth first from `start` until an edge leads back to it.
        let mut came_from: BTreeMap<&String, &String> = BTreeMap::new();
        let mut queue = std::collections::VecDeque::from([start]);
        let mut closing = None;
        while let Some(node) = queue.pop_front() {
            for next in graph.get(node).into_iter().flat_map(|m| m.keys()) {
                if next == start {
                    closing = Some(node);
                    break;
                }
                if inside.contains(next) && !came_from.contains_key(next) {
                    came_from.insert(next, node);
                    queue.push_back(next);
                }
            }
            if closing.is_some() {
                break;
            }
        }
        let Some(mut node) = closing else { continue };
        let mut path = vec![start.clone()];
        while node != start {
            path.push(node.clone());
            node = came_from[node];
        }
        path.push(start.clone());
        path.reverse();
        if best.is_empty() || path.len() < best.len() {
            best = path;
        }
    }
    best
}

/// The strongly connected components with more than one module (Tarjan's
/// algorithm), each sorted by name.
fn strongly_connected<T>(graph: &BTreeMap<String, BTreeMap<String, T>>) -> Vec<Vec<String>> {
    struct State<'g, T> {
        graph: &'g BTreeMap<String, BTreeMap<String, T>>,
        index: BTreeMap<&'g str, usize>,
        low: BTreeMap<&'g str, usize>,
        stack: Vec<&'g str>,
        on_stack: BTreeSet<&'g str>,
        found: Vec<Vec<String>>,
    }
    fn visit<'g, T>(state: &mut State<'g, T>, node: &'g str) {
        let n = state.index.len();
        state.index.insert(node, n);
        state.low.insert(node, n);
        state.stack.push(node);
        state.on_stack.insert(node);
        let graph = state.graph;
        for next in graph.get(node).into_iter().flat_map(|m| m.keys()) {
            let next = next.as_str();
            if !state.index.contains_key(next) {
                visit(state, next);
                let low = state.low[node].min(state.low[next]);
                state.low.insert(node, low);
            } else if state.on_stack.contains(next) {
                let low = state.low[node].min(state.index[next]);
                state.low.insert(node, low);
            }
        }
        if state.low[node] == state.index[node] {
            let mut component = Vec::new();
            while let Some(top) = state.stack.pop() {
                state.on_stack.remove(top);
                component.push(top.to_string());
                if top == node {
                    break;
                }
            }
            if component.len() > 1 {
                component.sort();
                state.found.push(component);
            }
        }
    }
    let mut state = State {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        found: Vec::new(),
    };
    for node in graph.keys() {
        if !state.index.contains_key(node.as_str()) {
            visit(&mut state, node);
        }
    }
    state.found.sort();
    state.found
}
