//! What every test of the workspace shares: a test that cannot run its subject here (not root,
//! a kernel feature or a program missing) must not pass silently. [`skip`] prints
//! `SKIPPED: <test>: <reason>`, appends the line to the file `$TALOS_SKIPPED_FILE` names (the
//! test script prints them all at the end), and under `CI=true` fails the test instead.
//!
//! [`fuzz`] replays the fuzz corpora (`fuzz/corpus/`) in the normal suite.
//!
//! ```no_run
//! #[test]
//! fn needs_root() {
//!     if !testkit::require_root("it switches uids") {
//!         return;
//!     }
//!     // ...
//! }
//! ```

use std::io::Write as _;

pub mod fuzz;

/// The running test's name (libtest runs each test on a thread named after it).
pub fn current_test() -> String {
    std::thread::current()
        .name()
        .unwrap_or("<unnamed test>")
        .to_string()
}

/// Reports that the running test cannot run its subject here, for `reason`. Under `CI=true`
/// it panics: in CI a test that cannot run is a failure, not a pass.
pub fn skip(reason: &str) {
    skip_named(&current_test(), reason);
}

/// [`skip`] for a test named explicitly.
pub fn skip_named(test: &str, reason: &str) {
    let line = format!("SKIPPED: {test}: {reason}");
    eprintln!("{line}");
    if let Some(path) = std::env::var_os("TALOS_SKIPPED_FILE") {
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
        {
            let _ = writeln!(f, "{line}");
        }
    }
    assert!(
        std::env::var("CI").as_deref() != Ok("true"),
        "{test} cannot run here ({reason}) and CI=true: a test that cannot run fails in CI"
    );
}

/// Whether the tests run as root; otherwise [`skip`]s the running test (root is needed `for`
/// what the test does: "it switches uids").
pub fn require_root(why: &str) -> bool {
    if nix::unistd::geteuid().is_root() {
        return true;
    }
    skip(&format!("needs root: {why}"));
    false
}

/// `cond`, or a [`skip`] for `reason`.
pub fn require(cond: bool, reason: &str) -> bool {
    if !cond {
        skip(reason);
    }
    cond
}

/// Whether `program` runs (`program --version`); otherwise a [`skip`] naming it.
pub fn require_program(program: &str, install_hint: &str) -> bool {
    let ok = std::process::Command::new(program)
        .arg("--version")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok();
    require(ok, &format!("{program} is not installed ({install_hint})"))
}
