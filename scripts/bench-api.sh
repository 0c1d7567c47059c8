#!/usr/bin/env bash
# The Talos API against the local State socket (BENCHMARKS.md, "apid"): a local cluster of two
# control planes and a worker from the release image; api-bench reads the first control plane's
# stated through its apid (published on 127.0.0.1, mutual TLS 1.3) and through its Unix socket
# (as root, via /proc), and times a one-to-many Version over the three nodes.
#
#   scripts/bench-api.sh [rounds]     default 500
#
# Builds talosctl and the bench (release) and the image (rootfs/build.sh). The cluster goes to a
# temporary state directory and talosconfig. Needs root.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds="${1:-500}"
if [ "$(id -u)" != 0 ]; then
	echo "bench-api: run as root (namespaces, mounts, network links)" >&2
	exit 1
fi
scripts/install-deps.sh >/dev/null
cargo build --release --locked -p talosctl -p bench --bin talosctl --bin api-bench
rootfs/build.sh >/dev/null
work="$(mktemp -d /tmp/bench-api.XXXXXX)"
talosctl() { target/release/talosctl --talosconfig "$work/talosconfig" "$@"; }
cleanup() {
	talosctl cluster destroy --state "$work/clusters" --name benchapi >/dev/null 2>&1 || true
	rm -rf "$work"
}
trap cleanup EXIT
talosctl cluster create --state "$work/clusters" --name benchapi --image target/rootfs/tree \
	--controlplanes 2 --workers 1 >/dev/null 2>"$work/progress"
show="$(talosctl cluster show --state "$work/clusters" --name benchapi -o json)"
nodes="$(echo "$show" | python3 -c 'import json,sys; print(",".join(n["ip"] for n in json.load(sys.stdin)["nodes"]))')"
init="$(echo "$show" | python3 -c 'import json,sys; print(json.load(sys.stdin)["nodes"][0]["initPid"])')"
echo "commit $(git rev-parse --short HEAD), $(date -u '+%Y-%m-%d %H:%M UTC')"
target/release/api-bench --talosconfig "$work/talosconfig" \
	--socket "/proc/$init/root/run/stated/state.sock" --netns "/proc/$init/ns/net" \
	--nodes "$nodes" --rounds "$rounds"
