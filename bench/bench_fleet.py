"""How a fleet's cost grows with its nodes (issue 25): ``kube32-sim fleet`` of N nodes
against a control plane of its own, for each N of ``--sizes``.

For each size: a fresh control plane (``--no-kubelet``, a checkpoint data space sized for
the pods the loss and the drain checkpoint) and a fleet of N devkit boards (pwasm, the
boards' 10 s Lease and status intervals, ``--interp-mops`` given so no node measures),
``--pods-per-node K`` counter pods bound to each.  Measured, in order: the time until
every node is Ready (from the fleet's start); the time until every pod runs; the fleet's
and the control plane's RSS and both processes' CPU at rest (over ``--rest`` seconds:
Lease renewals and status reports only), as a share of one core; the p50/p99 of watch
delivery (``--probes`` merge patches, each timed to its event on a watch of the
namespace's pods); ``list pods`` (all, and one node's by ``spec.nodeName``); the loss of
``--lose`` nodes at once (their pods get a periodic checkpoint every 120 s, and the nodes
to drain are cordoned, first; then the fleet kills the nodes: until every pod is Ready
elsewhere, restored from its checkpoint); the drain of ``--drain`` nodes through the
Eviction API (until every pod is Ready elsewhere, its state kept).  The loss and drain
are sized down to what the other boards can hold (:meth:`Plan.sized`: a devkit holds 16
pods).  ``--profile`` records the control plane with py-spy at the largest size at rest,
during the watch probes, during the loss and during the drain (``--profile-out``: texts of
the hottest functions); the control plane's event-loop stalls it logged (kube32.stalls:
over 250 ms, with the garbage collections in them) are kept with the figures.

The small sizes (the defaults: what ``make bench`` runs) add their section to the report;
100 nodes or more (``make bench-fleet``) replace theirs in docs/benchmarks.md in place,
with docs/fleet-growth.png (bench/pngplot.py) and each figure's growth.  Figures are of
this machine as it is (the bench does not own it: other work may run), so the report
says when each ran, what the machine was and its load."""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, AsyncIterator, Awaitable, Callable

from bench import cluster, pngplot, report
from kube32 import objects
from kube32.client import CHECKPOINTS, CONFIGMAPS, NODES, PODS, ApiError, Client, Informer
from kube32.terms import Annotation, CheckpointPhase

ROOT = Path(__file__).resolve().parent.parent
SIZES = (10, 30)              # `make bench`'s: small (`make bench-fleet` runs SCALE_ARGS)
SMALL_PODS, SMALL_DRAIN, SMALL_LOSE = 2, 2, 2
REST_SECONDS = 20.0
PROBES = 100
GRACE_SECONDS = 40.0   # four of the boards' 10 s Lease intervals (20 s lost nodes that were only busy)
CHECKPOINT_EVERY = 120.0
PROBE_ANNOTATION = "bench.kube32.io/probe"
ROOM_USED = 0.6                 # of the other boards' spare pod slots, at most, for the lost and drained pods
BOARD_MAX_PODS = 16             # a devkit board's pod capacity (kube32.sim.profiles)
SPACE_FLOOR = 16 << 20          # the control plane's checkpoint data space: the simulator's ...
SPACE_PER_POD = 128 << 10       # ... and this much more for each pod that a loss or a drain checkpoints
CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process (its threads included), from /proc."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def _start(args: list[str], log: Path, stdin: bool = False) -> subprocess.Popen:
    with open(log, "wb") as f:
        return subprocess.Popen(args, stdout=f, stderr=subprocess.STDOUT,
                                stdin=subprocess.PIPE if stdin else subprocess.DEVNULL, cwd=ROOT,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"}, start_new_session=True)


def _stop(p: subprocess.Popen, sig: int = signal.SIGTERM, wait: float = 60) -> None:
    if p.poll() is None:
        p.send_signal(sig)
        try:
            p.wait(wait)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(10)


async def _ready_count(api: Client, prefix: str) -> int:
    items, _ = await api.list(NODES)
    return sum(1 for n in items if n["metadata"]["name"].startswith(prefix) and any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in (n.get("status") or {}).get("conditions") or []))


@dataclasses.dataclass(frozen=True)
class Plan:
    """What one size measures beyond the join and the rest (see the module docstring)."""
    pods_per_node: int = 0
    rest: float = REST_SECONDS
    probes: int = PROBES          # watch-delivery probes
    drain: int = 0                # nodes drained through the Eviction API
    lose: int = 0                 # nodes lost at once (their pods restore from periodic checkpoints)
    grace: float = GRACE_SECONDS  # the control plane's node-monitor grace period
    trace: Path | None = None     # tracemalloc both processes, reports in this directory

    def sized(self, n: int) -> tuple[int, int]:
        """(nodes to drain, nodes to lose) at ``n`` nodes: at most a fifth and a third of
        them, and fewer lost while the others (less the drained, cordoned) have no room for
        both's pods within ROOM_USED of their spare pod capacity (a devkit board holds 16
        pods; moves choose their targets one by one, several may choose the same)."""
        drain, lose = min(self.drain, n // 5), min(self.lose, n // 3)
        spare = BOARD_MAX_PODS - self.pods_per_node
        if self.pods_per_node:
            while lose > 0 and self.pods_per_node * (lose + drain) > ROOM_USED * spare * (n - lose - drain):
                lose -= 1
        return drain, lose


def _sim(trace: Path | None, name: str, *args: str) -> list[str]:
    if trace is None:
        return cluster.sim(*args)
    return [sys.executable, "-m", "bench.tracemem", str(trace / f"{name}.txt"), *args]


async def one_size(n: int, plan: Plan, profile_out: Path | None) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="kube32-bench-fleet-"))
    # Room for every lost pod's latest periodic checkpoint and a drain's moves beside it:
    # the simulator's 16 MiB holds about a hundred counters' snapshots.
    space = SPACE_FLOOR + SPACE_PER_POD * plan.pods_per_node * (plan.sized(n)[1] + plan.sized(n)[0])
    cp = _start(_sim(plan.trace, "control-plane", "control-plane", "--data-dir", str(tmp), "--port", "0",
                     "--no-kubelet", "--node-monitor-grace-period", f"{plan.grace:g}s",
                     "--pod-eviction-timeout", "1s", "--checkpoint-space", str(space)), tmp / "control-plane.log")
    fleet: subprocess.Popen | None = None
    api: Client | None = None
    try:
        kubeconfig = tmp / "admin.kubeconfig"
        deadline = time.monotonic() + 60
        while not kubeconfig.exists():
            if cp.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the control plane did not start")
            await asyncio.sleep(0.05)
        api = Client.from_kubeconfig(kubeconfig, user_agent="kube32-bench")
        image = await _push(kubeconfig) if plan.pods_per_node else ""
        cp_rss0 = cluster.rss_bytes(cp.pid)
        began = time.monotonic()
        fleet = _start(_sim(plan.trace, "fleet", "fleet", "--kubeconfig", str(tmp / "node.kubeconfig"),
                            "--nodes", str(n), "--interp-mops", "5"), tmp / "fleet.log", stdin=True)
        ready_at = await cluster.Cluster.wait(_patient(lambda: _ready_at(api, n, fleet, began)), 60 + n,
                                              f"{n} nodes Ready", interval=0.5)
        nodes = [f"fleet-{i}" for i in range(1, n + 1)]
        print(f"  {n} nodes Ready in {ready_at:.1f} s", flush=True)
        drain, lose = plan.sized(n)
        lost = nodes[n - lose:] if lose else []
        pods_s = None
        if plan.pods_per_node:
            t_pods = time.monotonic()
            async with _watching(api, PODS) as pods:
                await _create_pods(api, nodes, plan.pods_per_node, image)
                await _until(lambda: sum(1 for p in pods.list() if objects.phase(p) == "Running")
                             >= n * plan.pods_per_node, 120 + 2 * n, "pods running")
            pods_s = time.monotonic() - t_pods
            print(f"  {n * plan.pods_per_node} pods Running in {pods_s:.1f} s", flush=True)
        await asyncio.sleep(2)   # the last joins' first status writes
        cp_cpu, fl_cpu = cpu_seconds(cp.pid), cpu_seconds(fleet.pid)
        load0 = os.getloadavg()[0]
        t0 = time.monotonic()
        if profile_out is not None:
            await _profile(cp.pid, plan.rest, profile_out)
        else:
            await asyncio.sleep(plan.rest)
        dt = time.monotonic() - t0
        out: dict[str, Any] = {
            "nodes": n, "join_s": ready_at, "fleet_rss": cluster.rss_bytes(fleet.pid),
            "cp_rss": cluster.rss_bytes(cp.pid), "cp_rss0": cp_rss0,
            "cp_cpu": (cpu_seconds(cp.pid) - cp_cpu) / dt, "fleet_cpu": (cpu_seconds(fleet.pid) - fl_cpu) / dt,
            "pods": n * plan.pods_per_node, "pods_s": pods_s, "load": round(load0, 2)}
        if plan.trace is not None:
            await _trace(plan.trace, {"control-plane": cp, "fleet": fleet}, n)
        probe = f"{nodes[0]}-1" if plan.pods_per_node else None
        async with _profiling(cp.pid, profile_out, "probes"):
            out["watch_ms"] = await watch_delivery(api, probe, plan.probes)
        out["stalls_at_rest"] = _stalls(tmp / "control-plane.log")
        out["list_ms"] = await list_times(api, nodes[0])
        print(f"  at rest: {json.dumps(out)}", flush=True)
        if drain and lose:   # the pods of the lost nodes go elsewhere than the nodes to drain
            await _cordon(api, nodes[:drain])
        if lose:   # first: the drain's pods stay off the nodes to lose (cordoned nodes are not the lost ones)
            async with _profiling(cp.pid, profile_out, "lose"):
                out["lose"] = await lose_nodes(api, fleet, lost, plan.grace)
        if drain:
            async with _profiling(cp.pid, profile_out, "drain"):
                out["drain"] = await drain_nodes(api, nodes[:drain])
        out["stalls"] = _stalls(tmp / "control-plane.log")
        print(f"  {n} nodes: {json.dumps(out)}", flush=True)
        return out
    finally:
        if api is not None:
            await api.close()
        if fleet is not None:
            _stop(fleet)
        _stop(cp)
        shutil.rmtree(tmp, ignore_errors=True)


async def _create_pods(api: Client, nodes: list[str], per_node: int, image: str) -> None:
    """``per_node`` counter pods bound to each node."""
    gate = asyncio.Semaphore(8)

    async def one(node: str, j: int) -> None:
        pod = cluster.counter_pod(f"{node}-{j}", image, node, labels={"kube32.io/fleet-node": node})
        pod["spec"]["terminationGracePeriodSeconds"] = 1
        async with gate:
            await api.create(PODS, pod, "default")
    await asyncio.gather(*(one(node, j) for node in nodes for j in range(1, per_node + 1)))


async def _cordon(api: Client, nodes: list[str]) -> None:
    await asyncio.gather(*(api.patch(NODES, n, {"spec": {"unschedulable": True}}) for n in nodes))


async def _periodic(api: Client, names: list[str]) -> None:
    """Periodic checkpoints for these pods only, from now on (so the figures at rest are
    without them: a thousand pods checkpointing every 120 s are a load of their own)."""
    gate = asyncio.Semaphore(8)

    async def one(name: str) -> None:
        async with gate:
            await api.patch(PODS, name, {"metadata": {"annotations": {
                Annotation.CHECKPOINT_INTERVAL: f"{CHECKPOINT_EVERY:g}s"}}}, "default")
    await asyncio.gather(*(one(n) for n in names))


@contextlib.asynccontextmanager
async def _profiling(pid: int, out: Path | None, phase: str) -> AsyncIterator[None]:
    """py-spy records ``pid`` while the block runs (when ``out``), into ``out``-``phase``."""
    if out is None:
        yield
        return
    raw = out.with_name(f"{out.stem}-{phase}.raw.txt")
    p = await asyncio.create_subprocess_exec(_spy(), "record", "--pid", str(pid), "--duration", "900",
                                             "--rate", "50", "--format", "raw", "--output", str(raw),
                                             "--nonblocking", stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    await asyncio.sleep(1)   # attached before the phase begins
    try:
        yield
    finally:
        if p.returncode is None:
            p.send_signal(signal.SIGINT)
        try:
            await asyncio.wait_for(p.wait(), 60)
        except asyncio.TimeoutError:
            p.kill()
            await p.wait()
        if raw.exists():
            out.with_name(f"{out.stem}-{phase}.txt").write_text(top_functions(raw.read_text()))


def _percentiles(samples: list[float]) -> dict[str, float]:
    s = sorted(samples)
    if not s:
        return {}
    return {"p50": round(s[len(s) // 2], 2), "p99": round(s[min(len(s) - 1, int(0.99 * len(s)))], 2),
            "max": round(s[-1], 2), "n": len(s), "over_100ms": sum(1 for v in s if v > 100)}


def _stalls(log: Path) -> list[str]:
    """The control plane's event-loop stalls logged so far (kube32.stalls), the last 20."""
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError:
        return []
    return [ln[-160:] for ln in lines if "event loop held" in ln][-20:]


async def watch_delivery(api: Client, pod: str | None, probes: int) -> dict[str, float]:
    """p50/p99 of one watch event's delivery: from a merge patch's send to its event on a
    watch of every pod of the namespace (a ConfigMap's when there are no pods), with the
    fleet's watches open beside it.  One patch at a time, 50 ms apart."""
    kind, name = (PODS, pod) if pod else (CONFIGMAPS, "fleet-probe")
    if pod is None:
        await api.create(CONFIGMAPS, {"apiVersion": "v1", "kind": "ConfigMap",
                                      "metadata": {"name": name}, "data": {}}, "default")
    _, rv = await api.list(kind, "default", field_selector=f"metadata.name={name}")
    arrived: dict[str, float] = {}
    waiting: dict[str, asyncio.Future[None]] = {}

    async def watch() -> None:
        async for _t, obj in api.watch(kind, "default", resource_version=rv, timeout_seconds=600):
            mark = objects.annotations(obj).get(PROBE_ANNOTATION)
            if mark is not None and mark not in arrived:
                arrived[mark] = time.monotonic()
                fut = waiting.pop(mark, None)
                if fut is not None and not fut.done():
                    fut.set_result(None)
    watcher = asyncio.create_task(watch())
    samples = []
    try:
        await asyncio.sleep(0.5)
        loop = asyncio.get_running_loop()
        for i in range(probes):
            mark = str(i)
            waiting[mark] = loop.create_future()
            sent = time.monotonic()
            await api.patch(kind, name, {"metadata": {"annotations": {PROBE_ANNOTATION: mark}}}, "default")
            await asyncio.wait_for(waiting[mark], 10)
            samples.append(1000 * (arrived[mark] - sent))
            await asyncio.sleep(0.05)
    finally:
        watcher.cancel()
        await asyncio.gather(watcher, return_exceptions=True)
    return _percentiles(samples)


async def list_times(api: Client, node: str, repeats: int = 5) -> dict[str, Any]:
    """Median ms of ``list pods`` (every namespace) and of ``list pods`` by
    ``spec.nodeName`` (one node's), with how many each returned."""
    out: dict[str, Any] = {}
    for key, sel in (("all", None), ("node", f"spec.nodeName={node}")):
        times, count = [], 0
        for _ in range(repeats):
            t = time.monotonic()
            items, _ = await api.list(PODS, field_selector=sel)
            times.append(1000 * (time.monotonic() - t))
            count = len(items)
        out[key] = round(sorted(times)[len(times) // 2], 1)
        out[f"{key}_items"] = count
    return out


def _patient(check: Callable[[], Awaitable[Any]]) -> Callable[[], Awaitable[Any]]:
    """A wait's check that takes a busy API server's timeout as "not yet" (the bench's
    own polls must not end a run that a loaded control plane answers slowly)."""
    async def asked() -> Any:
        try:
            return await check()
        except (ApiError, asyncio.TimeoutError) as e:
            if isinstance(e, ApiError) and e.code not in (0, 429, 500, 503, 504):
                raise
            print(f"  (a poll failed: {e}; asking again)", flush=True)
            return None
    return asked


async def _states(api: Client, names: list[str]) -> dict[str, Any]:
    gate = asyncio.Semaphore(8)

    async def ask(name: str) -> Any:
        async with gate:
            try:
                status, body = await cluster.pod_state(api, name)
            except (OSError, asyncio.TimeoutError) as e:
                return e
            return body if status == 200 else status
    return dict(zip(names, await asyncio.gather(*(ask(n) for n in names)), strict=True))


@contextlib.asynccontextmanager
async def _watching(api: Client, kind: Any) -> AsyncIterator[Informer]:
    """An informer of ``kind`` in the namespace: the bench's waits read its cache (a list
    of every pod each half second would be a load of its own on the control plane it
    measures: 3,000 pods, a second each)."""
    inf = Informer(api, kind, "default")
    inf.start()
    try:
        await asyncio.wait_for(inf.synced.wait(), 120)
        yield inf
    finally:
        await inf.stop()


def _pods_of(pods: Informer, nodes: list[str]) -> dict[str, str]:
    return {p["metadata"]["name"]: p["metadata"]["uid"] for p in pods.list() if p["spec"].get("nodeName") in nodes}


def _replaced(pods: Informer, uids: dict[str, str], away: list[str]) -> bool:
    return sum(1 for p in pods.list() if p["metadata"]["name"] in uids
               and p["metadata"]["uid"] != uids[p["metadata"]["name"]]
               and p["spec"].get("nodeName") not in (None, *away) and cluster.pod_ready(p)) == len(uids)


async def _until(check: Callable[[], bool], timeout: float, what: str) -> None:
    async def asked() -> bool:
        return check()
    await cluster.Cluster.wait(asked, timeout, what, 0.1)


async def drain_nodes(api: Client, nodes: list[str]) -> dict[str, Any]:
    """Cordon ``nodes``, evict every pod on them through the Eviction API (8 in flight),
    until every replacement is Ready elsewhere; kept: a pod whose counter went on from
    where it was (its state moved)."""
    async with _watching(api, PODS) as pods:
        return await _drain(api, pods, nodes)


async def _drain(api: Client, pods: Informer, nodes: list[str]) -> dict[str, Any]:
    uids = _pods_of(pods, nodes)
    names = sorted(uids)
    before = await _states(api, names)
    started = time.monotonic()
    await asyncio.gather(*(api.patch(NODES, n, {"spec": {"unschedulable": True}}) for n in nodes))
    gate = asyncio.Semaphore(8)

    async def evict(name: str) -> None:
        async with gate:
            await api.post_subresource(PODS, name, "eviction", {
                "apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": name, "namespace": "default"}},
                "default")
    await asyncio.gather(*(evict(n) for n in names))
    await _until(lambda: _replaced(pods, uids, nodes), 300, f"{len(names)} pods drained")
    seconds = time.monotonic() - started
    after = await _states(api, names)
    kept = sum(1 for n in names if isinstance(before[n], dict) and isinstance(after[n], dict)
               and after[n]["requests"] == before[n]["requests"] + 1 and after[n]["restored_calls"] >= 1)
    return {"nodes": len(nodes), "pods": len(names), "seconds": round(seconds, 1), "kept": kept}


def _all_checkpointed(checkpoints: Informer, names: set[str]) -> bool:
    return names <= {c["spec"].get("podName") for c in checkpoints.list() if objects.phase(c) == CheckpointPhase.SAVED
                     and objects.status(c).get("sizeBytes")}


async def lose_nodes(api: Client, fleet: subprocess.Popen, nodes: list[str], grace: float) -> dict[str, Any]:
    """Once every pod on ``nodes`` has a Saved periodic checkpoint, kill those nodes at
    once (the fleet's ``kill``: their Leases just stop), until every pod is Ready
    elsewhere again; restored: a pod that came back from its checkpoint."""
    async with _watching(api, PODS) as pods, _watching(api, CHECKPOINTS) as checkpoints:
        uids = _pods_of(pods, nodes)
        names = sorted(uids)
        await _periodic(api, names)
        await _until(lambda: _all_checkpointed(checkpoints, set(names)), 120 + CHECKPOINT_EVERY + len(names) / 10,
                     "periodic checkpoints")
        assert fleet.stdin is not None
        started = time.monotonic()
        fleet.stdin.write("".join(f"kill {n}\n" for n in nodes).encode())
        fleet.stdin.flush()
        await _until(lambda: _replaced(pods, uids, nodes), grace + 300, f"{len(names)} pods restored")
        seconds = time.monotonic() - started
    after = await _states(api, names)
    restored = sum(1 for n in names if isinstance(after[n], dict) and after[n]["restored_calls"] >= 1)
    return {"nodes": len(nodes), "pods": len(names), "seconds": round(seconds, 1), "grace": grace,
            "restored": restored}


async def _trace(out: Path, procs: dict[str, subprocess.Popen], n: int) -> None:
    """Each process writes where its traced memory is (bench.tracemem, on SIGUSR1)."""
    for name, p in procs.items():
        target = out / f"{name}.txt"
        target.unlink(missing_ok=True)
        p.send_signal(signal.SIGUSR1)
        deadline = time.monotonic() + 120
        while not target.exists() and time.monotonic() < deadline:
            await asyncio.sleep(0.5)
        await asyncio.sleep(1)
        if target.exists():
            target.rename(out / f"mem-{name}-{n}.txt")


async def _push(kubeconfig: Path) -> str:
    p = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "kube32.cli.main", "image", "push", str(cluster.COUNTER), "--kubeconfig",
        str(kubeconfig), cwd=ROOT, stdout=subprocess.PIPE)
    out, _ = await p.communicate()
    if p.returncode != 0:
        raise RuntimeError(f"image push failed: {out!r}")
    return out.decode().strip()


async def _ready_at(api: Client, n: int, fleet: subprocess.Popen, began: float) -> float | None:
    if fleet.poll() is not None:
        raise RuntimeError("the fleet exited")
    return time.monotonic() - began if await _ready_count(api, "fleet-") >= n else None


def _spy() -> str:
    return shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")


async def _profile(pid: int, seconds: float, out: Path) -> None:
    raw = out.with_suffix(".raw.txt")
    p = await asyncio.create_subprocess_exec(_spy(), "record", "--pid", str(pid), "--duration", str(int(seconds)),
                                             "--rate", "50", "--format", "raw", "--output", str(raw),
                                             "--nonblocking", stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    await p.wait()
    if raw.exists():
        out.write_text(top_functions(raw.read_text()))


def top_functions(raw: str, top: int = 30) -> str:
    """py-spy's raw (collapsed) stacks as the functions with the most samples, inclusive
    (a function counted once per stack) and exclusive (the leaf)."""
    inclusive: dict[str, int] = {}
    leaf: dict[str, int] = {}
    total = 0
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        k = int(count)
        total += k
        frames = stack.split(";")
        for f in set(frames):
            inclusive[f] = inclusive.get(f, 0) + k
        leaf[frames[-1]] = leaf.get(frames[-1], 0) + k
    lines = [f"{total} samples"]
    for title, table in (("inclusive", inclusive), ("self", leaf)):
        lines.append(f"-- {title}")
        for f, k in sorted(table.items(), key=lambda kv: -kv[1])[:top]:
            lines.append(f"{100 * k / max(total, 1):5.1f}%  {f}")
    return "\n".join(lines) + "\n"


SMALL_TITLE = "## Fleets (issue 25, small sizes: `make bench`)"
LEGACY_TITLES = ("## Fleets (issue 25)",)   # the section before these two
SCALE_TITLE = "## Fleets at scale (issue 25, `make bench-fleet`)"
PLOT = ROOT / "docs" / "fleet-growth.png"
GOAL_CPU, GOAL_WATCH_P99_MS, GOAL_DRAIN_S, GOAL_LOSS_OVER_GRACE_S = 0.25, 100.0, 60.0, 30.0


def growth(rows: list[dict[str, Any]], value: Callable[[dict[str, Any]], float | None]) -> tuple[str, float | None]:
    """How a figure grows from the smallest size to the largest: its exponent k (the
    figure ~ nodes^k) and a word for it."""
    pts = [(r["nodes"], value(r)) for r in rows]
    pts = [(n, v) for n, v in pts if v is not None and v > 0]
    if len(pts) < 2 or pts[-1][0] == pts[0][0]:
        return "-", None
    k = math.log(pts[-1][1] / pts[0][1]) / math.log(pts[-1][0] / pts[0][0])
    word = ("flat" if k < 0.3 else "sublinear" if k < 0.8 else "linear" if k <= 1.25
            else f"worse than linear (n^{k:.1f})")
    return word, k


def _get(r: dict[str, Any], *path: str) -> Any:
    for p in path:
        r = r.get(p) if isinstance(r, dict) else None
    return r


FIGURES: list[tuple[str, Callable[[dict[str, Any]], Any], Callable[[Any], str]]] = [
    ("all Ready (join)", lambda r: r["join_s"], lambda v: f"{v:.1f} s"),
    ("fleet RSS", lambda r: r["fleet_rss"], lambda v: f"{v / 2**20:.0f} MiB"),
    ("control plane RSS", lambda r: r["cp_rss"], lambda v: f"{v / 2**20:.0f} MiB"),
    ("control plane CPU at rest", lambda r: r["cp_cpu"], lambda v: f"{100 * v:.0f}%"),
    ("fleet CPU at rest", lambda r: r["fleet_cpu"], lambda v: f"{100 * v:.0f}%"),
    ("watch p50", lambda r: _get(r, "watch_ms", "p50"), lambda v: f"{v:.0f} ms"),
    ("watch p99", lambda r: _get(r, "watch_ms", "p99"), lambda v: f"{v:.0f} ms"),
    ("list pods (all)", lambda r: _get(r, "list_ms", "all"), lambda v: f"{v:.0f} ms"),
    ("list pods (one node's)", lambda r: _get(r, "list_ms", "node"), lambda v: f"{v:.0f} ms"),
    ("drain", lambda r: _get(r, "drain", "seconds"), lambda v: f"{v:.1f} s"),
    ("loss, to all restored", lambda r: _get(r, "lose", "seconds"), lambda v: f"{v:.1f} s"),
]


def _drain_cell(r: dict[str, Any]) -> str:
    d = r.get("drain")
    return f"{d['nodes']} nodes, {d['pods']} pods: {d['seconds']:.1f} s, {d['kept']} kept" if d else "-"


def _lose_cell(r: dict[str, Any]) -> str:
    d = r.get("lose")
    return (f"{d['nodes']} nodes, {d['pods']} pods: {d['seconds']:.1f} s (grace {d['grace']:g} s), "
            f"{d['restored']} restored" if d else "-")


def goals(r: dict[str, Any]) -> list[list[str]]:
    """The issue's goals against the largest size's figures."""
    out = [["control plane CPU at rest < 25% of a core", f"{100 * r['cp_cpu']:.0f}%",
            report.verdict(r["cp_cpu"] < GOAL_CPU)]]
    p99 = _get(r, "watch_ms", "p99")
    if p99 is not None:
        out.append(["watch delivery p99 < 100 ms", f"{p99:.0f} ms", report.verdict(p99 < GOAL_WATCH_P99_MS)])
    if "drain" not in r:
        out.append(["drain of 50 nodes (500 pods) < 60 s, nothing lost", "not measured at this size "
                    "(bench/notes.md says why)", report.verdict(False)])
    if "lose" not in r:
        out.append(["loss of 100 nodes recovered within grace + 30 s", "not measured at this size "
                    "(bench/notes.md says why)", report.verdict(False)])
    d = r.get("drain")
    if d:
        out.append([f"drain of {d['nodes']} nodes < 60 s, nothing lost", f"{d['seconds']:.1f} s, "
                    f"{d['kept']} of {d['pods']} kept",
                    report.verdict(d["seconds"] < GOAL_DRAIN_S and d["kept"] == d["pods"])])
    d = r.get("lose")
    if d:
        out.append([f"loss of {d['nodes']} nodes recovered within grace + 30 s", f"{d['seconds']:.1f} s "
                    f"(grace {d['grace']:g} s), {d['restored']} of {d['pods']} restored",
                    report.verdict(d["seconds"] <= d["grace"] + GOAL_LOSS_OVER_GRACE_S
                                   and d["restored"] == d["pods"])])
    return out


def section(rows: list[dict[str, Any]], rest: float, title: str = SMALL_TITLE, plot: Path | None = None) -> str:
    body = [[str(r["nodes"]), str(r["pods"]), f"{r['join_s']:.1f} s", f"{r['fleet_rss'] / r['nodes'] / 2**20:.2f} MiB",
             f"{r['cp_rss'] / 2**20:.0f} MiB", f"{100 * r['cp_cpu']:.0f}%", f"{100 * r['fleet_cpu']:.0f}%",
             (f"{r['watch_ms']['p50']:.0f} / {r['watch_ms']['p99']:.0f} ms" if r.get("watch_ms") else "-"),
             (f"{r['list_ms']['all']:.0f} / {r['list_ms']['node']:.0f} ms" if r.get("list_ms") else "-"),
             _drain_cell(r), _lose_cell(r), f"{r.get('load', '?')}", r.get("code", "this run")] for r in rows]
    text = (f"{title}\n\n"
            "`kube32-sim fleet --nodes N` (devkit boards, pwasm, Lease and status every 10 s; counter pods) against "
            f"a control plane of its own (`--no-kubelet`); CPU at rest over {rest:g} s after every pod runs, as a "
            "share of one core, before any periodic checkpoint; watch delivery: a merge patch's send to its event on a "
            "watch of the namespace's pods; list pods: every pod, and one node's by `spec.nodeName`; the loss first "
            "(its pods take a periodic checkpoint every 120 s from then on, the nodes to drain cordoned), then the "
            "drain through the Eviction API.  Measured on this 2-core machine with other sessions' work running "
            "(the load column: its 1-minute load average at rest): indicative, one run a size; the code column "
            "names the commit a row ran on when the rows come from different runs (`--json`, `--from-json`).\n\n")
    text += report.table(["nodes", "pods", "all Ready", "fleet RSS / node", "control plane RSS",
                          "control plane CPU", "fleet CPU", "watch p50 / p99", "list all / by node", "drain",
                          "loss", "load", "code"], body)
    if len(rows) > 1:
        grow = []
        series = []
        for name, value, fmt in FIGURES:
            vals = [value(r) for r in rows]
            if all(v is None for v in vals):
                continue
            word, k = growth(rows, value)
            first = next((v for v in vals if v), None)
            colour = pngplot.COLOURS[len(series) % len(pngplot.COLOURS)][0]
            series.append([(r["nodes"], v / first) for r, v in zip(rows, vals, strict=True) if v and first])
            grow.append([name, colour if plot else "-", " -> ".join("-" if v is None else fmt(v) for v in vals),
                         "-" if k is None else f"{k:.2f}", word])
        text += (f"\nGrowth from {rows[0]['nodes']} to {rows[-1]['nodes']} nodes: k in figure ~ nodes^k "
                 "(1 is linear)")
        if plot is not None:
            pngplot.write(plot, series)
            text += (f"; [the plot](fleet-growth.png) has each figure over its value at {rows[0]['nodes']} "
                     "nodes, log-log, the grey line linear growth")
        text += ".\n\n" + report.table(["figure", "colour", "by size", "k", "growth"], grow)
    text += "\nGoals (issue 25), at the largest size:\n\n" + report.table(["goal", "figure", ""], goals(rows[-1]))
    return text


async def run(sizes: list[int], plan: Plan, profile_out: Path | None) -> list[dict[str, Any]]:
    rows = []
    for i, n in enumerate(sizes):
        rows.append(await one_size(n, plan, profile_out if i == len(sizes) - 1 else None))
    return rows


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.bench_fleet")
    parser.add_argument("--sizes", default=",".join(map(str, SIZES)), help="comma-separated fleet sizes")
    parser.add_argument("--pods-per-node", type=int, default=SMALL_PODS)
    parser.add_argument("--rest", type=float, default=REST_SECONDS, help="seconds at rest to measure CPU over")
    parser.add_argument("--probes", type=int, default=PROBES, help="watch-delivery probes at each size")
    parser.add_argument("--drain", type=int, default=SMALL_DRAIN, metavar="D",
                        help="drain D nodes through the Eviction API at each size (needs --pods-per-node)")
    parser.add_argument("--lose", type=int, default=SMALL_LOSE, metavar="L",
                        help="lose L nodes at once at each size; their pods restore from periodic checkpoints")
    parser.add_argument("--grace", type=float, default=GRACE_SECONDS, help="the node-monitor grace period")
    parser.add_argument("--trace", type=Path, metavar="DIR",
                        help="tracemalloc both processes (bench.tracemem); reports mem-*-N.txt in DIR "
                             "(its CPU and time figures are then not the bench's)")
    parser.add_argument("--profile", action="store_true", help="py-spy the control plane at the largest size")
    parser.add_argument("--profile-out", type=Path, default=ROOT / "bench" / "fleet-profile.txt")
    parser.add_argument("--no-report", action="store_true", help="print the section, do not add it to the report")
    parser.add_argument("--scale", action="store_true",
                        help="write the scale section (and docs/fleet-growth.png) into docs/benchmarks.md in place "
                             "(the default when the largest size is 100 or more)")
    parser.add_argument("--in-place", action="store_true",
                        help="write the small sizes' section into docs/benchmarks.md in place too (not `make bench`)")
    parser.add_argument("--json", type=Path, help="also write every size's figures to this file")
    parser.add_argument("--from-json", type=Path, help="no run: write the section from figures a --json run wrote")
    args = parser.parse_args(argv)
    sizes = sorted(int(s) for s in args.sizes.split(",") if s.strip())
    plan = Plan(args.pods_per_node, args.rest, args.probes, args.drain, args.lose, args.grace, args.trace)
    if args.trace:
        args.trace.mkdir(parents=True, exist_ok=True)
    if args.from_json:
        rows = json.loads(args.from_json.read_text())
        sizes = [r["nodes"] for r in rows]
    else:
        rows = cluster.run(run(sizes, plan, args.profile_out if args.profile else None))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    scale = args.scale or max(sizes) >= 100
    text = section(rows, args.rest, SCALE_TITLE if scale else SMALL_TITLE, PLOT if scale else None)
    if args.no_report:
        pass
    elif scale or args.in_place:
        report.replace_section(text, drop=LEGACY_TITLES)   # its own target: the other benches' figures stay
    else:
        report.add(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
