//! A set of Linux capabilities as the kernel stores it (a 64-bit mask), named as capabilities(7)
//! names them (`CAP_NET_ADMIN`), in policies, in `/proc/<pid>/status` and in the audit.

use std::fmt;
use std::str::FromStr;

use caps::Capability;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A set of capabilities: bit `n` is capability number `n` (`CAP_CHOWN` is 0).
///
/// Serialized as a sorted list of names (`["CAP_NET_ADMIN", "CAP_NET_RAW"]`); a bit this build
/// has no name for (a capability newer than the `caps` crate) is written `CAP_<n>`, so that an
/// observed set is never silently shortened.
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct CapSet(u64);

/// A capability name that is neither known to this build nor of the form `CAP_<n>` (n < 64).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown capability {name:?}")]
pub struct UnknownCapability {
    /// The name as given.
    pub name: String,
}

impl CapSet {
    /// The empty set.
    pub const EMPTY: CapSet = CapSet(0);

    /// The set with exactly these bits.
    pub const fn from_bits(bits: u64) -> CapSet {
        CapSet(bits)
    }

    /// The raw mask, as capget(2) and `/proc/<pid>/status` hold it.
    pub const fn bits(self) -> u64 {
        self.0
    }

    /// True when no capability is in the set.
    pub const fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// True when capability number `index` is in the set.
    pub const fn contains_index(self, index: u8) -> bool {
        index < 64 && self.0 & (1 << index) != 0
    }

    /// True when `cap` is in the set.
    pub fn contains(self, cap: Capability) -> bool {
        self.contains_index(cap.index())
    }

    /// The set with `cap` added.
    #[must_use]
    pub fn with(self, cap: Capability) -> CapSet {
        CapSet(self.0 | cap.bitmask())
    }

    /// Union of two sets.
    #[must_use]
    pub const fn union(self, other: CapSet) -> CapSet {
        CapSet(self.0 | other.0)
    }

    /// The capabilities of `self` that are not in `other`.
    #[must_use]
    pub const fn difference(self, other: CapSet) -> CapSet {
        CapSet(self.0 & !other.0)
    }

    /// True when every capability of `self` is in `other`.
    pub const fn is_subset(self, other: CapSet) -> bool {
        self.0 & !other.0 == 0
    }

    /// Parses a hexadecimal mask as `/proc/<pid>/status` prints it (`000001fffeffffff`).
    pub fn from_hex(hex: &str) -> Option<CapSet> {
        u64::from_str_radix(hex.trim(), 16).ok().map(CapSet)
    }

    /// Parses one capability name: `CAP_SYS_ADMIN` (any case), or `CAP_<n>` for a bit number.
    pub fn parse_name(name: &str) -> Result<u8, UnknownCapability> {
        let canonical = name.trim().to_ascii_uppercase();
        if let Ok(cap) = Capability::from_str(&canonical) {
            return Ok(cap.index());
        }
        canonical
            .strip_prefix("CAP_")
            .and_then(|n| n.parse::<u8>().ok())
            .filter(|n| *n < 64)
            .ok_or_else(|| UnknownCapability {
                name: name.to_string(),
            })
    }

    /// The name of capability number `index`: its capabilities(7) name, or `CAP_<n>`.
    pub fn name_of(index: u8) -> String {
        caps::all()
            .into_iter()
            .find(|c| c.index() == index)
            .map(|c| c.to_string())
            .unwrap_or_else(|| format!("CAP_{index}"))
    }

    /// The bit numbers in the set, ascending.
    pub fn indices(self) -> impl Iterator<Item = u8> {
        (0u8..64).filter(move |i| self.contains_index(*i))
    }

    /// The names in the set, in bit order.
    pub fn names(self) -> Vec<String> {
        self.indices().map(CapSet::name_of).collect()
    }
}

impl FromIterator<u8> for CapSet {
    fn from_iter<I: IntoIterator<Item = u8>>(iter: I) -> Self {
        CapSet(
            iter.into_iter()
                .filter(|i| *i < 64)
                .fold(0, |m, i| m | (1 << i)),
        )
    }
}

impl fmt::Debug for CapSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set().entries(self.names()).finish()
    }
}

impl fmt::Display for CapSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_empty() {
            return f.write_str("none");
        }
        f.write_str(&self.names().join(","))
    }
}

impl FromStr for CapSet {
    type Err = UnknownCapability;

    /// Parses a comma-separated list of names; `""` and `"none"` are the empty set.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim();
        if s.is_empty() || s.eq_ignore_ascii_case("none") {
            return Ok(CapSet::EMPTY);
        }
        s.split(',')
            .map(CapSet::parse_name)
            .collect::<Result<CapSet, _>>()
    }
}

impl FromIterator<CapSet> for CapSet {
    fn from_iter<I: IntoIterator<Item = CapSet>>(iter: I) -> Self {
        iter.into_iter().fold(CapSet::EMPTY, CapSet::union)
    }
}

impl Serialize for CapSet {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(self.names())
    }
}

impl<'de> Deserialize<'de> for CapSet {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let names = Vec::<String>::deserialize(deserializer)?;
        names
            .iter()
            .map(|n| CapSet::parse_name(n))
            .collect::<Result<CapSet, _>>()
            .map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_names_and_numbers() {
        let set: CapSet = "CAP_NET_ADMIN,cap_net_raw,CAP_63".parse().unwrap();
        assert!(set.contains(Capability::CAP_NET_ADMIN));
        assert!(set.contains(Capability::CAP_NET_RAW));
        assert!(set.contains_index(63));
        assert_eq!(set.names(), ["CAP_NET_ADMIN", "CAP_NET_RAW", "CAP_63"]);
        assert!("CAP_FLY".parse::<CapSet>().is_err());
        assert!("CAP_64".parse::<CapSet>().is_err());
        assert_eq!("none".parse::<CapSet>().unwrap(), CapSet::EMPTY);
    }

    #[test]
    fn parses_proc_hex() {
        // The bounding set of a root shell on this machine: everything up to 40 but CAP_SYS_RESOURCE.
        let set = CapSet::from_hex("000001fffeffffff").unwrap();
        assert!(set.contains(Capability::CAP_SYS_ADMIN));
        assert!(!set.contains(Capability::CAP_SYS_RESOURCE));
        assert!(set.contains(Capability::CAP_CHECKPOINT_RESTORE));
        assert!(CapSet::from_hex("zz").is_none());
    }

    #[test]
    fn serde_round_trip_is_sorted_names() {
        let set: CapSet = serde_json::from_str(r#"["CAP_NET_RAW","CAP_NET_ADMIN"]"#).unwrap();
        assert_eq!(
            serde_json::to_string(&set).unwrap(),
            r#"["CAP_NET_ADMIN","CAP_NET_RAW"]"#
        );
        assert!(serde_json::from_str::<CapSet>(r#"["CAP_NOPE"]"#).is_err());
    }
}
