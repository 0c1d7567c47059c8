//! The node's uids against the host's: in container mode a node's daemons run under their
//! manifest uids on the host kernel, so a host user (or a subordinate uid range handed to a
//! container manager) with one of them could read a daemon's memory and files and signal it.
//! `cluster create` refuses to start a node whose manifest uses a uid the host has.

use std::ops::RangeInclusive;
use std::path::Path;

/// Every way the host already uses one of `ranges`, read from `etc` (normally `/etc`) and
/// `proc` (normally `/proc`): users and groups, subordinate id ranges, and processes of the
/// host's own PID namespace (a node's processes, in PID namespaces of their own, are not
/// conflicts: every node of every local cluster uses the same uids).
pub fn conflicts(ranges: &[RangeInclusive<u32>], etc: &Path, proc: &Path) -> Vec<String> {
    let hit = |id: u32| ranges.iter().any(|r| r.contains(&id));
    let overlaps = |lo: u32, hi: u32| ranges.iter().any(|r| lo <= *r.end() && *r.start() <= hi);
    let mut out = Vec::new();
    for (file, what) in [("passwd", "user"), ("group", "group")] {
        let Ok(text) = std::fs::read_to_string(etc.join(file)) else {
            continue;
        };
        for line in text.lines() {
            let mut f = line.split(':');
            let (Some(name), _, Some(id)) = (f.next(), f.next(), f.next()) else {
                continue;
            };
            if let Ok(id) = id.parse::<u32>() {
                if hit(id) {
                    out.push(format!(
                        "host {what} {name:?} has id {id} ({}/{file})",
                        etc.display()
                    ));
                }
            }
        }
    }
    for file in ["subuid", "subgid"] {
        let Ok(text) = std::fs::read_to_string(etc.join(file)) else {
            continue;
        };
        for line in text.lines() {
            let mut f = line.split(':');
            let (Some(name), Some(start), Some(count)) = (f.next(), f.next(), f.next()) else {
                continue;
            };
            let (Ok(start), Ok(count)) = (start.parse::<u32>(), count.trim().parse::<u32>()) else {
                continue;
            };
            if count > 0 && overlaps(start, start.saturating_add(count - 1)) {
                out.push(format!(
                    "{name:?} holds the subordinate range {start}+{count} ({}/{file})",
                    etc.display()
                ));
            }
        }
    }
    let host_pidns = std::fs::read_link(proc.join("self/ns/pid")).ok();
    if let Ok(rd) = std::fs::read_dir(proc) {
        for e in rd.flatten() {
            let name = e.file_name();
            let Some(pid) = name
                .to_str()
                .filter(|n| n.bytes().all(|b| b.is_ascii_digit()))
            else {
                continue;
            };
            let Ok(status) = std::fs::read_to_string(e.path().join("status")) else {
                continue;
            };
            let uid = status
                .lines()
                .find_map(|l| l.strip_prefix("Uid:"))
                .and_then(|l| l.split_whitespace().next())
                .and_then(|u| u.parse::<u32>().ok());
            let Some(uid) = uid.filter(|u| hit(*u)) else {
                continue;
            };
            let pidns = std::fs::read_link(e.path().join("ns/pid")).ok();
            if pidns.is_some() && pidns == host_pidns {
                out.push(format!("host process {pid} runs as uid {uid}"));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn users_groups_and_subordinate_ranges_in_the_node_range_are_conflicts() {
        let dir = tempfile::tempdir().unwrap();
        let etc = dir.path();
        std::fs::write(
            etc.join("passwd"),
            "root:x:0:0::/root:/bin/sh\nalice:x:1000:1000::/home/alice:/bin/sh\nmallory:x:1990000011:1:::\n",
        )
        .unwrap();
        std::fs::write(etc.join("group"), "root:x:0:\nwheel:x:1990000010:\n").unwrap();
        std::fs::write(
            etc.join("subuid"),
            "alice:100000:65536\nbob:1989999000:2000\n",
        )
        .unwrap();
        let ranges = [1_990_000_010..=1_990_000_011, 1_990_002_000..=1_990_002_099];
        let found = conflicts(&ranges, etc, &dir.path().join("no-proc"));
        assert_eq!(found.len(), 3, "{found:#?}");
        assert!(found[0].contains("mallory"));
        assert!(found[1].contains("wheel"));
        assert!(found[2].contains("bob"));
        // This machine's own /etc and /proc: its users are below the node range.
        let here = conflicts(&ranges, Path::new("/etc"), Path::new("/proc"));
        assert!(here.is_empty(), "{here:#?}");
        // And a range that holds uid 0 (root's processes run here) is found in /proc.
        let root = conflicts(&[0..=0], Path::new("/nonexistent"), Path::new("/proc"));
        assert!(
            root.iter().any(|c| c.contains("runs as uid 0")),
            "{root:#?}"
        );
    }
}
