"""One node's list of pods (``fieldSelector=spec.nodeName=<node>``): the scan of every pod
against the watch-fed index (kube32.apiserver.nodeindex), in one process.

A registry on SQLite holds N pods (10,000 by default) spread over N/10 nodes, 10 each,
as a fleet's (bench_fleet: 10 counter pods a node); then, 20 times each, one node's list
is read and encoded as the API server answers it (``Registry.listing``, every item's
JSON from its stored bytes, ``paging.encoded_list``): once by the scan the server made
before (every pod read from the store, decoded, filtered), once from the index (a
consistent read: the store's revision, the index's progress mark, the node's 10 pods),
each after a write of another kind, so the index has to catch up every time.  HTTP and
TLS are left out: they cost both the same, a list of 10 pods.

    python -m bench.bench_pods_by_node [--pods 10000] [--runs 20]
"""
from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from typing import Any

from kube32.apiserver import paging
from kube32.apiserver.nodeindex import NodeIndex
from kube32.apiserver.registry import Registry, encoded
from kube32.apiserver.resources import by_plural
from kube32.apiserver.selectors import parse_field_selector, parse_label_selector
from kube32.store import SQLiteStore

from . import report

PODS, CMS = by_plural("pods"), by_plural("configmaps")
PER_NODE = 10


def pod(i: int) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"p{i:05}", "namespace": "default", "labels": {"app": "bench"},
                         "annotations": {"kube32.io/tick-interval": "100ms"}},
            "spec": {"nodeName": f"node-{i // PER_NODE:04}",
                     "containers": [{"name": "main", "image": "kube32.io/wasm-sha256:" + "0" * 64}]}}


async def one_list(registry: Registry, node: str) -> tuple[float, int, bool]:
    """(seconds, bytes of the answer, answered from the index) of one node's list."""
    began = time.perf_counter()
    listing = await registry.listing(PODS, None, parse_label_selector(None),
                                     parse_field_selector(f"spec.nodeName={node}"), paging.ListOptions(limit=500),
                                     decoded=False).open()
    size = 0
    async for piece in paging.encoded_list({"kind": "PodList", "apiVersion": "v1"}, "items",
                                           (encoded(item.kv) async for item in listing),
                                           lambda: {"metadata": listing.metadata()}):
        size += len(piece)
    return time.perf_counter() - began, size, getattr(listing, "indexed", None) is not None


async def run(pods: int, runs: int) -> str:
    store = await SQLiteStore.open(":memory:")
    registry = Registry(store)
    try:
        await registry.create(by_plural("namespaces"), None, {"metadata": {"name": "default"}}, check_namespace=False)
        began = time.perf_counter()
        for i in range(pods):
            await registry.create(PODS, "default", pod(i))
        print(f"  {pods:,} pods stored in {time.perf_counter() - began:.1f} s", flush=True)
        index = NodeIndex(store, registry.shared_decode)
        began = time.perf_counter()
        await index.start()
        start_s = time.perf_counter() - began
        nodes = pods // PER_NODE
        times: dict[str, list[float]] = {"scan": [], "index": []}
        for r in range(runs):
            sizes = set()
            node = f"node-{(r * 37) % nodes:04}"
            for how in ("scan", "index"):
                registry.pods_by_node = index if how == "index" else None
                await registry.create(CMS, "default", {"metadata": {"name": f"c{how}{r}"}})  # the store moves on
                seconds, size, indexed = await one_list(registry, node)
                assert indexed == (how == "index"), how
                times[how].append(seconds)
                sizes.add(size)
            assert len(sizes) == 1, sizes   # the same answer both ways
        await index.close()
    finally:
        await store.close()
    scan, idx = statistics.median(times["scan"]), statistics.median(times["index"])
    print(f"  scan {scan * 1e3:.2f} ms, index {idx * 1e3:.3f} ms, ratio {scan / idx:.0f}", flush=True)
    rows = [["scan of every pod (before)", f"{scan * 1e3:.1f}", ""],
            ["from the index (consistent read)", f"{idx * 1e3:.2f}", f"{scan / idx:.0f}x faster"]]
    return "\n".join([
        f"## List of one node's pods (bench_pods_by_node, {runs} lists each, medians)\n",
        f"{pods:,} pods on {nodes:,} nodes ({PER_NODE} each), SQLite in memory, in one process: one node's list "
        f"(`fieldSelector=spec.nodeName=<node>`, `limit=500` as kubectl asks) read and encoded as the API "
        f"server answers it, each after a write of another kind (the index catches up by a progress mark); "
        f"HTTP and TLS left out (the same for both).  The index lists the pods once at the start: "
        f"{start_s:.2f} s.\n",
        report.table(["list pods by node", "ms", "ratio"], rows)])


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.bench_pods_by_node")
    parser.add_argument("--pods", type=int, default=10000)
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args(argv)
    text = asyncio.run(run(args.pods, args.runs))
    report.add(text)
    print(text)
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main(sys.argv[1:]))
