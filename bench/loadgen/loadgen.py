#!/usr/bin/env python3
"""A second load generator for the broker benchmark, independent of the repo's Rust client.

broker-bench (bench/src) drives stated with the repo's own cosi client and etcd with tonic. This
one drives both with gRPC's C-core (Python grpcio) and stubs generated here by grpc_tools.protoc
from the same .proto files: the COSI State API as upstream COSI clients speak it (Watch with
`aggregated`, UPDATED events with the old resource unless --omit-old), etcd's KV and Watch. The
workload is broker-bench's: KEYS resources with SPEC-byte specs, WRITERS writer processes each
with one update in flight (stated: Update with the version compare-and-set; etcd: Put), WATCHERS
kind watchers, each its own process and connection, every event of the measured window counted;
stated and etcd run as separate processes with their data on tmpfs, one after the other.

It reports updates/s and the CPU each side used per update (the broker from /proc/PID/stat, the
generator's processes likewise). Python costs far more per message than either broker, so on a
small machine the generator, not the broker, bounds the rate: compare the brokers by their CPU
per update here, and by rate only where the generator has cores to spare.

Usage (as root, from the repository; scripts/bench-loadgen.sh installs grpcio and builds stated):
  bench/loadgen/loadgen.py --stated target/release/stated --etcd /usr/bin/etcd --tmpfs /dev/shm
"""

import argparse
import json
import multiprocessing as mp
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
NS = "loadgen"
TYPE = "Items.loadgen.talos.dev"
PREFIX = b"/loadgen/items/"
CLK = os.sysconf("SC_CLK_TCK")


def stubs(out):
    """Generates the Python messages and stubs of both APIs into `out`; returns the modules."""
    from grpc_tools import protoc
    import grpc_tools

    wkt = os.path.join(os.path.dirname(grpc_tools.__file__), "_proto")
    cosi = os.path.join(ROOT, "proto", "proto")
    etcd = os.path.join(ROOT, "bench", "proto")
    for inc, files in [
        (cosi, ["v1alpha1/resource.proto", "v1alpha1/state.proto"]),
        (etcd, ["etcd/api/mvccpb/kv.proto", "etcd/api/etcdserverpb/rpc.proto"]),
    ]:
        args = ["protoc", f"-I{inc}", f"-I{wkt}", f"--python_out={out}", f"--grpc_python_out={out}"]
        if protoc.main(args + files) != 0:
            raise SystemExit(f"protoc failed on {files}")
    for d, _, _ in os.walk(out):
        open(os.path.join(d, "__init__.py"), "a").close()
    sys.path.insert(0, out)


def use_stubs(out):
    """Makes the stubs `stubs` generated into `out` importable (in a child process)."""
    if out not in sys.path:
        sys.path.insert(0, out)


def import_stubs():
    from v1alpha1 import resource_pb2, state_pb2, state_pb2_grpc
    from etcd.api.etcdserverpb import rpc_pb2, rpc_pb2_grpc

    return resource_pb2, state_pb2, state_pb2_grpc, rpc_pb2, rpc_pb2_grpc


def key(i):
    return f"item-{i:07d}"


def spec(n, size):
    head = f"{n}:{time.monotonic_ns()}:".encode()
    return head + b"x" * max(0, size - len(head))


def cpu_seconds(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLK
    except OSError:
        return 0.0


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---- the two brokers ---------------------------------------------------------------------------


def start_stated(binary, dir):
    sock = os.path.join(dir, "state.sock")
    p = subprocess.Popen(
        [binary, "--socket", sock, "--state-dir", os.path.join(dir, "state"), "--run-dir",
         os.path.join(dir, "run"), "--log-level", "warn"],
        stdout=subprocess.DEVNULL, stderr=open(os.path.join(dir, "stated.log"), "w"))
    for _ in range(300):
        if os.path.exists(sock):
            return p, "unix:" + sock
        time.sleep(0.02)
    p.kill()
    raise SystemExit("stated did not start")


def start_etcd(binary, dir):
    client, peer = free_port(), free_port()
    url, purl = f"http://127.0.0.1:{client}", f"http://127.0.0.1:{peer}"
    p = subprocess.Popen(
        [binary, "--name=loadgen", f"--data-dir={os.path.join(dir, 'etcd')}",
         f"--listen-client-urls={url}", f"--advertise-client-urls={url}",
         f"--listen-peer-urls={purl}", f"--initial-advertise-peer-urls={purl}",
         f"--initial-cluster=loadgen={purl}", "--initial-cluster-state=new",
         "--log-level=warn", "--logger=zap", "--log-outputs=stderr"],
        stdout=subprocess.DEVNULL, stderr=open(os.path.join(dir, "etcd.log"), "w"))
    return p, f"127.0.0.1:{client}"


# ---- processes of the generator -----------------------------------------------------------------


def load(broker, target, keys, size, out):
    import grpc

    use_stubs(out)
    resource_pb2, state_pb2, state_grpc, rpc_pb2, rpc_grpc = import_stubs()
    ch = grpc.insecure_channel(target)
    grpc.channel_ready_future(ch).result(timeout=30)
    if broker == "stated":
        st = state_grpc.StateStub(ch)
        for i in range(keys):
            r = resource_pb2.Resource(
                metadata=resource_pb2.Metadata(namespace=NS, type=TYPE, id=key(i)),
                spec=resource_pb2.Spec(proto_spec=spec(0, size)))
            st.Create(state_pb2.CreateRequest(
                resource=r, options=state_pb2.CreateOptions(owner="loadgen")), timeout=10)
    else:
        kv = rpc_grpc.KVStub(ch)
        for i in range(keys):
            kv.Put(rpc_pb2.PutRequest(key=PREFIX + key(i).encode(), value=spec(0, size)), timeout=10)


def writer(broker, target, index, writers, keys, size, out, start, stop, counts, rate):
    import grpc

    use_stubs(out)
    resource_pb2, state_pb2, state_grpc, rpc_pb2, rpc_grpc = import_stubs()
    ch = grpc.insecure_channel(target)
    mine = list(range(index, keys, writers))
    versions = {i: "1" for i in mine}
    if broker == "stated":
        st = state_grpc.StateStub(ch)
        update = st.Update
    else:
        put = rpc_grpc.KVStub(ch).Put
    start.wait()
    n = done = 0
    interval = writers / rate if rate else 0.0
    next_at = time.monotonic()
    while not stop.is_set():
        if interval:
            next_at += interval
            delay = next_at - time.monotonic()
            if delay > 0:
                time.sleep(delay)
        i = mine[n % len(mine)]
        n += 1
        if broker == "stated":
            r = resource_pb2.Resource(
                metadata=resource_pb2.Metadata(namespace=NS, type=TYPE, id=key(i), version=versions[i]),
                spec=resource_pb2.Spec(proto_spec=spec(n, size)))
            got = update(state_pb2.UpdateRequest(
                new_resource=r, options=state_pb2.UpdateOptions(owner="loadgen")), timeout=10)
            versions[i] = got.resource.metadata.version
        else:
            put(rpc_pb2.PutRequest(key=PREFIX + key(i).encode(), value=spec(n, size)), timeout=10)
        done += 1
        counts[index] = done


def watcher(broker, target, index, omit_old, out, ready, got):
    import grpc
    import queue

    use_stubs(out)
    resource_pb2, state_pb2, state_grpc, rpc_pb2, rpc_grpc = import_stubs()
    ch = grpc.insecure_channel(target)
    seen = 0
    if broker == "stated":
        opts = state_pb2.WatchOptions(aggregated=True, bootstrap_bookmark=True)
        if omit_old:
            opts.omit_old = True
        stream = state_grpc.StateStub(ch).Watch(
            state_pb2.WatchRequest(namespace=NS, type=TYPE, options=opts, api_version=1))
        updated = state_pb2.UPDATED
        for resp in stream:
            if not ready.is_set():
                if any(e.event_type == state_pb2.NOOP for e in resp.event):
                    ready.set()
                continue
            seen += sum(1 for e in resp.event if e.event_type == updated)
            got[index] = seen
    else:
        requests = queue.Queue()
        requests.put(rpc_pb2.WatchRequest(create_request=rpc_pb2.WatchCreateRequest(
            key=PREFIX, range_end=PREFIX[:-1] + bytes([PREFIX[-1] + 1]))))
        stream = rpc_grpc.WatchStub(ch).Watch(iter(requests.get, None))
        for resp in stream:
            if resp.created:
                ready.set()
                continue
            seen += len(resp.events)
            got[index] = seen


# ---- one run -----------------------------------------------------------------------------------


def run(args, broker, out):
    dir = tempfile.mkdtemp(prefix=f"loadgen-{broker}-", dir=args.tmpfs)
    ctx = mp.get_context("spawn")
    proc, target = (start_stated(args.stated, dir) if broker == "stated"
                    else start_etcd(args.etcd, dir))
    try:
        p = ctx.Process(target=load, args=(broker, target, args.keys, args.spec_size, out))
        p.start()
        p.join()
        if p.exitcode != 0:
            raise SystemExit(f"loading {broker} failed")
        start, stop = ctx.Event(), ctx.Event()
        counts = ctx.Array("q", args.writers)
        got = ctx.Array("q", args.watchers)
        readies, watchers = [], []
        for w in range(args.watchers):
            ready = ctx.Event()
            readies.append(ready)
            watchers.append(ctx.Process(target=watcher, args=(
                broker, target, w, args.omit_old, out, ready, got)))
        for w in watchers:
            w.start()
        for r in readies:
            if not r.wait(60):
                raise SystemExit(f"a {broker} watcher was not established")
        writers = [ctx.Process(target=writer, args=(
            broker, target, i, args.writers, args.keys, args.spec_size, out, start, stop,
            counts, args.rate)) for i in range(args.writers)]
        for w in writers:
            w.start()
        time.sleep(1.0)  # the writers' interpreters start
        gen = [w.pid for w in writers + watchers]
        start.set()
        time.sleep(args.warmup)
        c0, b0 = sum(counts), cpu_seconds(proc.pid)
        g0, t0 = sum(cpu_seconds(p) for p in gen), time.monotonic()
        time.sleep(args.duration)
        c1, b1 = sum(counts), cpu_seconds(proc.pid)
        g1, t1 = sum(cpu_seconds(p) for p in gen), time.monotonic()
        stop.set()
        for w in writers:
            w.join()
        total = sum(counts)
        deadline = time.monotonic() + args.drain
        while min(got) < total and time.monotonic() < deadline:
            time.sleep(0.05)
        delivered = min(got)
        for w in watchers:
            w.kill()
        n = c1 - c0
        return {
            "broker": broker,
            "updates_per_sec": n / (t1 - t0),
            "server_cpu_us_per_update": 1e6 * (b1 - b0) / max(n, 1),
            "generator_cpu_us_per_update": 1e6 * (g1 - g0) / max(n, 1),
            "server_cpu_cores": (b1 - b0) / (t1 - t0),
            "generator_cpu_cores": (g1 - g0) / (t1 - t0),
            "updates": total,
            "min_delivered": delivered,
            "all_events_delivered": delivered >= total,
        }
    finally:
        proc.kill()
        proc.wait()
        shutil.rmtree(dir, ignore_errors=True)


def main():
    a = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    a.add_argument("--stated", default=os.path.join(ROOT, "target/release/stated"))
    a.add_argument("--etcd", default="/usr/bin/etcd")
    a.add_argument("--tmpfs", default="/dev/shm")
    a.add_argument("--writers", type=int, default=4)
    a.add_argument("--watchers", type=int, default=10)
    a.add_argument("--keys", type=int, default=1000)
    a.add_argument("--spec-size", type=int, default=200)
    a.add_argument("--duration", type=float, default=10.0)
    a.add_argument("--warmup", type=float, default=1.0)
    a.add_argument("--drain", type=float, default=20.0)
    a.add_argument("--rounds", type=int, default=1)
    a.add_argument("--rate", type=float, default=0.0,
                   help="total updates/s, the writers paced to share it (0: as fast as they go)")
    a.add_argument("--omit-old", action="store_true",
                   help="stated's watchers set omit_old (talos-rs extension), as etcd's have no prev_kv")
    a.add_argument("--json", help="also write the results here")
    args = a.parse_args()
    out = tempfile.mkdtemp(prefix="loadgen-stubs-")
    stubs(out)
    results = []
    for r in range(args.rounds):
        order = ["stated", "etcd"] if r % 2 == 0 else ["etcd", "stated"]
        for broker in order:
            res = run(args, broker, out)
            res["round"] = r + 1
            results.append(res)
            print(json.dumps(res), flush=True)
    print()
    print(f"| broker | updates/s | server CPU µs/update | generator CPU µs/update | server / generator cores | every event delivered |")
    print(f"|---|---:|---:|---:|---|---|")
    for b in ["stated", "etcd"]:
        rs = sorted((x for x in results if x["broker"] == b), key=lambda x: x["updates_per_sec"])
        m = rs[len(rs) // 2]
        print(f"| {b} | {m['updates_per_sec']:.0f} | {m['server_cpu_us_per_update']:.1f} | "
              f"{m['generator_cpu_us_per_update']:.1f} | {m['server_cpu_cores']:.2f} / "
              f"{m['generator_cpu_cores']:.2f} | {all(x['all_events_delivered'] for x in rs)} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"config": vars(args), "results": results}, f, indent=1)
    shutil.rmtree(out, ignore_errors=True)


if __name__ == "__main__":
    main()
