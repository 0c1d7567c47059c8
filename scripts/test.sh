#!/usr/bin/env bash
# The whole test suite: installs what the tests need, builds, runs every test of the workspace.
# Run as root (tests switch uids, create namespaces).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
cargo build --workspace --all-targets --locked
cargo test --workspace --locked
