#!/usr/bin/env bash
# The etcd benchmark (BENCHMARKS.md, "etcd: bootstrap to three voters"): a local cluster of three
# control planes; from the moment `talosctl bootstrap` returns on the first, the time until
# etcd lists three voting members (etcdctl, polled every 0.1 s on the first node), then, after
# 10 s of idling, k8sd's and etcd's RSS on each control plane. Then the shared VIP
# (`machine.network.interfaces[].vip`, patched on the three): once one control plane has it on
# eth0, (1) that holder is rebooted (`talosctl reboot`) and the time until another control
# plane has it on eth0 is measured (polled every 0.05 s), then, once the rebooted node is back,
# (2) the new holder crashes (its init killed with SIGKILL, its eth0 set down) and the time
# until a third holder has it is measured (bounded by the lease's TTL, 10 s).
#
#   scripts/bench-etcd.sh [runs]             default 3 runs; medians are reported
#
# Builds the image and talosctl (rootfs/build.sh: static, stripped). Clusters go to a
# temporary state directory and talosconfig: ~/.talos is not touched. Needs root.
set -euo pipefail
cd "$(dirname "$0")/.."
runs="${1:-3}"

if [ "$(id -u)" != 0 ]; then
	echo "bench-etcd: run as root (namespaces, mounts, network links)" >&2
	exit 1
fi
scripts/install-deps.sh >/dev/null
rootfs/build.sh >/dev/null

work="$(mktemp -d /tmp/bench-etcd.XXXXXX)"
talosctl() { target/bin/talosctl --talosconfig "$work/talosconfig" "$@"; }
cleanup() {
	for d in "$work"/clusters/*/; do
		[ -d "$d" ] && talosctl cluster destroy --state "$work/clusters" --name "$(basename "$d")" >/dev/null 2>&1 || true
	done
	rm -rf "$work"
}
trap cleanup EXIT

median() { sort -g | awk '{a[NR]=$1} END {m=(NR%2)?a[(NR+1)/2]:(a[NR/2]+a[NR/2+1])/2; printf "%.2f", m}'; }
now() { date +%s.%N; }
# The host PIDs of the processes named $2 in the PID namespace of init $1.
procs_in() {
	local ns
	ns=$(readlink "/proc/$1/ns/pid")
	for p in $(pgrep -x "$2"); do
		[ "$(readlink "/proc/$p/ns/pid" 2>/dev/null)" = "$ns" ] && echo "$p"
	done
}
rss_kib() { awk '/^VmRSS:/ {print $2}' "/proc/$1/status"; }

: >"$work/voters"; : >"$work/k8sd"; : >"$work/etcd"; : >"$work/vip_reboot"; : >"$work/vip_crash"
for ((r = 1; r <= runs; r++)); do
	name="etcd$r"
	talosctl cluster create --state "$work/clusters" --name "$name" --image target/rootfs/tree \
		--controlplanes 3 --workers 0 >/dev/null 2>"$work/progress"
	show=$(talosctl cluster show --state "$work/clusters" --name "$name" -o json)
	first_ip=$(echo "$show" | python3 -c 'import json,sys; print(json.load(sys.stdin)["nodes"][0]["ip"])')
	first_ns=$(echo "$show" | python3 -c 'import json,sys; print(json.load(sys.stdin)["nodes"][0]["netns"])')
	first_init=$(echo "$show" | python3 -c 'import json,sys; print(json.load(sys.stdin)["nodes"][0]["initPid"])')
	inits=$(echo "$show" | python3 -c 'import json,sys; print(" ".join(str(n["initPid"]) for n in json.load(sys.stdin)["nodes"]))')
	pki="/proc/$first_init/root/system/secrets/etcd"
	talosctl -n "$first_ip" bootstrap >/dev/null
	t0=$(now)
	while :; do
		voters=$(ip netns exec "$first_ns" env ETCDCTL_API=3 etcdctl --endpoints=https://127.0.0.1:2379 \
			--cacert="$pki/ca.crt" --cert="$pki/admin.crt" --key="$pki/admin.key" --command-timeout=2s \
			member list -w json 2>/dev/null |
			python3 -c 'import json,sys; m=json.load(sys.stdin).get("members",[]); print(sum(1 for x in m if x.get("name") and not x.get("isLearner")))' 2>/dev/null || echo 0)
		[ "$voters" = 3 ] && break
		if awk -v a="$t0" -v b="$(now)" 'BEGIN {exit !(b - a > 180)}'; then
			echo "bench-etcd: no three voters within 180 s" >&2
			exit 1
		fi
		sleep 0.1
	done
	t1=$(now)
	awk -v a="$t0" -v b="$t1" 'BEGIN {print b - a}' >>"$work/voters"
	sleep 10
	for init in $inits; do
		for p in $(procs_in "$init" k8sd); do rss_kib "$p" >>"$work/k8sd"; done
		for p in $(procs_in "$init" etcd); do rss_kib "$p" >>"$work/etcd"; done
	done
	echo "run $r: three voters after $(tail -1 "$work/voters") s" >&2

	# The shared VIP: .200 of the first node's /24.
	vip="${first_ip%.*}.200"
	nodes_json="$show"
	ips=$(echo "$nodes_json" | python3 -c 'import json,sys; print(" ".join(n["ip"] for n in json.load(sys.stdin)["nodes"]))')
	for ip in $ips; do
		talosctl -n "$ip" patch machineconfig -p "{\"machine\": {\"network\": {\"interfaces\": [{\"interface\": \"eth0\", \"vip\": {\"ip\": \"$vip\"}}]}}}" >/dev/null
	done
	# The netns of the node holding the VIP, other than $1 ("" when none or several).
	holder() {
		local found=""
		for ns in $(talosctl cluster show --state "$work/clusters" --name "$name" -o json |
			python3 -c 'import json,sys; print(" ".join(n["netns"] for n in json.load(sys.stdin)["nodes"]))'); do
			[ "$ns" = "${1:-}" ] && continue
			if ip -n "$ns" -o -4 addr show dev eth0 2>/dev/null | grep -q "inet $vip/32"; then
				[ -n "$found" ] && { echo ""; return; }
				found="$ns"
			fi
		done
		echo "$found"
	}
	wait_holder() {
		local t0 h
		t0=$(now)
		while :; do
			h=$(holder "${1:-}")
			[ -n "$h" ] && { echo "$h"; return; }
			if awk -v a="$t0" -v b="$(now)" 'BEGIN {exit !(b - a > 120)}'; then
				echo "bench-etcd: no VIP holder within 120 s" >&2
				exit 1
			fi
			sleep 0.05
		done
	}
	first_holder=$(wait_holder)
	node_of() { talosctl cluster show --state "$work/clusters" --name "$name" -o json |
		python3 -c 'import json,sys; ns=sys.argv[1]; print([n[sys.argv[2]] for n in json.load(sys.stdin)["nodes"] if n["netns"]==ns][0])' "$1" "$2"; }
	talosctl -n "$(node_of "$first_holder" ip)" reboot >/dev/null
	t0=$(now)
	second=$(wait_holder "$first_holder")
	awk -v a="$t0" -v b="$(now)" 'BEGIN {print b - a}' >>"$work/vip_reboot"
	# Wait for the rebooted node's etcd again (three voters) before the crash.
	sleep 5
	for ((i = 0; i < 600; i++)); do
		init=$(node_of "$first_holder" initPid)
		ok=$(ip netns exec "$first_holder" env ETCDCTL_API=3 etcdctl --endpoints=https://127.0.0.1:2379 \
			--cacert="/proc/$init/root/system/secrets/etcd/ca.crt" --cert="/proc/$init/root/system/secrets/etcd/admin.crt" \
			--key="/proc/$init/root/system/secrets/etcd/admin.key" --command-timeout=2s endpoint health 2>&1 | grep -c "is healthy" || true)
		[ "$ok" = 1 ] && break
		sleep 0.2
	done
	kill -9 "$(node_of "$second" initPid)"
	ip -n "$second" link set eth0 down
	t0=$(now)
	wait_holder "$second" >/dev/null
	awk -v a="$t0" -v b="$(now)" 'BEGIN {print b - a}' >>"$work/vip_crash"
	echo "run $r: VIP failover $(tail -1 "$work/vip_reboot") s (holder rebooted), $(tail -1 "$work/vip_crash") s (holder crashed)" >&2
	talosctl cluster destroy --state "$work/clusters" --name "$name" >/dev/null 2>&1
done

echo "commit:                          $(git rev-parse --short HEAD)$(git diff --quiet || echo '+dirty')"
echo "runs:                            $runs"
echo "bootstrap -> 3 voters (median):  $(median <"$work/voters") s   (all: $(tr '\n' ' ' <"$work/voters"))"
echo "k8sd RSS, idle (median, max):    $(awk '{print $1/1024}' "$work/k8sd" | median) MiB, $(sort -g "$work/k8sd" | tail -1 | awk '{printf "%.1f", $1/1024}') MiB"
echo "etcd RSS, idle (median):         $(awk '{print $1/1024}' "$work/etcd" | median) MiB"
echo "VIP failover, holder rebooted:   $(median <"$work/vip_reboot") s   (all: $(tr '\n' ' ' <"$work/vip_reboot"))"
echo "VIP failover, holder crashed:    $(median <"$work/vip_crash") s   (all: $(tr '\n' ' ' <"$work/vip_crash"))"
