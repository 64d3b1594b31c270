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

from kube32.client import CHECKPOINTS, DEPLOYMENTS, PODS

from .bench_moves import EventWatch, deployment, serving
from .cluster import Cluster, pod_ready, run

Obj = dict[str, Any]


def line(plural: str, etype: str, obj: Obj) -> str:
    md, st = obj["metadata"], obj.get("status") or {}
    node = (obj.get("spec") or {}).get("nodeName", "")
    ready = pod_ready(obj) if plural == "pods" else ""
    return (f"{plural:11} {etype:8} {md['name'][-16:]:16} uid={md.get('uid', '')[:6]} {node:6} "
            f"{st.get('phase', '')!s:10} ready={ready!s:5} deleting={bool(md.get('deletionTimestamp'))}")


async def trace(pairs: int) -> None:
    async with Cluster() as c:
        api = c.api
        await api.create(DEPLOYMENTS, deployment(c.image), "default")
        async with EventWatch(api, PODS, "default", "app=dep") as pods, \
                EventWatch(api, CHECKPOINTS, "default") as checkpoints:
            _, pod = await pods.until(0, serving)
            for _ in range(pairs):
                for what in ("MOVE", "RESTART"):
                    await asyncio.sleep(0.5)
                    started = time.monotonic()
                    name, uid = pod["metadata"]["name"], pod["metadata"]["uid"]
                    if what == "MOVE":
                        await api.create(CHECKPOINTS, {
                            "apiVersion": "kube32.io/v1", "kind": "Checkpoint",
                            "metadata": {"name": f"trace-{secrets.token_hex(3)}"},
                            "spec": {"podName": name, "action": "Move"}}, "default")
                        _, pod = await pods.until(started, lambda p: serving(p) and p["metadata"]["uid"] != uid)
                    else:
                        await api.delete(PODS, name, "default")
                        _, pod = await pods.until(started, lambda p: serving(p) and p["metadata"]["name"] != name)
                    await asyncio.sleep(0.2)  # the events that follow Ready, for context
                    print(what, flush=True)
                    events = sorted((at, line(w.kind.plural, etype, obj)) for w in (pods, checkpoints)
                                    for at, etype, obj in w.seen if at >= started)
                    for at, text in events:
                        print(f"  {(at - started) * 1000:6.1f} {text}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=3)
    run(trace(parser.parse_args().pairs))


if __name__ == "__main__":
    main()
