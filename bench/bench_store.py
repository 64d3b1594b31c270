"""The store under the API server: SQLite against etcd with 1 and 3 members, in one run,
and how long the controllers take to fail over between control planes.

- writes/s: compare-and-swap updates of one key (what every API write is), one at a
  time and 8 in flight, straight on the store (kube32.store), 500 of each;
- watch latency: from a write's call to its event read by a watcher of the key's prefix,
  median and 95th percentile of 200;
- moves: a small counter pod moved back and forth through a control plane on each
  store (bench/cluster.py's cluster, `--store`), median of the Move's time (freeze to
  running) and of its wall time (Checkpoint created -> Completed);
- failover: two control planes on a 3-member etcd with client-go's leader-election
  timings (15 s / 10 s / 2 s); the leader is SIGKILLed; the time until the other holds
  the Lease. Target: lease duration + retry period (17 s) at most.

etcd members are the real etcd (Debian's etcd-server, fsync on every write: what
makes it durable) on loopback; SQLite runs WAL with synchronous=NORMAL.

    python -m bench.bench_store [--runs 5]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import signal
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from kube32.sim.etcd import EtcdCluster
from kube32.store import SQLiteStore, Store

from . import cluster, report
from .bench_moves import move
from .cluster import Cluster, counter_pod, pod_ready

WRITES = 500
LATENCIES = 200
INFLIGHT = 8


def med(xs: list[float]) -> float:
    return statistics.median(xs)


def p95(xs: list[float]) -> float:
    return sorted(xs)[int(len(xs) * 0.95) - 1]


async def writes_per_second(store: Store, inflight: int) -> float:
    keys = [await store.create(f"/bench/w{inflight}-{i}", b"0") for i in range(inflight)]

    async def lane(i: int) -> None:
        kv = keys[i]
        for n in range(WRITES // inflight):
            kv = await store.update(kv.key, b"%d" % n, kv.mod_revision)
    started = time.monotonic()
    await asyncio.gather(*(lane(i) for i in range(inflight)))
    return (WRITES // inflight * inflight) / (time.monotonic() - started)


async def watch_latency(store: Store) -> list[float]:
    kv = await store.create("/bench/l/k", b"0")
    events = store.watch("/bench/l/", 0)
    out = []
    try:
        for n in range(LATENCIES):
            started = time.monotonic()
            kv = await store.update(kv.key, b"%d" % n, kv.mod_revision)
            while (await asyncio.wait_for(anext(events), 10)).revision < kv.mod_revision:
                pass
            out.append((time.monotonic() - started) * 1000)
    finally:
        await events.aclose()  # type: ignore[attr-defined]
    return out


async def store_figures(store: Store) -> dict[str, Any]:
    try:
        one = await writes_per_second(store, 1)
        many = await writes_per_second(store, INFLIGHT)
        lat = await watch_latency(store)
    finally:
        await store.close()
    return {"w1": one, "w8": many, "lat50": med(lat), "lat95": p95(lat)}


async def move_figures(runs: int, store_flags: tuple[str, ...]) -> dict[str, float]:
    async with Cluster(cp_flags=store_flags) as c:
        await c.api.create(cluster.PODS, counter_pod("hm", c.image, "sim-1"), "default")
        await c.wait(lambda: _ready(c, "hm"), 60, "pod hm ready")
        figures = [await move(c, "hm", ["sim-2", "sim-1"][i % 2], poll=False) for i in range(runs)]
    return {"move": med([f["move_ms"] for f in figures]), "wall": med([f["wall_ms"] for f in figures])}


async def _ready(c: Cluster, name: str) -> bool:
    return pod_ready(await c.api.try_get(cluster.PODS, name, "default"))


def failover_seconds(directory: Path) -> float:
    """Two control planes on a 3-member etcd, default leader election; SIGKILL the leader."""
    with EtcdCluster(directory / "etcd", members=3) as etcd:
        planes = [directory / "cp-1", directory / "cp-2"]
        procs = []
        try:
            for plane in planes:
                procs.append(_control_plane(plane, etcd.store_url))
            _until(lambda: _holder(planes[1]) == _identity(planes[0]), 60)
            procs[0].send_signal(signal.SIGKILL)
            killed = time.monotonic()
            _until(lambda: _holder(planes[1]) == _identity(planes[1]), 60, interval=0.1)
            return time.monotonic() - killed
        finally:
            for p in procs:
                if p.poll() is None:
                    p.send_signal(signal.SIGTERM)
                    p.wait(15)


def _control_plane(plane: Path, store_url: str) -> subprocess.Popen[bytes]:
    plane.mkdir(parents=True)
    log = open(plane / "log", "wb")
    p = subprocess.Popen(cluster.sim("control-plane", "--data-dir", str(plane), "--port", "0", "--no-kubelet",
                                     "--store", store_url), stdout=log, stderr=subprocess.STDOUT,
                         cwd=cluster.ROOT, start_new_session=True)
    _until(lambda: (plane / "admin.kubeconfig").exists(), 60)
    return p


def _identity(plane: Path) -> str:
    return (plane / "controller-identity").read_text().strip()


def _holder(plane: Path) -> str:
    out = subprocess.run(["kubectl", "--kubeconfig", str(plane / "admin.kubeconfig"), "-n", "kube-system", "get",
                          "lease", "kube32-controller-manager", "-o", "json"], capture_output=True, text=True)
    return (json.loads(out.stdout)["spec"].get("holderIdentity") or "") if out.returncode == 0 else ""


def _until(predicate: Any, timeout: float, interval: float = 0.2) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise RuntimeError("timed out")
        time.sleep(interval)


async def run(runs: int) -> str:
    from kube32.store.etcd import EtcdStore

    rows: list[list[str]] = []
    with tempfile.TemporaryDirectory(prefix="kube32-bench-store-") as tmp:
        directory = Path(tmp)
        results: dict[str, dict[str, Any]] = {}
        results["SQLite"] = await store_figures(await SQLiteStore.open(directory / "s.db"))
        results["SQLite"].update(await move_figures(runs, ()))
        for members in (1, 3):
            with EtcdCluster(directory / f"etcd-{members}", members=members) as etcd:
                store = await EtcdStore.open(",".join(etcd.endpoints), compact_interval=None)
                label = f"etcd, {members} member{'s' if members > 1 else ''}"
                results[label] = await store_figures(store)
                results[label].update(await move_figures(runs, ("--store", etcd.store_url)))
        failover = failover_seconds(directory / "failover")
    base = results["SQLite"]
    for label, r in results.items():
        rows.append([label, f"{r['w1']:.0f}", f"{r['w8']:.0f}", f"{r['lat50']:.2f} / {r['lat95']:.2f}",
                     f"{r['move']:.0f}", f"{r['wall']:.0f}",
                     "1.00" if r is base else f"{r['w1'] / base['w1']:.2f}"])
    text = ("## The store: SQLite and etcd (`bench/bench_store.py`)\n\n"
            f"Straight on kube32.store: {WRITES} compare-and-swap writes one at a time and {INFLIGHT} "
            f"in flight, watch latency over {LATENCIES} writes (median / 95th percentile); moves of a "
            f"small counter pod through a control plane on each store, median of {runs}.\n\n")
    text += report.table(["store", "writes/s (1)", f"writes/s ({INFLIGHT})", "watch latency ms",
                          "move ms (freeze -> running)", "move wall ms", "writes/s vs SQLite"], rows)
    target = 15 + 2
    text += (f"\nControllers' failover (two control planes, 3-member etcd, client-go's 15 s / 10 s / 2 s): "
             f"**{failover:.1f} s** from the leader's SIGKILL to the other holding the Lease; target "
             f"at most lease duration + retry period ({target} s): {report.verdict(failover <= target)}.\n")
    return text


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.bench_store")
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args(argv)
    text = cluster.run(run(args.runs))
    report.add(text)
    print(text)
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main(sys.argv[1:]))
