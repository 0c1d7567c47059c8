//! Serde adapters that store addresses and prefixes as text (`10.0.0.2/24`, `fd00::1`), so
//! the CBOR spec renders readably in `talosctl get -o yaml` (CBOR is not a human-readable
//! format, so `IpAddr` and `IpNet` would otherwise be encoded as byte arrays).
//!
//! Use as `#[serde(with = "text")]` on a `T`, `text::opt` on an `Option<T>`, `text::vec` on a
//! `Vec<T>`, for any `T: Display + FromStr`.

use std::fmt::Display;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serializer};

/// Serializes as `Display`.
pub fn serialize<T: Display, S: Serializer>(v: &T, s: S) -> Result<S::Ok, S::Error> {
    s.collect_str(v)
}

/// Deserializes with `FromStr`.
pub fn deserialize<'de, T, D>(d: D) -> Result<T, D::Error>
where
    T: FromStr,
    T::Err: Display,
    D: Deserializer<'de>,
{
    String::deserialize(d)?
        .parse()
        .map_err(serde::de::Error::custom)
}

/// For `Option<T>`: `None` is stored as null.
pub mod opt {
    use super::*;

    /// Serializes `Some` as text, `None` as null.
    pub fn serialize<T: Display, S: Serializer>(v: &Option<T>, s: S) -> Result<S::Ok, S::Error> {
        match v {
            Some(v) => s.collect_str(v),
            None => s.serialize_none(),
        }
    }

    /// Deserializes text, null or an empty string (as `None`).
    pub fn deserialize<'de, T, D>(d: D) -> Result<Option<T>, D::Error>
    where
        T: FromStr,
        T::Err: Display,
        D: Deserializer<'de>,
    {
        match Option::<String>::deserialize(d)? {
            None => Ok(None),
            Some(s) if s.is_empty() => Ok(None),
            Some(s) => s.parse().map(Some).map_err(serde::de::Error::custom),
        }
    }
}

/// For `Vec<T>`: a list of texts.
pub mod vec {
    use super::*;

    /// Serializes as a list of texts.
    pub fn serialize<T: Display, S: Serializer>(v: &[T], s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(v.iter().map(ToString::to_string))
    }

    /// Deserializes a list of texts.
    pub fn deserialize<'de, T, D>(d: D) -> Result<Vec<T>, D::Error>
    where
        T: FromStr,
        T::Err: Display,
        D: Deserializer<'de>,
    {
        Vec::<String>::deserialize(d)?
            .into_iter()
            .map(|s| s.parse().map_err(serde::de::Error::custom))
            .collect()
    }
}
