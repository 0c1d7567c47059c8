#!/usr/bin/env bash
# Installs the Debian packages that building and testing talos-rs need. Idempotent and
# non-interactive; does nothing when everything is present. Run as root.
#
#   scripts/install-deps.sh          everything: the test suite (scripts/test.sh), VM nodes
#   scripts/install-deps.sh --run    only what building the image and running a local cluster
#                                    in namespaces needs (scripts/run-local.sh): a newcomer's
#                                    first cluster does not wait for qemu and the test tools
#   scripts/install-deps.sh --run --vm   the same, and what VM nodes need (qemu, kmod)
#   scripts/install-deps.sh --build  only what compiling the programs needs (run-local.sh
#                                    installs the rest of --run while they compile)
set -euo pipefail

mode=all
vm=0
for a in "$@"; do
  case "$a" in
  --run) mode=run ;;
  --build) mode=build ;;
  --vm) vm=1 ;;
  -h | --help)
    sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'
    exit 0
    ;;
  *)
    echo "install-deps: unknown argument $a (--run, --build, --vm, --help)" >&2
    exit 2
    ;;
  esac
done

# Building the image and running a local cluster in namespaces.
build_packages=(
  libc6-dev     # libc.a: rootfs/build.sh links the image's programs statically (glibc)
  git           # rootfs/build.sh: SOURCE_DATE_EPOCH defaults to the last commit's time
  protobuf-compiler  # protoc: the etcd-client crate (k8sd's etcd client) compiles etcd's protos
  libprotobuf-dev    # ... which import protobuf's well-known types (descriptor.proto)
)
packages=(
  iproute2      # ip netns / ip link: clusters and tests make their own network namespaces
  dnsmasq-base  # a cluster's DHCP server (binary only, no system service); networkd's kernel tests
  util-linux    # nsenter: `talosctl cluster create` starts dnsmasq in the cluster's namespace;
                #   unshare: networkd's kernel tests give it a UTS namespace of its own
  xfsprogs      # mkfs.xfs: in the image (blockd asks init to format a system volume with it);
                #   blockd's tests make real xfs filesystems to probe
  etcd-server   # etcd: the image carries Debian's binary, k8sd asks init to run it on control planes
  etcd-client   # etcdctl: in the image (snapshot restore on --recover-from); the tests use it too
)
# VM nodes (--provisioner qemu): Debian's stock kernel under qemu.
vm_packages=(
  qemu-system-x86  # VM nodes, TCG by default (the VM test)
  kmod          # depmod: rootfs/kernel.sh indexes the kernel's modules for the image
)
# The test suite only.
test_packages=(
  procps        # ps, pkill in test cleanup
  iputils-ping  # ping: the cluster tests check that nodes reach each other over the bridge
  openssl       # openssl s_client: trustd's tests check TLS 1.2 is refused, TLS 1.3 verified
  curl          # a gRPC client that is not ours: the cluster tests call apid with the talosconfig
  e2fsprogs     # blockd's tests: ext4 (mkfs.ext4)
  dosfstools    # blockd's tests: vfat (mkfs.vfat)
  fdisk         # blockd's tests: GPTs made by sfdisk
)
if [ "$mode" = build ]; then
  packages=("${build_packages[@]}")
else
  packages=("${build_packages[@]}" "${packages[@]}")
  if [ "$mode" = all ] || [ "$vm" = 1 ]; then
    packages+=("${vm_packages[@]}")
  fi
  if [ "$mode" = all ]; then
    packages+=("${test_packages[@]}")
  fi
fi

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "installing: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  # Package lists fetched in the last hour (by a --build just before) are not fetched again,
  # unless the install does not find a package in them.
  updated=0
  if [ -z "$(find /var/lib/apt/lists -maxdepth 1 -name '*_Packages*' -mmin -60 -print -quit 2>/dev/null)" ]; then
    apt-get update -qq
    updated=1
  fi
  if ! apt-get install -y -qq --no-install-recommends "${missing[@]}"; then
    if [ "$updated" = 1 ]; then
      exit 1
    fi
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}"
  fi
  # On a host with systemd, Debian enables and starts a system etcd on :2379: nothing here uses
  # it (nodes run their own in their namespaces), so the one just installed is stopped, disabled
  # and masked (no later upgrade or dependency starts it again and holds 2379/2380). Only then:
  # an etcd-server that was already there is the host's own business.
  if [[ " ${missing[*]} " == *" etcd-server "* ]] && [ -d /run/systemd/system ]; then
    systemctl disable --now etcd.service >/dev/null 2>&1 || true
    systemctl mask etcd.service >/dev/null 2>&1 || true
  fi
fi

# grpcio (gRPC's C-core for Python): stated's tests talk to it with a real C-core client, which
# sends the socket path as :authority; apid's, over TLS (BoringSSL: no Ed25519 server keys). From PyPI: Debian's python3-grpcio (1.51) predates that.
if [ "$mode" = all ] && ! python3 -c 'import grpc' 2>/dev/null; then
  echo "installing: grpcio (PyPI)"
  python3 -m pip install --quiet --root-user-action=ignore 'grpcio>=1.60' 2>/dev/null ||
    python3 -m pip install --quiet --break-system-packages 'grpcio>=1.60'
fi

# PyYAML: apid's test of gRPC's C-core clients reads a talosconfig as README.md's Python client
# does.
if [ "$mode" = all ] && ! python3 -c 'import yaml' 2>/dev/null; then
  echo "installing: PyYAML (PyPI)"
  python3 -m pip install --quiet --root-user-action=ignore pyyaml 2>/dev/null ||
    python3 -m pip install --quiet --break-system-packages pyyaml
fi

if ! command -v cargo >/dev/null; then
  echo "cargo not found: install the Rust toolchain (https://rustup.rs) and re-run" >&2
  exit 1
fi
