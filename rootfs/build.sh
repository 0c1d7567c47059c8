#!/usr/bin/env bash
# Builds the node image in one command: the image's programs (init, stated, networkd, blockd,
# secretsd, trustd, apid, k8sd) compiled statically (glibc, `-C target-feature=+crt-static`,
# profile `image`: release optimized for size, stripped; see Cargo.toml), then the tree and
# the initramfs with mkrootfs.
#
# The host's talosctl and mkrootfs are compiled in the same cargo invocation, profile and flags:
# every crate they share with the daemons is compiled once (a first run used to compile them
# all twice, once for `--release` and once for the image). talosctl is linked to target/bin.
#
#   rootfs/build.sh                    → target/rootfs/tree, target/rootfs/initramfs.cpio.gz,
#                                        target/bin/talosctl
#   OUT=/some/dir rootfs/build.sh      another output directory
#   ROOTFS_STATIC=0 rootfs/build.sh    dynamically linked programs (their libraries are shipped)
#   rootfs/kernel.sh && rootfs/build.sh  with Debian's kernel for VM nodes: its boot modules
#                                        in the image, target/rootfs/vmlinuz beside it
#   rootfs/build.sh programs           only the cargo build (and the talosctl link)
#   rootfs/build.sh image              only the tree and initramfs, from programs built before
#                                        (scripts/run-local.sh installs the packages the image
#                                        carries, etcd and mkfs.xfs, while the programs compile)
#
# Reproducible: every entry gets the mtime SOURCE_DATE_EPOCH (default: the last commit's time),
# owner 0:0 and a fixed mode; same sources, same toolchain → same bytes. Run as root so the
# tree is owned by root (as a node expects); as another user it keeps that user's ownership.
set -euo pipefail
cd "$(dirname "$0")/.."

step=all
case "${1:-}" in
"") ;;
programs | image) step="$1" ;;
-h | --help)
	sed -n '2,24p' "$0" | sed 's/^# \{0,1\}//'
	exit 0
	;;
*)
	echo "rootfs/build.sh: unknown argument $1 (programs, image, --help)" >&2
	exit 2
	;;
esac

out="${OUT:-target/rootfs}"
triple="$(rustc -vV | sed -n 's/^host: //p')"
if [ -z "${SOURCE_DATE_EPOCH:-}" ]; then
	SOURCE_DATE_EPOCH="$(git log -1 --format=%ct 2>/dev/null || echo 0)"
fi
export SOURCE_DATE_EPOCH

static=()
if [ "${ROOTFS_STATIC:-1}" != 0 ]; then
	# With an explicit --target these flags apply to the target's artifacts only: build
	# scripts and proc macros stay dynamic, as they must. talosctl and mkrootfs, host programs,
	# are static too: a static glibc program looks users and host names up through the host's
	# NSS modules, which works with the glibc it was built against (this machine's).
	# getrandom finds glibc's getrandom() with dlsym, which a static program cannot: it would
	# fall back to /dev/urandom, which the daemons' landlock rules do not grant. Call it directly.
	var="CARGO_TARGET_$(echo "$triple" | tr 'a-z-' 'A-Z_')_RUSTFLAGS"
	static=("$var=${!var:-} -C target-feature=+crt-static --cfg getrandom_backend=\"linux_getrandom\"")
fi
if [ "$step" != image ]; then
	echo "rootfs: building init, stated, networkd, blockd, secretsd, trustd, apid, talosctl and mkrootfs for $triple (profile image${static:+, static})" >&2
	# Only these programs (`--bin`): init's test daemon, init-testd, is not part of the image.
	env "${static[@]}" cargo build --locked --profile image --target "$triple" \
		-p init -p stated -p networkd -p blockd -p secretsd -p trustd -p apid -p k8sd -p talosctl -p rootfs \
		--bin init --bin stated --bin networkd --bin blockd --bin secretsd --bin trustd --bin apid --bin k8sd \
		--bin talosctl --bin mkrootfs
	mkdir -p target/bin
	ln -sfn "../$triple/image/talosctl" target/bin/talosctl
fi
if [ "$step" = programs ]; then
	exit 0
fi
bin="target/$triple/image"
# A kernel for VM nodes (rootfs/kernel.sh) when there is one: its boot modules go into the
# image and its vmlinuz beside it.
kernel=()
kernel_dir="${KERNEL_DIR:-target/kernel}"
if [ -f "$kernel_dir/vmlinuz" ]; then
	kernel=(--kernel "$kernel_dir")
fi
if [ ! -x "$bin/mkrootfs" ]; then
	echo "rootfs/build.sh: $bin/mkrootfs is missing: build the programs first (rootfs/build.sh programs)" >&2
	exit 1
fi
"$bin/mkrootfs" --bin-dir "$bin" --out "$out" "${kernel[@]}"
