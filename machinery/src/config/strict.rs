//! Strict decoding that reports every problem at once.
//!
//! serde stops at the first error, and `deny_unknown_fields` reports only the first unknown key.
//! This module decodes from an already parsed [`serde_yaml_ng::Value`] with a deserializer that
//! knows the path of every value it hands out. When it meets an unknown struct field or a value of
//! the wrong type it records a [`ConfigError`] with the full path, substitutes the zero value
//! (skips the key, or hands out `false`/`0`/`""`/empty), and carries on, so one pass collects all
//! the problems of a document.
//!
//! The schema types cooperate: every struct has `#[serde(default)]` (so a missing field is never a
//! decoding error; required fields are checked by validation) and no type of the schema fails on
//! its own. Should a visitor fail anyway (an unsupported enum, say), the error is recorded at the
//! value's path and decoding of that document stops.
//!
//! YAML 1.1 conveniences that the upstream (Go, yaml.v3) decoder accepts are accepted here too:
//! `yes`/`no`/`on`/`off` for booleans, and any scalar (number, boolean) where a string is expected.

use std::cell::RefCell;
use std::fmt;

use serde::de::{self, DeserializeOwned, DeserializeSeed, IntoDeserializer, Visitor};
use serde_yaml_ng::{Mapping, Value};

use super::error::{join_index, join_key, ConfigError};

/// Decodes `value` into `T`, collecting every problem; paths start at `base`.
pub(crate) fn decode<T: DeserializeOwned>(
    value: &Value,
    base: &str,
) -> Result<T, Vec<ConfigError>> {
    let errors = RefCell::new(Vec::new());
    let result = T::deserialize(ValueDe {
        value,
        path: base.to_owned(),
        errors: &errors,
    });
    let mut errors = errors.into_inner();
    match result {
        Ok(decoded) if errors.is_empty() => Ok(decoded),
        Ok(_) => Err(errors),
        Err(err) => {
            if !err.recorded {
                errors.push(ConfigError::new(base, err.message));
            }
            Err(errors)
        }
    }
}

/// The error type of the strict deserializer. `recorded` means it is already in the error list.
#[derive(Debug)]
pub(crate) struct DeError {
    message: String,
    recorded: bool,
}

impl fmt::Display for DeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for DeError {}

impl de::Error for DeError {
    fn custom<T: fmt::Display>(msg: T) -> Self {
        Self {
            message: msg.to_string(),
            recorded: false,
        }
    }
}

/// A short description of a YAML value for type errors.
pub(crate) fn describe(value: &Value) -> String {
    match value {
        Value::Null => "null".to_owned(),
        Value::Bool(b) => format!("boolean `{b}`"),
        Value::Number(n) => format!("number `{n}`"),
        Value::String(s) => {
            let shown: String = s.chars().take(40).collect();
            let ellipsis = if s.chars().count() > 40 { "..." } else { "" };
            format!("string {shown:?}{ellipsis}")
        }
        Value::Sequence(_) => "a list".to_owned(),
        Value::Mapping(_) => "a mapping".to_owned(),
        Value::Tagged(t) => describe(&t.value),
    }
}

/// Text of a scalar YAML key (string, number or boolean), as yaml.v3 would decode it into a string.
pub(crate) fn scalar_text(value: &Value) -> Option<String> {
    match value {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        Value::Tagged(t) => scalar_text(&t.value),
        _ => None,
    }
}

fn yaml11_bool(s: &str) -> Option<bool> {
    match s {
        "y" | "Y" | "yes" | "Yes" | "YES" | "on" | "On" | "ON" | "true" | "True" | "TRUE" => {
            Some(true)
        }
        "n" | "N" | "no" | "No" | "NO" | "off" | "Off" | "OFF" | "false" | "False" | "FALSE" => {
            Some(false)
        }
        _ => None,
    }
}

/// A YAML 1.1 octal integer (`0644`), which YAML 1.2 parsers read as a string but the upstream
/// decoder accepts as a number.
fn yaml11_octal(s: &str) -> Option<u64> {
    let digits = s.strip_prefix('0')?;
    if digits.is_empty() || !digits.bytes().all(|b| (b'0'..=b'7').contains(&b)) {
        return None;
    }
    u64::from_str_radix(digits, 8).ok()
}

/// Levenshtein distance, for "did you mean" hints.
fn distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1; b.len() + 1];
        for (j, cb) in b.iter().enumerate() {
            let cost = usize::from(ca != *cb);
            cur[j + 1] = (prev[j] + cost).min(prev[j + 1] + 1).min(cur[j] + 1);
        }
        prev = cur;
    }
    prev[b.len()]
}

fn unknown_field_message(key: &str, fields: &[&str]) -> String {
    let best = fields
        .iter()
        .map(|f| {
            let d = if f.eq_ignore_ascii_case(key) {
                0
            } else {
                distance(key, f)
            };
            (d, *f)
        })
        .min_by_key(|(d, _)| *d);
    match best {
        Some((d, f)) if d <= 2 => format!("unknown field (did you mean `{f}`?)"),
        _ => "unknown field".to_owned(),
    }
}

struct ValueDe<'a> {
    value: &'a Value,
    path: String,
    errors: &'a RefCell<Vec<ConfigError>>,
}

impl<'a> ValueDe<'a> {
    fn value(&self) -> &'a Value {
        let mut v = self.value;
        while let Value::Tagged(t) = v {
            v = &t.value;
        }
        v
    }

    fn record(&self, message: String) {
        self.errors
            .borrow_mut()
            .push(ConfigError::new(self.path.clone(), message));
    }

    fn mismatch(&self, expected: &str) {
        self.record(format!(
            "invalid type: expected {expected}, found {}",
            describe(self.value())
        ));
    }

    fn seq(&self, items: &'a [Value]) -> SeqDe<'a> {
        SeqDe {
            items: items.iter().enumerate(),
            path: self.path.clone(),
            errors: self.errors,
        }
    }

    fn map(
        &self,
        mapping: Option<&'a Mapping>,
        fields: Option<&'static [&'static str]>,
    ) -> MapDe<'a> {
        MapDe {
            entries: mapping.map(|m| m.iter().collect()).unwrap_or_default(),
            next: 0,
            fields,
            pending: None,
            path: self.path.clone(),
            errors: self.errors,
        }
    }
}

macro_rules! deserialize_integer {
    ($method:ident, $ty:ty, $visit:ident) => {
        fn $method<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
            match self.value() {
                Value::Number(n) => {
                    let parsed = if let Some(u) = n.as_u64() {
                        Some(<$ty>::try_from(u).ok())
                    } else if let Some(i) = n.as_i64() {
                        Some(<$ty>::try_from(i).ok())
                    } else {
                        None
                    };
                    match parsed {
                        Some(Some(v)) => visitor.$visit(v),
                        Some(None) => {
                            self.record(format!(
                                "invalid value: {n} is out of range {}..={}",
                                <$ty>::MIN,
                                <$ty>::MAX
                            ));
                            visitor.$visit(0)
                        }
                        None => {
                            self.mismatch("an integer");
                            visitor.$visit(0)
                        }
                    }
                }
                Value::Null => visitor.$visit(0),
                Value::String(s) => match yaml11_octal(s).and_then(|u| <$ty>::try_from(u).ok()) {
                    Some(v) => visitor.$visit(v),
                    None => {
                        self.mismatch("an integer");
                        visitor.$visit(0)
                    }
                },
                _ => {
                    self.mismatch("an integer");
                    visitor.$visit(0)
                }
            }
        }
    };
}

impl<'de> de::Deserializer<'de> for ValueDe<'_> {
    type Error = DeError;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        match self.value() {
            Value::Null | Value::Tagged(_) => visitor.visit_unit(),
            Value::Bool(b) => visitor.visit_bool(*b),
            Value::Number(n) => {
                if let Some(u) = n.as_u64() {
                    visitor.visit_u64(u)
                } else if let Some(i) = n.as_i64() {
                    visitor.visit_i64(i)
                } else {
                    visitor.visit_f64(n.as_f64().unwrap_or(f64::NAN))
                }
            }
            Value::String(s) => visitor.visit_str(s),
            Value::Sequence(items) => visitor.visit_seq(self.seq(items)),
            Value::Mapping(m) => visitor.visit_map(self.map(Some(m), None)),
        }
    }

    fn deserialize_bool<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        match self.value() {
            Value::Bool(b) => visitor.visit_bool(*b),
            Value::Null => visitor.visit_bool(false),
            Value::String(s) => match yaml11_bool(s) {
                Some(b) => visitor.visit_bool(b),
                None => {
                    self.mismatch("a boolean");
                    visitor.visit_bool(false)
                }
            },
            _ => {
                self.mismatch("a boolean");
                visitor.visit_bool(false)
            }
        }
    }

    deserialize_integer!(deserialize_i8, i8, visit_i8);
    deserialize_integer!(deserialize_i16, i16, visit_i16);
    deserialize_integer!(deserialize_i32, i32, visit_i32);
    deserialize_integer!(deserialize_i64, i64, visit_i64);
    deserialize_integer!(deserialize_u8, u8, visit_u8);
    deserialize_integer!(deserialize_u16, u16, visit_u16);
    deserialize_integer!(deserialize_u32, u32, visit_u32);
    deserialize_integer!(deserialize_u64, u64, visit_u64);

    fn deserialize_f32<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        self.deserialize_f64(visitor)
    }

    fn deserialize_f64<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        match self.value() {
            Value::Number(n) => visitor.visit_f64(n.as_f64().unwrap_or(f64::NAN)),
            Value::Null => visitor.visit_f64(0.0),
            _ => {
                self.mismatch("a number");
                visitor.visit_f64(0.0)
            }
        }
    }

    fn deserialize_char<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        self.deserialize_str(visitor)
    }

    fn deserialize_str<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        match self.value() {
            Value::String(s) => visitor.visit_str(s),
            Value::Number(n) => visitor.visit_str(&n.to_string()),
            Value::Bool(b) => visitor.visit_str(if *b { "true" } else { "false" }),
            Value::Null => visitor.visit_str(""),
            _ => {
                self.mismatch("a string");
                visitor.visit_str("")
            }
        }
    }

    fn deserialize_string<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        self.deserialize_str(visitor)
    }

    fn deserialize_bytes<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        self.deserialize_any(visitor)
    }

    fn deserialize_byte_buf<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        self.deserialize_any(visitor)
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        match self.value() {
            Value::Null => visitor.visit_none(),
            _ => visitor.visit_some(self),
        }
    }

    fn deserialize_unit<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        visitor.visit_unit()
    }

    fn deserialize_unit_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        visitor: V,
    ) -> Result<V::Value, DeError> {
        visitor.visit_unit()
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        visitor: V,
    ) -> Result<V::Value, DeError> {
        visitor.visit_newtype_struct(self)
    }

    fn deserialize_seq<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        match self.value() {
            Value::Sequence(items) => visitor.visit_seq(self.seq(items)),
            Value::Null => visitor.visit_seq(self.seq(&[])),
            _ => {
                self.mismatch("a list");
                visitor.visit_seq(self.seq(&[]))
            }
        }
    }

    fn deserialize_tuple<V: Visitor<'de>>(
        self,
        _len: usize,
        visitor: V,
    ) -> Result<V::Value, DeError> {
        self.deserialize_seq(visitor)
    }

    fn deserialize_tuple_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _len: usize,
        visitor: V,
    ) -> Result<V::Value, DeError> {
        self.deserialize_seq(visitor)
    }

    fn deserialize_map<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        match self.value() {
            Value::Mapping(m) => visitor.visit_map(self.map(Some(m), None)),
            Value::Null => visitor.visit_map(self.map(None, None)),
            _ => {
                self.mismatch("a mapping");
                visitor.visit_map(self.map(None, None))
            }
        }
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, DeError> {
        match self.value() {
            Value::Mapping(m) => visitor.visit_map(self.map(Some(m), Some(fields))),
            Value::Null => visitor.visit_map(self.map(None, Some(fields))),
            _ => {
                self.mismatch("a mapping");
                visitor.visit_map(self.map(None, Some(fields)))
            }
        }
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, DeError> {
        match self.value() {
            Value::String(s) => visitor.visit_enum(s.as_str().into_deserializer()),
            other => Err(de::Error::custom(format!(
                "invalid type: expected a string, found {}",
                describe(other)
            ))),
        }
    }

    fn deserialize_identifier<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        self.deserialize_str(visitor)
    }

    fn deserialize_ignored_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        visitor.visit_unit()
    }
}

/// Deserializes one child value; a visitor error is recorded at the child's path.
fn child<'de, 'a, T: DeserializeSeed<'de>>(
    seed: T,
    value: &'a Value,
    path: String,
    errors: &'a RefCell<Vec<ConfigError>>,
) -> Result<T::Value, DeError> {
    let de = ValueDe {
        value,
        path: path.clone(),
        errors,
    };
    seed.deserialize(de).map_err(|err| {
        if !err.recorded {
            errors
                .borrow_mut()
                .push(ConfigError::new(path, err.message));
        }
        DeError {
            message: String::new(),
            recorded: true,
        }
    })
}

struct SeqDe<'a> {
    items: std::iter::Enumerate<std::slice::Iter<'a, Value>>,
    path: String,
    errors: &'a RefCell<Vec<ConfigError>>,
}

impl<'de> de::SeqAccess<'de> for SeqDe<'_> {
    type Error = DeError;

    fn next_element_seed<T: DeserializeSeed<'de>>(
        &mut self,
        seed: T,
    ) -> Result<Option<T::Value>, DeError> {
        match self.items.next() {
            None => Ok(None),
            Some((i, item)) => child(seed, item, join_index(&self.path, i), self.errors).map(Some),
        }
    }

    fn size_hint(&self) -> Option<usize> {
        Some(self.items.len())
    }
}

struct MapDe<'a> {
    entries: Vec<(&'a Value, &'a Value)>,
    next: usize,
    /// `Some` when decoding a struct: keys outside this list are reported and skipped.
    fields: Option<&'static [&'static str]>,
    pending: Option<(&'a Value, String)>,
    path: String,
    errors: &'a RefCell<Vec<ConfigError>>,
}

impl<'de> de::MapAccess<'de> for MapDe<'_> {
    type Error = DeError;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, DeError> {
        while let Some((key, value)) = self.entries.get(self.next).copied() {
            self.next += 1;
            let text = scalar_text(key);
            match self.fields {
                Some(fields) => {
                    let Some(name) = text else {
                        self.errors.borrow_mut().push(ConfigError::new(
                            self.path.clone(),
                            format!("invalid key: expected a string, found {}", describe(key)),
                        ));
                        continue;
                    };
                    let path = join_key(&self.path, &name);
                    if !fields.contains(&name.as_str()) {
                        self.errors
                            .borrow_mut()
                            .push(ConfigError::new(path, unknown_field_message(&name, fields)));
                        continue;
                    }
                    self.pending = Some((value, path));
                    let key: de::value::StrDeserializer<'_, DeError> =
                        name.as_str().into_deserializer();
                    return seed.deserialize(key).map(Some);
                }
                None => {
                    let segment = text.unwrap_or_else(|| describe(key));
                    let path = join_key(&self.path, &segment);
                    self.pending = Some((value, path.clone()));
                    return child(seed, key, path, self.errors).map(Some);
                }
            }
        }
        Ok(None)
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, DeError> {
        match self.pending.take() {
            Some((value, path)) => child(seed, value, path, self.errors),
            None => Err(de::Error::custom("value requested before its key")),
        }
    }

    fn size_hint(&self) -> Option<usize> {
        Some(self.entries.len().saturating_sub(self.next))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use serde::Deserialize;

    use super::*;

    #[derive(Debug, Default, Deserialize, PartialEq)]
    #[serde(default, deny_unknown_fields, rename_all = "camelCase")]
    struct Inner {
        mtu: Option<u16>,
        name: Option<String>,
        enabled: Option<bool>,
    }

    #[derive(Debug, Default, Deserialize, PartialEq)]
    #[serde(default, deny_unknown_fields, rename_all = "camelCase")]
    struct Outer {
        items: Vec<Inner>,
        labels: BTreeMap<String, String>,
        free: Option<Value>,
        inner: Option<Inner>,
    }

    fn parse(text: &str) -> Result<Outer, Vec<ConfigError>> {
        let value: Value =
            serde_yaml_ng::from_str(text).map_err(|e| vec![ConfigError::new("", e.to_string())])?;
        decode(&value, "")
    }

    #[test]
    fn decodes_valid_input() {
        let out = parse(
            "items:\n  - mtu: 1500\n    name: 42\n    enabled: yes\nlabels:\n  a: 1\n  b: true\nfree: {x: [1, 2]}\n",
        )
        .expect("valid");
        assert_eq!(out.items[0].mtu, Some(1500));
        assert_eq!(out.items[0].name.as_deref(), Some("42"));
        assert_eq!(out.items[0].enabled, Some(true));
        assert_eq!(out.labels.get("a").map(String::as_str), Some("1"));
        assert!(out.free.is_some());
    }

    #[test]
    fn collects_every_problem() {
        let errs = parse(
            "items:\n  - mtuu: 1500\n  - mtu: 70000\n    enabled: maybe\ninner:\n  name: [1]\n  bogus: 1\nother: 2\n",
        )
        .expect_err("invalid");
        let paths: Vec<&str> = errs.iter().map(|e| e.path.as_str()).collect();
        assert_eq!(
            paths,
            [
                "items[0].mtuu",
                "items[1].mtu",
                "items[1].enabled",
                "inner.name",
                "inner.bogus",
                "other"
            ]
        );
        assert!(
            errs[0].message.contains("did you mean `mtu`"),
            "{}",
            errs[0].message
        );
        assert!(
            errs[1].message.contains("out of range"),
            "{}",
            errs[1].message
        );
    }

    #[test]
    fn wrong_container_types_are_reported() {
        let errs = parse("items: 3\nlabels: [a]\ninner: x\n").expect_err("invalid");
        let paths: Vec<&str> = errs.iter().map(|e| e.path.as_str()).collect();
        assert_eq!(paths, ["items", "labels", "inner"]);
    }
}
