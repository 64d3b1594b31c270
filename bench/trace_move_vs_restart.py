"""Where a Deployment pod's move and restart spend their time: a few of each, every pod
and Checkpoint watch event printed as ms after the action (the Checkpoint's creation, the
pod's deletion).  A profiling aid beside bench_moves' "move vs restart", not part of
`make bench`.

    python -m bench.trace_move_vs_restart [--pairs 3]

Each event line: ms, kind, type, name, uid, node, phase, Ready, deleting.
"""
from __future__ import annotations

import argparse
import asyncio
import secrets
import time
from typing import Any

from kube32.client import CHECKPOINTS, DEPLOYMENTS, PODS, Kind

from .cluster import Cluster, pod_ready, run

Obj = dict[str, Any]


def line(kind: Kind, etype: str, obj: Obj) -> str:
    md, st = obj["metadata"], obj.get("status") or {}
    node = (obj.get("spec") or {}).get("nodeName", "")
    ready = pod_ready(obj) if kind is PODS else ""
    return (f"{kind.plural:11} {etype:8} {md['name'][-16:]:16} uid={md.get('uid', '')[:6]} {node:6} "
            f"{st.get('phase', '')!s:10} ready={ready!s:5} deleting={bool(md.get('deletionTimestamp'))}")


async def trace(pairs: int) -> None:
    async with Cluster() as c:
        api = c.api
        await api.create(DEPLOYMENTS, {
            "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "dep"},
            "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "dep"}},
                     "template": {"metadata": {"labels": {"app": "dep"}},
                                  "spec": {"containers": [{"name": "main", "image": c.image}]}}}}, "default")
        seen: list[tuple[float, str, Obj]] = []
        t0 = [time.monotonic()]

        async def watch(kind: Kind) -> None:
            async for etype, obj in api.watch(kind, "default"):
                seen.append((time.monotonic(), line(kind, etype, obj), obj if kind is PODS else {}))

        tasks = [asyncio.create_task(watch(k)) for k in (PODS, CHECKPOINTS)]

        async def until(accept: Any) -> Obj:
            while True:
                for at, _, obj in seen:
                    if at >= t0[0] and obj and accept(obj):
                        return obj
                await asyncio.sleep(0.005)

        def running(p: Obj) -> bool:
            return not p["metadata"].get("deletionTimestamp") and pod_ready(p)
        try:
            pod = await until(running)
            for _ in range(pairs):
                for what in ("MOVE", "RESTART"):
                    await asyncio.sleep(0.5)
                    seen.clear()
                    t0[0] = time.monotonic()
                    name, uid = pod["metadata"]["name"], pod["metadata"]["uid"]
                    if what == "MOVE":
                        await api.create(CHECKPOINTS, {
                            "apiVersion": "kube32.io/v1", "kind": "Checkpoint",
                            "metadata": {"name": f"trace-{secrets.token_hex(3)}"},
                            "spec": {"podName": name, "action": "Move"}}, "default")
                        pod = await until(lambda p: running(p) and p["metadata"]["uid"] != uid)
                    else:
                        await api.delete(PODS, name, "default")
                        pod = await until(lambda p: running(p) and p["metadata"]["name"] != name)
                    await asyncio.sleep(0.2)  # the events that follow Ready, for context
                    print(what, flush=True)
                    for at, text, _ in list(seen):
                        print(f"  {(at - t0[0]) * 1000:6.1f} {text}", flush=True)
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=3)
    run(trace(parser.parse_args().pairs))


if __name__ == "__main__":
    main()
