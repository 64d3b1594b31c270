"""Helpers for test_attack20b.py: a kube32-sim cluster run process by process (so the
control plane can be restarted and workers killed, stopped and faulted), real kubectl,
kube32-cli, and the counter example pod."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parents[2]
VENV = REPO / ".venv" / "bin"
SIM = str(VENV / "kube32-sim")
CLI = str(VENV / "kube32-cli")
COUNTER = REPO / "examples" / "pods" / "counter.wasm"

CP_FLAGS = ["--lease-interval", "1", "--node-monitor-grace-period", "4s",
            "--pod-eviction-timeout", "1s", "--move-rollback-timeout", "20s",
            "--checkpoint-retention", "40s"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(fn: Callable[[], Any], timeout: float = 60, every: float = 0.5, what: str = "") -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = fn()
        except Exception as e:  # noqa: BLE001
            last = e
        if last and not isinstance(last, Exception):
            return last
        time.sleep(every)
    raise AssertionError(f"timed out waiting for {what or fn}: last {last!r}")


class Cluster:
    def __init__(self, data_dir: Path) -> None:
        self.dir = data_dir
        self.port = free_port()
        self.cp: subprocess.Popen | None = None
        self.workers: dict[str, subprocess.Popen] = {}
        self.addr = 2
        self.env = dict(os.environ, KUBECONFIG=str(data_dir / "admin.kubeconfig"))
        self.image = ""

    # --- processes ---------------------------------------------------------------
    def start_cp(self) -> None:
        (self.dir / "logs").mkdir(parents=True, exist_ok=True)
        (self.dir / "admin.kubeconfig").unlink(missing_ok=True)
        log = open(self.dir / "logs" / "control-plane.log", "ab")
        self.cp = subprocess.Popen([SIM, "control-plane", "--data-dir", str(self.dir), "--port",
                                    str(self.port), *CP_FLAGS], stdout=log, stderr=subprocess.STDOUT,
                                   start_new_session=True)
        wait_for(lambda: (self.dir / "admin.kubeconfig").exists(), 60, what="admin.kubeconfig")
        wait_for(lambda: self.kubectl("get", "--raw", "/readyz", check=False).returncode == 0, 60,
                 what="readyz")

    def stop_cp(self, sig: int = signal.SIGTERM, timeout: float = 40) -> None:
        assert self.cp
        self.cp.send_signal(sig)
        try:
            self.cp.wait(timeout)
        except subprocess.TimeoutExpired:
            self.cp.kill()
            self.cp.wait()
            raise AssertionError(f"control plane did not exit {timeout}s after signal {sig}")

    def start_worker(self, name: str, *extra: str, wait: bool = True) -> subprocess.Popen:
        log = open(self.dir / "logs" / f"{name}.log", "ab")
        addr = self.addr
        self.addr += 1
        p = subprocess.Popen([SIM, "worker", "--kubeconfig", str(self.dir / "node.kubeconfig"),
                              "--name", name, "--address", f"127.0.0.{addr}", "--port", "0",
                              "--data-dir", str(self.dir / "nodes" / name), "--lease-interval", "1",
                              *extra], stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self.workers[name] = p
        if wait:
            self.wait_node_ready(name)
        return p

    def wait_node_ready(self, name: str, timeout: float = 90) -> None:
        def ready() -> bool:
            n = self.get("node", name)
            return any(c["type"] == "Ready" and c["status"] == "True" for c in n["status"]["conditions"])
        wait_for(ready, timeout, 1, f"node {name} Ready")

    def stop_worker(self, name: str, sig: int = signal.SIGTERM, delete: bool = True) -> None:
        p = self.workers.pop(name, None)
        if p and p.poll() is None:
            if sig == signal.SIGSTOP:
                p.send_signal(signal.SIGCONT)
                sig = signal.SIGKILL
            p.send_signal(sig)
            try:
                p.wait(40)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        if delete:
            self.kubectl("delete", "node", name, "--wait=false", check=False)

    def shutdown(self) -> None:
        for name in list(self.workers):
            p = self.workers.pop(name)
            if p.poll() is None:
                p.send_signal(signal.SIGCONT)
                p.kill()
                p.wait()
        if self.cp and self.cp.poll() is None:
            self.cp.terminate()
            try:
                self.cp.wait(30)
            except subprocess.TimeoutExpired:
                self.cp.kill()
                self.cp.wait()

    # --- clients -----------------------------------------------------------------
    def kubectl(self, *args: str, check: bool = True, input: str | None = None,
                timeout: float = 120) -> subprocess.CompletedProcess:
        r = subprocess.run(["kubectl", *args], env=self.env, capture_output=True, text=True, errors="replace",
                           input=input, timeout=timeout)
        if check and r.returncode:
            raise AssertionError(f"kubectl {' '.join(args)}: {r.returncode}\n{r.stdout}\n{r.stderr}")
        return r

    def cli(self, *args: str, check: bool = False, timeout: float = 150) -> subprocess.CompletedProcess:
        r = subprocess.run([CLI, *args], env=self.env, capture_output=True, text=True, timeout=timeout)
        if check and r.returncode:
            raise AssertionError(f"kube32-cli {' '.join(args)}: {r.returncode}\n{r.stdout}\n{r.stderr}")
        return r

    def apply(self, text: str) -> None:
        self.kubectl("apply", "-f", "-", input=text)

    def get(self, kind: str, name: str = "", *args: str) -> Any:
        a = [kind] + ([name] if name else [])
        return json.loads(self.kubectl("get", *a, *args, "-o", "json").stdout)

    def try_get(self, kind: str, name: str) -> Any:
        r = self.kubectl("get", kind, name, "-o", "json", check=False)
        return json.loads(r.stdout) if r.returncode == 0 else None

    def push_image(self) -> str:
        if not self.image:
            self.image = self.cli("image", "push", str(COUNTER), check=True).stdout.strip()
        return self.image

    # --- the counter pod ---------------------------------------------------------
    def ask(self, pod: str, ns: str = "default") -> dict:
        r = self.kubectl("get", "--raw", f"/api/v1/namespaces/{ns}/pods/{pod}/proxy/", check=False)
        if r.returncode:
            raise AssertionError(f"ask {pod}: {r.stderr.strip()}")
        return json.loads(r.stdout)

    def ask_wait(self, pod: str, timeout: float = 60) -> dict:
        return wait_for(lambda: self.ask(pod), timeout, 1, f"{pod} answers")

    def pod_yaml(self, name: str, node: str | None = None, annotations: dict | None = None,
                 labels: dict | None = None, limits: str | None = None,
                 extra_spec: str = "") -> str:
        ann = json.dumps(annotations or {})
        lab = json.dumps(labels or {})
        res = f"\n    resources:\n      limits:\n        memory: {limits}" if limits else ""
        return f"""apiVersion: v1
kind: Pod
metadata:
  name: {name}
  annotations: {ann}
  labels: {lab}
spec:
  {f'nodeName: {node}' if node else ''}
  restartPolicy: Never{extra_spec}
  containers:
  - name: main
    image: {self.push_image()}{res}
"""

    def run_counter(self, name: str, node: str | None = None, **kw: Any) -> dict:
        self.apply(self.pod_yaml(name, node, **kw))
        self.kubectl("wait", "--for=condition=Ready", f"pod/{name}", "--timeout=90s")
        return self.ask_wait(name)

    def pod(self, name: str) -> Any:
        return self.try_get("pod", name)

    def node_of(self, name: str) -> str:
        return (self.pod(name) or {}).get("spec", {}).get("nodeName", "")

    def events(self, name: str, reason: str | None = None) -> list[dict]:
        sel = f"involvedObject.name={name}" + (f",reason={reason}" if reason else "")
        items = self.get("events", "", "--field-selector", sel)["items"]
        return sorted(items, key=lambda e: e.get("lastTimestamp") or e.get("eventTime") or "")

    def ckpts(self, pod: str | None = None) -> list[dict]:
        items = self.get("checkpoints")["items"]
        return [c for c in items if pod is None or c["spec"]["podName"] == pod]

    def ckpt(self, name: str) -> Any:
        return self.try_get("checkpoint", name)

    def wait_ckpt_phase(self, name: str, phases: tuple[str, ...], timeout: float = 120) -> dict:
        def f() -> Any:
            c = self.ckpt(name)
            return c if c and c.get("status", {}).get("phase") in phases else None
        return wait_for(f, timeout, 0.5, f"checkpoint {name} in {phases}")

    def delete_pod(self, name: str) -> None:
        self.kubectl("delete", "pod", name, "--wait=false", "--ignore-not-found", check=False)

    def cleanup(self) -> None:
        for kind in ("deployment", "daemonset", "pdb", "pod"):
            self.kubectl("delete", kind, "--all", "--wait=false", check=False)
        self.kubectl("delete", "checkpoints", "--all", "--wait=false", check=False)
        for n in ("sim-1", "sim-2", "devkit"):
            self.kubectl("uncordon", n, check=False)

    def log(self, name: str) -> str:
        p = self.dir / "logs" / f"{name}.log"
        return p.read_text(errors="replace") if p.exists() else ""
