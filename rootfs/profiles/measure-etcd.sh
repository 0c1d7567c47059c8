#!/usr/bin/env bash
# Measures the system calls etcd (Debian's etcd-server) and `etcdctl snapshot restore` make doing
# a control plane's real work, and lists those their seccomp profiles (x86_64/etcd.json,
# x86_64/etcdctl.json) do not allow. Run as root; needs strace, openssl, setpriv (util-linux).
#   rootfs/profiles/measure-etcd.sh                   strace -f -qq -c of every etcd and etcdctl
#   rootfs/profiles/measure-etcd.sh --args            the argument shapes of clone, socket, ioctl,
#                                                     prctl, fcntl, kill... (what gen.py filters)
#   rootfs/profiles/measure-etcd.sh --under WRAPPER   no strace: every etcd and restore runs as
#       `WRAPPER x86_64/<profile>.json PROGRAM ARGS...`, a program that installs what the sandbox
#       installs (no_new_privs, the filter failing clone3 with ENOSYS, then the allow-list) and
#       execs; fails if one dies of SIGSYS (status 159, "Bad system call")
# Everything runs in a network namespace of its own (unshare -n: only its lo and a default route
# over it, gone at exit) and a mktemp directory: a TLS cluster (a CA, server, peer and client
# certificates made by openssl; client-cert-auth and peer-client-cert-auth on; the flags k8sd
# renders, k8sd/src/etcd/args.rs), each member on its own address 127.0.0.N with the ports a
# node's sandbox allows, 2379 and 2380. etcd and the restore run as a non-root uid, as on a node.
# The scenario: bootstrap m1; put/get/txn/watch, leases, compaction, a minute of load; m2 and m3
# added as learners (they get raft snapshots: --snapshot-count is small) and promoted; endpoint
# status/health, snapshot save, defrag, alarm list/disarm, move-leader; SIGTERM of m2 and restart
# from its data dir; SIGKILL of the leader and restart; member remove of m3 (it stops itself);
# `etcdctl snapshot restore` of the saved snapshot and of a copied db (--skip-hash-check); SIGTERM
# of m1 and m2; an etcd started on the restored directory, listening on [::] and 0.0.0.0, and its
# SIGINT. Takes about two minutes. A name printed under "missing" must be added to gen.py (with a
# comment when a reviewer would ask why), then:
#   python3 rootfs/profiles/gen.py
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
if [ "${1:-}" != --in-netns ]; then
  exec unshare --net -- "$0" --in-netns "$@"
fi
shift
mode=measure under=""
case "${1:-}" in
  --args) mode=args ;;
  --under) mode=under under=$(realpath "$2") ;;
  "") ;;
  *) echo "usage: $0 [--args | --under WRAPPER]" >&2; exit 2 ;;
esac
uid=${ETCD_UID:-2379} # the member's uid; no passwd entry is needed
ip link set lo up
# A default route (over lo: no traffic leaves the namespace) as on a node: etcd looks for it at
# start (rtnetlink dumps of routes, addresses and links) to pick a default host.
ip route add default dev lo
work=$(mktemp -d)
declare -A pid=() ip=()
cleanup() { # the programs first (strace does not kill its tracee when it dies), then strace
  local j n rc
  for n in "${!pid[@]}"; do # a member that died unexpectedly: how
    kill -0 "${pid[$n]}" 2>/dev/null && continue
    rc=0; wait "${pid[$n]}" 2>/dev/null || rc=$?
    [ "$rc" = 159 ] && echo "$n died of SIGSYS (a call outside its profile)" >&2
  done
  for j in $(jobs -p); do pkill -KILL -P "$j" 2>/dev/null || true; kill -KILL "$j" 2>/dev/null || true; done
  wait 2>/dev/null || true
  if [ -n "${KEEP:-}" ]; then echo "kept: $work"; else rm -rf "$work"; fi
}
trap cleanup EXIT
chmod 0755 "$work"
mkdir -p "$work"/{pki,data,trace,log}
chown "$uid:$uid" "$work"/{data,trace}

# The PKI: one CA; per member a server and a peer certificate for 127.0.0.N; a client certificate.
pki=$work/pki
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 -subj /CN=etcd-ca \
  -keyout "$pki/ca.key" -out "$pki/ca.crt" 2>/dev/null
cert() { # name cn extendedKeyUsage [ip]
  printf 'basicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=%s\n%s' \
    "$3" "${4:+subjectAltName=IP:$4,IP:127.0.0.1,IP:::1,DNS:localhost}" >"$pki/$1.ext"
  openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=$2" \
    -keyout "$pki/$1.key" -out "$pki/$1.csr" 2>/dev/null
  openssl x509 -req -in "$pki/$1.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" -CAcreateserial \
    -days 2 -extfile "$pki/$1.ext" -out "$pki/$1.crt" 2>/dev/null
}
for i in 1 2 3 4; do
  cert "server$i" "m$i" serverAuth,clientAuth "127.0.0.$i"
  cert "peer$i" "m$i" serverAuth,clientAuth "127.0.0.$i"
done
cert client root clientAuth
chown -R "$uid:$uid" "$pki"

# Runs PROFILE's PROGRAM as the member uid: under strace, or under the wrapper. Meant to be run
# in the background or foreground; execs, so `$!` is strace's (or the program's own) pid.
runs=0
# The calls whose arguments gen.py filters or a reviewer asks about (--args).
shapes=clone,clone3,socket,ioctl,prctl,fcntl,kill,tgkill,madvise,setsockopt,getsockopt,flock
shapes+=,prlimit64,setrlimit,mmap,mprotect,fallocate
launch() { # profile tag program args...
  local profile=$1 tag=$2; shift 2
  local as=(setpriv --reuid="$uid" --regid="$uid" --clear-groups --)
  # A soft limit below the hard one, as a node's services get (the kernel's 1024:4096): Go raises
  # its soft RLIMIT_NOFILE to the hard one at start.
  ulimit -S -n 1024
  case $mode in
    measure) exec "${as[@]}" strace -f -qq -c -o "$work/trace/$profile.$tag.txt" "$@" ;;
    args) exec "${as[@]}" strace -f -qq -o "$work/trace/$profile.$tag.txt" -e trace="$shapes" "$@" ;;
    under) exec "${as[@]}" "$under" "$here/x86_64/$profile.json" "$@" ;;
  esac
}
statuses=()
# The etcd process of member NAME (strace's child when traced).
etcd_pid() {
  if [ "$mode" = under ]; then echo "${pid[$1]}"; else pgrep -P "${pid[$1]}" -x etcd; fi
}
# Starts member NAME with k8sd's flags; m1 logs with 3.4's default logger (capnslog), the others
# as k8sd runs etcd (zap to stderr). --snapshot-count=200 is ours: raft snapshots come sooner.
start() { # name state initial-cluster [client-listen-host [peer-listen-host]]
  local n=$1 a=${ip[$1]} l=${4:-${ip[$1]}} lp=${5:-${4:-${ip[$1]}}} k=${1#m}; runs=$((runs + 1))
  [ "$n" = r1 ] && k=4
  (launch etcd "$n.$runs" /usr/bin/etcd --name "$n" --data-dir "$work/data/$n" \
    --listen-peer-urls "https://$lp:2380" --listen-client-urls "https://$l:2379" \
    --advertise-client-urls "https://$a:2379" --initial-advertise-peer-urls "https://$a:2380" \
    --initial-cluster "$3" --initial-cluster-state "$2" \
    --cert-file "$pki/server$k.crt" --key-file "$pki/server$k.key" --trusted-ca-file "$pki/ca.crt" \
    --peer-cert-file "$pki/peer$k.crt" --peer-key-file "$pki/peer$k.key" \
    --peer-trusted-ca-file "$pki/ca.crt" --client-cert-auth=true --peer-client-cert-auth=true \
    --experimental-initial-corrupt-check=true --experimental-watch-progress-notify-interval=5s \
    --auto-tls=false --peer-auto-tls=false --snapshot-count=200 \
    $([ "$n" = m1 ] || echo --logger=zap --log-outputs=stderr) >>"$work/log/$n.log" 2>&1) &
  pid[$n]=$!
}
# Waits for member NAME's process to end (at most 30 s) and records its status.
reap() { # name expected-status
  local n=$1 rc=0 t
  for t in $(seq 60); do kill -0 "${pid[$n]}" 2>/dev/null || break; sleep 0.5; done
  wait "${pid[$n]}" 2>/dev/null || rc=$?
  statuses+=("$n: exit $rc (expected $2)")
  echo "  $n exited with status $rc (expected $2)"
}
ctl() { # etcdctl as the cluster's client; its messages go to log/etcdctl.log
  echo "+ etcdctl $*" >>"$work/log/etcdctl.log"
  ETCDCTL_API=3 etcdctl --dial-timeout=3s --command-timeout=20s --cacert "$pki/ca.crt" \
    --cert "$pki/client.crt" --key "$pki/client.key" "$@" 2>>"$work/log/etcdctl.log" ||
    { local rc=$?; tail -n 5 "$work/log/etcdctl.log" >&2; return $rc; }
}
eps() { local e="" n; for n in "$@"; do e+="${e:+,}https://${ip[$n]}:2379"; done; echo "$e"; }
healthy() { # name...
  local t n
  for t in $(seq 120); do
    if ctl --endpoints "$(eps "$@")" endpoint health >/dev/null 2>&1; then
      for n in "$@"; do # under the wrapper: the allow-list and the ENOSYS filter are in force
        [ "$mode" != under ] || grep -q '^Seccomp_filters:[[:space:]]*2$' "/proc/$(etcd_pid "$n")/status" ||
          { echo "$n is not under its two seccomp filters" >&2; return 1; }
      done
      return 0
    fi
    sleep 0.5
  done
  echo "members $* not healthy; logs:" >&2; tail -n 20 "$work"/log/*.log >&2; return 1
}
add_learner() { # name cluster-so-far
  local n=$1 id t
  id=$(ctl --endpoints "$(eps m1)" member add "$n" --learner --peer-urls "https://${ip[$n]}:2380" |
    awk '/^Member/ {print $2}')
  start "$n" existing "$2,$n=https://${ip[$n]}:2380"
  for t in $(seq 120); do
    ctl --endpoints "$(eps m1)" member promote "$id" >/dev/null 2>&1 && { echo "  $n promoted"; return 0; }
    sleep 0.5
  done
  echo "$n not promoted" >&2; return 1
}
pu() { echo "https://${ip[$1]}:2380"; }

for n in 1 2 3; do ip[m$n]=127.0.0.$n; done
ip[r1]=127.0.0.4
echo "etcd: bootstrap m1, client work"
start m1 new "m1=$(pu m1)"
healthy m1
c=$(eps m1)
for i in $(seq 40); do ctl --endpoints "$c" put "/registry/k$i" "v$i" >/dev/null; done
timeout 12 etcdctl --cacert "$pki/ca.crt" --cert "$pki/client.crt" --key "$pki/client.key" \
  --endpoints "$c" watch --prefix /registry/ --progress-notify >/dev/null 2>&1 &
watch_pid=$!
ctl --endpoints "$c" txn >/dev/null <<'EOF'
mod("/registry/k1") > "0"

put /registry/k1 txn

put /registry/k1 else

EOF
# A minute of load (some 9000 writes): with --snapshot-count=200 the members take raft snapshots
# and compact their raft logs, so a learner joining later gets the state as a raft snapshot sent
# over the peer port. It reports a failure when the traced etcd is slow: only the writes matter.
ctl --endpoints "$c" check perf --load=s --prefix=/perf/ --auto-compact --auto-defrag >/dev/null 2>&1 || true
ctl --endpoints "$c" get --prefix /registry/ --keys-only >/dev/null
lease=$(ctl --endpoints "$c" lease grant 60 | awk '{print $2}')
ctl --endpoints "$c" put --lease="$lease" /registry/leased x >/dev/null
ctl --endpoints "$c" lease keep-alive --once "$lease" >/dev/null
ctl --endpoints "$c" lease revoke "$lease" >/dev/null
rev=$(ctl --endpoints "$c" endpoint status -w json | grep -o '"revision":[0-9]*' | head -1 | cut -d: -f2)
ctl --endpoints "$c" compact "$rev" --physical >/dev/null
ctl --endpoints "$c" del --prefix /perf/ >/dev/null || true
echo "etcd: m2 and m3 join as learners and are promoted"
add_learner m2 "m1=$(pu m1)"
healthy m1 m2
add_learner m3 "m1=$(pu m1),m2=$(pu m2)"
healthy m1 m2 m3
all=$(eps m1 m2 m3)
ctl --endpoints "$all" member list >/dev/null
ctl --endpoints "$all" endpoint status >/dev/null
ctl --endpoints "$all" endpoint health >/dev/null
ctl --endpoints "$(eps m2)" snapshot save "$work/snap.db" >/dev/null
ctl --endpoints "$all" defrag >/dev/null
ctl --endpoints "$all" alarm list >/dev/null
ctl --endpoints "$all" alarm disarm >/dev/null
leader=$(ctl --endpoints "$all" endpoint status | awk -F', ' '$5 == "true" {print $1}')
target=$(ctl --endpoints "$all" endpoint status | awk -F', ' '$5 != "true" {print $2; exit}')
ctl --endpoints "$leader" move-leader "$target" >/dev/null
echo "  leader moved from $leader to $target"
wait "$watch_pid" 2>/dev/null || true
# A watch on a follower, long enough for progress notifications (every 5 s).
timeout 7 etcdctl --cacert "$pki/ca.crt" --cert "$pki/client.crt" --key "$pki/client.key" \
  --endpoints "$(eps m3)" watch --prefix /registry/ --progress-notify >/dev/null 2>&1 || true

echo "etcd: SIGTERM of m2, restart; SIGKILL of the leader, restart"
kill -TERM "$(etcd_pid m2)"
reap m2 143
cp "$work/data/m2/member/snap/db" "$work/copied.db" # a db taken from a data dir: no hash
start m2 existing "m1=$(pu m1),m2=$(pu m2),m3=$(pu m3)"
healthy m1 m2 m3
leader=$(ctl --endpoints "$all" endpoint status | awk -F', ' '$5 == "true" {print $1}')
for n in m1 m2 m3; do [ "$(eps $n)" = "$leader" ] && victim=$n; done
kill -KILL "$(etcd_pid "$victim")"
reap "$victim" 137
start "$victim" existing "m1=$(pu m1),m2=$(pu m2),m3=$(pu m3)"
healthy m1 m2 m3
ctl --endpoints "$all" put /registry/after-restart y >/dev/null

echo "etcd: member remove of m3 (it stops itself)"
id3=$(ctl --endpoints "$(eps m1)" member list | awk -F', ' '$3 == "m3" {print $1}')
for t in $(seq 60); do # refused until the leader has seen every member for 5 s
  ctl --endpoints "$(eps m1)" member remove "$id3" >/dev/null 2>&1 && break
  sleep 0.5
done
reap m3 "any but 159"
ctl --endpoints "$(eps m1 m2)" endpoint health >/dev/null

echo "etcdctl: snapshot restore (saved snapshot; copied db with --skip-hash-check)"
chown "$uid:$uid" "$work/snap.db" "$work/copied.db"
for r in r1:snap.db r2:copied.db; do
  n=${r%%:*} f=${r#*:} rc=0; runs=$((runs + 1))
  (launch etcdctl "$n.$runs" /usr/bin/etcdctl snapshot restore "$work/$f" --data-dir "$work/data/$n" \
    --name "$n" --initial-cluster "$n=https://127.0.0.4:2380" \
    --initial-advertise-peer-urls "https://127.0.0.4:2380" \
    $([ "$f" = copied.db ] && echo --skip-hash-check) >>"$work/log/restore.log" 2>&1) || rc=$?
  statuses+=("restore $n: exit $rc (expected 0)")
  echo "  restore $n exited with status $rc"
  [ "$rc" = 0 ] || { tail -n 5 "$work/log/restore.log" >&2; exit 1; }
done
echo "etcd: SIGTERM of m1 and m2"
for n in m1 m2; do kill -TERM "$(etcd_pid "$n")"; done
for n in m1 m2; do reap "$n" 143; done
echo "etcd: a member started on the restored data, listening on [::] (clients) and 0.0.0.0 (peers)"
start r1 new "r1=$(pu r1)" "[::]" 0.0.0.0
healthy r1
ctl --endpoints "$(eps r1)" get /registry/k1 >/dev/null
ctl --endpoints "$(eps r1)" put /registry/restored z >/dev/null
ctl --endpoints "https://[::1]:2379" get /registry/restored >/dev/null
kill -INT "$(etcd_pid r1)" # SIGINT: etcd raises it again on itself like SIGTERM
reap r1 130

case $mode in
  measure)
    for p in etcd etcdctl; do
      used=$(awk 'FNR>2 && $NF!="total" && $1 !~ /^-/ {print $NF}' "$work"/trace/"$p".*.txt | sort -u)
      allowed=$( (grep -o '"syscall": "[a-z0-9_]*"' "$here/x86_64/$p.json" 2>/dev/null || true) | cut -d'"' -f4 | sort -u)
      echo "$p: $(echo "$used" | wc -w) calls measured: $(echo "$used" | tr '\n' ' ')"
      echo "$p: missing from the profile: $(comm -23 <(echo "$used") <(echo "$allowed") | tr '\n' ' ')"
    done ;;
  args)
    for p in etcd etcdctl; do
      echo "$p: argument shapes (count, call, the arguments a filter can check)"
      sed -E -n -e 's/^[0-9]+ +//' \
        -e 's/^(clone3?)\(.*flags=([A-Z_|]+).*/\1 \2/p' \
        -e 's/^socket\(([^,]*), ([^,]*), ([^ ,)<]*).*/socket \1 \2 \3/p' \
        -e 's/^([gs]etsockopt)\([^,]*, ([^,]*), ([^,]*),.*/\1 \2 \3/p' \
        -e 's/^(fcntl|ioctl|flock|kill|fallocate)\([^,]*, ([A-Za-z_0-9|]+).*/\1 \2/p' \
        -e 's/^prctl\(([A-Z_0-9]+).*/prctl \1/p' \
        -e 's/^(tgkill|madvise|mprotect)\([^,]*, [^,]*, ([A-Z_0-9|]+).*/\1 \2/p' \
        -e 's/^mmap\([^,]*, [^,]*, ([A-Z_|]+), ([A-Z_|]+).*/mmap \1 \2/p' \
        -e 's/^prlimit64\([^,]*, ([A-Z_]+), NULL.*/prlimit64 \1 (read)/p' \
        -e 's/^setrlimit\(([A-Z_]+).*/setrlimit \1/p' \
        -e 's/^prlimit64\([^,]*, ([A-Z_]+), \{.*/prlimit64 \1 (set)/p' \
        "$work"/trace/"$p".*.txt | sort | uniq -c | sort -k2,2 -k1,1rn
    done ;;
  under)
    printf '%s\n' "${statuses[@]}"
    if grep -l -i 'bad system call' "$work"/log/*.log 2>/dev/null ||
      printf '%s\n' "${statuses[@]}" | grep -q 'exit 159'; then
      echo "FAILED: a process died of SIGSYS" >&2; exit 1
    fi
    echo "no process died of SIGSYS" ;;
esac
