#!/usr/bin/env bash
# Fetches Debian's stock kernel for VM nodes into target/kernel (or $KERNEL_OUT): vmlinuz and
# lib/modules/<release> with a modules.dep (depmod -b). Nothing is installed on the host: the
# package is downloaded (apt-get download) and unpacked (dpkg -x) into the build directory.
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
chmod 755 "$work" # apt-get download runs as _apt
trap 'rm -rf "$work"' EXIT
echo "kernel.sh: fetching $pkg" >&2
(cd "$work" && apt-get download -qq "$pkg")
dpkg -x "$work"/*.deb "$work/x"
release="$(ls "$work/x/lib/modules")"
depmod -b "$work/x" "$release"
rm -rf "$out.new"
mkdir -p "$out.new/lib/modules"
cp "$work/x/boot/vmlinuz-$release" "$out.new/vmlinuz"
mv "$work/x/lib/modules/$release" "$out.new/lib/modules/$release"
echo "$pkg" > "$out.new/package"
rm -rf "$out"
mv "$out.new" "$out"
echo "kernel.sh: $out/vmlinuz and $out/lib/modules/$release" >&2
