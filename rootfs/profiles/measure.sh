#!/usr/bin/env bash
# Measures the system calls stated and networkd make doing their real work, and lists those
# their seccomp profiles (x86_64/*.json) do not allow. Run as root after a build; needs strace.
#   rootfs/profiles/measure.sh [target/debug]
# stated serves networkd (in a network namespace of its own) and talosctl get/--watch; each
# runs under `strace -f -qq -c`. A name printed under "missing" must be added to gen.py (with
# a comment when a reviewer would ask why), then: python3 rootfs/profiles/gen.py
set -euo pipefail
bin=${1:-target/debug}
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT
strace -f -qq -c -o "$work/stated.txt" "$bin/stated" --socket "$work/s.sock" \
  --state-dir "$work/state" --run-dir "$work/run" --notify-fd 3 3>"$work/notify" 2>/dev/null &
sleep 1.5
unshare -n strace -f -qq -c -o "$work/networkd.txt" "$bin/networkd" --socket "$work/s.sock" \
  --root "$work/net" 2>/dev/null &
sleep 4
TALOS_SOCKET="$work/s.sock" "$bin/talosctl" get links >/dev/null 2>&1 || true
TALOS_SOCKET="$work/s.sock" timeout 2 "$bin/talosctl" get addresses --watch >/dev/null 2>&1 || true
pkill -TERM -f "$bin/networkd --socket $work/s.sock" || true
sleep 1.5
pkill -TERM -f "$bin/stated --socket $work/s.sock" || true
sleep 1.5
for d in stated networkd; do
  used=$(awk 'NR>2 && $NF!="total" && $1 !~ /^-/ {print $NF}' "$work/$d.txt" | sort -u)
  allowed=$(grep -o '"syscall": "[a-z0-9_]*"' "$here/x86_64/$d.json" | cut -d'"' -f4 | sort -u)
  echo "$d: $(echo "$used" | wc -w) calls measured; missing from the profile:" \
    "$(comm -23 <(echo "$used") <(echo "$allowed") | tr '\n' ' ')"
done
