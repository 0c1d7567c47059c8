#!/usr/bin/env bash
# Builds talos-rs and runs a local stated (the resource broker) on a socket you can talk to with
# talosctl. Until the node image lands (issue: node image and local clusters), this is the local
# development setup: a standalone broker, root-only, state under ./_local.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
cargo build --release -p stated -p talosctl
dir="$PWD/_local"
mkdir -p "$dir"
echo "stated listening on $dir/state.sock"
echo "try:  export TALOS_SOCKET=$dir/state.sock; target/release/talosctl get rd"
exec target/release/stated --socket "$dir/state.sock" --state-dir "$dir/state"
