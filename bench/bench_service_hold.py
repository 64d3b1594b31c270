"""Requests through a Service while its pods move (issue 24): with holding (the default)
and, as the baseline, with it off (``kube32.io/hold-requests: "0"``), in the same run on
the same cluster.

1. Moves: a Deployment of one counter pod behind a Service, a steady open-loop client
   load through the Service proxy (``--rate`` requests/s, each sent on time whatever
   the others are doing), and ``--moves`` moves back and forth between sim-1 and sim-2
   (a Move Checkpoint each, one after the other).
2. Drain: a Deployment of ``--drain-pods`` counter pods on sim-1 behind a Service, the
   same load, and ``kubectl drain sim-1``; the baseline drains them back from sim-2.

Figures: failed requests (anything but a 200 from a pod: the pods here answer only
200); the added latency of the requests a move touched (sent between a move's freeze
and its replacement running, + 50 ms), against the median latency of the others in
the same run, at p50 and p99; the moves' freeze-to-running (``status.moveMillis``)
from the same run; and the goal, per touched request, added latency <= its move's
freeze-to-running + 20 ms (at p99).

    python -m bench.bench_service_hold [--moves 40] [--rate 100] [--drain-pods 20]
    python -m bench.bench_service_hold --moves 200     # the issue's figure
"""
from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from typing import Any

from kube32.client import CHECKPOINTS, DEPLOYMENTS, PODS, SERVICES, Client

from . import cluster, report
from .cluster import Cluster, pod_ready

Obj = dict[str, Any]
TOUCH_SLACK_MS = 50     # a request sent this soon after the replacement runs may still meet the move
GOAL_MS = 20


def pct(xs: list[float], q: float) -> float:
    if not xs:
        return 0.0
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


class Load:
    """Open-loop requests at ``rate`` per second through the Service proxy; each answer
    kept as (sent at, wall ms; latency, ms; status)."""

    def __init__(self, api: Client, service: str, rate: float) -> None:
        self.api, self.path, self.rate = api, f"/api/v1/namespaces/default/services/{service}/proxy/", rate
        self.answers: list[tuple[float, float, int]] = []
        self._stop = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._inflight: set[asyncio.Task] = set()

    async def _one(self) -> None:
        sent, started = time.time() * 1000, time.monotonic()
        try:
            async with self.api.request("GET", self.path) as r:
                await r.read()
                status = r.status
        except Exception:  # noqa: BLE001 - a failed request is a figure
            status = 0
        self.answers.append((sent, (time.monotonic() - started) * 1000, status))

    async def _run(self) -> None:
        period, due = 1 / self.rate, time.monotonic()
        while not self._stop.is_set():
            task = asyncio.ensure_future(self._one())
            self._inflight.add(task)
            task.add_done_callback(self._inflight.discard)
            due += period
            await asyncio.sleep(max(0.0, due - time.monotonic()))

    async def __aenter__(self) -> "Load":
        self._task = asyncio.ensure_future(self._run())
        return self

    async def __aexit__(self, *exc: Any) -> None:
        self._stop.set()
        assert self._task is not None
        await self._task
        await asyncio.gather(*list(self._inflight), return_exceptions=True)


def figures(load: Load, windows: list[tuple[float, float]]) -> Obj:
    """The run's figures; ``windows``: (frozen at, wall ms; freeze to running, ms) per move."""
    touched: list[tuple[float, float]] = []   # (added latency, its move's freeze-to-running)
    others: list[float] = []
    for sent, latency, status in load.answers:
        move = next(((at, ms) for at, ms in windows if at <= sent <= at + ms + TOUCH_SLACK_MS), None)
        if move is None:
            if status == 200:
                others.append(latency)
        elif status == 200:
            touched.append((latency, move[1]))
    base = statistics.median(others) if others else 0.0
    added = [max(0.0, lat - base) for lat, _ in touched]
    return {"requests": len(load.answers), "failed": sum(1 for *_, s in load.answers if s != 200),
            "touched": len(touched), "base_ms": base,
            "added_p50": pct(added, 0.5), "added_p99": pct(added, 0.99),
            "over_p99": pct([a - f for a, (_, f) in zip(added, touched, strict=True)], 0.99),
            "f2r_p50": pct([ms for _, ms in windows], 0.5), "f2r_p99": pct([ms for _, ms in windows], 0.99),
            "moves": len(windows)}


def window(ck: Obj) -> tuple[float, float] | None:
    st = ck.get("status") or {}
    if st.get("frozenAtMs") is None or st.get("moveMillis") is None:
        return None
    return float(st["frozenAtMs"]), float(st["moveMillis"])


async def app(cl: Cluster, name: str, replicas: int, hold: str | None) -> None:
    api = cl.api
    await api.create(DEPLOYMENTS, {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
                 "template": {"metadata": {"labels": {"app": name}},
                              "spec": {"containers": [{"name": "main", "image": cl.image}]}}}}, "default")
    await api.create(SERVICES, {"apiVersion": "v1", "kind": "Service",
                                "metadata": {"name": name,
                                             "annotations": {"kube32.io/hold-requests": hold} if hold else {}},
                                "spec": {"selector": {"app": name}, "ports": [{"port": 80}]}}, "default")

    async def ready() -> bool:
        pods, _ = await api.list(PODS, "default", label_selector=f"app={name}")
        return sum(pod_ready(p) for p in pods) == replicas
    await cl.wait(ready, 300, f"{replicas} pods of {name} Ready", interval=0.1)


async def moves(cl: Cluster, count: int, rate: float, hold: str | None) -> Obj:
    api, name = cl.api, f"mv{'off' if hold == '0' else 'on'}"
    await app(cl, name, 1, hold)
    pods, _ = await api.list(PODS, "default", label_selector=f"app={name}")
    pod = pods[0]["metadata"]["name"]
    windows = []
    async with Load(api, name, rate) as load:
        await asyncio.sleep(1)
        for i in range(count):
            here = (await api.get(PODS, pod, "default"))["spec"]["nodeName"]
            ck = await api.create(CHECKPOINTS, {
                "apiVersion": "kube32.io/v1", "kind": "Checkpoint", "metadata": {"generateName": f"{pod}-"},
                "spec": {"podName": pod, "action": "Move",
                         "target": {"nodeName": "sim-2" if here == "sim-1" else "sim-1"}}}, "default")

            async def done() -> Obj | None:
                cur = await api.get(CHECKPOINTS, ck["metadata"]["name"], "default")
                return cur if (cur.get("status") or {}).get("phase") in ("Completed", "Failed") else None
            final = await cl.wait(done, 120, f"move {i}", interval=0.02)
            if final["status"]["phase"] != "Completed":
                raise RuntimeError(f"move {i} failed: {final['status'].get('message')}")
            w = window(final)
            if w:
                windows.append(w)
            await asyncio.sleep(0.3)
        await asyncio.sleep(1)
    await api.delete(DEPLOYMENTS, name, "default")
    await api.delete(SERVICES, name, "default")
    return figures(load, windows)


async def drain(cl: Cluster, count: int, rate: float) -> tuple[Obj, Obj]:
    """kubectl drain sim-1 with holding on; then, holding off, sim-2 (the pods come back)."""
    api, name = cl.api, "drained"
    await cl.kubectl("cordon", "sim-2")
    await app(cl, name, count, None)
    await cl.kubectl("uncordon", "sim-2")
    out = []
    for node, hold in (("sim-1", None), ("sim-2", "0")):
        await api.patch(SERVICES, name, {"metadata": {"annotations": {"kube32.io/hold-requests": hold}}}, "default")
        started = time.time() * 1000
        async with Load(api, name, rate) as load:
            await asyncio.sleep(1)
            await cl.kubectl("drain", node, "--ignore-daemonsets", "--timeout=300s", timeout=320)
            await asyncio.sleep(1)
        await cl.kubectl("uncordon", node)
        cks, _ = await api.list(CHECKPOINTS, "default")
        windows = [w for ck in cks if (w := window(ck)) and w[0] >= started]
        out.append(figures(load, windows))
    await api.delete(DEPLOYMENTS, name, "default")
    await api.delete(SERVICES, name, "default")
    return out[0], out[1]


def row(label: str, f: Obj, goal: bool) -> list[str]:
    ok = f["failed"] == 0 and f["over_p99"] <= GOAL_MS
    return [label, str(f["moves"]), str(f["requests"]), str(f["failed"]), str(f["touched"]),
            f"{f['added_p50']:.0f} / {f['added_p99']:.0f}", f"{f['f2r_p50']:.0f} / {f['f2r_p99']:.0f}",
            f"{f['over_p99']:.0f}",
            (f"0 failed, p99 added <= freeze-to-running + {GOAL_MS} ms: {report.verdict(ok)}" if goal
             else "baseline")]


def section(on: Obj, off: Obj, d_on: Obj, d_off: Obj, rate: float, drain_pods: int) -> str:
    return "\n".join([
        "## Requests through a Service while its pods move (bench_service_hold)\n",
        f"A steady open-loop load of {rate:g} requests/s through the Service proxy (each sent on time), "
        "while the Service's pod moves back and forth between two workers, and while `kubectl drain` "
        f"moves {drain_pods} pods behind one Service; with holding (the default, 10 s) and, as the "
        "baseline, with it off (`kube32.io/hold-requests: \"0\"`), in the same run.  Failed: anything "
        "but the pod's 200.  Touched: requests sent between a move's freeze and its replacement running "
        f"(+ {TOUCH_SLACK_MS} ms); their added latency is against the median of the untouched ones "
        "(p50 / p99, ms), beside the moves' freeze-to-running (`status.moveMillis`, p50 / p99) from "
        "the same run; over is each touched request's added latency less its own move's "
        "freeze-to-running, at p99.\n",
        report.table(["run", "moves", "requests", "failed", "touched", "added ms p50 / p99",
                      "freeze->running ms p50 / p99", "over ms p99", "target"], [
            row("moves, holding", on, True), row("moves, holding off", off, False),
            row(f"kubectl drain of {drain_pods} pods, holding", d_on, True),
            row(f"kubectl drain of {drain_pods} pods, holding off", d_off, False)]),
    ])


async def run(count: int, rate: float, drain_pods: int) -> str:
    async with Cluster(workers=2) as cl:
        on = await moves(cl, count, rate, None)
        print(f"  moves, holding: {on}", flush=True)
        off = await moves(cl, count, rate, "0")
        print(f"  moves, holding off: {off}", flush=True)
        d_on, d_off = await drain(cl, drain_pods, rate)
        print(f"  drain, holding: {d_on}\n  drain, holding off: {d_off}", flush=True)
    return section(on, off, d_on, d_off, rate, drain_pods)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.bench_service_hold")
    parser.add_argument("--moves", type=int, default=40, help="moves with holding, and as many without (200: "
                                                             "the issue's figure)")
    parser.add_argument("--rate", type=float, default=100.0, help="client requests per second")
    parser.add_argument("--drain-pods", type=int, default=20)
    args = parser.parse_args(argv)
    text = cluster.run(run(args.moves, args.rate, args.drain_pods))
    report.add(text)
    print(text)
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main(sys.argv[1:]))
