#!/usr/bin/env bash
# Builds talos-rs and starts a local cluster you can talk to with talosctl: one control plane
# and one worker (override with e.g. `scripts/run-local.sh --workers 2`), nodes in namespaces
# on this host, on a private bridge with its own DHCP server. Needs root.
#
#   scripts/run-local.sh [talosctl cluster create options...]
#   scripts/run-local.sh --provisioner qemu      VMs: also fetches Debian's kernel first
#
# Steps: install what compiling needs if it is missing (scripts/install-deps.sh --build); compile
# the node's programs and talosctl in one cargo build (rootfs/build.sh programs: static
# binaries, talosctl in target/bin) while the rest of what a cluster needs is installed (--run:
# dnsmasq, etcd, mkfs.xfs; its output in target/run-local-deps.log) and, for VMs, Debian's
# kernel fetched; then the image (rootfs/build.sh image: tree and initramfs in target/rootfs)
# and `talosctl cluster create`. A cluster of the same name that exists
# already is shown, not recreated (destroy it first: target/bin/talosctl cluster destroy).
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" != 0 ]; then
	echo "run-local: run as root (namespaces, mounts, network links)" >&2
	exit 1
fi
# VM nodes boot Debian's kernel under qemu: install it too and fetch the kernel (once) before
# the image is built with its modules. A cluster in namespaces needs neither, nor the test
# suite's tools (scripts/install-deps.sh without --run installs those).
vm=()
for a in "$@"; do
	case "$a" in
	qemu | --provisioner=qemu) vm=(--vm) ;;
	esac
done
scripts/install-deps.sh --build
# The packages are downloaded and unpacked while the compiler has the CPUs: off the first run's
# critical path. The image needs them (it carries etcd and mkfs.xfs): waited for before it.
mkdir -p target
deps_log=target/run-local-deps.log
(
	scripts/install-deps.sh --run "${vm[@]}"
	if ((${#vm[@]})); then
		rootfs/kernel.sh
	fi
) >"$deps_log" 2>&1 &
deps=$!
if ! rootfs/build.sh programs; then
	echo "run-local: the build failed; waiting for the package installation to finish" >&2
	wait "$deps" || true
	exit 1
fi
if ! wait "$deps"; then
	echo "run-local: installing what a cluster needs failed ($deps_log):" >&2
	cat "$deps_log" >&2
	exit 1
fi
cat "$deps_log"
rootfs/build.sh image

talosctl=target/bin/talosctl
name=talos-default
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
	case "${args[$i]}" in
	--name) name="${args[$((i + 1))]:-$name}" ;;
	--name=*) name="${args[$i]#--name=}" ;;
	esac
done

if "$talosctl" cluster show --name "$name" >/dev/null 2>&1; then
	echo "run-local: cluster $name exists:" >&2
	"$talosctl" cluster show --name "$name"
else
	"$talosctl" cluster create --image target/rootfs/tree "$@"
fi

cat <<TRY

Try (as root; talosctl finds the nodes through the context "$name" in ~/.talos/config):
  export PATH=\$PWD/target/bin:\$PATH
  talosctl cluster show --name $name
  talosctl get addresses                       # the first control plane
  talosctl -n $name-worker-1 get links
  talosctl -n $name-worker-1 services
  talosctl -n $name-worker-1 logs networkd
  talosctl -n $name-worker-1 audit
  talosctl -n $name-worker-1 patch machineconfig -p '{"machine": {"network": {"nameservers": ["10.5.0.1"]}}}' --dry-run
  talosctl cluster destroy --name $name
TRY
