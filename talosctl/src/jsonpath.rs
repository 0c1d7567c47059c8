//! The small part of Kubernetes JSONPath that resource definitions use for print columns:
//! templates such as `{.field.sub}`, `{.list[*]}`, `{.list[0].name}` or `{.a}/{.b}`.
//!
//! Rendering follows kubectl: a string prints as itself, a number or boolean as JSON, a list or
//! map as compact JSON, several results (from `[*]`) separated by spaces, a missing field as
//! nothing.

use serde_json::Value;

/// A parsed template: literal text and `{...}` expressions.
#[derive(Clone, Debug, PartialEq)]
pub struct Template {
    parts: Vec<Part>,
}

#[derive(Clone, Debug, PartialEq)]
enum Part {
    Text(String),
    Expr(Vec<Step>),
}

#[derive(Clone, Debug, PartialEq)]
enum Step {
    /// `.name` or `['name']`.
    Field(String),
    /// `[n]`; negative counts from the end.
    Index(i64),
    /// `[*]`: every element of a list or value of a map.
    All,
}

impl Template {
    /// Parses a template; the error says what is wrong and where.
    pub fn parse(template: &str) -> Result<Self, String> {
        let mut parts = Vec::new();
        let mut rest = template;
        while !rest.is_empty() {
            match rest.find('{') {
                Some(0) => {
                    let end = rest
                        .find('}')
                        .ok_or_else(|| format!("unclosed '{{' in {template:?}"))?;
                    parts.push(Part::Expr(parse_expr(&rest[1..end])?));
                    rest = &rest[end + 1..];
                }
                Some(i) => {
                    parts.push(Part::Text(rest[..i].to_string()));
                    rest = &rest[i..];
                }
                None => {
                    parts.push(Part::Text(rest.to_string()));
                    rest = "";
                }
            }
        }
        Ok(Self { parts })
    }

    /// Renders the template against `value`.
    pub fn render(&self, value: &Value) -> String {
        let mut out = String::new();
        for part in &self.parts {
            match part {
                Part::Text(t) => out.push_str(t),
                Part::Expr(steps) => {
                    let results = eval(steps, value);
                    let texts: Vec<String> = results.into_iter().map(text).collect();
                    out.push_str(&texts.join(" "));
                }
            }
        }
        out
    }
}

fn parse_expr(expr: &str) -> Result<Vec<Step>, String> {
    let err = |what: &str| format!("{what} in expression {{{expr}}}");
    let mut s = expr.trim();
    // `$` is the root, `@` the current object: the same here (upstream's print columns use
    // `{@}` for a spec that is a bare value, MachineTypes').
    s = s
        .strip_prefix('$')
        .or_else(|| s.strip_prefix('@'))
        .unwrap_or(s);
    if s.is_empty() || s == "." {
        return Ok(Vec::new());
    }
    let mut steps = Vec::new();
    while !s.is_empty() {
        if let Some(after) = s.strip_prefix('.') {
            if after.starts_with('.') {
                return Err(err("recursive descent '..' is not supported"));
            }
            if after.starts_with('[') {
                s = after;
                continue;
            }
            let end = after.find(['.', '[']).unwrap_or(after.len());
            let name = &after[..end];
            if name.is_empty() {
                return Err(err("empty field name"));
            }
            steps.push(Step::Field(name.to_string()));
            s = &after[end..];
        } else if let Some(after) = s.strip_prefix('[') {
            let end = after.find(']').ok_or_else(|| err("unclosed '['"))?;
            let inner = after[..end].trim();
            let step = if inner == "*" {
                Step::All
            } else if let Some(name) = quoted(inner) {
                Step::Field(name.to_string())
            } else {
                let n = inner
                    .parse::<i64>()
                    .map_err(|_| err(&format!("unsupported subscript [{inner}]")))?;
                Step::Index(n)
            };
            steps.push(step);
            s = &after[end + 1..];
        } else {
            return Err(err(&format!("unexpected {s:?}")));
        }
    }
    Ok(steps)
}

fn quoted(s: &str) -> Option<&str> {
    for q in ['\'', '"'] {
        if let Some(inner) = s.strip_prefix(q).and_then(|r| r.strip_suffix(q)) {
            return Some(inner);
        }
    }
    None
}

fn eval<'a>(steps: &[Step], value: &'a Value) -> Vec<&'a Value> {
    let mut cur = vec![value];
    for step in steps {
        let mut next = Vec::new();
        for v in cur {
            match (step, v) {
                (Step::Field(name), Value::Object(m)) => next.extend(m.get(name)),
                (Step::All, Value::Array(a)) => next.extend(a.iter()),
                (Step::All, Value::Object(m)) => next.extend(m.values()),
                (Step::Index(i), Value::Array(a)) => {
                    let idx = if *i < 0 {
                        usize::try_from(-*i)
                            .ok()
                            .and_then(|back| a.len().checked_sub(back))
                    } else {
                        usize::try_from(*i).ok()
                    };
                    next.extend(idx.and_then(|i| a.get(i)));
                }
                _ => {}
            }
        }
        cur = next;
    }
    cur
}

fn text(v: &Value) -> String {
    match v {
        Value::Null => String::new(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn render(t: &str, v: &Value) -> String {
        Template::parse(t).unwrap().render(v)
    }

    #[test]
    fn fields_lists_and_text() {
        let v = json!({
            "hostname": "talos-1",
            "port": 6443,
            "up": true,
            "aliases": ["a", "b"],
            "links": [{"name": "eth0"}, {"name": "eth1"}],
            "nested": {"x": {"y": "z"}},
        });
        assert_eq!(render("{.hostname}", &v), "talos-1");
        assert_eq!(render("{.port}", &v), "6443");
        assert_eq!(render("{.up}", &v), "true");
        assert_eq!(render("{.aliases}", &v), r#"["a","b"]"#);
        assert_eq!(render("{.aliases[*]}", &v), "a b");
        assert_eq!(render("{.aliases[-1]}", &v), "b");
        assert_eq!(render("{.links[*].name}", &v), "eth0 eth1");
        assert_eq!(render("{.links[0].name}", &v), "eth0");
        assert_eq!(render("{.nested.x.y}", &v), "z");
        assert_eq!(render("{.nested['x'].y}", &v), "z");
        assert_eq!(render("{$.hostname}:{.port}", &v), "talos-1:6443");
        assert_eq!(render("{.missing}", &v), "");
        assert_eq!(render("{.links[7].name}", &v), "");
        assert_eq!(render("{.hostname.deeper}", &v), "");
        assert_eq!(render("{@}", &json!("controlplane")), "controlplane");
        assert_eq!(render("{@.hostname}", &v), "talos-1");
    }

    #[test]
    fn bad_templates_are_errors() {
        for bad in ["{.a", "{..a}", "{.a[x]}", "{a}", "{.a[1}"] {
            assert!(Template::parse(bad).is_err(), "{bad}");
        }
    }
}
