"""The API server's request rates, so the control plane is not what limits a drain.

A control plane with no nodes running (one Node object, ``bench-node``, with no
kubelet: its 1,000 pods are bound and never started) serves, over HTTPS with the
admin token, from one client process with 8 requests in flight on keep-alive
connections:

- get:   GET of one pod, 2,000 times;
- list:  GET of all 1,000 pods (about 1 MB of JSON), 20 times;
- patch: a merge patch of one label, once on each of the 1,000 pods;
- watch: a pod watch open while the 1,000 patches run; the rate at which their
  MODIFIED events arrive (first patch sent -> last event read).

Baseline in the same run: a bare aiohttp server over TLS (another process, same
client) that answers each request with the same bytes the API server answered,
without looking at them: the floor of this machine's Python HTTP stack.

    python -m bench.bench_apiserver [--runs 3]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any, Awaitable, Callable


from kube32.client import NODES, PODS, Client

from . import cluster, report
from .cluster import Cluster

PODS_N = 1000
GETS = 2000
LISTS = 20
INFLIGHT = 8


def _bare_server(pki_dir: str, bodies: dict[str, bytes], port_out: Any) -> None:
    from aiohttp import web

    from kube32.apiserver import pki

    crt, key = pki.issue_serving_cert(Path(pki_dir), "bench-bare", ["127.0.0.1", "localhost"])

    async def answer(request: web.Request) -> web.Response:
        await request.read()
        body = bodies["list"] if request.path.endswith("/pods") else bodies["get"]
        return web.Response(body=body, content_type="application/json")

    async def run() -> None:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", answer)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=pki.server_context(crt, key))
        await site.start()
        port_out.put(site._server.sockets[0].getsockname()[1])  # type: ignore[union-attr]
        await asyncio.Event().wait()

    asyncio.run(run())


async def rate(count: int, one: Callable[[int], Awaitable[Any]]) -> float:
    """Requests per second for ``count`` calls of ``one(i)``, INFLIGHT at a time."""
    it = iter(range(count))

    async def lane() -> None:
        for i in it:
            await one(i)
    started = time.monotonic()
    await asyncio.gather(*(lane() for _ in range(INFLIGHT)))
    return count / (time.monotonic() - started)


async def measure(api: Client, run: int) -> dict[str, float]:
    ns = "default"

    async def get(i: int) -> None:
        await api.get(PODS, f"p{i % PODS_N:04}", ns)

    async def lst(i: int) -> None:
        await api.list(PODS, ns)

    async def patch(i: int) -> None:
        await api.patch(PODS, f"p{i:04}", {"metadata": {"labels": {"run": str(run)}}}, ns)

    out = {"get": await rate(GETS, get), "list": await rate(LISTS, lst)}
    _, rv = await api.list(PODS, ns)
    seen = 0
    done = asyncio.Event()

    async def watch() -> None:
        nonlocal seen
        async for etype, obj in api.watch(PODS, ns, resource_version=rv):
            if etype == "MODIFIED" and obj["metadata"]["labels"].get("run") == str(run):
                seen += 1
                if seen == PODS_N:
                    done.set()
                    return
    task = asyncio.create_task(watch())
    await asyncio.sleep(0.2)
    started = time.monotonic()
    out["patch"] = await rate(PODS_N, patch)
    await asyncio.wait_for(done.wait(), 120)
    out["watch"] = PODS_N / (time.monotonic() - started)
    task.cancel()
    return out


async def bare_rates(port: int, ca: bytes) -> dict[str, float]:
    client = Client(f"https://127.0.0.1:{port}", None, ca_pem=ca)
    try:
        async def get(i: int) -> None:
            await client._json("GET", f"/api/v1/namespaces/default/pods/p{i % PODS_N:04}")

        async def lst(i: int) -> None:
            await client._json("GET", "/api/v1/namespaces/default/pods")

        async def patch(i: int) -> None:
            await client._json("PATCH", f"/api/v1/namespaces/default/pods/p{i:04}",
                               body={"metadata": {"labels": {"run": "x"}}},
                               content_type="application/merge-patch+json")
        return {"get": await rate(GETS, get), "list": await rate(LISTS, lst), "patch": await rate(PODS_N, patch)}
    finally:
        await client.close()


async def run(runs: int) -> str:
    async with Cluster(workers=0) as cluster:
        api = cluster.api
        await api.create(NODES, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "bench-node"}})
        sem = asyncio.Semaphore(INFLIGHT)

        async def create(i: int) -> None:
            async with sem:
                await api.create(PODS, {"apiVersion": "v1", "kind": "Pod",
                                        "metadata": {"name": f"p{i:04}", "labels": {"app": "bench"}},
                                        "spec": {"nodeName": "bench-node",
                                                 "containers": [{"name": "main", "image": cluster.image}]}},
                                 "default")
        await asyncio.gather(*(create(i) for i in range(PODS_N)))
        bodies = {"get": json.dumps(await api.get(PODS, "p0000", "default")).encode()}
        async with api.request("GET", "/api/v1/namespaces/default/pods") as r:
            bodies["list"] = await r.read()
        results = [await measure(api, i) for i in range(runs)]

        pki_dir = tempfile.mkdtemp(prefix="kube32-bench-pki-")
        from kube32.apiserver import pki
        ca = pki.ensure_pki(Path(pki_dir)).apiserver
        ctx = mp.get_context("spawn")
        port_q = ctx.Queue()
        server = ctx.Process(target=_bare_server, args=(pki_dir, bodies, port_q), daemon=True)
        server.start()
        try:
            port = port_q.get(timeout=30)
            bare = [await bare_rates(port, ca.read_bytes()) for _ in range(runs)]
        finally:
            server.kill()
            server.join(10)
            shutil.rmtree(pki_dir, ignore_errors=True)
    med = {k: statistics.median(r[k] for r in results) for k in results[0]}
    bmed = {k: statistics.median(r[k] for r in bare) for k in bare[0]}
    print(f"  api: {med}\n  bare: {bmed}", flush=True)
    rows = [
        ["get (one pod)", f"{med['get']:.0f}", f"{bmed['get']:.0f}", f"{med['get'] / bmed['get']:.2f}", ""],
        [f"list ({PODS_N:,} pods, {len(bodies['list']) / 1e6:.1f} MB)", f"{med['list']:.1f}",
         f"{bmed['list']:.1f}", f"{med['list'] / bmed['list']:.2f}", _at_least(med["list"] / bmed["list"], 0.5)],
        ["patch (merge, one label)", f"{med['patch']:.0f}", f"{bmed['patch']:.0f}",
         f"{med['patch'] / bmed['patch']:.2f}", _at_least(med["patch"] / bmed["patch"], 0.5)],
        ["watch events delivered during the patches", f"{med['watch']:.0f}", f"{med['patch']:.0f} (patches/s)",
         f"{med['watch'] / med['patch']:.2f}", ""],
    ]
    return "\n".join([
        f"## API server (bench_apiserver, {runs} runs, medians)\n",
        f"Requests per second from one client, {INFLIGHT} in flight, HTTPS, {PODS_N:,} pods stored; the "
        "baseline is a bare aiohttp server over TLS answering the same bytes without looking at them.  The "
        "targets (issue 25) are for list and patch, the control plane's share of a fleet's load; a drain "
        "mixes evictions, Checkpoint and status writes, replacements, restores and watch fan-out, and keeps "
        "the control plane's one event loop busy all along (see the notes).\n",
        report.table(["request", "per second", "bare aiohttp baseline", "ratio", "target"], rows)])


def _at_least(ratio: float, goal: float) -> str:
    return f">= {goal:.2f}: {report.verdict(ratio >= goal)}"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.bench_apiserver")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args(argv)
    text = cluster.run(run(args.runs))
    report.add(text)
    print(text)
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main(sys.argv[1:]))
