#!/usr/bin/env bash
# The broker benchmark (BENCHMARKS.md, "Broker: stated vs etcd"): stated against etcd, side by
# side in one run on this machine, both with their data on tmpfs.
#
#   scripts/bench-broker.sh [broker-bench options...]     e.g. --rounds 3, --watchers 10
#
# Installs Debian's etcd (etcd-server, etcd-client) if missing, builds stated and the benchmark
# in release, runs target/release/broker-bench and prints its tables; the output is also kept in
# target/broker-bench.txt and the machine-readable summary in target/broker-bench.json.
# Needs root (stated standalone admits uid 0 only; apt-get). No system protoc is needed: the
# etcd API subset is compiled with protox like the rest of the workspace.
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
command -v etcd >/dev/null 2>&1 || need+=(etcd-server)
command -v etcdctl >/dev/null 2>&1 || need+=(etcd-client)
if ((${#need[@]})); then
	echo "bench-broker: installing ${need[*]}" >&2
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq
	# On a host with systemd, Debian enables and starts a system etcd on :2379 here; the
	# benchmark starts its own on free ports and does not use it.
	apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

scripts/bench-build.sh

# Both brokers keep their data on tmpfs: /dev/shm, or a tmpfs mounted for the run.
tmpfs="${BENCH_TMPFS:-/dev/shm}"
mounted=""
if [ "$(stat -f -c %T "$tmpfs" 2>/dev/null)" != tmpfs ]; then
	tmpfs="$(mktemp -d /tmp/broker-bench-tmpfs.XXXXXX)"
	mount -t tmpfs -o size=4g tmpfs "$tmpfs"
	mounted="$tmpfs"
fi

bench_pid=""
cleanup() {
	# broker-bench stops stated and etcd itself on SIGTERM/SIGINT.
	if [ -n "$bench_pid" ] && kill -0 "$bench_pid" 2>/dev/null; then
		kill -TERM "$bench_pid" 2>/dev/null || true
		wait "$bench_pid" 2>/dev/null || true
	fi
	if [ -n "$mounted" ]; then
		umount "$mounted" && rmdir "$mounted"
	fi
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

echo "bench-broker: $(nproc) CPUs, load average $(cut -d' ' -f1-3 /proc/loadavg), tmpfs $tmpfs" >&2
target/release/broker-bench \
	--stated target/release/stated \
	--etcd "$(command -v etcd)" \
	--tmpfs "$tmpfs" \
	--json target/broker-bench.json \
	"$@" > >(tee target/broker-bench.txt) &
bench_pid=$!
wait "$bench_pid"
status=$?
bench_pid=""
exit "$status"
