#!/usr/bin/env bash
# The whole test suite: installs what the tests need, builds, runs every test of the workspace.
# Run as root (tests switch uids, create namespaces).
#
# A test that cannot run its subject here (not root, a kernel feature missing) says
# "SKIPPED: <test>: <reason>" and, under CI=true, fails. At the end this script lists every
# skipped test and every ignored one (#[ignore]: tests that need a VM node) by name.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
# A fresh clone builds once: incremental caches (2+ GB here) would only take disk, and so would
# debug information (two thirds of each of ~60 test binaries; a panic still names its file and
# line without it). A CI run once died of a full disk (the linker's SIGBUS) with both.
if [[ "${CI:-}" == "true" ]]; then
  export CARGO_INCREMENTAL=0 CARGO_PROFILE_DEV_DEBUG=false CARGO_PROFILE_RELEASE_DEBUG=false
fi
# The suite needs about 5 GB of disk under CI=true (debug build ~3.5 GB, the image's release
# build, the kernel), about 9 GB otherwise.
free_kb=$(df -Pk . | awk 'NR == 2 {print $4}')
if (( free_kb < 6 * 1024 * 1024 )); then
  echo "test.sh: warning: $((free_kb / 1024)) MB free here; the suite needs about 5-9 GB" >&2
fi
cargo build --workspace --all-targets --locked
# The VM test boots the release image with Debian's kernel: fetch the kernel (once) and build
# the image (rootfs/build.sh, the README's own build) with its boot modules.
rootfs/kernel.sh
rootfs/build.sh
mkdir -p target
export TALOS_SKIPPED_FILE="$PWD/target/skipped-tests.txt"
: > "$TALOS_SKIPPED_FILE"
status=0
cargo test --workspace --locked || status=$?
echo
if [[ -s "$TALOS_SKIPPED_FILE" ]]; then
  echo "== tests that could not run here ($(wc -l < "$TALOS_SKIPPED_FILE")):"
  sort -u "$TALOS_SKIPPED_FILE"
else
  echo "== no test was skipped"
fi
# (child_client is the other half of stated's peer tests, run by them under other uids.)
ignored=$(cargo test --workspace --locked -q -- --list --ignored 2>/dev/null | grep ': test$' |
  sed 's/: test$//' | grep -vx 'child_client' || true)
if [[ -n "$ignored" ]]; then
  echo "== ignored tests, not run ($(echo "$ignored" | wc -l)):"
  echo "$ignored" | sed 's/^/IGNORED: /'
fi
exit "$status"
