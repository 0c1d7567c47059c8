#!/usr/bin/env bash
# Fetches Debian's stock kernel for VM nodes into target/kernel (or $KERNEL_OUT): vmlinuz and
# lib/modules/<release> with a modules.dep (depmod -b). Nothing is installed on the host: the
# package is downloaded (apt-get download) and the parts a VM node can use are unpacked
# (dpkg-deb --fsys-tarfile | tar) into the build directory: vmlinuz and the module trees of
# $KERNEL_MODULE_DIRS (about 120 MB of the package's 400; no graphics, sound, media, USB or
# wireless/ethernet drivers). A boot module outside them makes rootfs/build.sh fail by name.
# Idempotent: does nothing when that kernel is already there. rootfs/build.sh then puts the
# boot modules (rootfs/etc/kernel-modules.conf) into the image and the kernel beside it.
#
#   rootfs/kernel.sh                     # the kernel linux-image-amd64 depends on now
#   KERNEL_PACKAGE=linux-image-6.1.0-57-amd64 rootfs/kernel.sh
set -euo pipefail
cd "$(dirname "$0")/.."

out="${KERNEL_OUT:-target/kernel}"
command -v depmod >/dev/null 2>&1 || {
	echo "kernel.sh: installing kmod (depmod)" >&2
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends kmod >/dev/null
}
pkg="${KERNEL_PACKAGE:-}"
if [ -z "$pkg" ]; then
	pkg="$(apt-cache depends linux-image-amd64 2>/dev/null | sed -n 's/^ *Depends: \(linux-image-[^ ]*\)$/\1/p' | head -1)"
	if [ -z "$pkg" ]; then
		apt-get update -qq
		pkg="$(apt-cache depends linux-image-amd64 | sed -n 's/^ *Depends: \(linux-image-[^ ]*\)$/\1/p' | head -1)"
	fi
fi
[ -n "$pkg" ] || { echo "kernel.sh: cannot tell which package linux-image-amd64 depends on" >&2; exit 1; }
if [ -f "$out/package" ] && [ "$(cat "$out/package")" = "$pkg" ] && [ -f "$out/vmlinuz" ]; then
	exit 0
fi
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
echo "kernel.sh: fetching $pkg" >&2
(cd "$work" && apt-get download -qq -o APT::Sandbox::User=root "$pkg")
deb="$(ls "$work"/*.deb)"
release="$(dpkg-deb --fsys-tarfile "$deb" | tar -t | sed -n 's|^\./lib/modules/\([^/]*\)/$|\1|p' | head -1)"
[ -n "$release" ] || { echo "kernel.sh: $pkg holds no lib/modules/<release>" >&2; exit 1; }
dirs="${KERNEL_MODULE_DIRS:-arch crypto lib net fs block drivers/block drivers/virtio drivers/scsi drivers/nvme drivers/md drivers/char drivers/net/bonding drivers/net/wireguard drivers/net/team drivers/net/vxlan drivers/net/ipvlan}"
want=("./boot/vmlinuz-$release" "./lib/modules/$release/modules.builtin" "./lib/modules/$release/modules.builtin.modinfo" "./lib/modules/$release/modules.order")
for d in $dirs; do want+=("./lib/modules/$release/kernel/$d"); done
# drivers/net's own modules (dummy, veth, macvlan, virtio_net, net_failover…), not its
# subdirectories of hardware drivers.
want+=("./lib/modules/$release/kernel/drivers/net/*.ko")
mkdir -p "$work/x"
dpkg-deb --fsys-tarfile "$deb" | tar -x -C "$work/x" --wildcards --no-wildcards-match-slash "${want[@]}"
rm -f "$deb"
depmod -b "$work/x" "$release"
rm -rf "$out.new"
mkdir -p "$out.new/lib/modules"
cp "$work/x/boot/vmlinuz-$release" "$out.new/vmlinuz"
mv "$work/x/lib/modules/$release" "$out.new/lib/modules/$release"
echo "$pkg" > "$out.new/package"
rm -rf "$out"
mv "$out.new" "$out"
echo "kernel.sh: $out/vmlinuz and $out/lib/modules/$release" >&2
