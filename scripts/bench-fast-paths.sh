#!/usr/bin/env bash
# Every benchmark behind issue 12's targets (BENCHMARKS.md: broker, networkd, node start), one
# after the other at one commit, so that the figures describe the same code:
#
#   scripts/bench-broker.sh --rounds 3                     stated vs etcd, the repo's generator
#   scripts/bench-loadgen.sh --go -rounds 3 -omit-old      ... grpc-go, as the controller runtime watches
#   scripts/bench-loadgen.sh --go -rounds 3                ... grpc-go, COSI's default watch (old resource)
#   scripts/bench-loadgen.sh --rounds 3 [--omit-old]       ... Python grpcio (C-core)
#   scripts/bench-networkd.sh                              networkd vs ip -batch, DHCP vs udhcpc
#   target/release/examples/node_bench 20                  node start, restarts, idle RSS
#
#   scripts/bench-fast-paths.sh [--skip NAME,...]   NAME: broker, go, python, networkd, node
#
# Needs root (as each of them). About 30 minutes on 2 CPUs after the build. Each part's output
# goes to target/bench-fast-paths-<commit>/<name>.txt with the commit, the time and the load
# before it; a part that fails is reported and the others still run (the exit code says so).
# Run nothing else meanwhile: every figure is a ratio against a peer run in the same minutes,
# but the machine's speed moves them all.
set -uo pipefail
cd "$(dirname "$0")/.."

skip=","
while (($#)); do
	case "$1" in
	--skip)
		skip=",${2:?--skip needs a list},"
		shift 2
		;;
	-h | --help)
		sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'
		exit 0
		;;
	*)
		echo "bench-fast-paths: unknown argument $1 (see --help)" >&2
		exit 2
		;;
	esac
done
if [ "$(id -u)" != 0 ]; then
	echo "bench-fast-paths: run as root (namespaces, stated's admin-only socket)" >&2
	exit 1
fi

commit="$(git rev-parse --short HEAD)"
if [ -n "$(git status --porcelain --untracked-files=no)" ]; then
	commit="$commit-dirty"
fi
out="target/bench-fast-paths-$commit"
mkdir -p "$out"
failed=()

# part GROUP NAME COMMAND...: runs COMMAND unless GROUP is skipped, its output in NAME.txt.
part() {
	local group="$1" name="$2"
	shift 2
	case "$skip" in *",$group,"*) return ;; esac
	{
		echo "# $name: $*"
		echo "# commit $commit, $(date -u '+%F %T UTC'), load average $(cut -d' ' -f1-3 /proc/loadavg), $(nproc) CPUs"
	} >"$out/$name.txt"
	echo "bench-fast-paths: $name ($*) → $out/$name.txt" >&2
	if ! "$@" >>"$out/$name.txt" 2>&1; then
		failed+=("$name")
		echo "bench-fast-paths: $name FAILED (see $out/$name.txt)" >&2
	fi
	echo "# ended $(date -u '+%F %T UTC')" >>"$out/$name.txt"
}

# One build of everything first (scripts/bench-build.sh: the one cargo package set every bench
# script builds, so that each builds nothing more and no figure shares the machine with a compiler).
if ! scripts/bench-build.sh; then
	echo "bench-fast-paths: the build failed" >&2
	exit 1
fi
part broker broker scripts/bench-broker.sh --rounds 3
part go go-omit-old scripts/bench-loadgen.sh --go -rounds 3 -omit-old
part go go scripts/bench-loadgen.sh --go -rounds 3
part python python-omit-old scripts/bench-loadgen.sh --rounds 3 --omit-old
part python python scripts/bench-loadgen.sh --rounds 3
part networkd networkd scripts/bench-networkd.sh
part node node target/release/examples/node_bench 20

if ((${#failed[@]})); then
	echo "bench-fast-paths: failed: ${failed[*]} (outputs in $out)" >&2
	exit 1
fi
echo "bench-fast-paths: done, outputs in $out" >&2
