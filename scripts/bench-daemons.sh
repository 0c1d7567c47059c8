#!/usr/bin/env bash
# Idle memory of every daemon of a local cluster (BENCHMARKS.md, "Daemon memory"): a control
# plane and a worker from the release image, left idle, then VmRSS and VmHWM of each daemon
# process read from /proc on the host.
#
#   scripts/bench-daemons.sh [idle-seconds]     default 30
#
# Builds the image and talosctl (rootfs/build.sh: static, stripped). The cluster goes
# to a temporary state directory and talosconfig. Run it alone: it reads every process named
# like a daemon. Needs root.
set -euo pipefail
cd "$(dirname "$0")/.."
idle="${1:-30}"
if [ "$(id -u)" != 0 ]; then
	echo "bench-daemons: run as root (namespaces, mounts, network links)" >&2
	exit 1
fi
scripts/install-deps.sh >/dev/null
rootfs/build.sh >/dev/null
work="$(mktemp -d /tmp/bench-daemons.XXXXXX)"
talosctl() { target/bin/talosctl --talosconfig "$work/talosconfig" "$@"; }
cleanup() {
	talosctl cluster destroy --state "$work/clusters" --name benchmem >/dev/null 2>&1 || true
	rm -rf "$work"
}
trap cleanup EXIT
talosctl cluster create --state "$work/clusters" --name benchmem --image target/rootfs/tree \
	--controlplanes 1 --workers 1 >/dev/null 2>"$work/progress"
sleep "$idle"
kib() { awk -v k="$2" '$1 == k":" {print $2}' "/proc/$1/status"; }
echo "Daemon memory, idle ${idle} s after create ($(nproc) CPUs; $(git rev-parse --short HEAD))"
echo
echo "| daemon | node | VmRSS | VmHWM (peak) |"
echo "|---|---|---:|---:|"
for d in stated networkd secretsd trustd apid; do
	for pid in $(pgrep -x "$d"); do
		host=$(nsenter -t "$pid" -u hostname 2>/dev/null || echo '?')
		awk -v d="$d" -v h="$host" -v r="$(kib "$pid" VmRSS)" -v p="$(kib "$pid" VmHWM)" \
			'BEGIN {printf "| %s | %s | %.1f MiB | %.1f MiB |\n", d, h, r / 1024, p / 1024}'
	done
done
