"""What a pod's module costs its engine counts in the node's heap (issue #21, attack round
21b: a pwasm node took pods of 1 MiB modules, about 70 MB each, and said its 8 MiB heap was
free).  A real control plane and a pwasm kubelet of a small heap, in one event loop."""
from __future__ import annotations

import asyncio
import functools
from pathlib import Path
from typing import Any

import wasmtime

from kube32.client import NODES, PODS, Client
from kube32.kubelet import Kubelet, KubeletOptions
from kube32.sim.controlplane import ControlPlane, ControlPlaneOptions
from kube32.wasm import Runtime
from tests.conftest import until
from kube32.wasm.engine_pwasm import DECODED_BYTES_PER_INSTRUCTION

ROOT = Path(__file__).resolve().parents[2]
COUNTER = ROOT / "examples" / "pods" / "counter.wasm"
HEAP = 3 << 20
PAGE = 65536


def in_loop(fn):
    @functools.wraps(fn)
    def run(*args, **kwargs):
        return asyncio.run(fn(*args, **kwargs))
    return run


def fat_module(functions: int) -> bytes:
    """A module of ``functions`` functions of 761 instructions each (about 1 KiB of code)."""
    body = "(local.get 0) " + "(i32.const 3) (i32.add) (i32.const 5) (i32.xor) " * 190
    funcs = " ".join(f"(func (param i32) (result i32) {body})" for _ in range(functions))
    return bytes(wasmtime.wat2wasm(f"""(module
      (import "k32" "k32_resp_body" (func $rb (param i32 i32) (result i32)))
      (memory 1) {funcs}
      (func (export "k32_handle") (drop (call $rb (i32.const 0) (i32.const 1)))))"""))


def test_pwasm_counts_its_decoded_code_near_what_it_holds() -> None:
    """The engine's figure for a module of 60 KiB of code is of the order of what pwasm
    holds (about 100 bytes an instruction), not of its bytes or pages."""
    rt = Runtime(engine="pwasm")
    try:
        wasm = fat_module(60)
        module = rt.load(wasm)
        instructions = 60 * 761
        assert module.cost_bytes >= DECODED_BYTES_PER_INSTRUCTION * instructions > 60 * len(wasm)
        assert module.cost_bytes < 3 * DECODED_BYTES_PER_INSTRUCTION * instructions
        assert module.instance_bytes > 60 * 700
    finally:
        rt.close()


def _pod(name: str, image: str, node: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"},
            "spec": {"nodeName": node, "restartPolicy": "Never", "containers": [{"name": "main", "image": image}]}}


def _until(predicate, timeout: float = 30.0, what: str = "condition"):
    return until(predicate, timeout, what)


@in_loop
async def test_a_pwasm_node_counts_its_modules_and_refuses_a_pod_whose_module_does_not_fit(tmp_path: Path) -> None:
    cp = ControlPlane(ControlPlaneOptions(data_dir=tmp_path / "cp", port=0))
    await cp.start()
    assert cp.server is not None and cp.kubeconfig is not None
    counter = cp.server.images.put(COUNTER.read_bytes())["reference"]
    fat = cp.server.images.put(fat_module(60))["reference"]       # about 6 MiB in pwasm
    admin = Client.from_kubeconfig(cp.kubeconfig)
    kl = Kubelet(Client.from_kubeconfig(tmp_path / "cp" / "node.kubeconfig"),
                 KubeletOptions(node_name="heap", engine="pwasm", heap_bytes=HEAP, interp_mops=1.0,
                                lease_interval=0.2, status_interval=0.3))
    await kl.start()
    try:
        empty = kl.free_heap()
        assert empty == HEAP

        async def container(name: str) -> dict | None:
            p = await admin.get(PODS, name, "default")
            cs = ((p.get("status") or {}).get("containerStatuses") or [{}])[0]
            return cs if cs.get("ready") or "terminated" in (cs.get("state") or {}) else None

        await admin.create(PODS, _pod("c1", counter, "heap"))
        assert (await _until(lambda: container("c1"), what="c1 Ready"))["ready"]
        module = next(iter(kl.workers.values())).instance.module  # type: ignore[union-attr]
        one = empty - kl.free_heap()
        # The module's decoded code, once, and the pod's own instance and page.
        assert one >= module.cost_bytes + module.instance_bytes + PAGE
        assert module.cost_bytes > 10 * module.size

        await admin.create(PODS, _pod("c2", counter, "heap"))
        assert (await _until(lambda: container("c2"), what="c2 Ready"))["ready"]
        two = empty - kl.free_heap()
        assert two - one < module.cost_bytes      # the second pod of the image shares its module

        async def announced() -> bool:
            node = await admin.get(NODES, "heap")
            return int(node["metadata"]["annotations"]["kube32.io/free-heap"]) == kl.free_heap()
        await _until(announced, what="the node to announce its free heap")

        await admin.create(PODS, _pod("fat", fat, "heap"))
        state = (await _until(lambda: container("fat"), what="fat refused"))["state"]["terminated"]
        assert state["message"].startswith("the node's heap cannot hold this pod: its module ("), state
        assert "costs the pwasm engine" in state["message"] and "bytes of the node's heap are free" in state["message"]
        assert empty - kl.free_heap() == two      # nothing of it kept
    finally:
        await kl.stop()
        await kl.client.close()
        await admin.close()
        await cp.stop()
