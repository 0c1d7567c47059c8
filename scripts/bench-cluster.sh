#!/usr/bin/env bash
# The local-cluster benchmark (BENCHMARKS.md, "Local clusters"): wall time of
# `talosctl cluster create` for 1 and 3 nodes (until every node's daemons are ready, and until
# every node also has its DHCP address, which is when create returns), of `cluster destroy`,
# and the size of the node image (tree and initramfs).
#
#   scripts/bench-cluster.sh [runs]          default 5 runs per size; medians are reported
#
# Builds the image and talosctl (rootfs/build.sh: static, stripped). Clusters go to a
# temporary state directory and talosconfig: ~/.talos is not touched. Needs root.
set -euo pipefail
cd "$(dirname "$0")/.."
runs="${1:-5}"

if [ "$(id -u)" != 0 ]; then
	echo "bench-cluster: run as root (namespaces, mounts, network links)" >&2
	exit 1
fi
scripts/install-deps.sh >/dev/null
linking=$(rootfs/build.sh | sed -n 's/^linking *//p')

work="$(mktemp -d /tmp/bench-cluster.XXXXXX)"
talosctl() { target/bin/talosctl --talosconfig "$work/talosconfig" "$@"; }
cleanup() {
	for d in "$work"/clusters/*/; do
		[ -d "$d" ] && talosctl cluster destroy --state "$work/clusters" --name "$(basename "$d")" >/dev/null 2>&1 || true
	done
	rm -rf "$work"
}
trap cleanup EXIT

median() { sort -g | awk '{a[NR]=$1} END {m=(NR%2)?a[(NR+1)/2]:(a[NR/2]+a[NR/2+1])/2; printf "%.2f", m}'; }
now() { date +%s.%N; }

declare -A results
for nodes in 1 3; do
	workers=$((nodes - 1))
	: >"$work/ready-$nodes" ; : >"$work/create-$nodes" ; : >"$work/destroy-$nodes"
	for ((r = 1; r <= runs; r++)); do
		name="bench$nodes-$r"
		t0=$(now)
		talosctl cluster create --state "$work/clusters" --name "$name" --image target/rootfs/tree \
			--controlplanes 1 --workers "$workers" >"$work/out" 2>"$work/progress"
		t1=$(now)
		# Progress lines: "[  0.42s] <node>: running" once a node's daemons are all ready.
		last_running=$(grep -E ': running$' "$work/progress" | sed -E 's/^\[ *([0-9.]+)s\].*/\1/' | sort -g | tail -1 || true)
		echo "${last_running:-0}" >>"$work/ready-$nodes"
		awk -v a="$t0" -v b="$t1" 'BEGIN {print b - a}' >>"$work/create-$nodes"
		t2=$(now)
		talosctl cluster destroy --state "$work/clusters" --name "$name" >/dev/null 2>&1
		t3=$(now)
		awk -v a="$t2" -v b="$t3" 'BEGIN {print b - a}' >>"$work/destroy-$nodes"
	done
	results[ready-$nodes]=$(median <"$work/ready-$nodes")
	results[create-$nodes]=$(median <"$work/create-$nodes")
	results[destroy-$nodes]=$(median <"$work/destroy-$nodes")
done

tree_bytes=$(du -sb --apparent-size target/rootfs/tree | cut -f1)
initramfs_bytes=$(stat -c %s target/rootfs/initramfs.cpio.gz)

cat <<OUT
Local clusters ($(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg), median of $runs runs)

| nodes | create: every node's daemons ready | create: returns (addresses leased too) | destroy |
|---|---|---|---|
| 1 | ${results[ready-1]} s | ${results[create-1]} s | ${results[destroy-1]} s |
| 3 | ${results[ready-3]} s | ${results[create-3]} s | ${results[destroy-3]} s |

| image | bytes |
|---|---|
| tree (target/rootfs/tree, apparent size; programs: $linking) | $tree_bytes |
| initramfs (target/rootfs/initramfs.cpio.gz) | $initramfs_bytes |
OUT
