#!/usr/bin/env bash
# The networkd benchmark (BENCHMARKS.md, "networkd"): networkd against `ip -batch` (1000
# addresses + 1000 routes) and busybox udhcpc (link up → DHCP lease applied, same dnsmasq), and
# the time networkd takes to restore an address deleted behind its back. Everything runs in
# network namespaces the benchmark creates; the host's interfaces are never touched.
#
#   scripts/bench-networkd.sh [networkd-bench options...]   e.g. --runs 5 --dhcp-runs 10
#
# Installs what is missing (iproute2, dnsmasq-base, udhcpc, util-linux's unshare) with apt-get,
# builds networkd, stated and the benchmark in release, runs target/release/networkd-bench and
# prints its table; the output is also kept in target/networkd-bench.txt and every figure in
# target/networkd-bench.json. Needs root (namespaces, netlink writes, stated's admin-only socket).
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" != 0 ]; then
	echo "bench-networkd: run as root (network namespaces, netlink writes)" >&2
	exit 1
fi

need=()
command -v ip >/dev/null 2>&1 || need+=(iproute2)
command -v dnsmasq >/dev/null 2>&1 || need+=(dnsmasq-base)
command -v udhcpc >/dev/null 2>&1 || need+=(udhcpc)
command -v unshare >/dev/null 2>&1 || need+=(util-linux)
if ((${#need[@]})); then
	echo "bench-networkd: installing ${need[*]}" >&2
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq
	apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

scripts/bench-build.sh

bench_pid=""
# What a run that could not clean up itself (SIGKILL) may leave: namespaces and temporary
# directories carry the benchmark's pid in their names; processes live in those namespaces
# (networkd, dnsmasq, udhcpc) or are stated on a socket in those directories.
leftovers() {
	local pid="$1" ns p
	for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^trs-[a-z]+-${pid}-[0-9]+$" || true); do
		for p in $(ip netns pids "$ns" 2>/dev/null || true); do
			kill -KILL "$p" 2>/dev/null || true
		done
		ip netns del "$ns" 2>/dev/null || true
	done
	for d in /dev/shm/networkd-bench-"${pid}"-* /tmp/networkd-bench-"${pid}"-*; do
		[ -e "$d" ] || continue
		for p in $(pgrep -f -- "--socket $d/state.sock" || true); do
			kill -KILL "$p" 2>/dev/null || true
		done
		rm -rf -- "$d"
	done
}
cleanup() {
	# networkd-bench stops everything it started on SIGTERM/SIGINT.
	if [ -n "$bench_pid" ]; then
		if kill -0 "$bench_pid" 2>/dev/null; then
			kill -TERM "$bench_pid" 2>/dev/null || true
			wait "$bench_pid" 2>/dev/null || true
		fi
		leftovers "$bench_pid"
	fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

echo "bench-networkd: $(nproc) CPUs, load average $(cut -d' ' -f1-3 /proc/loadavg)" >&2
target/release/networkd-bench \
	--stated target/release/stated \
	--networkd target/release/networkd \
	--json target/networkd-bench.json \
	"$@" > >(tee target/networkd-bench.txt) &
bench_pid=$!
status=0
wait "$bench_pid" || status=$?
exit "$status"
