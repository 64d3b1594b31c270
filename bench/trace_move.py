"""Where a move's time goes: a few moves of one pod back and forth, each with its
Checkpoint's timestamps (from the request) and the CPU time each process spent on it.
A profiling aid, not part of `make bench`.

    python -m bench.trace_move [--kib 65472] [--moves 3]

Each line: request->Completed, the Moved event's freeze->Running (moveMillis), the CPU
ms of the control plane and of each worker during the move, then every `...Ms`
timestamp of the Checkpoint's status as ms after the request (snapshotStartMs: the
snapshot slot taken; frozenAtMs; snapshotEndMs: the data stored; movingSinceMs: the
replacement bound).
"""
from __future__ import annotations

import argparse
import os
import secrets
import time
from typing import Any

from kube32.client import CHECKPOINTS

from .bench_moves import grown_pod
from .cluster import Cluster, run

PROCESSES = ("control-plane", "sim-1", "sim-2")


def cpu_ms(pid: int) -> float:
    """utime + stime of a process, all its threads, in ms."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * 1000 / os.sysconf("SC_CLK_TCK")


async def one_move(c: Cluster, target: str) -> str:
    name = f"traced-{secrets.token_hex(3)}"
    cpu0 = {p: cpu_ms(c.pid(p)) for p in PROCESSES}
    t0 = time.time() * 1000
    await c.api.create(CHECKPOINTS, {"apiVersion": "kube32.io/v1", "kind": "Checkpoint", "metadata": {"name": name},
                                     "spec": {"podName": "traced", "action": "Move",
                                              "target": {"nodeName": target}}}, "default")

    async def done() -> Any:
        ck = await c.api.get(CHECKPOINTS, name, "default")
        return ck if (ck.get("status") or {}).get("phase") in ("Completed", "Failed") else None
    st = (await c.wait(done, 120, name, interval=0.005))["status"]
    t1 = time.time() * 1000
    cpu = " ".join(f"{p} {cpu_ms(c.pid(p)) - cpu0[p]:.0f}" for p in PROCESSES)
    marks = sorted((v - t0, k) for k, v in st.items() if k.endswith("Ms") and isinstance(v, int) and v > 1e12)
    return (f"{st['phase']}: request->Completed {t1 - t0:.0f} ms, moveMillis {st.get('moveMillis')}; CPU ms {cpu}; "
            + ", ".join(f"{k} +{t:.0f}" for t, k in marks))


async def trace(kib: int, moves: int) -> None:
    async with Cluster() as c:
        await grown_pod(c, "traced", "sim-1", None, kib)
        for i in range(moves):
            print(f"move {i}:", await one_move(c, ["sim-2", "sim-1"][i % 2]), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.trace_move")
    parser.add_argument("--kib", type=int, default=65472, help="memory the pod allocates (default: 64 MiB in all)")
    parser.add_argument("--moves", type=int, default=3)
    args = parser.parse_args()
    run(trace(args.kib, args.moves))


if __name__ == "__main__":
    main()
