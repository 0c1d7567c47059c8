//! The dependency graph of a runtime's controllers and the resource kinds they read and write,
//! as COSI's `DependencyGraph` and `talosctl inspect dependencies`.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use crate::resource::ResourceSpec;
use crate::runtime::controller::{Input, InputKind, Output, OutputKind};

/// How a controller relates to a resource kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum EdgeKind {
    /// The controller is the only writer of the type.
    OutputExclusive,
    /// The controller is one of the writers of the type.
    OutputShared,
    /// A strong input.
    InputStrong,
    /// A weak input.
    InputWeak,
    /// A destroy-ready input.
    InputDestroyReady,
}

impl EdgeKind {
    /// COSI's name of the edge kind (`EdgeOutputExclusive` …, without the prefix).
    pub fn as_str(self) -> &'static str {
        match self {
            EdgeKind::OutputExclusive => "OutputExclusive",
            EdgeKind::OutputShared => "OutputShared",
            EdgeKind::InputStrong => "InputStrong",
            EdgeKind::InputWeak => "InputWeak",
            EdgeKind::InputDestroyReady => "InputDestroyReady",
        }
    }

    /// Whether the controller writes the kind.
    pub fn is_output(self) -> bool {
        matches!(self, EdgeKind::OutputExclusive | EdgeKind::OutputShared)
    }
}

/// One edge: a controller and a resource kind (namespace, type, optional ID).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Edge {
    /// Controller name.
    pub controller: String,
    /// Kind of the edge.
    pub kind: EdgeKind,
    /// Namespace of the resources.
    pub namespace: String,
    /// Type of the resources.
    pub r#type: String,
    /// One resource, for an input narrowed to an ID.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
}

/// Edges between controllers and resource kinds, in registration order (per controller, its
/// outputs, then its inputs).
///
/// A running daemon publishes its graph as a resource of this type (ID = daemon name) in a
/// namespace it writes, so `talosctl inspect dependencies` can draw the whole node.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DependencyGraph {
    /// The edges.
    pub edges: Vec<Edge>,
}

impl ResourceSpec for DependencyGraph {
    const TYPE: &'static str = "DependencyGraphs.cosi.talos.dev";
    // Published in a namespace of the daemon's; this is only the definition's default.
    const DEFAULT_NAMESPACE: &'static str = "runtime";
}

/// The owner of published dependency graphs.
pub const GRAPH_OWNER: &str = "cosi.Runtime";

impl DependencyGraph {
    /// Adds the edges of one controller.
    pub fn add_controller(&mut self, name: &str, inputs: &[Input], outputs: &[Output]) {
        for o in outputs {
            self.edges.push(Edge {
                controller: name.to_string(),
                kind: match o.kind {
                    OutputKind::Exclusive => EdgeKind::OutputExclusive,
                    OutputKind::Shared => EdgeKind::OutputShared,
                },
                namespace: o.namespace.clone(),
                r#type: o.r#type.clone(),
                id: None,
            });
        }
        for i in inputs {
            self.edges.push(Edge {
                controller: name.to_string(),
                kind: match i.kind {
                    InputKind::Weak => EdgeKind::InputWeak,
                    InputKind::Strong => EdgeKind::InputStrong,
                    InputKind::DestroyReady => EdgeKind::InputDestroyReady,
                },
                namespace: i.namespace.clone(),
                r#type: i.r#type.clone(),
                id: i.id.clone(),
            });
        }
    }

    /// Merges the edges of another graph (another daemon's) into this one.
    pub fn extend(&mut self, other: DependencyGraph) {
        self.edges.extend(other.edges);
    }

    /// Renders the graph in Graphviz DOT as `talosctl inspect dependencies` does: controllers
    /// are boxes, resource types `note`s, edges run from writer to type and from type to reader;
    /// exclusive outputs are bold, weak inputs dotted, ID-narrowed inputs labelled with the ID.
    /// Destroy-ready inputs are left out, as upstream, to reduce clutter.
    pub fn to_dot(&self) -> String {
        let mut ids: BTreeMap<(bool, String), usize> = BTreeMap::new();
        let mut nodes = String::new();
        let mut node = |is_type: bool, label: &str, nodes: &mut String| -> usize {
            let next = ids.len() + 1;
            let id = *ids.entry((is_type, label.to_string())).or_insert(next);
            if id == next {
                let label = escape(label);
                let _ = if is_type {
                    writeln!(
                        nodes,
                        "\tn{id}[fillcolor=\"azure2\",label=\"{label}\",shape=\"note\",style=\"filled\"];"
                    )
                } else {
                    writeln!(nodes, "\tn{id}[label=\"{label}\",shape=\"box\"];")
                };
            }
            id
        };
        let mut edges = String::new();
        for e in &self.edges {
            if e.kind == EdgeKind::InputDestroyReady {
                continue;
            }
            let c = node(false, &e.controller, &mut nodes);
            let t = node(true, &e.r#type, &mut nodes);
            let label =
                e.id.as_deref()
                    .map(|id| format!("label=\"{}\",", escape(id)))
                    .unwrap_or_default();
            let _ = match e.kind {
                EdgeKind::OutputExclusive => writeln!(edges, "\tn{c}->n{t}[style=\"bold\"];"),
                EdgeKind::OutputShared => writeln!(edges, "\tn{c}->n{t}[style=\"solid\"];"),
                EdgeKind::InputStrong => writeln!(edges, "\tn{t}->n{c}[{label}style=\"solid\"];"),
                EdgeKind::InputWeak => writeln!(edges, "\tn{t}->n{c}[{label}style=\"dotted\"];"),
                EdgeKind::InputDestroyReady => Ok(()),
            };
        }
        format!("digraph  {{\n\t\n{nodes}{edges}\t\n}}\n")
    }
}

/// Writes `graph` as the resource `namespace/DependencyGraphs/daemon`, retrying with backoff
/// until stated takes it (a daemon may start before stated is reachable).
pub(crate) async fn publish(
    client: crate::Client,
    namespace: String,
    daemon: String,
    graph: DependencyGraph,
) {
    let mut backoff = std::time::Duration::from_millis(100);
    loop {
        match publish_once(&client, &namespace, &daemon, &graph).await {
            Ok(()) => return,
            Err(e) => {
                tracing::debug!(error = %e, "publishing the dependency graph failed, retrying");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(std::time::Duration::from_secs(10));
            }
        }
    }
}

async fn publish_once(
    client: &crate::Client,
    namespace: &str,
    daemon: &str,
    graph: &DependencyGraph,
) -> Result<(), crate::StateError> {
    let spec = crate::resource::encode_spec(graph).map_err(|e| {
        crate::StateError::new(crate::ErrorKind::Other, crate::error::Chain(&e).to_string())
    })?;
    match client.get(namespace, DependencyGraph::TYPE, daemon).await {
        Ok(cur) if cur.spec == spec => Ok(()),
        Ok(mut cur) => {
            cur.spec = spec;
            client.update(&cur, GRAPH_OWNER, None).await.map(|_| ())
        }
        Err(e) if e.is_not_found() => {
            let r = crate::RawResource {
                metadata: crate::Metadata::new(namespace, DependencyGraph::TYPE, daemon),
                spec,
                yaml_spec: String::new(),
            };
            client.create(&r, GRAPH_OWNER).await.map(|_| ())
        }
        Err(e) => Err(e),
    }
}

fn escape(s: &str) -> String {
    s.replace('\\', "\\\\").replace('"', "\\\"")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dot_renders_nodes_and_edge_styles() {
        let mut g = DependencyGraph::default();
        g.add_controller(
            "network.LinkStatusController",
            &[
                Input::new("network", "LinkSpecs.net.talos.dev", InputKind::Weak),
                Input::new(
                    "network",
                    "LinkStatuses.net.talos.dev",
                    InputKind::DestroyReady,
                ),
            ],
            &[Output::new(
                "network",
                "LinkStatuses.net.talos.dev",
                OutputKind::Exclusive,
            )],
        );
        g.add_controller(
            "network.AddressStatusController",
            &[
                Input::new("network", "LinkStatuses.net.talos.dev", InputKind::Strong)
                    .with_id("eth0"),
            ],
            &[Output::new(
                "network",
                "AddressStatuses.net.talos.dev",
                OutputKind::Shared,
            )],
        );
        assert_eq!(g.edges.len(), 5);
        assert_eq!(g.edges[2].kind, EdgeKind::InputDestroyReady);
        let dot = g.to_dot();
        let expected = "digraph  {\n\t\n\
            \tn1[label=\"network.LinkStatusController\",shape=\"box\"];\n\
            \tn2[fillcolor=\"azure2\",label=\"LinkStatuses.net.talos.dev\",shape=\"note\",style=\"filled\"];\n\
            \tn3[fillcolor=\"azure2\",label=\"LinkSpecs.net.talos.dev\",shape=\"note\",style=\"filled\"];\n\
            \tn4[label=\"network.AddressStatusController\",shape=\"box\"];\n\
            \tn5[fillcolor=\"azure2\",label=\"AddressStatuses.net.talos.dev\",shape=\"note\",style=\"filled\"];\n\
            \tn1->n2[style=\"bold\"];\n\
            \tn3->n1[style=\"dotted\"];\n\
            \tn4->n5[style=\"solid\"];\n\
            \tn2->n4[label=\"eth0\",style=\"solid\"];\n\
            \t\n}\n";
        assert_eq!(dot, expected);
    }

    #[test]
    fn labels_are_escaped() {
        assert_eq!(escape(r#"a"b\c"#), r#"a\"b\\c"#);
    }
}
