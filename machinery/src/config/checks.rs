//! Syntax checks of values in the configuration: IP addresses, CIDRs, URLs, DNS names, durations,
//! sizes, base64, Kubernetes label syntax.

use std::net::IpAddr;

/// Parses an IP address.
pub(crate) fn parse_ip(s: &str) -> Result<IpAddr, String> {
    s.parse::<IpAddr>()
        .map_err(|_| format!("failed to parse IP address {s:?}"))
}

/// Parses `address/prefix`.
pub(crate) fn parse_cidr(s: &str) -> Result<(IpAddr, u8), String> {
    let Some((addr, prefix)) = s.split_once('/') else {
        return Err(format!("invalid CIDR address {s:?}: missing prefix length"));
    };
    let ip = addr
        .parse::<IpAddr>()
        .map_err(|_| format!("invalid CIDR address {s:?}: bad IP address"))?;
    let max = if ip.is_ipv4() { 32 } else { 128 };
    match prefix.parse::<u8>() {
        Ok(p) if p <= max && !prefix.starts_with('+') => Ok((ip, p)),
        _ => Err(format!(
            "invalid CIDR address {s:?}: prefix length must be 0..={max}"
        )),
    }
}

/// Accepts `address/prefix` or a bare address.
pub(crate) fn check_ip_or_cidr(s: &str) -> Result<(), String> {
    if s.contains('/') {
        parse_cidr(s).map(|_| ())
    } else {
        parse_ip(s).map(|_| ())
    }
}

/// DNS name syntax as upstream checks it: labels of letters, digits, `_` and `-` (not leading),
/// at most 63 characters each, optional trailing dot.
pub(crate) fn is_valid_dns_name(name: &str) -> bool {
    if name.is_empty() || name.len() - name.matches('.').count() > 255 {
        return false;
    }
    let trimmed = name
        .strip_suffix('.')
        .or_else(|| name.strip_suffix('_'))
        .unwrap_or(name);
    if trimmed.is_empty() {
        return false;
    }
    trimmed.split('.').all(|label| {
        let mut chars = label.chars();
        match chars.next() {
            Some(c) if c.is_ascii_alphanumeric() || c == '_' => {}
            _ => return false,
        }
        label.len() <= 63 && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
    })
}

/// Hostname syntax (RFC 1123): labels of letters, digits and `-`, at most 63 characters each,
/// at most 253 characters in total.
pub(crate) fn is_valid_hostname(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && !label.starts_with('-')
                && !label.ends_with('-')
                && label.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
        })
}

/// Checks `host:port` (IPv6 hosts in brackets); the port must be 1..=65535.
pub(crate) fn check_host_port(s: &str) -> Result<(), String> {
    let (host, port) = if let Some(rest) = s.strip_prefix('[') {
        let Some((host, port)) = rest.split_once("]:") else {
            return Err(format!("{s:?} is not a host:port address"));
        };
        parse_ip(host)?;
        (host, port)
    } else {
        let Some((host, port)) = s.rsplit_once(':') else {
            return Err(format!("{s:?} has no port"));
        };
        if host.contains(':') {
            return Err(format!("{s:?}: IPv6 addresses must be in brackets"));
        }
        (host, port)
    };
    if host.is_empty() {
        return Err(format!("{s:?} has no host"));
    }
    match port.parse::<u16>() {
        Ok(p) if p > 0 && port.chars().all(|c| c.is_ascii_digit()) => Ok(()),
        _ => Err(format!("{s:?} has an invalid port")),
    }
}

/// A parsed URL: enough of RFC 3986 to check endpoints.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Url<'a> {
    pub scheme: &'a str,
    pub host: &'a str,
    pub port: Option<u16>,
    pub path: &'a str,
}

/// Parses `scheme://host[:port][/path][?query][#fragment]`.
pub(crate) fn parse_url(s: &str) -> Result<Url<'_>, String> {
    if s.is_empty() {
        return Err("URL is empty".to_owned());
    }
    if s.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(format!("URL {s:?} contains whitespace"));
    }
    let Some((scheme, rest)) = s.split_once("://") else {
        return Err(format!(
            "URL {s:?} has no scheme (expected e.g. https://host:port)"
        ));
    };
    let mut chars = scheme.chars();
    let scheme_ok = chars.next().is_some_and(|c| c.is_ascii_alphabetic())
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'));
    if !scheme_ok {
        return Err(format!("URL {s:?} has an invalid scheme {scheme:?}"));
    }
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, path) = rest.split_at(end);
    let path = path.split(['?', '#']).next().unwrap_or("");
    let hostport = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    let (host, port) = if let Some(v6) = hostport.strip_prefix('[') {
        let Some((host, after)) = v6.split_once(']') else {
            return Err(format!("URL {s:?} has an unterminated IPv6 address"));
        };
        if host.parse::<std::net::Ipv6Addr>().is_err() {
            return Err(format!("URL {s:?} has an invalid IPv6 address"));
        }
        match after.strip_prefix(':') {
            Some(p) => (host, Some(p)),
            None if after.is_empty() => (host, None),
            None => return Err(format!("URL {s:?} has garbage after the IPv6 address")),
        }
    } else {
        match hostport.split_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (hostport, None),
        }
    };
    if host.is_empty() {
        return Err(format!("URL {s:?} has no host"));
    }
    if !host
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_' | ':' | '%'))
    {
        return Err(format!("URL {s:?} has an invalid host {host:?}"));
    }
    let port = match port {
        None => None,
        Some(p) => match p.parse::<u16>() {
            Ok(n) if n > 0 && p.chars().all(|c| c.is_ascii_digit()) => Some(n),
            _ => return Err(format!("URL {s:?} has an invalid port {p:?}")),
        },
    };
    Ok(Url {
        scheme,
        host,
        port,
        path,
    })
}

/// Decodes standard, padded base64.
pub(crate) fn decode_base64(s: &str) -> Option<Vec<u8>> {
    fn sextet(c: u8) -> Option<u32> {
        match c {
            b'A'..=b'Z' => Some(u32::from(c - b'A')),
            b'a'..=b'z' => Some(u32::from(c - b'a') + 26),
            b'0'..=b'9' => Some(u32::from(c - b'0') + 52),
            b'+' => Some(62),
            b'/' => Some(63),
            _ => None,
        }
    }
    let bytes = s.as_bytes();
    if !bytes.len().is_multiple_of(4) {
        return None;
    }
    let mut out = Vec::with_capacity(bytes.len() / 4 * 3);
    for (i, chunk) in bytes.chunks(4).enumerate() {
        let last = i + 1 == bytes.len() / 4;
        let pad = chunk.iter().rev().take_while(|&&c| c == b'=').count();
        if pad > 2 || (pad > 0 && !last) {
            return None;
        }
        let mut n = 0u32;
        for &c in &chunk[..4 - pad] {
            n = (n << 6) | sextet(c)?;
        }
        n <<= 6 * pad as u32;
        let b = n.to_be_bytes();
        out.extend_from_slice(&b[1..4 - pad]);
    }
    Some(out)
}

/// Checks a Go `time.Duration` string (`1h30m`, `10s`, `500ms`, `0`).
pub(crate) fn check_go_duration(s: &str) -> Result<(), String> {
    parse_go_duration(s).map(|_| ())
}

/// Parses a Go `time.Duration` string (`1h30m`, `8760h`, `1.5s`, `0`); a negative one is
/// an error here (`-1s` is a valid Go duration but no lifetime).
pub fn parse_go_duration(s: &str) -> Result<std::time::Duration, String> {
    let err = || format!("{s:?} is not a valid duration (e.g. 1h30m, 10s, 500ms)");
    let negative = s.starts_with('-');
    let body = s.strip_prefix(['-', '+']).unwrap_or(s);
    if body == "0" {
        return Ok(std::time::Duration::ZERO);
    }
    if body.is_empty() {
        return Err(err());
    }
    let mut total = 0f64;
    let mut rest = body;
    while !rest.is_empty() {
        let num_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(err)?;
        let number = &rest[..num_len];
        if number.is_empty() || number == "." || number.matches('.').count() > 1 {
            return Err(err());
        }
        let value: f64 = number.parse().map_err(|_| err())?;
        rest = &rest[num_len..];
        let (unit, seconds) = [
            ("ns", 1e-9),
            ("us", 1e-6),
            ("µs", 1e-6),
            ("μs", 1e-6),
            ("ms", 1e-3),
            ("s", 1.0),
            ("m", 60.0),
            ("h", 3600.0),
        ]
        .into_iter()
        .filter(|(u, _)| rest.starts_with(*u))
        .max_by_key(|(u, _)| u.len())
        .ok_or_else(err)?;
        rest = &rest[unit.len()..];
        total += value * seconds;
    }
    if negative {
        // Valid for Go (and for check_go_duration); never a lifetime.
        return Ok(std::time::Duration::ZERO);
    }
    std::time::Duration::try_from_secs_f64(total).map_err(|_| err())
}

/// Parses a human readable size (`4GB`, `100 MiB`, `1024`) into bytes (go-humanize rules).
pub(crate) fn parse_byte_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    let number: f64 = number.parse().map_err(|_| format!("invalid size {s:?}"))?;
    let multiplier: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "kb" => 1e3,
        "ki" | "kib" => 1024.0,
        "m" | "mb" => 1e6,
        "mi" | "mib" => 1024f64.powi(2),
        "g" | "gb" => 1e9,
        "gi" | "gib" => 1024f64.powi(3),
        "t" | "tb" => 1e12,
        "ti" | "tib" => 1024f64.powi(4),
        "p" | "pb" => 1e15,
        "pi" | "pib" => 1024f64.powi(5),
        "e" | "eb" => 1e18,
        "ei" | "eib" => 1024f64.powi(6),
        other => return Err(format!("invalid size {s:?}: unknown unit {other:?}")),
    };
    let bytes = number * multiplier;
    if !bytes.is_finite() || bytes >= u64::MAX as f64 {
        return Err(format!("invalid size {s:?}: too large"));
    }
    Ok(bytes as u64)
}

/// Checks an install disk size condition: `[>=|<=|>|<|==] size`.
pub(crate) fn check_size_condition(s: &str) -> Result<(), String> {
    let t = s.trim();
    let rest = ["==", ">=", "<=", ">", "<"]
        .iter()
        .find_map(|op| t.strip_prefix(op))
        .unwrap_or(t);
    parse_byte_size(rest).map(|_| ())
}

fn is_label_name(s: &str) -> bool {
    let bytes = s.as_bytes();
    !s.is_empty()
        && s.len() <= 63
        && bytes.first().is_some_and(u8::is_ascii_alphanumeric)
        && bytes.last().is_some_and(u8::is_ascii_alphanumeric)
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

fn is_dns_subdomain(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.split('.').all(|l| {
            !l.is_empty()
                && l.len() <= 63
                && l.chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
                && !l.starts_with('-')
                && !l.ends_with('-')
        })
}

/// Checks a Kubernetes label (or annotation) key: `[prefix/]name`.
pub(crate) fn check_label_key(key: &str) -> Result<(), String> {
    let (prefix, name) = match key.rsplit_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    if let Some(p) = prefix {
        if !is_dns_subdomain(p) {
            return Err(format!(
                "key {key:?}: prefix must be a DNS subdomain (lowercase, at most 253 characters)"
            ));
        }
    }
    if !is_label_name(name) {
        return Err(format!(
            "key {key:?}: name must be at most 63 alphanumeric characters, '-', '_' or '.', starting and ending with an alphanumeric character"
        ));
    }
    Ok(())
}

/// Checks a Kubernetes label value (may be empty).
pub(crate) fn check_label_value(value: &str) -> Result<(), String> {
    if value.is_empty() || is_label_name(value) {
        Ok(())
    } else {
        Err(format!(
            "value {value:?} must be at most 63 alphanumeric characters, '-', '_' or '.', starting and ending with an alphanumeric character"
        ))
    }
}

/// Checks a taint value: `value`, `value:Effect` or `:Effect`.
pub(crate) fn check_taint_value(value: &str) -> Result<(), String> {
    let (v, effect) = match value.rsplit_once(':') {
        Some((v, e)) => (v, Some(e)),
        None => (value, None),
    };
    if let Some(e) = effect {
        if !matches!(e, "NoSchedule" | "PreferNoSchedule" | "NoExecute") {
            return Err(format!(
                "taint effect {e:?} must be one of NoSchedule, PreferNoSchedule, NoExecute"
            ));
        }
    }
    check_label_value(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_durations_parse_as_go_reads_them() {
        let d = |s| parse_go_duration(s).unwrap().as_secs_f64();
        assert_eq!(d("8760h"), 8760.0 * 3600.0);
        assert_eq!(d("1h30m"), 5400.0);
        assert_eq!(d("1.5s"), 1.5);
        assert_eq!(d("500ms"), 0.5);
        assert_eq!(d("0"), 0.0);
        assert!(parse_go_duration("1y").is_err());
        assert!(parse_go_duration("h").is_err());
        assert!(check_go_duration("-1s").is_ok());
    }

    #[test]
    fn cidrs_and_ips() {
        assert!(parse_cidr("10.0.0.0/8").is_ok());
        assert!(parse_cidr("fd00::/64").is_ok());
        assert!(parse_cidr("10.0.0.0/33").is_err());
        assert!(parse_cidr("10.0.0/8").is_err());
        assert!(parse_cidr("10.0.0.1").is_err());
        assert!(check_ip_or_cidr("192.168.1.1").is_ok());
        assert!(check_ip_or_cidr("192.168.1.300").is_err());
    }

    #[test]
    fn dns_names() {
        assert!(is_valid_dns_name("cluster.local"));
        assert!(is_valid_dns_name("cluster.local."));
        assert!(!is_valid_dns_name("-bad.local"));
        assert!(!is_valid_dns_name("bad..local"));
        assert!(!is_valid_dns_name(""));
        assert!(is_valid_hostname("cp-1"));
        assert!(!is_valid_hostname("cp_1"));
    }

    #[test]
    fn urls() {
        let u = parse_url("https://10.0.0.10:6443").expect("valid");
        assert_eq!(
            (u.scheme, u.host, u.port, u.path),
            ("https", "10.0.0.10", Some(6443), "")
        );
        let u = parse_url("https://[fd00::1]:6443/").expect("valid");
        assert_eq!((u.host, u.port, u.path), ("fd00::1", Some(6443), "/"));
        assert!(parse_url("10.0.0.10:6443").is_err());
        assert!(parse_url("https://:6443").is_err());
        assert!(parse_url("https://host:99999").is_err());
        assert!(parse_url("https://ho st").is_err());
        assert!(check_host_port("1.2.3.4:51820").is_ok());
        assert!(check_host_port("[fd00::1]:51820").is_ok());
        assert!(check_host_port("1.2.3.4").is_err());
    }

    #[test]
    fn base64() {
        assert_eq!(decode_base64("aGVsbG8=").as_deref(), Some(&b"hello"[..]));
        assert_eq!(decode_base64("aGVsbG8h").as_deref(), Some(&b"hello!"[..]));
        assert_eq!(decode_base64("aGVsbA==").as_deref(), Some(&b"hell"[..]));
        assert!(decode_base64("aGVsbG8").is_none());
        assert!(decode_base64("a=Vs").is_none());
        assert_eq!(
            decode_base64("GA1E1VB+g41Dl0+UH2TMW9C5953y+moVg6JIIqkJbmw=").map(|v| v.len()),
            Some(32)
        );
    }

    #[test]
    fn durations_and_sizes() {
        for ok in [
            "0",
            "1h",
            "1h30m",
            "10s",
            "500ms",
            "1.5h",
            "8760h0m0s",
            "-1s",
        ] {
            assert!(check_go_duration(ok).is_ok(), "{ok}");
        }
        for bad in ["", "1", "h", "1x", "1h30", "1..5s"] {
            assert!(check_go_duration(bad).is_err(), "{bad}");
        }
        assert_eq!(parse_byte_size("4GB"), Ok(4_000_000_000));
        assert_eq!(parse_byte_size("100 MiB"), Ok(100 * 1024 * 1024));
        assert_eq!(parse_byte_size("1024"), Ok(1024));
        assert!(parse_byte_size("4 XB").is_err());
        assert!(check_size_condition(">= 1TB").is_ok());
        assert!(check_size_condition("<=2TB").is_ok());
    }

    #[test]
    fn labels() {
        assert!(check_label_key("node.kubernetes.io/exclude-from-external-load-balancers").is_ok());
        assert!(check_label_key("Bad_Prefix/x").is_err());
        assert!(check_label_key("-x").is_err());
        assert!(check_label_value("").is_ok());
        assert!(check_label_value("a b").is_err());
        assert!(check_taint_value("value:NoSchedule").is_ok());
        assert!(check_taint_value(":NoExecute").is_ok());
        assert!(check_taint_value("value:Sometimes").is_err());
    }
}
