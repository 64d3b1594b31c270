"""Lifecycle paths of real processes that the other suites do not walk (issue 20):
how a node measures its speed on a loaded machine, how the control plane and the
workers stop and start again, what a pod's image change and a failed restore do.

Every test starts its own processes (``kube32-sim control-plane`` and ``worker``) and
drives them with the real kubectl."""
from __future__ import annotations

import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from tests.conftest import ROOT, ControlPlane, Proc, sim_command, start, wait_for
from tests.e2e.helpers import get_json, push
from tests.e2e.test_moves import counter_pod, running

COUNTER = ROOT / "examples" / "pods" / "counter.wasm"
BUSY_SECONDS = 90  # a busy loop never outlives its test by more than this


@contextmanager
def cpu_load(processes: int) -> Iterator[None]:
    """``processes`` busy loops in processes of their own, bounded in time."""
    loops = [subprocess.Popen([sys.executable, "-c",
                               f"import time\nend = time.monotonic() + {BUSY_SECONDS}\n"
                               "while time.monotonic() < end: pass"]) for _ in range(processes)]
    try:
        yield
    finally:
        for p in loops:
            p.kill()
            p.wait(5)


def worker(cp: ControlPlane, name: str, address: str, *flags: str) -> Proc:
    return start(sim_command("worker", "--kubeconfig", str(cp.data_dir / "node.kubeconfig"), "--name", name,
                             "--address", address, "--lease-interval", "0.5", "--backoff", "1", *flags),
                 cp.data_dir / f"{name}.log")


def ready(cp: ControlPlane, name: str) -> dict:
    def check() -> dict | None:
        node = get_json(cp, "node", name)
        ok = any(c["type"] == "Ready" and c["status"] == "True" for c in node["status"]["conditions"])
        return node if ok else None
    return wait_for(check, 60, what=f"node {name} Ready")


# --- kube32.io/interp-mops -------------------------------------------------------------

def test_identical_workers_measure_alike_under_load_and_a_placement_pod_stays(control_plane: ControlPlane) -> None:
    """Two workers of one profile on one machine, started under different CPU load,
    report figures within 20 % of each other, the same machine, and an Auto pod with
    ``placement: fastest`` does not move between them."""
    cp = control_plane
    procs: list[Proc] = []
    try:
        with cpu_load(1):
            procs.append(worker(cp, "calm", "127.0.0.21"))
            calm = ready(cp, "calm")
            with cpu_load(3):
                procs.append(worker(cp, "busy", "127.0.0.22"))
                busy = ready(cp, "busy")
        figures = [float(n["metadata"]["annotations"]["kube32.io/interp-mops"]) for n in (calm, busy)]
        assert min(figures) >= 0.8 * max(figures), figures
        machines = {n["metadata"]["annotations"].get("kube32.io/interp-mops-measured-on") for n in (calm, busy)}
        assert len(machines) == 1 and None not in machines, machines

        image = push(cp, COUNTER)
        cp.kubectl("apply", "-f", "-", input=counter_pod(
            "racer", "calm", image, annotations={"kube32.io/migration": "Auto", "kube32.io/placement": "fastest"}))
        running(cp, "racer")
        time.sleep(3)  # the placement pass runs at once on every pod and node change
        assert get_json(cp, "checkpoints")["items"] == []
        assert get_json(cp, "pod", "racer")["spec"]["nodeName"] == "calm"
    finally:
        for p in procs:
            p.stop(signal.SIGKILL)
