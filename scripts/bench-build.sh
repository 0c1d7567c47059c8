#!/usr/bin/env bash
# Builds, in release, every program the benchmarks run, as one cargo package set. Cargo unifies
# the features of shared dependencies over the packages of one build, so stated built with
# `-p stated` alone and stated built with `-p stated -p bench` are different binaries; every
# bench script builds this one set, so that the figures of one commit describe one binary each.
#
#   scripts/bench-build.sh [CARGO ARGS...]    (extra args go to cargo build, e.g. --locked)
set -euo pipefail
cd "$(dirname "$0")/.."
exec cargo build --release -p init -p stated -p networkd -p blockd -p secretsd -p trustd \
	-p apid -p k8sd -p bench --bins --examples "$@"
