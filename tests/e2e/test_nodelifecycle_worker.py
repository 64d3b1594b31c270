"""With real kubelets (``kube32-sim worker`` processes): spread, drain, a killed worker, cascade.

The control plane runs with short node-lifecycle timings; two workers renew
their Leases every 0.3 s.  A Deployment of counter pods spreads over both, a
drain moves them (replacements on the other node), a worker killed with SIGKILL
turns Unknown and its pods are replaced after the toleration, and deleting the
Deployment removes its ReplicaSet and pods.
"""
from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Iterator

import pytest

from tests.conftest import ROOT, ControlPlane, Proc, sim_command, start, start_control_plane, wait_for
from tests.e2e.helpers import push

COUNTER = ROOT / "examples" / "pods" / "counter.wasm"

DEPLOYMENT = """
apiVersion: apps/v1
kind: Deployment
metadata: {name: web}
spec:
  replicas: 2
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      terminationGracePeriodSeconds: 1
      containers: [{name: main, image: "%s"}]
"""


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[ControlPlane, dict[str, Proc]]]:
    cp = start_control_plane(tmp_path / "cp", "--no-kubelet", "--node-monitor-grace-period", "2s",
                             "--pod-eviction-timeout", "1s", "--node-monitor-period", "200ms")
    workers: dict[str, Proc] = {}
    try:
        for name in ("sim-1", "sim-2"):
            workers[name] = start(sim_command("worker", "--kubeconfig", str(cp.data_dir / "node.kubeconfig"),
                                              "--name", name, "--port", "0", "--data-dir", str(tmp_path / name),
                                              "--lease-interval", "0.3", "--status-interval", "0.5",
                                              "--interp-mops", "5", "--backoff", "1"),
                                  tmp_path / f"{name}.log")
        wait_for(lambda: cp.kubectl("get", "nodes").stdout.count(" Ready ") == 2, 60, what="two Ready workers")
        yield cp, workers
    finally:
        for w in workers.values():
            w.stop(signal.SIGKILL)
        cp.proc.stop()


def web_pods(cp: ControlPlane) -> list[dict]:
    items = json.loads(cp.kubectl("get", "pods", "-l", "app=web", "-o", "json").stdout)["items"]
    return [p for p in items if not p["metadata"].get("deletionTimestamp")]


def running_on(cp: ControlPlane) -> list[str]:
    return sorted(p["spec"].get("nodeName", "") for p in web_pods(cp) if p["status"].get("phase") == "Running")


def test_spread_drain_lost_worker_and_cascade(cluster) -> None:
    cp, workers = cluster
    image = push(cp, COUNTER)
    cp.kubectl("apply", "-f", "-", input=DEPLOYMENT % image)
    assert wait_for(lambda: (lambda on: on if len(on) == 2 else None)(running_on(cp)), 60,
                    what="two running pods") == ["sim-1", "sim-2"]

    drained = cp.kubectl("drain", "sim-1", "--ignore-daemonsets", "--timeout=60s", timeout=90)
    assert "node/sim-1 drained" in drained.stdout
    wait_for(lambda: running_on(cp) == ["sim-2", "sim-2"], 60, what="replacements on sim-2")
    cp.kubectl("uncordon", "sim-1")

    workers["sim-2"].stop(signal.SIGKILL)
    wait_for(lambda: "Unknown" in cp.kubectl("get", "node", "sim-2").stdout
             or "NotReady" in cp.kubectl("get", "node", "sim-2").stdout, 30, what="sim-2 lost")
    taints = json.loads(cp.kubectl("get", "node", "sim-2", "-o", "json").stdout)["spec"].get("taints") or []
    assert {"node.kubernetes.io/unreachable"} == {t["key"] for t in taints}
    wait_for(lambda: running_on(cp) == ["sim-1", "sim-1"], 60, what="pods replaced on sim-1")
    events = cp.kubectl("get", "events").stdout
    assert "TaintManagerEviction" in events and "NodeNotReady" in events

    cp.kubectl("delete", "deployment", "web")
    wait_for(lambda: not web_pods(cp) and "No resources" in cp.kubectl("get", "rs").stderr, 60,
             what="cascade to ReplicaSet and pods")
