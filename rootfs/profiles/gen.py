#!/usr/bin/env python3
"""Writes the seccomp profiles of the image (x86_64/<name>.json, seccompiler's JSON format).

The allow-lists were measured, not guessed: `strace -f -qq -c` of each binary running its real
work (stated serving networkd and talosctl; networkd reconciling in a netns; sleep; a TLS etcd
cluster and `etcdctl snapshot restore`: measure-etcd.sh), plus the calls a reviewer finds
commented below. Edit this script, not the JSON, then run it:
    python3 rootfs/profiles/gen.py
init's build.rs compiles every profile with seccompiler (the build fails on an unknown name) and
embeds it. Every profile kills the process on a call outside its list (SIGSYS): a missing call
is found at once, in tests, never silently refused.
"""
import json, os

AF_UNIX, AF_INET, AF_INET6, AF_NETLINK, AF_PACKET = 1, 2, 10, 16, 17
FIONBIO = 0x5421
FIONREAD = 0x541B
PR_SET_NAME = 15
PR_SET_DUMPABLE = 4
# CLONE_NEWNS | CLONE_NEWCGROUP | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWUSER | CLONE_NEWPID | CLONE_NEWNET
CLONE_NEW_ANY = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000

def call(name, comment=None, args=None):
    d = {"syscall": name}
    if comment:
        d["comment"] = comment
    if args:
        d["args"] = args
    return d

SOCK_TYPE_MASK, SOCK_STREAM, SOCK_DGRAM = 0xF, 1, 2  # the type without SOCK_CLOEXEC/SOCK_NONBLOCK
NETLINK_ROUTE = 0
SIGINT, SIGTERM = 2, 15
RLIMIT_NOFILE = 7

def arg_masked(index, mask, val, comment):
    return {"index": index, "type": "dword", "op": {"masked_eq": mask}, "val": val, "comment": comment}

def arg_eq(index, val, comment):
    return {"index": index, "type": "dword", "op": "eq", "val": val, "comment": comment}

# What any dynamically linked glibc program does until main (ld.so, libc init).
STARTUP = [
    call("execve", "the filter is installed before exec: the exec itself must pass"),
    call("brk"), call("mmap", "unfiltered: W^X is not enforced (no MemoryDenyWriteExecute equivalent)"),
    call("mprotect", "ld.so maps segments read-only after relocation"), call("munmap"),
    call("arch_prctl", "ld.so sets up thread-local storage (ARCH_SET_FS)"),
    call("set_tid_address"), call("set_robust_list"), call("rseq", "glibc registers restartable sequences"),
    call("access", "ld.so probes /etc/ld.so.preload"), call("openat", "any path: landlock, not seccomp, decides which paths open"),
    call("newfstatat"), call("pread64", "ld.so reads ELF headers"), call("read"), call("close"),
    call("prlimit64", "the stack limit is read at start; raising a limit still needs CAP_SYS_RESOURCE"),
    call("getrandom", "glibc malloc and Rust's hash seeds"),
    call("readlink", "a static-pie glibc program reads /proc/self/exe at start (the image's binaries)"),
    call("exit"), call("exit_group"),
]

# Rust std + tokio multi-thread runtime, measured in stated and networkd.
RUNTIME = [
    call("write"), call("writev", "tonic/hyper write frames with writev"),
    call("mremap", "realloc of large buffers"), call("madvise", "glibc frees thread stacks and arenas"),
    call("rt_sigaction", "std installs SIGSEGV/SIGBUS handlers; tokio its signal handlers"),
    call("rt_sigprocmask"), call("rt_sigreturn"), call("sigaltstack", "std's stack-overflow guard"),
    call("poll", "std checks at startup that fds 0-2 are open"),
    call("fcntl", "std and tokio: F_GETFD/F_SETFD/F_GETFL/F_SETFL on their own fds"),
    call("futex"), call("sched_getaffinity", "tokio sizes its thread pool"), call("sched_yield"),
    call("gettid"), call("getpid"),
    call("clone3", "listed so that it is not killed: the sandbox stacks a filter that fails it with ENOSYS "
         "(its flags sit in a struct seccomp cannot read), and glibc then creates threads with clone"),
    call("clone", "threads (glibc's fallback from clone3): never with a CLONE_NEW* flag",
         [{"index": 0, "type": "qword", "op": {"masked_eq": CLONE_NEW_ANY}, "val": 0,
           "comment": "no CLONE_NEWNS/CGROUP/UTS/IPC/USER/PID/NET"}]),
    call("prctl", "only PR_SET_NAME (tokio names its threads); no other prctl after the sandbox is set",
         [arg_eq(0, PR_SET_NAME, "PR_SET_NAME")]),
    call("prctl", "PR_SET_DUMPABLE to 0 only: the daemon makes itself non-dumpable first thing "
         "(sandbox::daemon::harden; execve resets the flag)",
         [arg_eq(0, PR_SET_DUMPABLE, "PR_SET_DUMPABLE"), arg_eq(1, 0, "0: not dumpable")]),
    call("epoll_create1"), call("epoll_ctl"), call("epoll_wait"), call("epoll_pwait"),
    call("eventfd2", "mio's waker"),
    call("socketpair", "tokio's signal driver: a UNIX stream pair", [arg_eq(0, AF_UNIX, "AF_UNIX")]),
    call("statx"), call("lseek"),
    call("clock_nanosleep"), call("nanosleep"), call("restart_syscall"),
    call("clock_gettime", "normally in the vDSO; kept for hosts without it"),
    call("tgkill", "abort() on a fatal Rust error raises SIGABRT on itself"),
    call("ioctl", "only FIONBIO (std's set_nonblocking, e.g. on a socket handed over by init); no device "
         "or interface ioctls", [arg_eq(1, FIONBIO, "FIONBIO")]),
]

def profile(name, calls):
    seen, out = set(), []
    for c in calls:
        key = json.dumps(c, sort_keys=True)
        if key in seen:
            continue
        seen.add(key)
        out.append(c)
    return {name: {"mismatch_action": "kill_process", "match_action": "allow", "filter": out}}

STATED = STARTUP + RUNTIME + [
    call("socket", "the State API socket only: UNIX (and only when it binds its own, without --listen-fd)",
         [arg_eq(0, AF_UNIX, "AF_UNIX")]),
    call("bind"), call("listen"), call("accept4", "clients of the State API"),
    call("getsockopt", "SO_PEERCRED: every peer is identified by the kernel"),
    call("getpeername"), call("getsockname"),
    call("recvfrom"), call("sendto"), call("shutdown"),
    call("chmod", "the socket is made 0666 (access is per request, by peer uid)"),
    call("mkdir"), call("rename", "atomic replace of durable namespace files"), call("unlink", "the stale socket, temp files"),
    call("ftruncate", "the run log is cut back to its last valid record on open"),
    call("fsync", "durable namespaces: the file, then its directory"), call("fdatasync"),
    call("getdents64", "listing the state directories at open"),
]

NETWORKD = STARTUP + RUNTIME + [
    call("socket", "stated's socket", [arg_eq(0, AF_UNIX, "AF_UNIX")]),
    call("socket", "rtnetlink: links, addresses, routes, and their multicast events", [arg_eq(0, AF_NETLINK, "AF_NETLINK")]),
    call("socket", "DHCPv4 (UDP 68 bound to a link)", [arg_eq(0, AF_INET, "AF_INET")]),
    call("socket", "IPv6 address and route families of rtnetlink helpers", [arg_eq(0, AF_INET6, "AF_INET6")]),
    call("socket", "the gratuitous ARP of a shared IP: a link-layer datagram socket (protocol 0: it "
         "sends only, receives nothing; needs CAP_NET_RAW)",
         [arg_eq(0, AF_PACKET, "AF_PACKET"), arg_masked(1, SOCK_TYPE_MASK, SOCK_DGRAM, "SOCK_DGRAM")]),
    call("connect", "stated's socket; landlock decides TCP ports (none)"),
    call("bind", "netlink groups; DHCP port 68"),
    call("setsockopt", "SO_RCVBUF on netlink sockets; SO_BROADCAST, SO_BINDTODEVICE (needs CAP_NET_RAW), SO_REUSEADDR for DHCP"),
    call("getsockopt", "SO_ERROR after a non-blocking connect"),
    call("getsockname", "netlink-sys reads its port id after bind"),
    call("sendto"), call("recvfrom"), call("sendmsg"), call("recvmsg"),
    call("shutdown", "closing the connection to stated (measured when stated restarts)"),
    call("getpeername"),
    call("chmod", "rendered etc files get their mode"), call("mkdir"), call("rename", "etc files are replaced atomically"),
    call("unlink", "a temp file left by a failed rename"),
]

# secretsd: a stated client and nothing else (its certificates are made in memory; ring's
# randomness is getrandom, in STARTUP).
SECRETSD = STARTUP + RUNTIME + [
    call("socket", "stated's socket", [arg_eq(0, AF_UNIX, "AF_UNIX")]),
    call("connect", "stated's socket; landlock forbids every TCP port"),
    call("getsockopt", "SO_ERROR after a non-blocking connect"),
    call("sendto"), call("recvfrom"),
    call("shutdown", "closing the connection to stated"), call("getpeername"), call("getsockname"),
]

BLKRRPART = 0x125F
# blockd: a stated client that reads sysfs and the first blocks of the disks, and writes the
# partition table of a blank disk (formatting is mkfs.xfs, a service init runs for it).
BLOCKD = SECRETSD + [
    call("getdents64", "listing /sys/block and a disk's partitions"),
    call("flock", "a shared lock on a disk while it is probed (writers take it exclusive)"),
    call("readlinkat", "sysfs links (a disk's device directory)"),
    call("fsync", "a partition table written is flushed before the kernel reads it"),
    call("ioctl", "BLKRRPART: the kernel reads a disk's new partition table (needs CAP_SYS_ADMIN)",
         [arg_eq(1, BLKRRPART, "BLKRRPART")]),
]

# mkfs.xfs (xfsprogs 6.1), the service blockd asks init to run to format a system volume:
# measured with `strace -f -c` formatting a loop device, and its ioctls one by one, by number
# (`strace -e raw=ioctl`), on a loop device and in a VM (strace run as the service, its lines
# in /dev/kmsg with printk.devkmsg=on): the same requests on virtio partitions.
BLK_IOCTLS = [
    (0x80081272, "BLKGETSIZE64"), (0x1268, "BLKSSZGET"), (0x80041284, "BLKGETZONESZ"),
    (0x40081271, "BLKBSZSET (needs CAP_SYS_ADMIN)"), (0x1277, "BLKDISCARD"), (0x1261, "BLKFLSBUF"),
    (0x5331, "CDROM_GET_CAPABILITY (libblkid: is it a CD? EINVAL on a disk)"),
    (0x5395, "CDROM_LAST_WRITTEN (libblkid)"), (0x80280215, "FDGETFDCSTAT (libblkid: is it a floppy?)"),
    (0x5401, "TCGETS (stdio: is stdout a terminal?)"),
]
MKFS = STARTUP + [
    call("write"), call("writev"), call("pwrite64", "the new filesystem's metadata"), call("lseek"),
    call("fsync"), call("fdatasync"), call("fadvise64"),
    call("fallocate", "FALLOC_FL_ZERO_RANGE of the log"),
    call("futex"), call("rt_sigaction"), call("rt_sigprocmask"), call("rt_sigreturn"),
    call("clone3", "liburcu's threads (ENOSYS from the stacked filter: glibc falls back to clone)"),
    call("clone", "threads: never with a CLONE_NEW* flag",
         [{"index": 0, "type": "qword", "op": {"masked_eq": CLONE_NEW_ANY}, "val": 0,
           "comment": "no CLONE_NEWNS/CGROUP/UTS/IPC/USER/PID/NET"}]),
    call("membarrier", "liburcu"), call("madvise"), call("mremap"),
    call("getpid"), call("getppid"), call("gettid"), call("getuid"), call("geteuid"), call("getgid"), call("getegid"),
    call("faccessat2", "sysfs topology files"), call("fcntl"), call("statx"), call("fstatfs"), call("statfs"),
    call("uname"), call("sysinfo"), call("sched_getaffinity"), call("sched_yield"),
    call("clock_gettime"), call("clock_nanosleep"), call("nanosleep"), call("tgkill", "abort()"),
    call("gettimeofday", "vDSO calls made as system calls where the clock source has no vDSO "
         "(seen under qemu TCG)"), call("time"), call("clock_getres"), call("getcpu"),
] + [call("ioctl", name, [arg_eq(1, num, name)]) for num, name in BLK_IOCTLS]

# glibc's resolver (getaddrinfo of a control plane endpoint by name; static glibc 2.36,
# measured with `strace -f -c` resolving a name through a name server): the queries of A and AAAA
# in one sendmmsg on a connected UDP socket, FIONREAD before each recvfrom, uname for the
# search domain. The sockets, connect, poll and recvfrom are the daemons' own already.
RESOLVER = [
    call("sendmmsg", "glibc's resolver: the A and AAAA queries at once"),
    call("uname", "glibc's resolver: the host's domain"),
    call("ioctl", "FIONREAD: glibc's resolver sizes an answer before reading it",
         [arg_eq(1, FIONREAD, "FIONREAD")]),
]

# blkid (util-linux 2.38), the one-shot service blockd asks init to run before it writes a disk
# (`blkid -p -o export DEVICE`): measured with `strace -f` on a loop device holding an MBR and on
# a blank one, with an empty environment (as init runs it: no locale files). Its ioctls one by
# one: the size, the sector size, the zone size, and libblkid's "is it a floppy or a CD?"
# questions (EINVAL on a disk).
BLKID = STARTUP + [
    call("write", "its answer on stdout"), call("dup", "stdout and stderr"),
    call("lseek"), call("fadvise64", "POSIX_FADV_RANDOM on the device"),
    call("faccessat2", "sysfs: is it a partition"), call("futex"),
] + [call("ioctl", name, [arg_eq(1, num, name)]) for num, name in [
    (0x80081272, "BLKGETSIZE64"), (0x1268, "BLKSSZGET"), (0x80041284, "BLKGETZONESZ"),
    (0x5331, "CDROM_GET_CAPABILITY (libblkid: is it a CD? EINVAL on a disk)"),
    (0x5395, "CDROM_LAST_WRITTEN (libblkid)"), (0x80280215, "FDGETFDCSTAT (libblkid: is it a floppy?)"),
]]

# trustd: a stated client and a TLS server on TCP 50001; on a worker, a TLS client of a control
# plane's trustd (landlock allows binding and connecting to that port only).
TRUSTD = STARTUP + RUNTIME + [
    call("socket", "stated's socket", [arg_eq(0, AF_UNIX, "AF_UNIX")]),
    call("socket", "the listener and its connections (IPv4)", [arg_eq(0, AF_INET, "AF_INET")]),
    call("socket", "the listener and its connections (IPv6)", [arg_eq(0, AF_INET6, "AF_INET6")]),
    call("connect", "stated's socket; a control plane's trustd (landlock allows TCP port 50001 only)"),
    call("bind", "0.0.0.0:50001; landlock allows no other TCP port"), call("listen"),
    call("accept4", "clients of the Certificate RPC"),
    call("setsockopt", "SO_REUSEADDR on the listener, TCP_NODELAY on connections"),
    call("getsockopt", "SO_ERROR after a non-blocking connect"),
    call("sendto"), call("recvfrom"), call("sendmsg"), call("recvmsg"),
    call("shutdown"), call("getpeername"), call("getsockname"),
] + RESOLVER

# apid: a client of stated and of init's control socket, a TLS server on TCP 50000 and a TLS
# client of other nodes' apid (landlock allows binding and connecting to that port only).
APID = STARTUP + RUNTIME + [
    call("socket", "stated's and init's sockets", [arg_eq(0, AF_UNIX, "AF_UNIX")]),
    call("socket", "the listener and its connections (IPv4)", [arg_eq(0, AF_INET, "AF_INET")]),
    call("socket", "the listener and its connections (IPv6)", [arg_eq(0, AF_INET6, "AF_INET6")]),
    call("connect", "stated's and init's sockets; other nodes' apid (landlock allows TCP port 50000 only)"),
    call("bind", "0.0.0.0:50000; landlock allows no other TCP port"), call("listen"),
    call("accept4", "API clients"),
    call("setsockopt", "SO_REUSEADDR on the listener, TCP_NODELAY on connections"),
    call("getsockopt", "SO_ERROR after a non-blocking connect"),
    call("sendto"), call("recvfrom"), call("sendmsg"), call("recvmsg"),
    call("shutdown"), call("getpeername"), call("getsockname"),
]

# k8sd: a stated client; a TLS client of the local etcd (landlock allows connecting to TCP 2379
# only); writes etcd's certificates (a temporary file, fsync, rename) and lists etcd's data
# directory.
K8SD = STARTUP + RUNTIME + [
    call("socket", "stated's socket", [arg_eq(0, AF_UNIX, "AF_UNIX")]),
    call("socket", "etcd's client port (IPv4)", [arg_eq(0, AF_INET, "AF_INET")]),
    call("socket", "etcd's client port (IPv6)", [arg_eq(0, AF_INET6, "AF_INET6")]),
    call("connect", "stated's socket; the local etcd (landlock allows TCP port 2379 only)"),
    call("setsockopt", "TCP_NODELAY, keepalive"), call("getsockopt", "SO_ERROR after a non-blocking connect"),
    call("sendto"), call("recvfrom"), call("sendmsg"), call("recvmsg"),
    call("shutdown"), call("getpeername"), call("getsockname"),
    call("fsync", "a certificate file before it is renamed into place"),
    call("rename", "a certificate file into place"), call("unlink", "a stale temporary file"),
    call("getdents64", "is etcd's data directory empty"), call("fchmod", "0440 on a certificate file"),
    call("statx"), call("lseek"),
    call("bind", "the static pod server on 127.0.0.1 (landlock: the port the kernel picks only)"),
    call("listen"), call("accept4", "the static pod server's clients (a kubelet)"),
] + RESOLVER

# A program that only sleeps: coreutils sleep, the requested-service test workload.
SERVICE = STARTUP + [
    call("clock_nanosleep"), call("nanosleep"), call("restart_syscall"),
    call("futex"), call("rt_sigaction"), call("rt_sigprocmask"), call("rt_sigreturn"),
    call("write", "diagnostics on stderr"),
]

# init-testd: a stated client (tests only).
TESTD = STARTUP + RUNTIME + [
    call("socket", "stated's socket", [arg_eq(0, AF_UNIX, "AF_UNIX")]),
    call("connect"), call("getsockopt", "SO_ERROR after a non-blocking connect"),
    call("sendto"), call("recvfrom"), call("shutdown"), call("getpeername"), call("getsockname"),
]

# Debian's etcd 3.4 and etcdctl: Go 1.19 programs linked to glibc through cgo. Measured with
# measure-etcd.sh (`strace -f -qq -c` of a TLS cluster's members and of `etcdctl snapshot
# restore`, as a non-root uid). With cgo, Go makes its threads with pthread_create: clone3,
# ENOSYS from the stacked filter, then clone (flags CLONE_VM|FS|FILES|SIGHAND|THREAD|SYSVSEM|
# SETTLS|PARENT_SETTID|CHILD_CLEARTID, measured). No ioctl, no prctl.
GO_CGO = [
    call("write"), call("futex"), call("nanosleep", "Go's usleep (scheduler, sysmon)"), call("sched_yield"),
    call("sched_getaffinity", "GOMAXPROCS"),
    call("epoll_create1"), call("epoll_ctl"), call("epoll_pwait", "Go's netpoller"),
    call("pipe2", "the netpoller's wake-up pipe"),
    call("rt_sigaction", "Go installs a handler for every signal"), call("rt_sigprocmask"), call("rt_sigreturn"),
    call("sigaltstack", "every thread's signal stack"),
    call("tgkill", "Go preempts a goroutine by sending SIGURG to its thread"),
    call("getpid"), call("gettid"), call("getppid", "read once at start"),
    call("madvise", "the Go heap (MADV_DONTNEED, MADV_[NO]HUGEPAGE); bbolt's MADV_RANDOM on its map"),
    call("clone3", "pthread_create: ENOSYS from the stacked filter, glibc then creates threads with clone"),
    call("clone", "threads (glibc's fallback from clone3): never with a CLONE_NEW* flag",
         [{"index": 0, "type": "qword", "op": {"masked_eq": CLONE_NEW_ANY}, "val": 0,
           "comment": "no CLONE_NEWNS/CGROUP/UTS/IPC/USER/PID/NET"}]),
    call("fcntl", "F_GETFL/F_SETFL; etcd locks its WAL and data files with F_OFD_SETLK(W)/F_OFD_GETLK"),
    call("fstat"), call("lseek"), call("readlinkat", "os.Executable: /proc/self/exe"),
    call("getrlimit"),
    call("setrlimit", "only RLIMIT_NOFILE: Go raises its soft limit to the hard one at start "
         "(measured with soft < hard); raising the hard limit needs CAP_SYS_RESOURCE",
         [arg_eq(0, RLIMIT_NOFILE, "RLIMIT_NOFILE")]),
    call("uname", "os.Hostname (Go tries uname first)"),
    call("socket", "go-systemd's journald probe at start: a UNIX datagram socket, autobound (no "
         "journald on a node: nothing is sent)",
         [arg_eq(0, AF_UNIX, "AF_UNIX"), arg_masked(1, SOCK_TYPE_MASK, SOCK_DGRAM, "SOCK_DGRAM")]),
    call("bind", "the journald probe's autobind; etcd: its listeners (landlock allows TCP 2379 and "
         "2380 only) and rtnetlink sockets"),
    call("getsockname"),
    call("clock_gettime", "normally in the vDSO; a system call where the clock source has no vDSO "
         "(qemu TCG)"),
    call("restart_syscall", "a sleep or wait interrupted by a stop (SIGSTOP, the cgroup freezer) resumes with it"),
]

# The data directory (both etcd and `etcdctl snapshot restore` write one): the WAL, bbolt's db,
# snapshots.
ETCD_DATA = [
    call("mkdirat"), call("getdents64", "listing the WAL and snap directories"),
    call("unlinkat", "purged WAL and snapshot files, the .touch files of writability checks"),
    call("renameat", "WAL segments and received snapshots put into place; defrag's new db"),
    call("pwrite64", "bbolt writes its pages (pread64 is in STARTUP)"), call("ftruncate", "bbolt grows its db file"),
    call("fallocate", "the WAL preallocates its 64 MB segments (mode 0)"),
    call("fsync"), call("fdatasync", "every WAL append and bbolt commit"),
    call("flock", "bbolt locks its db file (LOCK_EX|LOCK_NB)"),
]

# etcd, a requested service of control planes: a TLS server on TCP 2379 (clients) and 2380 (peers)
# and a TLS client of the other members' 2380 (landlock allows binding and connecting to those
# ports only).
ETCD = STARTUP + GO_CGO + ETCD_DATA + [
    call("socket", "TCP over IPv4 only: no UDP (no DNS lookups; etcd's URLs are addresses on a node)",
         [arg_eq(0, AF_INET, "AF_INET"), arg_masked(1, SOCK_TYPE_MASK, SOCK_STREAM, "SOCK_STREAM")]),
    call("socket", "TCP over IPv6 only (listening on [::]; Go's IPv6 probe at the first listen)",
         [arg_eq(0, AF_INET6, "AF_INET6"), arg_masked(1, SOCK_TYPE_MASK, SOCK_STREAM, "SOCK_STREAM")]),
    call("socket", "rtnetlink dumps of routes, addresses and links at start (etcd's default host)",
         [arg_eq(0, AF_NETLINK, "AF_NETLINK"), arg_eq(2, NETLINK_ROUTE, "NETLINK_ROUTE")]),
    call("listen"), call("accept4", "clients and peers"),
    call("connect", "other members' peer port; etcd's gRPC gateway dials its own client port"),
    call("setsockopt", "SO_REUSEADDR, IPV6_V6ONLY on listeners; TCP_NODELAY and keepalives on connections"),
    call("getsockopt", "SO_ERROR after a non-blocking connect"), call("getpeername"),
    call("sendto", "rtnetlink requests (TCP is written with write)"), call("recvfrom", "rtnetlink dumps"),
    call("kill", "on SIGTERM/SIGINT etcd stops, restores the default action and raises the same "
         "signal on itself (pkg/osutil); the pid cannot be checked here, etcd's own uid bounds it",
         [arg_eq(1, SIGTERM, "SIGTERM")]),
    call("kill", "the same, on SIGINT", [arg_eq(1, SIGINT, "SIGINT")]),
]

# `etcdctl snapshot restore`, a one-shot service: reads a snapshot and writes a new data
# directory. No network: the only socket is the journald probe's.
ETCDCTL = STARTUP + GO_CGO + ETCD_DATA + [
    call("copy_file_range", "the snapshot is copied into the new data directory's db"),
    # Found on a node (not in measure-etcd.sh, whose uid had a passwd entry): etcdctl looks its
    # uid up (cgo getpwuid_r), and glibc's NSS first asks nscd on its UNIX stream socket
    # (ENOENT: no nscd on a node). Landlock gives the restore no TCP port.
    call("socket", "glibc NSS's nscd probe: a UNIX stream socket",
         [arg_eq(0, AF_UNIX, "AF_UNIX"), arg_masked(1, SOCK_TYPE_MASK, SOCK_STREAM, "SOCK_STREAM")]),
    call("connect", "the nscd probe (/var/run/nscd/socket: absent on a node)"),
]

here = os.path.dirname(os.path.abspath(__file__))
# `k8sd --wipe-contents DIR` (the one-shot etcd-wipe service after `talosctl etcd leave`) and
# `k8sd --adopt-restored DIR` (etcd-restore-adopt, after a snapshot restore): measured with
# strace -f -c on a data directory with nested files and a symbolic link, and on a restore.
WIPE = STARTUP + [
    call("write", "its one line on stderr"), call("sigaltstack", "std's stack-overflow guard"),
    call("rt_sigaction"), call("rt_sigprocmask"), call("rt_sigreturn"),
    call("poll", "std checks at startup that fds 0-2 are open"), call("fcntl"),
    call("sched_getaffinity"), call("gettid"), call("futex"), call("madvise"), call("mremap"),
    call("getdents64", "listing the directories"), call("statx"),
    call("unlink", "files (remove_file)"), call("unlinkat", "remove_dir_all: entries and directories"),
    call("rename", "the restored member moved into the data directory"),
    call("renameat"), call("renameat2", "what glibc's rename may use instead"),
    call("fsync", "the data directory after the move"),
]
for name, calls in [("stated", STATED), ("networkd", NETWORKD), ("secretsd", SECRETSD), ("blockd", BLOCKD), ("mkfs", MKFS), ("blkid", BLKID), ("trustd", TRUSTD), ("apid", APID), ("k8sd", K8SD), ("service", SERVICE), ("testd", TESTD), ("etcd", ETCD), ("etcdctl", ETCDCTL), ("wipe", WIPE)]:
    path = os.path.join(here, "x86_64", f"{name}.json")
    with open(path, "w") as f:
        json.dump(profile(name, calls), f, indent=1)
        f.write("\n")
    print(path, len(calls))
