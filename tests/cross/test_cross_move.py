"""One counter pod moves x86_64 -> s390x -> armhf -> arm64 -> x86_64 (issue 21 part 3).

A ``kube32-sim up --workers 1`` cluster on this machine (x86_64, wasmtime) and three
workers of other CPUs, each a ``kube32-sim worker`` in its root filesystem under
qemu-user with its CPU's engine (tests/cross/rootfs.py): s390x is big-endian, armhf
32-bit, arm64 runs wasmtime's aarch64 build.  The pod is moved with ``kube32-cli move
--to`` from node to node; at every hop its own answer must show that it went on where
it left off: the request counter one more than before, its clock not behind, the event
it got on the previous node still its last, its memory growth kept, one init and one
more restore.
"""
from __future__ import annotations

import time
from typing import Iterator

import pytest

from kube32.kubelet.node import cpu_architecture
from tests.conftest import ROOT, ControlPlane, Proc, start_cluster, wait_for
from tests.cross import rootfs as cross
from tests.cross.conftest import CrossRun
from tests.e2e.helpers import cli, get_json, push, raw

COUNTER = ROOT / "examples" / "pods" / "counter.wasm"
CHAIN = ("s390x", "armhf", "arm64")  # between two stays on x86_64
HOST_NODE = "sim-1"
READY_TIMEOUT = 420  # three emulated Pythons starting at once on two cores
MOVE_TIMEOUT = 300


def node_name(arch: str) -> str:
    return f"cross-{arch}"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, cross_run) -> Iterator[tuple[ControlPlane, dict[str, Proc]]]:
    runs: dict[str, CrossRun] = {arch: cross_run(arch) for arch in CHAIN}  # skips before any process starts
    c = start_cluster(tmp_path_factory.mktemp("cross"), 1, "--backoff", "1")
    workers: dict[str, Proc] = {}
    try:
        for i, arch in enumerate(CHAIN):
            workers[arch] = runs[arch].start_worker(c, node_name(arch), f"127.0.0.{20 + i}",
                                                    c.data_dir / "logs" / f"{node_name(arch)}.log")
        for arch, proc in workers.items():
            wait_for(lambda: ready(c, node_name(arch)) or proc.popen.poll() is not None, READY_TIMEOUT, 1,
                     what=f"the {arch} worker to be Ready")
            assert proc.popen.poll() is None, f"the {arch} worker exited:\n{proc.output()[-5000:]}"
        yield c, workers
    finally:
        for proc in workers.values():
            proc.stop(timeout=60)
        c.proc.stop(timeout=30)


def ready(cluster: ControlPlane, node: str) -> bool:
    conditions = ((get_json(cluster, "node", node).get("status") or {}).get("conditions")) or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def counter_state(cluster: ControlPlane) -> dict:
    return raw(cluster, "/api/v1/namespaces/default/pods/counter/proxy/")


def running_on(cluster: ControlPlane, node: str) -> dict:
    def check() -> dict | None:
        pod = get_json(cluster, "pod", "counter")
        cs = (pod.get("status") or {}).get("containerStatuses") or [{}]
        return pod if pod["spec"].get("nodeName") == node and cs[0].get("ready") else None
    return wait_for(check, 120, 0.5, what=f"the counter pod ready on {node}")


def test_counter_pod_moves_through_every_cpu(cluster) -> None:
    c, workers = cluster
    image = push(c, COUNTER)
    nodes = {n["metadata"]["name"]: n for n in get_json(c, "nodes")["items"]}
    for arch in CHAIN:
        node = nodes[node_name(arch)]
        assert node["status"]["nodeInfo"]["architecture"] == cross.ARCHES[arch].kube_arch, node["status"]
        assert node["metadata"]["labels"]["kube32.io/engine"] == cross.ARCHES[arch].engine
    assert nodes[HOST_NODE]["status"]["nodeInfo"]["architecture"] == cpu_architecture()
    wide = {line.split()[0]: line.split() for line in c.kubectl("get", "nodes", "-o", "wide").stdout.splitlines()}
    for arch in CHAIN:  # ... CONTAINER-RUNTIME ARCHITECTURE
        assert wide[node_name(arch)][-2:] == [nodes[node_name(arch)]["status"]["nodeInfo"]["containerRuntimeVersion"],
                                               cross.ARCHES[arch].kube_arch], wide

    c.kubectl("run", "counter", f"--image={image}", "--restart=Never", "--annotations=kube32.io/events=greet",
              "--annotations=kube32.io/tick-interval=500ms",
              f"--overrides={{\"spec\": {{\"nodeName\": \"{HOST_NODE}\"}}}}")
    running_on(c, HOST_NODE)
    assert cli(c, "publish", "greet", f"on {HOST_NODE}").returncode == 0
    before = wait_for(lambda: (s := counter_state(c))["last_event"] == f"greet:on {HOST_NODE}" and s, 30,
                      what="the event on the first node")
    grown = c.kubectl("create", "--raw", "/api/v1/namespaces/default/pods/counter/proxy/alloc?kb=128", "-f", "-",
                      input="").stdout
    assert '"grown_kb":128' in grown, grown
    before = counter_state(c)
    hops = [*(node_name(a) for a in CHAIN), HOST_NODE]
    seen: list[tuple[str, dict]] = [(HOST_NODE, before)]
    for restores, target in enumerate(hops, start=1):
        source = seen[-1][0]
        t0 = time.monotonic()
        out = cli(c, "move", "counter", "--to", target, "--timeout", str(MOVE_TIMEOUT))
        took = time.monotonic() - t0
        text = out.stdout.decode() + out.stderr.decode()
        assert out.returncode == 0 and "Completed" in text, f"move {source} -> {target} failed:\n{text}\n" + \
            "\n".join(f"--- {a}\n{p.output()[-3000:]}" for a, p in workers.items())
        pod = running_on(c, target)
        after = counter_state(c)
        last = seen[-1][1]
        where = f"after the move {source} -> {target} ({took:.0f} s)"
        assert after["requests"] == last["requests"] + 1, where
        assert after["time_ms"] >= last["time_ms"], where
        assert after["ticks"] >= last["ticks"], where
        assert after["last_event"] == f"greet:on {source}", where
        assert (after["init_calls"], after["restored_calls"]) == (1, restores), where
        assert after["hostname"] == "counter" and after["channel"] == last["channel"], where
        assert (after["grown_kb"], after["memory_bytes"]) == (128, last["memory_bytes"]), where
        assert pod["spec"]["nodeName"] == target
        # An event on this node, to be found on the next.
        assert cli(c, "publish", "greet", f"on {target}").returncode == 0
        seen.append((target, wait_for(lambda: (s := counter_state(c))["last_event"] == f"greet:on {target}" and s,
                                      60, 0.5, what=f"the event on {target}")))
    c.kubectl("delete", "pod", "counter", "--wait=false")
