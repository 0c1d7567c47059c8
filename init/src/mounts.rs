//! The node's mounted filesystems as upstream's `machine.Mounts` reports them: every entry of
//! `/proc/mounts` whose mount point is a directory, with its size and available bytes from
//! statfs(2).

use std::path::Path;

use proto::init::MountStat;

/// `/proc/mounts` escapes space, tab, newline and backslash as `\ooo`.
fn unescape(field: &str) -> String {
    let b = field.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let octal = b
            .get(i + 1..i + 4)
            .filter(|d| d.iter().all(|c| (b'0'..=b'7').contains(c)));
        if let (b'\\', Some(d)) = (b[i], octal) {
            let v = d.iter().fold(0u32, |v, c| v * 8 + u32::from(c - b'0'));
            out.push(u8::try_from(v).unwrap_or(b'?'));
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// (source, mount point) of each line of a `/proc/mounts` text.
pub fn parse(text: &str) -> Vec<(String, String)> {
    text.lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            Some((unescape(f.next()?), unescape(f.next()?)))
        })
        .collect()
}

/// Every mount of `proc_mounts` with its statfs figures; mounts that cannot be measured (gone
/// meanwhile, not a directory) are left out, as upstream does.
pub fn stats(proc_mounts: &Path) -> std::io::Result<Vec<MountStat>> {
    let text = std::fs::read_to_string(proc_mounts)?;
    Ok(parse(&text)
        .into_iter()
        .filter_map(|(filesystem, mounted_on)| {
            let dir = Path::new(&mounted_on);
            if !dir.is_dir() {
                return None;
            }
            let s = nix::sys::statfs::statfs(dir).ok()?;
            #[allow(clippy::useless_conversion, clippy::unnecessary_cast)] // c types differ by arch
            let bsize = s.block_size() as u64;
            Some(MountStat {
                filesystem,
                size: bsize.saturating_mul(s.blocks()),
                available: bsize.saturating_mul(s.blocks_available()),
                mounted_on,
            })
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_and_escapes() {
        let m = parse("proc /proc proc rw 0 0\n/dev/vda1 /var/mnt/a\\040b xfs rw 0 0\nbad\n");
        assert_eq!(
            m,
            [
                ("proc".to_string(), "/proc".to_string()),
                ("/dev/vda1".to_string(), "/var/mnt/a b".to_string())
            ]
        );
        assert_eq!(unescape("a\\134b\\011"), "a\\b\t");
        assert_eq!(unescape("end\\04"), "end\\04");
        assert_eq!(unescape("\\777x"), "?x");
    }

    #[test]
    fn this_processes_mounts_are_measured() {
        let s = stats(Path::new("/proc/self/mounts")).unwrap();
        let root = s
            .iter()
            .find(|m| m.mounted_on == "/")
            .expect("/ is mounted");
        assert!(root.size > 0 && root.available <= root.size, "{root:?}");
    }
}
