//! Device selectors of `machine.network.interfaces[].deviceSelector` and
//! `bond.deviceSelectors`, matched against LinkStatus (upstream `DeviceConfigController`).
//!
//! Every set criterion must match (glob patterns as Go's `filepath.Match`). Unlike upstream, a
//! selector matches only physical links unless it says `physical: false`: a VLAN or bond has
//! the MAC address of its parent, and matching it made Talos try to enslave a VLAN to its own
//! bond (upstream issue #7331).

use machinery::config::v1alpha1::DeviceSelector;
use machinery::resources::network::LinkStatus;

/// Whether `link` satisfies every criterion of `selector`.
pub fn matches(selector: &DeviceSelector, link: &LinkStatus) -> bool {
    let s = &link.spec;
    let physical_wanted = selector.physical.unwrap_or(true);
    if physical_wanted && !s.physical() {
        return false;
    }
    let checks: [(&Option<String>, String, bool); 5] = [
        (&selector.hardware_addr, s.hardware_addr.to_string(), true),
        (&selector.permanent_addr, s.permanent_addr.to_string(), true),
        (&selector.bus_path, s.bus_path.clone(), false),
        (&selector.pci_id, s.pci_id.clone(), false),
        (&selector.driver, s.driver.clone(), false),
    ];
    checks
        .iter()
        .all(|(pattern, value, lowercase)| match pattern {
            None => true,
            Some(p) if *lowercase => glob(&p.to_lowercase(), value),
            Some(p) => glob(p, value),
        })
}

/// The names of the links `selector` matches, sorted by name.
pub fn select<'a>(selector: &DeviceSelector, links: &'a [LinkStatus]) -> Vec<&'a str> {
    let mut names: Vec<&str> = links
        .iter()
        .filter(|l| matches(selector, l))
        .map(|l| l.metadata.id.as_str())
        .collect();
    names.sort_unstable();
    names
}

/// Shell-style pattern matching as Go's `filepath.Match`: `*` (any run), `?` (one character),
/// `[a-z]`, `[!a-z]` or `[^a-z]` (a class), `\x` (a literal). A malformed class matches
/// nothing.
pub fn glob(pattern: &str, text: &str) -> bool {
    let p: Vec<char> = pattern.chars().collect();
    let t: Vec<char> = text.chars().collect();
    glob_at(&p, &t)
}

fn glob_at(p: &[char], t: &[char]) -> bool {
    let Some((&first, rest)) = p.split_first() else {
        return t.is_empty();
    };
    match first {
        '*' => (0..=t.len()).any(|skip| glob_at(rest, &t[skip..])),
        '?' => !t.is_empty() && glob_at(rest, &t[1..]),
        '[' => {
            let Some((&c, t_rest)) = t.split_first() else {
                return false;
            };
            match class(rest, c) {
                Some((true, after)) => glob_at(after, t_rest),
                _ => false,
            }
        }
        '\\' => match rest.split_first() {
            Some((&lit, after)) => t.first() == Some(&lit) && glob_at(after, &t[1..]),
            None => false,
        },
        lit => t.first() == Some(&lit) && glob_at(rest, &t[1..]),
    }
}

/// Matches `c` against the class starting after `[`; returns whether it matched and the
/// pattern after `]`, or `None` if the class is not closed.
fn class(p: &[char], c: char) -> Option<(bool, &[char])> {
    let (negate, mut i) = match p.first() {
        Some('!' | '^') => (true, 1),
        _ => (false, 0),
    };
    let mut matched = false;
    let mut first = true;
    loop {
        let &lo = p.get(i)?;
        if lo == ']' && !first {
            return Some((matched != negate, &p[i + 1..]));
        }
        first = false;
        i += 1;
        if p.get(i) == Some(&'-') && p.get(i + 1).is_some_and(|h| *h != ']') {
            let hi = p[i + 1];
            matched |= lo <= c && c <= hi;
            i += 2;
        } else {
            matched |= lo == c;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cosi::Resource;
    use machinery::resources::network::{HardwareAddr, LinkStatusSpec, LinkType};

    fn link(name: &str, mac: &str, driver: &str, kind: &str) -> LinkStatus {
        Resource::new_default(
            name,
            LinkStatusSpec {
                r#type: LinkType::ETHER,
                kind: kind.into(),
                hardware_addr: mac.parse::<HardwareAddr>().expect("mac"),
                driver: driver.into(),
                bus_path: "pci-0000:00:1f.6".into(),
                ..Default::default()
            },
        )
    }

    #[test]
    fn globs() {
        assert!(glob("0c:c4:7a:*", "0c:c4:7a:00:11:22"));
        assert!(!glob("0c:c4:7a:*", "0c:c4:7b:00:11:22"));
        assert!(glob("eth?", "eth1"));
        assert!(glob("eth[0-2]", "eth2"));
        assert!(!glob("eth[!0-2]", "eth2"));
        assert!(glob("*", ""));
        assert!(!glob("eth[0-", "eth0"));
        assert!(glob(r"a\*", "a*"));
    }

    #[test]
    fn selectors_match_physical_links_only_by_default() {
        let links = vec![
            link("eth1", "0c:c4:7a:00:00:02", "ixgbe", ""),
            link("eth0", "0c:c4:7a:00:00:01", "ixgbe", ""),
            link("bond0.10", "0c:c4:7a:00:00:01", "", "vlan"),
            link("eth2", "aa:bb:cc:00:00:01", "e1000", ""),
        ];
        let sel = DeviceSelector {
            hardware_addr: Some("0C:C4:7A:*".into()),
            driver: Some("ixgbe".into()),
            ..Default::default()
        };
        assert_eq!(select(&sel, &links), ["eth0", "eth1"]);
        let any = DeviceSelector {
            hardware_addr: Some("0c:c4:7a:00:00:01".into()),
            physical: Some(false),
            ..Default::default()
        };
        assert_eq!(select(&any, &links), ["bond0.10", "eth0"]);
        let bus = DeviceSelector {
            bus_path: Some("pci-0000:00:*".into()),
            driver: Some("e1000".into()),
            ..Default::default()
        };
        assert_eq!(select(&bus, &links), ["eth2"]);
    }
}
