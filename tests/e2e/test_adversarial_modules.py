"""Adversarial modules against a real cluster (``kube32-sim up``, two workers): a module's
reader costs a node near the module's size, never a multiple of it, and refuses what is
no module with a reason the pod's status shows (issue 19, attack round 19).

The attacker hosts its modules on a local HTTP server (``wasm://``) and runs pods of them
on sim-2 while the test samples that kubelet's resident memory; the module store gets a
push of a module that is all exports.  Moved from tests/attack/test_attack19.py (10 MiB
of zeros after the Wasm header were 5 million empty custom sections, a tuple each: the
kubelet grew by a gigabyte; 8 such pods of 50 MiB on ``devkit`` took the control plane's
process to 12 GB).
"""
from __future__ import annotations

import base64
import json
import subprocess
import time
from pathlib import Path
from typing import Iterator

import pytest
import yaml

from kube32 import wasmformat
from tests.conftest import ControlPlane, start_cluster, wait_for
from tests.e2e.helpers import ModuleServer, get_json, pod_yaml, rss_of, worker_pid

pytestmark = pytest.mark.e2e

MiB = 1 << 20
NODE = "sim-2"
HEADER = wasmformat.MAGIC


def uleb(n: int) -> bytes:
    out = bytearray()
    while True:
        b, n = n & 0x7F, n >> 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def section(sid: int, body: bytes) -> bytes:
    return bytes([sid]) + uleb(len(body)) + body


# Each: (module, what the pod's status must say).
BOMBS = {
    "zeros": (HEADER + bytes(10 * MiB - 8), "the custom section at offset 8 has no whole name"),
    "customs": (HEADER + section(0, b"\x01x") * (wasmformat.MAX_CUSTOM_SECTIONS + 1),
                f"more than {wasmformat.MAX_CUSTOM_SECTIONS} custom sections"),
    "unknown-section": (HEADER + section(14, b"") + bytes(MiB), "unknown section id 14"),
    "counts": (HEADER + bytes([1, 6]) + b"\x80\x80\x80\x80\x10\x60", "more than the limit of 1000000"),
}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    c = start_cluster(tmp_path_factory.mktemp("adversarial-modules"), 2, "--backoff", "1")
    try:
        yield c
    finally:
        c.proc.stop(timeout=30)


def _message(cluster: ControlPlane, pod: str) -> str | None:
    status = get_json(cluster, "pod", pod).get("status") or {}
    if status.get("phase") != "Failed":
        return None
    state = ((status.get("containerStatuses") or [{}])[0].get("state") or {}).get("terminated") or {}
    return state.get("message") or ""


def test_a_module_cannot_make_a_node_allocate_a_hundred_times_its_size(cluster: ControlPlane) -> None:
    """Every bomb at once on sim-2 (the zeros restarting as they fail, pulled again each
    time): its kubelet's memory stays near the modules' own size, and each pod ends Failed
    with the reader's reason."""
    srv = ModuleServer({f"{name}.wasm": data for name, (data, _) in BOMBS.items()})
    pid = worker_pid(cluster, NODE)
    before = rss_of(pid)
    peak = before
    try:
        cluster.kubectl("apply", "-f", "-", input=pod_yaml("zeros-again", NODE, srv.image("zeros.wasm")))
        for name in BOMBS:
            cluster.kubectl("apply", "-f", "-", input=pod_yaml(name, NODE, srv.image(f"{name}.wasm"),
                                                               restartPolicy="Never"))
        messages: dict[str, str | None] = {}
        deadline = time.monotonic() + 45
        while time.monotonic() < deadline:
            peak = max(peak, rss_of(pid))
            messages = {name: _message(cluster, name) for name in BOMBS}
            if all(m is not None for m in messages.values()) and time.monotonic() > deadline - 30:
                break
            time.sleep(0.2)
    finally:
        srv.close()
        cluster.kubectl("delete", "pod", "--all", "--grace-period=0", "--force", check=False)
    assert peak - before < 100 * MiB, (
        f"modules of {sum(len(d) for d, _ in BOMBS.values()) // MiB} MiB in all grew {NODE}'s kubelet from "
        f"{before // MiB} MiB to {peak // MiB} MiB; expected each refused at a cost near its size")
    for name, (_, why) in BOMBS.items():
        assert messages[name] is not None and "not a valid WebAssembly module" in messages[name] \
            and why in messages[name], (name, messages[name])


def test_the_module_store_refuses_a_module_of_exports_past_the_limit(cluster: ControlPlane, tmp_path: Path) -> None:
    """An 8 MiB push that is one export section of 2 million exports (a dict each in the
    API server, and each in the answer): refused with the limit, at once."""
    entry = b"\x01e\x00\x00"
    count = (8 * MiB - 16) // len(entry)
    body = uleb(count) + entry * count
    module = tmp_path / "exports.wasm"
    module.write_bytes(HEADER + b"\x07" + uleb(len(body)) + body)
    doc = yaml.safe_load(cluster.kubeconfig.read_text())
    server = doc["clusters"][0]["cluster"]["server"]
    token = doc["users"][0]["user"]["token"]
    ca = tmp_path / "ca.crt"
    ca.write_bytes(base64.b64decode(doc["clusters"][0]["cluster"]["certificate-authority-data"]))
    start = time.monotonic()
    out = subprocess.run(["curl", "-s", "--cacert", str(ca), "-X", "POST", "-H", f"Authorization: Bearer {token}",
                          "-H", "Content-Type: application/wasm", "--data-binary", f"@{module}",
                          f"{server}/apis/kube32.io/v1/images"], capture_output=True, text=True, timeout=60)
    took = time.monotonic() - start
    status = json.loads(out.stdout)
    assert status["code"] == 400 and f"more than the limit of {wasmformat.MAX_EXPORTS}" in status["message"], status
    assert took < 10, f"the refusal took {took:.1f} s"
    wait_for(lambda: cluster.kubectl("get", "--raw", "/healthz").stdout == "ok", 5, what="/healthz")
