//! Error and warning types of the machine configuration, each carrying the path of the value it is about.

use std::fmt;

/// One problem found while decoding or validating a machine configuration.
///
/// `path` names the offending value in the document, e.g. `machine.network.interfaces[0].mtu`;
/// it is empty for problems about the configuration as a whole, and `document[N]` for problems
/// about the N-th (0-based) YAML document of a multi-document configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// Where the problem is, in `a.b[0].c` notation.
    pub path: String,
    /// What the problem is.
    pub message: String,
}

impl ConfigError {
    /// Creates an error about the value at `path`.
    pub fn new(path: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            path: path.into(),
            message: message.into(),
        }
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.path.is_empty() {
            f.write_str(&self.message)
        } else {
            write!(f, "{}: {}", self.path, self.message)
        }
    }
}

impl std::error::Error for ConfigError {}

/// Every problem found in a machine configuration; never empty when returned as an error.
///
/// Its `Display` lists one problem per line.
#[derive(Debug, Clone, PartialEq, Eq, Default, thiserror::Error)]
#[error("{}", display_lines(&self.errors))]
pub struct ConfigErrors {
    /// The problems, in the order they were found.
    pub errors: Vec<ConfigError>,
}

fn display_lines<T: fmt::Display>(items: &[T]) -> String {
    items
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("\n")
}

impl ConfigErrors {
    /// Wraps a list of problems.
    pub fn new(errors: Vec<ConfigError>) -> Self {
        Self { errors }
    }

    /// A single problem.
    pub fn single(path: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            errors: vec![ConfigError::new(path, message)],
        }
    }

    /// The problems.
    pub fn errors(&self) -> &[ConfigError] {
        &self.errors
    }

    /// Number of problems.
    pub fn len(&self) -> usize {
        self.errors.len()
    }

    /// True if there is no problem.
    pub fn is_empty(&self) -> bool {
        self.errors.is_empty()
    }

    /// True if some problem is about exactly `path`.
    pub fn has_path(&self, path: &str) -> bool {
        self.errors.iter().any(|e| e.path == path)
    }
}

impl IntoIterator for ConfigErrors {
    type Item = ConfigError;
    type IntoIter = std::vec::IntoIter<ConfigError>;

    fn into_iter(self) -> Self::IntoIter {
        self.errors.into_iter()
    }
}

impl<'a> IntoIterator for &'a ConfigErrors {
    type Item = &'a ConfigError;
    type IntoIter = std::slice::Iter<'a, ConfigError>;

    fn into_iter(self) -> Self::IntoIter {
        self.errors.iter()
    }
}

/// A non-fatal finding of validation (deprecated field, legacy value), with the path it is about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Warning {
    /// Where the finding is, in `a.b[0].c` notation (empty for the whole configuration).
    pub path: String,
    /// What was found.
    pub message: String,
}

impl Warning {
    /// Creates a warning about the value at `path`.
    pub fn new(path: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            path: path.into(),
            message: message.into(),
        }
    }
}

impl fmt::Display for Warning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.path.is_empty() {
            f.write_str(&self.message)
        } else {
            write!(f, "{}: {}", self.path, self.message)
        }
    }
}

/// Appends a map key to a path: `a.b` + `c` = `a.b.c`; keys that are not plain identifiers are
/// quoted, `machine.sysctls` + `net.ipv4.ip_forward` = `machine.sysctls["net.ipv4.ip_forward"]`.
pub(crate) fn join_key(base: &str, key: &str) -> String {
    let plain = !key.is_empty()
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-' || c == '$');
    match (base.is_empty(), plain) {
        (true, true) => key.to_owned(),
        (false, true) => format!("{base}.{key}"),
        (_, false) => format!("{base}[{key:?}]"),
    }
}

/// Appends a list index to a path: `a.b` + 3 = `a.b[3]`.
pub(crate) fn join_index(base: &str, index: usize) -> String {
    format!("{base}[{index}]")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_joined() {
        assert_eq!(join_key("", "machine"), "machine");
        assert_eq!(join_key("machine", "network"), "machine.network");
        assert_eq!(
            join_key("machine.sysctls", "net.ipv4.ip_forward"),
            "machine.sysctls[\"net.ipv4.ip_forward\"]"
        );
        assert_eq!(join_index("a.b", 3), "a.b[3]");
    }

    #[test]
    fn errors_display_one_per_line() {
        let errs = ConfigErrors::new(vec![
            ConfigError::new("a.b", "first"),
            ConfigError::new("", "second"),
        ]);
        assert_eq!(errs.to_string(), "a.b: first\nsecond");
        assert!(errs.has_path("a.b"));
        assert_eq!(errs.len(), 2);
    }
}
