"""Helpers of test_engines_adversarial.py (issue #21's attack round b): a real ``kube32-sim
up`` cluster with workers of both engines, hand-written WAT modules built with wasmtime's
wat2wasm (as examples/pods/Makefile builds state.wat), and the real kubectl / kube32-cli."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.conftest import ROOT, ControlPlane, Proc, sim_command, start, wait_for

CLI = str(Path(sys.executable).with_name("kube32-cli"))


def wat(text: str) -> bytes:
    import wasmtime
    return bytes(wasmtime.wat2wasm(text))


def push(cp: ControlPlane, module: bytes, tmp: Path, name: str) -> str:
    path = tmp / f"{name}.wasm"
    path.write_bytes(module)
    out = cli(cp, "image", "push", str(path))
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def cli(cp: ControlPlane, *args: str, timeout: float = 200) -> subprocess.CompletedProcess:
    return subprocess.run([CLI, *args, "--kubeconfig", str(cp.kubeconfig)],
                          capture_output=True, text=True, timeout=timeout)


def move(cp: ControlPlane, pod: str, to: str, timeout: int = 90) -> subprocess.CompletedProcess:
    return subprocess.run([CLI, "move", pod, "--to", to, "--timeout", str(timeout),
                           "--kubeconfig", str(cp.kubeconfig)],
                          capture_output=True, text=True, timeout=timeout + 30)


def run_pod(cp: ControlPlane, name: str, image: str, node: str, limit: str | None = None,
            annotations: dict[str, str] | None = None, wait: bool = True) -> None:
    container: dict = {"name": "main", "image": image}
    if limit:
        container["resources"] = {"limits": {"memory": limit}}
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": name, "annotations": annotations or {}},
           "spec": {"nodeName": node, "restartPolicy": "Never", "containers": [container]}}
    cp.kubectl("apply", "-f", "-", input=json.dumps(pod))
    if wait:
        cp.kubectl("wait", "--for=condition=Ready", f"pod/{name}", "--timeout=90s", timeout=100)


def get(cp: ControlPlane, pod: str, path: str = "", check: bool = True) -> str:
    return cp.kubectl("get", "--raw", f"/api/v1/namespaces/default/pods/{pod}/proxy/{path}",
                      check=check).stdout


def pod_json(cp: ControlPlane, name: str) -> dict:
    return json.loads(cp.kubectl("get", "pod", name, "-o", "json").stdout)


def add_worker(cp: ControlPlane, name: str, address: str, *extra: str) -> Proc:
    proc = start(sim_command("worker", "--kubeconfig", str(cp.data_dir / "node.kubeconfig"),
                             "--name", name, "--address", address, "--backoff", "1", *extra),
                 cp.data_dir / f"worker-{name}.log")
    wait_for(lambda: "True" in cp.kubectl(
        "get", "node", name, "-o", "jsonpath={.status.conditions[?(@.type=='Ready')].status}",
        check=False).stdout, 90, 0.5, what=f"node {name} Ready")
    return proc


def node_pid(data_dir: Path, node: str) -> int | None:
    """The pid of the ``python -m kube32.sim.node`` process of ``node`` under ``data_dir``."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        text = b" ".join(argv).decode(errors="replace")
        if "kube32.sim.node" in text and str(data_dir) in text and f'"node_name": "{node}"' in text:
            return int(entry)
    return None


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split()[2]
    except OSError:
        return False
    return state != "Z"


def kill(pid: int, sig: int = signal.SIGKILL) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def until(predicate, timeout: float, interval: float = 0.5):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            value = predicate()
            if value:
                return value
        except Exception:  # noqa: BLE001 - keep polling
            pass
        time.sleep(interval)
    return None


__all__ = ["ROOT", "ControlPlane", "wat", "push", "cli", "move", "run_pod", "get", "pod_json",
           "add_worker", "node_pid", "alive", "kill", "until"]
