//! Replaying the fuzz corpora in the normal test suite: every file of `fuzz/corpus/<target>/`
//! goes through the same library entry the cargo-fuzz target `fuzz/fuzz_targets/<target>.rs`
//! calls, so that CI runs every corpus (and every crash kept in it) without cargo-fuzz.
//!
//! Targets are named `<crate>_<what>`, and the crate's own tests replay them with
//! [`replay_crate`], which fails if the crate has a target it does not replay.

use std::path::{Path, PathBuf};

/// Crates whose tests replay their fuzz targets: a target of another crate would be replayed
/// by no test, so [`targets`] refuses it (add the crate here and a replay to its tests).
pub const REPLAYING_CRATES: &[&str] = &["stated", "machinery", "networkd"];

/// The `fuzz/` directory of the repository.
pub fn fuzz_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap_or(Path::new(".."))
        .join("fuzz")
}

/// Every fuzz target (`fuzz/fuzz_targets/*.rs`), sorted by name.
pub fn targets() -> Vec<String> {
    let dir = fuzz_dir().join("fuzz_targets");
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", dir.display()))
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            e.file_name()
                .to_str()
                .and_then(|n| n.strip_suffix(".rs"))
                .map(str::to_string)
        })
        .collect();
    names.sort();
    for n in &names {
        let krate = n.split('_').next().unwrap_or_default();
        assert!(
            REPLAYING_CRATES.contains(&krate),
            "fuzz target {n} is not named <crate>_<what> for a crate of {REPLAYING_CRATES:?}: \
             no test would replay its corpus"
        );
    }
    names
}

/// The corpus files of `target`, sorted.
pub fn corpus(target: &str) -> Vec<PathBuf> {
    let dir = fuzz_dir().join("corpus").join(target);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", dir.display()))
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    files
}

thread_local! {
    static PANICS: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// Counts every panic of the calling thread from now on, also those caught on the way (a task
/// of a current-thread runtime, a `catch_unwind` guard): what a fuzzer would report.
fn count_panics() {
    static HOOK: std::sync::Once = std::sync::Once::new();
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            PANICS.with(|p| p.set(p.get() + 1));
            previous(info);
        }));
    });
}

fn panics() -> usize {
    PANICS.with(std::cell::Cell::get)
}

/// Replays every corpus file of `target` through `entry` on the calling thread; returns how
/// many files there are, or the files that panicked (even where the panic was caught).
pub fn replay(target: &str, entry: &dyn Fn(&[u8])) -> Result<usize, Vec<String>> {
    count_panics();
    let files = corpus(target);
    let mut failed = Vec::new();
    for f in &files {
        let data = std::fs::read(f).unwrap_or_else(|e| panic!("cannot read {}: {e}", f.display()));
        let before = panics();
        let unwound = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| entry(&data)));
        if unwound.is_err() || panics() != before {
            failed.push(f.display().to_string());
        }
    }
    if failed.is_empty() {
        Ok(files.len())
    } else {
        Err(failed)
    }
}

/// A fuzz target's name and the library entry its corpus goes through.
pub type Entry<'a> = (&'a str, &'a dyn Fn(&[u8]));

/// Replays the corpus of every target of `krate` through its entry in `entries`: fails if one
/// panics, if a target's corpus is empty, or if `entries` and the crate's targets in
/// `fuzz/fuzz_targets` differ.
pub fn replay_crate(krate: &str, entries: &[Entry<'_>]) {
    let prefix = format!("{krate}_");
    let ours: Vec<String> = targets()
        .into_iter()
        .filter(|t| t.starts_with(&prefix))
        .collect();
    let mut given: Vec<String> = entries.iter().map(|(t, _)| t.to_string()).collect();
    given.sort();
    assert_eq!(
        given, ours,
        "the fuzz targets of {krate} and those its replay test knows differ"
    );
    let mut failures = Vec::new();
    for (target, entry) in entries {
        match replay(target, *entry) {
            Ok(0) => failures.push(format!("{target}: the corpus is empty")),
            Ok(n) => eprintln!("{target}: {n} corpus files replayed"),
            Err(files) => failures.extend(files.into_iter().map(|f| format!("{f}: panicked"))),
        }
    }
    assert!(
        failures.is_empty(),
        "fuzz corpus replay failed:\n{}",
        failures.join("\n")
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_target_has_a_corpus_and_a_replaying_crate() {
        let targets = targets();
        assert!(targets.len() >= 4, "{targets:?}");
        for t in &targets {
            assert!(!corpus(t).is_empty(), "{t} has no corpus");
        }
    }

    #[test]
    fn a_panic_fails_the_replay_even_when_caught() {
        let target = "networkd_dhcp6";
        let n = corpus(target).len();
        assert_eq!(replay(target, &|_| {}), Ok(n));
        let failed = replay(target, &|_| panic!("a finding")).expect_err("panics");
        assert_eq!(failed.len(), n);
        let failed = replay(target, &|_| {
            let _ = std::panic::catch_unwind(|| panic!("caught inside the entry"));
        })
        .expect_err("a caught panic counts");
        assert_eq!(failed.len(), n);
    }
}
