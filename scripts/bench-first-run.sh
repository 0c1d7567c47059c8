#!/usr/bin/env bash
# A newcomer's first run, timed on a fresh Debian 12 (BENCHMARKS.md, "First run"): a new root
# made by debootstrap (minbase, with gcc, git and procps: what a machine that has a Rust
# toolchain has; no package list, no cargo registry), this machine's Rust toolchain bound in
# read-only, a clone of COMMIT, then `scripts/run-local.sh` in a chroot, from its start to a
# ready cluster. Prints, from run-local's own output with each line's time: the total, when the
# cargo build started and finished, when the last node was ready, and how many of the worker's
# daemons `talosctl services` shows Running/OK; then destroys the cluster and removes the root.
# The timed output is kept in target/bench-first-run-SHA.log.
#
#   scripts/bench-first-run.sh [COMMIT...]     default HEAD; several commits run one after another
#
# Needs root and the Debian mirror (apt-get, debootstrap) and crates.io. The host is not
# changed: debootstrap runs from a package unpacked in the temporary directory, the nodes run
# in their own namespaces, and the root's mounts are private to it and removed on exit.
set -euo pipefail
cd "$(dirname "$0")/.."
repo="$PWD"

case "${1:-}" in
-h | --help)
	sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'
	exit 0
	;;
esac
if [ "$(id -u)" != 0 ]; then
	echo "bench-first-run: run as root (debootstrap, chroot, namespaces)" >&2
	exit 1
fi
rustup_home="${RUSTUP_HOME:-$HOME/.rustup}"
cargo_bin="$(dirname "$(command -v cargo)")"
if [ ! -d "$rustup_home/toolchains" ]; then
	echo "bench-first-run: no rustup toolchain in $rustup_home (the root borrows this machine's)" >&2
	exit 1
fi
commits=("$@")
if ((${#commits[@]} == 0)); then
	commits=(HEAD)
fi
for c in "${commits[@]}"; do
	git rev-parse --verify -q "$c^{commit}" >/dev/null || {
		echo "bench-first-run: no commit $c" >&2
		exit 2
	}
done

work="$(mktemp -d /tmp/bench-first-run.XXXXXX)"
root="$work/root"
mounted() { findmnt -rn -o TARGET | grep -q "^$root\(/\|$\)"; }
unmount() {
	if mounted; then
		umount -R "$root" 2>/dev/null || umount -R -l "$root" 2>/dev/null || true
	fi
}
cleanup() {
	unmount
	# Never remove a tree something is still mounted in (the host's /dev, the toolchain).
	if mounted; then
		echo "bench-first-run: $root is still mounted: left in place" >&2
	else
		rm -rf "$work"
	fi
}
trap cleanup EXIT

(cd "$work" && apt-get download -qq debootstrap 2>/dev/null && dpkg -x debootstrap_*.deb dbs)
export DEBOOTSTRAP_DIR="$work/dbs/usr/share/debootstrap"

for c in "${commits[@]}"; do
	sha="$(git rev-parse --short "$c")"
	unmount
	rm -rf "$root"
	echo "bench-first-run: $sha: making a fresh Debian 12 root" >&2
	"$work/dbs/usr/sbin/debootstrap" --variant=minbase --include=ca-certificates,gcc,git,procps \
		bookworm "$root" http://deb.debian.org/debian >"$work/debootstrap.log" 2>&1 ||
		{ tail -20 "$work/debootstrap.log" >&2; exit 1; }
	# The host's apt sources and CAs (a proxy's, where there is one), its resolver; no service
	# starts in the root (etcd-server's would listen in the host's network namespace); no
	# package list yet, as on a fresh cloud machine.
	if [ -f /etc/apt/sources.list.d/debian.sources ]; then
		cp /etc/apt/sources.list.d/debian.sources "$root/etc/apt/sources.list.d/"
		rm -f "$root/etc/apt/sources.list"
	fi
	cp /usr/local/share/ca-certificates/*.crt "$root/usr/local/share/ca-certificates/" 2>/dev/null || true
	chroot "$root" update-ca-certificates >/dev/null 2>&1
	cp /etc/resolv.conf "$root/etc/"
	printf '#!/bin/sh\nexit 101\n' >"$root/usr/sbin/policy-rc.d"
	chmod +x "$root/usr/sbin/policy-rc.d"
	rm -rf "$root"/var/lib/apt/lists/*
	mkdir -p "$root/opt/rustup" "$root/opt/cargo-bin" "$root/src"

	# A root that is a mount point, as on a machine (ip netns makes / a slave mount).
	mount --bind "$root" "$root"
	mount --make-private "$root"
	mount -t proc proc "$root/proc"
	mount --rbind /sys "$root/sys" && mount --make-rslave "$root/sys"
	mount --rbind /dev "$root/dev" && mount --make-rslave "$root/dev"
	mount -t tmpfs tmpfs "$root/run"
	mount --bind "$rustup_home" "$root/opt/rustup" && mount -o remount,bind,ro "$root/opt/rustup"
	mount --bind "$cargo_bin" "$root/opt/cargo-bin" && mount -o remount,bind,ro "$root/opt/cargo-bin"
	mount --bind "$repo" "$root/src" && mount -o remount,bind,ro "$root/src"

	in_root() {
		chroot "$root" /usr/bin/env -i HOME=/root TERM=dumb LANG=C.UTF-8 \
			PATH=/opt/cargo-bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
			RUSTUP_HOME=/opt/rustup CARGO_HOME=/root/.cargo bash -c "$1"
	}
	in_root "set -e; git config --global --add safe.directory '*'; git clone -q /src /root/talos-rs; cd /root/talos-rs; git checkout -q $sha"
	log="$work/run-local-$sha.log"
	echo "bench-first-run: $sha: scripts/run-local.sh (log: $log until the end)" >&2
	# Each line of its output with the seconds since it started (tenths).
	in_root 'cd /root/talos-rs && s=$(date +%s%N)
		{ scripts/run-local.sh; echo "run-local exit $?"; } 2>&1 |
			while IFS= read -r l; do t=$((($(date +%s%N) - s) / 100000000)); printf "%d.%d %s\n" $((t / 10)) $((t % 10)) "$l"; done' >"$log" 2>&1 || true
	# (talosctl is in target/release before becf4c5, a build of its own then.)
	t='cd /root/talos-rs && t=target/bin/talosctl && { [ -x $t ] || t=target/release/talosctl; } &&'
	in_root "$t \$t -n talos-default-worker-1 services" >>"$log" 2>&1 || true
	in_root "$t \$t cluster destroy --name talos-default" >/dev/null 2>&1 || true

	mkdir -p "$repo/target"
	cp "$log" "$repo/target/bench-first-run-$sha.log"
	at() { awk -v pat="$1" 'index($0, pat) { print $1; exit }' "$log"; }
	build_start="$(at 'rootfs: building')"
	build_end="$(at 'Finished `image` profile')"
	ready="$(awk '/: ready$/ { t = $1 } END { print t }' "$log")"
	end="$(awk '/run-local exit/ { print $1 }' "$log")"
	services="$(grep -c ' Running *OK' "$log" || true)"
	if ! grep -q 'run-local exit 0' "$log"; then
		tail -30 "$log" >&2
		echo "bench-first-run: $sha: run-local.sh failed" >&2
		exit 1
	fi
	echo "$sha: first run ${end} s: build from ${build_start} s to ${build_end} s, every node ready at ${ready} s; daemons Running/OK on the worker: $services"
done
