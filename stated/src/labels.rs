//! Label and ID queries, evaluated on metadata only (COSI's semantics, `reference/cosi.md` §2.5).

use std::collections::BTreeMap;

use cosi::error::{ErrorKind, StateError};
use proto::label_term::Operation;

/// A compiled filter of List and kind watches.
#[derive(Clone, Debug, Default)]
pub struct Filter {
    labels: Vec<proto::LabelQuery>,
    id: Option<regex::Regex>,
}

/// Longest ID regular expression accepted.
const MAX_REGEXP: usize = 1024;

impl Filter {
    /// Compiles the queries of a request; a bad regexp or operation is `InvalidArgument`.
    pub fn new(
        labels: Vec<proto::LabelQuery>,
        id: Option<proto::IdQuery>,
    ) -> Result<Self, StateError> {
        for q in &labels {
            for t in &q.terms {
                if Operation::try_from(t.op).is_err() {
                    return Err(StateError::new(
                        ErrorKind::Unimplemented,
                        format!("unsupported label operation {}", t.op),
                    ));
                }
            }
        }
        let id = match id {
            Some(q) if !q.regexp.is_empty() => {
                if q.regexp.len() > MAX_REGEXP {
                    return Err(StateError::new(
                        ErrorKind::InvalidArgument,
                        "id query regexp too long",
                    ));
                }
                Some(
                    regex::RegexBuilder::new(&q.regexp)
                        .size_limit(1 << 20)
                        .build()
                        .map_err(|e| {
                            StateError::new(
                                ErrorKind::InvalidArgument,
                                format!("invalid id query: {e}"),
                            )
                        })?,
                )
            }
            _ => None,
        };
        Ok(Self { labels, id })
    }

    /// Whether the filter accepts everything.
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty() && self.id.is_none()
    }

    /// Whether a resource with this ID and labels matches.
    pub fn matches(&self, id: &str, labels: &BTreeMap<String, String>) -> bool {
        if let Some(re) = &self.id {
            if !re.is_match(id) {
                return false;
            }
        }
        self.labels.is_empty()
            || self
                .labels
                .iter()
                .any(|q| q.terms.iter().all(|t| term(t, labels)))
    }
}

#[allow(deprecated)] // NOT_EXISTS is deprecated on the wire but still sent by old clients.
fn term(t: &proto::LabelTerm, labels: &BTreeMap<String, String>) -> bool {
    let op = Operation::try_from(t.op).unwrap_or(Operation::Exists);
    let value = labels.get(&t.key);
    let first = t.value.first();
    let result = match op {
        Operation::Exists => value.is_some(),
        Operation::NotExists => value.is_none(),
        Operation::Equal => matches!((value, first), (Some(v), Some(w)) if v == w),
        Operation::In => value.is_some_and(|v| t.value.contains(v)),
        Operation::Lt | Operation::Lte | Operation::LtNumeric | Operation::LteNumeric => {
            // Comparisons on a missing key or a non-numeric value are false even when inverted.
            let (Some(v), Some(w)) = (value, first) else {
                return false;
            };
            let ord = if matches!(op, Operation::LtNumeric | Operation::LteNumeric) {
                let (Some(a), Some(b)) = (parse_numeric(v), parse_numeric(w)) else {
                    return false;
                };
                a.cmp(&b)
            } else {
                v.as_str().cmp(w.as_str())
            };
            match op {
                Operation::Lt | Operation::LtNumeric => ord.is_lt(),
                _ => ord.is_le(),
            }
        }
    };
    result != t.invert
}

/// A label value as COSI compares it numerically (`pkg/resource/internal/compare`): the leading
/// run of digits and `-` as a 64-bit integer, then, after spaces, a unit of which only the first
/// two letters (`ki`, `mi`, `gi`, `ti`, `pi`: powers of 1024) or the first letter (`k`, `m`, `g`,
/// `t`, `p`: powers of 1000) count, case-insensitively: "10kg" is 10k, "4GiB" is 4Gi, "4GB" is
/// 4G. Anything else after the number (another number, an unknown unit) is not numeric. The
/// product wraps on overflow as upstream's `int64` does, so both sides compare alike.
fn parse_numeric(s: &str) -> Option<i64> {
    let s = s.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '-'))
        .unwrap_or(s.len());
    let (digits, unit) = s.split_at(split);
    if digits.is_empty() {
        return None;
    }
    let n: i64 = digits.parse().ok()?;
    let unit = unit.trim().to_ascii_lowercase();
    let mult: i64 = if unit.is_empty() {
        1
    } else {
        let two = unit.get(..2);
        match two {
            Some("ki") => 1 << 10,
            Some("mi") => 1 << 20,
            Some("gi") => 1 << 30,
            Some("ti") => 1 << 40,
            Some("pi") => 1 << 50,
            _ => match unit.get(..1) {
                Some("k") => 1_000,
                Some("m") => 1_000_000,
                Some("g") => 1_000_000_000,
                Some("t") => 1_000_000_000_000,
                Some("p") => 1_000_000_000_000_000,
                _ => return None,
            },
        }
    };
    Some(n.wrapping_mul(mult))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(key: &str, op: Operation, value: &[&str], invert: bool) -> proto::LabelTerm {
        proto::LabelTerm {
            key: key.into(),
            op: op as i32,
            value: value.iter().map(|s| s.to_string()).collect(),
            invert,
        }
    }

    fn labels(kv: &[(&str, &str)]) -> BTreeMap<String, String> {
        kv.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    #[allow(deprecated)]
    fn terms() {
        let l = labels(&[("a", "1"), ("size", "2Ki")]);
        assert!(term(&t("a", Operation::Exists, &[], false), &l));
        assert!(!term(&t("a", Operation::Exists, &[], true), &l));
        assert!(term(&t("b", Operation::NotExists, &[], false), &l));
        assert!(term(&t("a", Operation::Equal, &["1"], false), &l));
        assert!(!term(&t("a", Operation::Equal, &[], false), &l));
        assert!(term(&t("a", Operation::In, &["0", "1"], false), &l));
        assert!(term(&t("size", Operation::LtNumeric, &["3000"], false), &l));
        assert!(!term(&t("size", Operation::LtNumeric, &["2k"], false), &l));
        assert!(term(
            &t("size", Operation::LteNumeric, &["2048"], false),
            &l
        ));
        // A comparison on a missing key is false, inverted or not.
        assert!(!term(&t("zz", Operation::Lt, &["5"], true), &l));
        assert!(term(&t("a", Operation::Lt, &["2"], false), &l));
    }

    #[test]
    fn numeric_values_as_cosi_reads_them() {
        // Upstream's own cases (compare_test.go) and the unit prefixes that conformance uses.
        assert_eq!(parse_numeric("4GiB"), Some(4 << 30));
        assert_eq!(parse_numeric("4GB"), Some(4_000_000_000));
        assert_eq!(parse_numeric("10kg"), Some(10_000));
        assert_eq!(parse_numeric(" 1 k"), Some(1_000));
        assert_eq!(parse_numeric("-1 k"), Some(-1_000));
        assert_eq!(parse_numeric("2000"), Some(2000));
        assert_eq!(parse_numeric("1 1"), None);
        assert_eq!(parse_numeric("1.1 k"), None);
        assert_eq!(parse_numeric("1 i"), None);
        assert_eq!(parse_numeric("k"), None);
        assert_eq!(parse_numeric("1-2"), None);
        let l = labels(&[("w", "10kg"), ("mem", "4GiB")]);
        assert!(term(&t("w", Operation::LtNumeric, &["10001"], false), &l));
        assert!(term(&t("w", Operation::LteNumeric, &["10k"], false), &l));
        assert!(!term(&t("mem", Operation::LtNumeric, &["4GB"], false), &l));
        assert!(term(&t("mem", Operation::LteNumeric, &["4Gi"], false), &l));
    }

    #[test]
    fn queries_or_terms_and() {
        let f = Filter::new(
            vec![
                proto::LabelQuery {
                    terms: vec![
                        t("a", Operation::Equal, &["1"], false),
                        t("b", Operation::Exists, &[], false),
                    ],
                },
                proto::LabelQuery {
                    terms: vec![t("c", Operation::Exists, &[], false)],
                },
            ],
            Some(proto::IdQuery {
                regexp: "^eth".into(),
            }),
        )
        .unwrap();
        assert!(f.matches("eth0", &labels(&[("a", "1"), ("b", "")])));
        assert!(f.matches("eth0", &labels(&[("c", "")])));
        assert!(!f.matches("eth0", &labels(&[("a", "1")])));
        assert!(!f.matches("lo", &labels(&[("c", "")])));
        assert!(Filter::new(vec![], Some(proto::IdQuery { regexp: "(".into() })).is_err());
    }
}
