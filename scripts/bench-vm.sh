#!/usr/bin/env bash
# VM boot figures (BENCHMARKS.md, "VM nodes"): a one-node `talosctl cluster create --provisioner
# qemu` cluster, ROUNDS times (default 3), each measuring
#   - kernel handoff → every daemon ready: the kernel's "Run /init" timestamp against init's
#     "every daemon is ready uptime=…" (both on the kernel's clock since boot);
#   - whole boot: qemu started → the node ready as `cluster create` sees it (config fetched
#     over HTTP, DHCP lease, every daemon healthy through apid);
#   - reboot → ready again: `talosctl reboot` (once STATE is mounted: the configuration is on
#     disk) → MachineStatus running and ready;
# and the initramfs's size. Uses the release image (rootfs/kernel.sh && rootfs/build.sh).
#
#   scripts/bench-vm.sh [ROUNDS] [ACCEL]       e.g. scripts/bench-vm.sh 5 tcg
set -euo pipefail
cd "$(dirname "$0")/.."
rounds="${1:-3}"
accel="${2:-tcg}"
[ -f target/rootfs/vmlinuz ] && [ -f target/rootfs/initramfs.cpio.gz ] ||
	{ echo "bench-vm: build the VM image first: rootfs/kernel.sh && rootfs/build.sh" >&2; exit 1; }
talosctl=target/bin/talosctl
work="$(mktemp -d)"
name="benchvm$$"
cleanup() {
	"$talosctl" --talosconfig "$work/talosconfig" cluster destroy --name "$name" --state "$work/state" >/dev/null 2>&1 || true
	rm -rf "$work"
}
trap cleanup EXIT
t() { "$talosctl" --talosconfig "$work/talosconfig" "$@"; }
now() { date +%s.%N; }
echo "bench-vm: $(nproc) CPUs ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)), accel $accel, load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "bench-vm: initramfs $(stat -c %s target/rootfs/initramfs.cpio.gz) bytes, kernel $(cat target/kernel/package 2>/dev/null || echo '?')"
for r in $(seq 1 "$rounds"); do
	t cluster create --provisioner qemu --accel "$accel" --name "$name" --state "$work/state" \
		--workers 0 --memory 1024 > "$work/create.out" 2> "$work/create.err"
	console="$work/state/$name/nodes/$name-controlplane-1/console.log"
	launched="$(sed -n 's/^\[ *\([0-9.]*\)s\] .*: VM (qemu pid.*/\1/p' "$work/create.err")"
	ready="$(sed -n 's/^\[ *\([0-9.]*\)s\] .*: ready$/\1/p' "$work/create.err")"
	handoff="$(sed 's/\x1b\[[0-9;]*m//g' "$console" | sed -n 's/^\[ *\([0-9.]*\)\] Run \/init as init process.*/\1/p' | head -1)"
	daemons="$(sed 's/\x1b\[[0-9;]*m//g' "$console" | sed -n 's/.*every daemon is ready.*uptime=\([0-9.]*\)s.*/\1/p' | head -1)"
	# The first boot partitions and formats the disk once configured: reboot once STATE
	# holds the configuration (a reboot during the format boots to maintenance again and
	# fetches the configuration anew, a different path).
	until t get mountstatuses 2>/dev/null | grep -q '/system/state'; do sleep 0.2; done
	start="$(now)"
	t reboot >/dev/null
	until sed 's/\x1b\[[0-9;]*m//g' "$console" | grep -c 'every daemon is ready' | grep -q 2 &&
		t get machinestatus 2>/dev/null | grep -q 'running *true'; do
		sleep 0.2
	done
	back="$(now)"
	awk -v r="$r" -v h="$handoff" -v d="$daemons" -v l="$launched" -v y="$ready" -v s="$start" -v b="$back" 'BEGIN {
		printf "round %d: kernel /init at %.2f s, every daemon ready at %.2f s: /init -> ready %.3f s; qemu -> node ready %.2f s; reboot -> ready %.2f s\n", r, h, d, d - h, y - l, b - s
	}'
	"$talosctl" --talosconfig "$work/talosconfig" cluster destroy --name "$name" --state "$work/state" >/dev/null 2>&1
done
