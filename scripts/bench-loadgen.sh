#!/usr/bin/env bash
# The broker benchmark with a load generator that is not the repo's own (BENCHMARKS.md,
# "Broker: stated vs etcd", second generator): bench/loadgen/loadgen.py, gRPC's C-core through
# Python grpcio, with stubs generated from the same .proto files by grpc_tools.protoc.
#
#   scripts/bench-loadgen.sh [loadgen.py options...]     e.g. --rounds 3, --omit-old, --rate 1000
#
# Installs Debian's etcd and grpcio-tools (PyPI) if missing, builds stated in release. Needs
# root (stated standalone admits uid 0 only). The output is kept in target/loadgen.txt.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/install-deps.sh >/dev/null
if ! command -v etcd >/dev/null 2>&1; then
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq
	apt-get install -y -qq --no-install-recommends etcd-server >/dev/null
fi
if ! python3 -c 'import grpc_tools' 2>/dev/null; then
	echo "bench-loadgen: installing grpcio-tools (PyPI)" >&2
	python3 -m pip install --quiet --root-user-action=ignore 'grpcio-tools>=1.60' 2>/dev/null ||
		python3 -m pip install --quiet --break-system-packages 'grpcio-tools>=1.60'
fi
cargo build --release -p stated
mkdir -p target
echo "bench-loadgen: $(nproc) CPUs, load average $(cut -d' ' -f1-3 /proc/loadavg)" >&2
python3 bench/loadgen/loadgen.py --stated target/release/stated --etcd "$(command -v etcd)" \
	--json target/loadgen.json "$@" | tee target/loadgen.txt
