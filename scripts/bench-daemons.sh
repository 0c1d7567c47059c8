#!/usr/bin/env bash
# Idle memory of every daemon of a local cluster (BENCHMARKS.md, "Daemon memory"): a control
# plane and a worker from the release image, left idle, then VmRSS and VmHWM of each daemon
# process read from /proc on the host, with the split of each RSS into anonymous memory and
# pages of the program's file (smaps_rollup), and the sum over every daemon of a node.
#
#   scripts/bench-daemons.sh [idle-seconds] [TREE]     default 30 s, target/rootfs/tree
#
# Builds the image and talosctl (rootfs/build.sh: static, stripped) unless a TREE (an image
# tree made by mkrootfs, e.g. of another build profile) is given. The cluster goes
# to a temporary state directory and talosconfig. Run it alone: it reads every process named
# like a daemon. Needs root.
set -euo pipefail
cd "$(dirname "$0")/.."
idle="${1:-30}"
tree="${2:-}"
if [ "$(id -u)" != 0 ]; then
	echo "bench-daemons: run as root (namespaces, mounts, network links)" >&2
	exit 1
fi
scripts/install-deps.sh >/dev/null
if [ -z "$tree" ]; then
	rootfs/build.sh >/dev/null
	tree=target/rootfs/tree
fi
work="$(mktemp -d /tmp/bench-daemons.XXXXXX)"
talosctl() { target/bin/talosctl --talosconfig "$work/talosconfig" "$@"; }
cleanup() {
	talosctl cluster destroy --state "$work/clusters" --name benchmem >/dev/null 2>&1 || true
	rm -rf "$work"
}
trap cleanup EXIT
talosctl cluster create --state "$work/clusters" --name benchmem --image "$tree" \
	--controlplanes 1 --workers 1 >/dev/null 2>"$work/progress"
sleep "$idle"
kib() { awk -v k="$2" '$1 == k":" {print $2}' "/proc/$1/status"; }
smaps() { awk -v k="$2" '$1 == k":" {print $2}' "/proc/$1/smaps_rollup"; }
echo "Daemon memory, idle ${idle} s after create ($(nproc) CPUs; $(git rev-parse --short HEAD); image $tree)"
echo
echo "| daemon | node | VmRSS | of which anonymous / file | VmHWM (peak) |"
echo "|---|---|---:|---|---:|"
declare -A total anon
for d in stated networkd blockd secretsd trustd apid k8sd; do
	for pid in $(pgrep -x "$d"); do
		host=$(nsenter -t "$pid" -u hostname 2>/dev/null || echo '?')
		r=$(kib "$pid" VmRSS 2>/dev/null || true)
		a=$(smaps "$pid" Anonymous 2>/dev/null || true)
		# Gone since pgrep (a restart): not counted.
		[ -n "$r" ] && [ -n "$a" ] || continue
		total[$host]=$((${total[$host]:-0} + r))
		anon[$host]=$((${anon[$host]:-0} + a))
		awk -v d="$d" -v h="$host" -v r="$r" -v a="$a" -v p="$(kib "$pid" VmHWM)" \
			'BEGIN {printf "| %s | %s | %.1f MiB | %.1f / %.1f MiB | %.1f MiB |\n", d, h, r / 1024, a / 1024, (r - a) / 1024, p / 1024}'
	done
done
for host in "${!total[@]}"; do
	awk -v h="$host" -v r="${total[$host]}" -v a="${anon[$host]}" \
		'BEGIN {printf "| **every daemon** | %s | **%.1f MiB** | %.1f / %.1f MiB | |\n", h, r / 1024, a / 1024, (r - a) / 1024}'
done
