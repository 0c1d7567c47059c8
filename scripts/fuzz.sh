#!/usr/bin/env bash
# Bounded fuzzing: runs every cargo-fuzz target of fuzz/ for SECONDS each (default 30) from its
# committed corpus (fuzz/corpus/<target>/), and fails if any target crashes (a panic, a sanitizer
# report, a timeout or running out of memory). The crashing input is kept in
# fuzz/artifacts/<target>/; reproduce with `cargo fuzz run <target> <file>` in fuzz/.
#
#   scripts/fuzz.sh [SECONDS]
#
# Installs cargo-fuzz if it is missing. The toolchain is stable: RUSTC_BOOTSTRAP=1 lets it take
# the -Z flags that cargo-fuzz passes (sanitizer, coverage instrumentation). New inputs the
# fuzzer finds go to a scratch directory, not into the committed corpus: add the interesting
# ones by hand (`cargo fuzz cmin` keeps the corpus minimal), and the normal test suite replays
# every corpus file (the `fuzz_corpus` tests of stated, machinery and networkd).
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-30}"
[[ "$seconds" =~ ^[0-9]+$ ]] || { echo "usage: $0 [SECONDS]" >&2; exit 2; }
export RUSTC_BOOTSTRAP=1
# cargo-fuzz builds with `--cfg fuzzing`, which makes the vendored h2 (a path dependency, so its
# lints are not capped as a registry crate's are) compile an undocumented module under its
# deny(missing_docs). cargo-fuzz appends RUSTFLAGS to its own.
export RUSTFLAGS="${RUSTFLAGS:-} --cap-lints=warn"

if ! cargo fuzz --version >/dev/null 2>&1; then
  echo "== installing cargo-fuzz"
  cargo install cargo-fuzz --locked
fi

cd fuzz
echo "== building the fuzz targets"
cargo fuzz build
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
failed=()
for target in $(cargo fuzz list); do
  echo "== fuzzing $target for ${seconds}s"
  mkdir -p "$scratch/$target"
  if ! cargo fuzz run "$target" "$scratch/$target" "corpus/$target" -- \
      -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1; then
    failed+=("$target")
  fi
done
if (( ${#failed[@]} )); then
  echo "== crashed: ${failed[*]} (inputs in fuzz/artifacts/)"
  exit 1
fi
echo "== no crash in $(cargo fuzz list | wc -l) targets"
