//! Rendering of resources as `talosctl get` prints them: an aligned table, YAML documents or
//! JSON lines, with the watch event when watching.
//!
//! Every printer gets each resource with its spec already decoded into a generic value, so a
//! resource of a type talosctl was not compiled with renders like any other.

use std::io::{self, Write};

use cosi::resource::version_to_wire;
use cosi::{EventKind, Metadata, RawResource};
use serde::Serialize;
use serde_json::Value;

use crate::jsonpath::Template;

/// Output format of `get`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// Aligned columns: NAMESPACE TYPE ID VERSION and the type's print columns.
    Table,
    /// One YAML document per resource (metadata and spec), separated by `---`.
    Yaml,
    /// One JSON object per resource and line.
    Json,
}

/// An extra table column from the type's resource definition.
#[derive(Clone, Debug)]
pub struct Column {
    /// Header, upper case.
    pub header: String,
    /// The path into the spec; `None` when the definition's path could not be parsed.
    pub template: Option<Template>,
}

/// One resource to print, with its decoded spec.
pub struct Item<'a> {
    /// The resource.
    pub resource: &'a RawResource,
    /// The spec as a generic value.
    pub spec: Value,
    /// The watch event, when watching.
    pub event: Option<EventKind>,
    /// The node it comes from, when the command names nodes (through apid, or `-n`).
    pub node: Option<&'a str>,
}

/// A printer of one `get` invocation. Rows may be buffered until [`Printer::flush`].
pub trait Printer {
    /// Prints whatever comes before the first resource.
    fn begin(&mut self, out: &mut dyn Write) -> io::Result<()>;
    /// Prints (or buffers) one resource.
    fn resource(&mut self, out: &mut dyn Write, item: &Item<'_>) -> io::Result<()>;
    /// Writes buffered output.
    fn flush(&mut self, out: &mut dyn Write) -> io::Result<()>;
}

/// The printer for `format`. `display_type` fills the table's TYPE column; `watch` adds the
/// event; `nodes` a first NODE column (upstream's; YAML and JSON carry `node`).
pub fn printer(
    format: Format,
    display_type: &str,
    columns: Vec<Column>,
    watch: bool,
    nodes: bool,
) -> Box<dyn Printer> {
    match format {
        Format::Table => Box::new(Table::new(display_type, columns, watch, nodes)),
        Format::Yaml => Box::new(Yaml { first: true }),
        Format::Json => Box::new(Json),
    }
}

/// Table output, aligned as Go's tabwriter with a padding of 3 (upstream talosctl). Column widths
/// only grow, so rows printed while watching stay aligned with the ones before.
pub struct Table {
    display_type: String,
    columns: Vec<Column>,
    watch: bool,
    nodes: bool,
    widths: Vec<usize>,
    pending: Vec<Vec<String>>,
}

const PADDING: usize = 3;

impl Table {
    fn new(display_type: &str, columns: Vec<Column>, watch: bool, nodes: bool) -> Self {
        Self {
            display_type: display_type.to_string(),
            columns,
            watch,
            nodes,
            widths: Vec::new(),
            pending: Vec::new(),
        }
    }
}

impl Printer for Table {
    fn begin(&mut self, _out: &mut dyn Write) -> io::Result<()> {
        let mut row: Vec<String> = Vec::new();
        if self.nodes {
            row.push("NODE".into());
        }
        if self.watch {
            row.push("*".into());
        }
        row.extend(["NAMESPACE", "TYPE", "ID", "VERSION"].map(String::from));
        row.extend(self.columns.iter().map(|c| c.header.clone()));
        self.pending.push(row);
        Ok(())
    }

    fn resource(&mut self, _out: &mut dyn Write, item: &Item<'_>) -> io::Result<()> {
        let md = &item.resource.metadata;
        let mut row = Vec::new();
        if self.nodes {
            row.push(item.node.unwrap_or_default().to_string());
        }
        if self.watch {
            row.push(
                match item.event {
                    Some(EventKind::Created) => "+",
                    Some(EventKind::Destroyed) => "-",
                    _ => " ",
                }
                .to_string(),
            );
        }
        row.push(md.namespace.clone());
        row.push(self.display_type.clone());
        row.push(md.id.clone());
        row.push(version_to_wire(md.version));
        for c in &self.columns {
            row.push(
                c.template
                    .as_ref()
                    .map(|t| t.render(&item.spec))
                    .unwrap_or_default(),
            );
        }
        self.pending.push(row);
        Ok(())
    }

    fn flush(&mut self, out: &mut dyn Write) -> io::Result<()> {
        for row in &self.pending {
            if self.widths.len() < row.len() {
                self.widths.resize(row.len(), 0);
            }
            for (w, cell) in self.widths.iter_mut().zip(row) {
                *w = (*w).max(cell.chars().count());
            }
        }
        for row in self.pending.drain(..) {
            let mut line = String::new();
            let last = row.len().saturating_sub(1);
            for (i, cell) in row.iter().enumerate() {
                line.push_str(cell);
                if i < last {
                    let pad = self.widths[i] + PADDING - cell.chars().count();
                    line.extend(std::iter::repeat_n(' ', pad));
                }
            }
            writeln!(out, "{}", line.trim_end())?;
        }
        Ok(())
    }
}

/// YAML output: `---` between documents.
struct Yaml {
    first: bool,
}

impl Printer for Yaml {
    fn begin(&mut self, _out: &mut dyn Write) -> io::Result<()> {
        Ok(())
    }

    fn resource(&mut self, out: &mut dyn Write, item: &Item<'_>) -> io::Result<()> {
        if !self.first {
            writeln!(out, "---")?;
        }
        self.first = false;
        let text = serde_yaml_ng::to_string(&Document::of(item)).map_err(io::Error::other)?;
        out.write_all(text.as_bytes())
    }

    fn flush(&mut self, _out: &mut dyn Write) -> io::Result<()> {
        Ok(())
    }
}

/// JSON output: one object per line.
struct Json;

impl Printer for Json {
    fn begin(&mut self, _out: &mut dyn Write) -> io::Result<()> {
        Ok(())
    }

    fn resource(&mut self, out: &mut dyn Write, item: &Item<'_>) -> io::Result<()> {
        serde_json::to_writer(&mut *out, &Document::of(item)).map_err(io::Error::other)?;
        writeln!(out)
    }

    fn flush(&mut self, _out: &mut dyn Write) -> io::Result<()> {
        Ok(())
    }
}

/// A resource as YAML and JSON output show it (upstream's `resource.MarshalYAML` plus `event`).
#[derive(Serialize)]
struct Document<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    node: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    event: Option<&'static str>,
    metadata: MetadataDoc<'a>,
    spec: &'a Value,
}

#[derive(Serialize)]
struct MetadataDoc<'a> {
    namespace: &'a str,
    #[serde(rename = "type")]
    r#type: &'a str,
    id: &'a str,
    version: u64,
    owner: &'a str,
    phase: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    created: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    updated: Option<String>,
    #[serde(skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    labels: &'a std::collections::BTreeMap<String, String>,
    #[serde(skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    annotations: &'a std::collections::BTreeMap<String, String>,
    #[serde(skip_serializing_if = "std::collections::BTreeSet::is_empty")]
    finalizers: &'a std::collections::BTreeSet<String>,
}

impl<'a> Document<'a> {
    fn of(item: &'a Item<'a>) -> Self {
        let md: &Metadata = &item.resource.metadata;
        Self {
            node: item.node,
            event: item.event.and_then(event_name),
            metadata: MetadataDoc {
                namespace: &md.namespace,
                r#type: &md.r#type,
                id: &md.id,
                version: md.version,
                owner: &md.owner,
                phase: md.phase.as_str(),
                created: md.created.map(rfc3339),
                updated: md.updated.map(rfc3339),
                labels: &md.labels,
                annotations: &md.annotations,
                finalizers: &md.finalizers,
            },
            spec: &item.spec,
        }
    }
}

fn event_name(kind: EventKind) -> Option<&'static str> {
    match kind {
        EventKind::Created => Some("created"),
        EventKind::Updated => Some("updated"),
        EventKind::Destroyed => Some("destroyed"),
        EventKind::Bootstrapped | EventKind::Noop => None,
    }
}

pub use machinery::rfc3339::rfc3339;

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::UNIX_EPOCH;

    fn raw(id: &str, version: u64) -> RawResource {
        let mut md = Metadata::new("ns", "Things.test.dev", id);
        md.version = version;
        RawResource {
            metadata: md,
            ..Default::default()
        }
    }

    #[test]
    fn table_aligns_and_keeps_widths() {
        let cols = vec![Column {
            header: "NAME".into(),
            template: Template::parse("{.name}").ok(),
        }];
        let mut t = Table::new("Thing", cols, true, false);
        let mut out = Vec::new();
        t.begin(&mut out).unwrap();
        let a = raw("a-long-id", 1);
        let item = Item {
            resource: &a,
            spec: serde_json::json!({"name": "x"}),
            event: Some(EventKind::Created),
            node: None,
        };
        t.resource(&mut out, &item).unwrap();
        t.flush(&mut out).unwrap();
        let b = raw("b", 2);
        let item = Item {
            resource: &b,
            spec: serde_json::json!({}),
            event: Some(EventKind::Updated),
            node: None,
        };
        t.resource(&mut out, &item).unwrap();
        t.flush(&mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert_eq!(
            text,
            "*   NAMESPACE   TYPE    ID          VERSION   NAME\n\
             +   ns          Thing   a-long-id   1         x\n    \
             ns          Thing   b           2\n"
        );
    }

    #[test]
    fn documents_carry_metadata_spec_and_event() {
        let mut r = raw("a", 3);
        r.metadata.labels.insert("k".into(), "v".into());
        r.metadata.created = Some(UNIX_EPOCH);
        let item = Item {
            resource: &r,
            spec: serde_json::json!({"x": 1}),
            event: Some(EventKind::Destroyed),
            node: Some("10.5.0.2"),
        };
        let mut out = Vec::new();
        Json.resource(&mut out, &item).unwrap();
        let v: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["event"], "destroyed");
        assert_eq!(v["node"], "10.5.0.2");
        assert_eq!(v["metadata"]["version"], 3);
        assert_eq!(v["metadata"]["labels"]["k"], "v");
        assert_eq!(v["metadata"]["created"], "1970-01-01T00:00:00Z");
        assert!(v["metadata"].get("finalizers").is_none());
        assert_eq!(v["spec"]["x"], 1);
    }
}
