"""Nodes of two engines in one cluster (issue 21): ``kube32-sim up --workers 1`` (sim-1,
a laptop: wasmtime) plus a worker started with ``--engine pwasm``.  Each Node says which
engine and CPU it has; a pod moves wasmtime -> pwasm -> wasmtime with all its state:
counters, the clock, its channel, events held while frozen, NaN-payload globals, a
table it rewrote and a funcref global (examples/pods/state.wat)."""
from __future__ import annotations

from typing import Iterator

import pytest

from kube32.kubelet.node import cpu_architecture
from tests.conftest import ROOT, ControlPlane, sim_command, start, start_cluster, wait_for
from tests.e2e.helpers import api_call, cli, get_json, pod_yaml, push

STATE = ROOT / "examples" / "pods" / "state.wasm"
FIELDS = ("requests", "events", "restored", "time_ms", "f32", "f64", "table", "fg", "channel", "send")
PWASM_NODE = "pw-1"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    c = start_cluster(tmp_path_factory.mktemp("engines"), 1, "--backoff", "1")
    worker = start(sim_command("worker", "--kubeconfig", str(c.data_dir / "node.kubeconfig"), "--name", PWASM_NODE,
                               "--address", "127.0.0.3", "--engine", "pwasm",
                               "--data-dir", str(c.data_dir / "nodes" / PWASM_NODE)),
                   c.data_dir / f"{PWASM_NODE}.log")
    try:
        wait_for(lambda: any(x["type"] == "Ready" and x["status"] == "True"
                             for x in get_json(c, "node", PWASM_NODE)["status"]["conditions"]),
                 60, what=f"{PWASM_NODE} Ready")
        yield c
    finally:
        worker.stop(timeout=30)
        c.proc.stop(timeout=30)


def report(cluster: ControlPlane, method: str = "GET", path: str = "") -> dict[str, str]:
    status, _, body = api_call(cluster, method, f"/api/v1/namespaces/default/pods/st/proxy/{path}")
    assert status == 200, body
    return dict(zip(FIELDS, body.decode().split(), strict=False))


def running_on(cluster: ControlPlane, node: str) -> dict:
    def check() -> dict | None:
        pod = get_json(cluster, "pod", "st")
        cs = (pod.get("status") or {}).get("containerStatuses") or [{}]
        return pod if cs[0].get("ready") and pod["spec"].get("nodeName") == node else None
    return wait_for(check, 60, what=f"pod st ready on {node}")


def freeze_and_publish(cluster: ControlPlane, node: str) -> None:
    """Freeze the pod as a move's snapshot leaves it, then publish two events: they are
    held in the snapshot and must reach the pod on the other node."""
    status, _, body = api_call(cluster, "POST", f"/api/v1/nodes/{node}/proxy/checkpoint/default/st/main?leave=frozen")
    assert status == 200, body[:300]
    for word in ("one", "two"):
        out = cli(cluster, "publish", "greet", word)
        assert out.returncode == 0, out.stderr.decode()


def move(cluster: ControlPlane, node: str) -> None:
    out = cli(cluster, "move", "st", "--to", node)
    assert out.returncode == 0, out.stdout.decode() + out.stderr.decode()
    assert "Completed" in out.stdout.decode()


def test_every_node_shows_its_engine_and_cpu(cluster: ControlPlane) -> None:
    arch = cpu_architecture()
    wide = cluster.kubectl("get", "nodes", "-o", "wide").stdout.splitlines()
    header = wide[0].split()
    assert header[-2:] == ["CONTAINER-RUNTIME", "ARCHITECTURE"]
    rows = {line.split()[0]: line.split() for line in wide[1:]}
    assert rows[PWASM_NODE][-2:] == ["pwasm://0.2a0", arch]
    assert rows["sim-1"][-2].startswith("wasmtime://") and rows["sim-1"][-1] == arch
    assert rows["devkit"][-2] == "pwasm://0.2a0"                       # a board profile's default
    described = cluster.kubectl("describe", "node", PWASM_NODE).stdout
    assert "Container Runtime Version:  pwasm://0.2a0" in described
    assert f"Architecture:               {arch}" in described
    selected = cluster.kubectl("get", "nodes", "-l", "kube32.io/engine=pwasm", "-o", "name").stdout.split()
    assert sorted(selected) == ["node/devkit", f"node/{PWASM_NODE}"]
    # Each node measured its own engine: the interpreter is far slower than compiled code.
    mops = {n: float(get_json(cluster, "node", n)["metadata"]["annotations"]["kube32.io/interp-mops"])
            for n in ("sim-1", PWASM_NODE)}
    assert 0 < mops[PWASM_NODE] < mops["sim-1"] / 3, mops


def test_a_pod_moves_from_wasmtime_to_pwasm_and_back_with_all_its_state(cluster: ControlPlane) -> None:
    image = push(cluster, STATE)
    cluster.kubectl("apply", "-f", "-", input=pod_yaml("st", "sim-1", image, {"kube32.io/events": "greet"}))
    running_on(cluster, "sim-1")
    report(cluster)
    report(cluster, "POST", "mutate")
    before = report(cluster, "POST", "mutate")
    assert (before["f32"], before["f64"], before["table"], before["fg"]) == \
        ("7f800003", "fff4000000000003", "312", "2")

    freeze_and_publish(cluster, "sim-1")
    move(cluster, PWASM_NODE)
    running_on(cluster, PWASM_NODE)
    there = wait_for(lambda: (s := report(cluster))["events"] == "00000002" and s, 15, what="the held events on pwasm")
    assert int(there["requests"], 16) == int(before["requests"], 16) + 1
    assert there["restored"] == "00000001"
    for name in ("f32", "f64", "table", "fg", "channel"):
        assert there[name] == before[name], name
    assert int(there["send"], 16) < 1 << 31                            # its channel is open on pw-1
    assert int(there["time_ms"], 16) >= int(before["time_ms"], 16)      # the clock went on

    moved = report(cluster, "POST", "mutate")
    assert (moved["f32"], moved["f64"], moved["table"], moved["fg"]) == ("7f800004", "fff4000000000004", "123", "3")
    freeze_and_publish(cluster, PWASM_NODE)
    move(cluster, "sim-1")
    running_on(cluster, "sim-1")
    back = wait_for(lambda: (s := report(cluster))["events"] == "00000004" and s, 15, what="the held events on wasmtime")
    assert int(back["requests"], 16) == int(moved["requests"], 16) + 1
    assert back["restored"] == "00000002"
    for name in ("f32", "f64", "table", "fg", "channel"):
        assert back[name] == moved[name], name
    assert int(back["send"], 16) < 1 << 31
    assert int(back["time_ms"], 16) >= int(moved["time_ms"], 16)
    cluster.kubectl("delete", "pod", "st")
