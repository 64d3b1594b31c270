"""The engines side by side: wasmtime (compiled) and pwasm (pure Python, any CPU).

1. Speed: each engine's ``kube32.io/interp-mops`` (the fixed i32 kernel a kubelet times
   at boot, kube32.wasm.runtime) and one counter-pod request (``GET /``, in this
   process, straight into the pod: no HTTP), against wasmtime's in the same run; the
   boards' reference figures beside them.
2. Moves between engines: the counter pod with 1 MiB of linear memory moved round a
   cluster of four workers, two of each engine: wasmtime -> wasmtime, wasmtime ->
   pwasm, pwasm -> pwasm, pwasm -> wasmtime, each freeze -> Running
   (``status.moveMillis``), against wasmtime -> wasmtime in the same run.

    python -m bench.bench_engines [--runs 5]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from pathlib import Path

from kube32.sim.profiles import PROFILES
from kube32.wasm import ENGINES, ChannelRegistry, HttpRequest, Pod, PodConfig, Runtime

from . import report
from .bench_moves import delete_pod, grown_pod, move
from .cluster import Cluster

COUNTER = Path(__file__).resolve().parent.parent / "examples" / "pods" / "counter.wasm"
REQUESTS = 200
# The cycle of moves: each leg is one pair of engines (workers sim-1, sim-2: wasmtime;
# pw-1, pw-2: pwasm).
LEGS = [("sim-2", "wasmtime -> wasmtime"), ("pw-1", "wasmtime -> pwasm"), ("pw-2", "pwasm -> pwasm"),
        ("sim-1", "pwasm -> wasmtime")]


class _Host:
    channels = ChannelRegistry()

    def log(self, pod, line):
        pass

    def publish(self, pod, topic, payload):
        pass


def speed(engine: str, runs: int) -> dict[str, float]:
    rt = Runtime(engine=engine)
    try:
        mops = statistics.median(rt.measure_mops() for _ in range(runs))
        pod = Pod(rt, rt.load(COUNTER.read_bytes()), PodConfig("default", "counter", memory_limit_bytes=1 << 20),
                  _Host())
        pod.start()
        try:
            for _ in range(5):   # past pwasm's tier-up: hot code, as a pod that has served a while
                pod.handle(HttpRequest("GET", "/")).result(timeout=10)
            times = []
            for _ in range(REQUESTS):
                started = time.perf_counter()
                body = pod.handle(HttpRequest("GET", "/")).result(timeout=10).body
                times.append((time.perf_counter() - started) * 1000)
            assert json.loads(body)["requests"] == REQUESTS + 5
        finally:
            pod.stop()
        return {"mops": mops, "request_ms": statistics.median(times)}
    finally:
        rt.close()


async def moves(runs: int) -> dict[str, float]:
    async with Cluster(workers=2) as cluster:
        for name in ("pw-1", "pw-2"):
            await cluster.add_worker(name, "--engine", "pwasm")
        await grown_pod(cluster, "eng", "sim-1", None, 960)
        figures: dict[str, list[float]] = {leg: [] for _, leg in LEGS}
        for _ in range(runs):
            for target, leg in LEGS:
                figures[leg].append((await move(cluster, "eng", target, poll=False))["move_ms"])
        await delete_pod(cluster, "eng")
    return {leg: statistics.median(xs) for leg, xs in figures.items()}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.bench_engines")
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args(argv)
    speeds = {engine: speed(engine, args.runs) for engine in ENGINES}
    moved = asyncio.run(moves(args.runs))
    base = speeds["wasmtime"]
    print(f"Engines, {args.runs} runs (median):")
    for engine, s in speeds.items():
        print(f"  {engine:9} {s['mops']:9.1f} interp-mops  GET / {s['request_ms']:.3f} ms")
    for leg, ms in moved.items():
        print(f"  move {leg:22} {ms:7.0f} ms")
    boards = ", ".join(f"{p.name} {p.reference_mops:g}" for p in PROFILES.values() if p.reference_mops)
    speed_rows = [[engine, f"{s['mops']:.1f}", f"{s['mops'] / base['mops']:.3f}", f"{s['request_ms']:.3f}",
                   f"{s['request_ms'] / base['request_ms']:.1f}x"] for engine, s in speeds.items()]
    w2w = moved["wasmtime -> wasmtime"]
    move_rows = [[leg, f"{ms:.0f}", f"{ms / w2w:.2f}"] for leg, ms in moved.items()]
    report.add("\n".join([
        f"## Engines (bench_engines, {args.runs} runs, medians)\n",
        "wasmtime compiles a pod to native code; pwasm (pure Python, for any CPU) interprets it and runs "
        "its hot functions as generated Python.  interp-mops is the fixed i32 kernel a kubelet times at boot "
        f"(kube32.io/interp-mops; the boards' own figures: {boards}); a request is one `GET /` of the "
        "counter pod handed to the pod in this process (no HTTP), after five warm-up requests.\n",
        report.table(["engine", "interp-mops", "ratio", "GET / ms", "vs wasmtime"], speed_rows),
        "\nThe counter pod with 1 MiB of linear memory moved round four workers (two of each engine), "
        "freeze -> Running (`status.moveMillis`), against wasmtime -> wasmtime in the same run.  The "
        "snapshot's bytes are the same whichever engines; what differs is the restoring side's work "
        "(pwasm's memory is a bytearray, its `k32_restored` runs interpreted).\n",
        report.table(["move", "freeze->Running ms", "ratio"], move_rows)]))
    return 0


if __name__ == "__main__":
    import sys
    sys.exit(main(sys.argv[1:]))
