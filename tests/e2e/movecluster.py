"""A cluster as a user starts it, and the tools a user reaches it with, for the move
scenarios of issue #20's attack round (tests/e2e/test_move_scenarios.py, whence they came:
tests/attack/test_attack20.py).

The control plane runs on its own (``kube32-sim control-plane --no-kubelet``) so that it
can be killed and started again on the same port and data directory; the workers are
``kube32-sim worker`` processes, some with ``--fault`` flags (docs/reliability.md).
Everything is read back with kubectl, kube32-cli and the ``kubernetes`` client.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from tests.conftest import wait_for

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
SIM = str(BIN / "kube32-sim")
CLI = str(BIN / "kube32-cli")
COUNTER_WASM = ROOT / "examples" / "pods" / "counter.wasm"

ROLLBACK_S = 8          # --move-rollback-timeout of the control plane
CP_FLAGS = ["--no-kubelet", "--move-rollback-timeout", f"{ROLLBACK_S}s",
            "--node-monitor-grace-period", "3s", "--pod-eviction-timeout", "1s", "--backoff", "1"]
# documented test-only hooks (docs/reliability.md); they touch only Checkpoints labelled for them
CP_ENV = {"KUBE32_TEST_FAULTS": "hold-moving-status,corrupt-stored-data"}

WORKERS = {  # name: (address, fault flags)
    "sim-1": ("127.0.0.2", []),
    "sim-2": ("127.0.0.3", []),
    "bad": ("127.0.0.4", ["--fault", "corrupt-restores"]),
    "hang": ("127.0.0.5", ["--fault", "hang-restores"]),
    "crash": ("127.0.0.6", ["--fault", "crash-restores"]),
    "slow": ("127.0.0.7", ["--fault", "slow-snapshots"]),
}


@dataclass
class Proc:
    popen: subprocess.Popen
    log: Path

    def alive(self) -> bool:
        return self.popen.poll() is None

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30) -> None:
        if self.popen.poll() is None:
            self.popen.send_signal(sig)
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(10)


def _start(args: list[str], log: Path, env: dict | None = None) -> Proc:
    f = open(log, "ab")
    p = subprocess.Popen(args, stdout=f, stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True,
                         env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})})
    f.close()
    return Proc(p, log)


@dataclass
class Cluster:
    dir: Path
    cp: Proc | None = None
    port: int = 0
    workers: dict[str, Proc] = field(default_factory=dict)
    _api: object = None

    # ---- processes -------------------------------------------------------------------
    @property
    def kubeconfig(self) -> Path:
        return self.dir / "cp" / "admin.kubeconfig"

    def start_cp(self) -> None:
        d = self.dir / "cp"
        d.mkdir(parents=True, exist_ok=True)
        if self.kubeconfig.exists() and not self.port:
            self.kubeconfig.unlink()
        old = self.kubeconfig.stat().st_mtime if self.kubeconfig.exists() else None
        self.cp = _start([SIM, "control-plane", "--data-dir", str(d), "--port", str(self.port), *CP_FLAGS],
                         self.dir / "logs" / "control-plane.log", CP_ENV)
        wait_for(lambda: (self.kubeconfig.exists() and self.kubeconfig.stat().st_mtime != old) or not self.cp.alive(),
                 60, what="the control plane's kubeconfig")
        assert self.cp.alive(), self.cp.log.read_text()[-3000:]
        server = yaml.safe_load(self.kubeconfig.read_text())["clusters"][0]["cluster"]["server"]
        self.port = int(server.rsplit(":", 1)[1].split("/")[0])
        self._api = None
        wait_for(lambda: self.kubectl("get", "--raw", "/readyz", check=False, timeout=10).returncode == 0, 60,
                 what="the API server")

    def restart_cp(self, sig: int = signal.SIGKILL) -> None:
        self.cp.stop(sig, timeout=20)
        self.start_cp()

    def start_worker(self, name: str, address: str, *flags: str, wait: bool = True) -> Proc:
        if "--interp-mops" not in flags:      # every node reports the same speed unless told:
            flags = (*flags, "--interp-mops", "1000")    # no placement move happens by chance
        p = _start([SIM, "worker", "--kubeconfig", str(self.dir / "cp" / "node.kubeconfig"), "--name", name,
                    "--address", address, "--port", "0", "--lease-interval", "1", "--backoff", "1",
                    "--data-dir", str(self.dir / "nodes" / name), *flags],
                   self.dir / "logs" / f"{name}.log")
        self.workers[name] = p
        if wait:
            self.wait_node_ready(name)
        return p

    def wait_node_ready(self, name: str, timeout: float = 90) -> None:
        def ready():
            cp = self.kubectl("get", "node", name, "-o",
                              "jsonpath={.status.conditions[?(@.type=='Ready')].status}", check=False)
            return cp.stdout.strip() == "True"
        wait_for(ready, timeout, 0.5, what=f"node {name} Ready")

    def kill_worker(self, name: str, sig: int = signal.SIGKILL) -> None:
        self.workers[name].stop(sig)

    def stop(self) -> None:
        for p in self.workers.values():
            p.stop(signal.SIGKILL, 10)
        if self.cp:
            self.cp.stop(signal.SIGTERM, 20)

    # ---- tools -----------------------------------------------------------------------
    def kubectl(self, *args: str, check: bool = True, input: str | None = None,
                timeout: float = 90) -> subprocess.CompletedProcess:
        cmd = ["kubectl", "--kubeconfig", str(self.kubeconfig), "--cache-dir", str(self.dir / "kcache"), *args]
        cp = subprocess.run(cmd, capture_output=True, text=True, input=input, timeout=timeout)
        if check and cp.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed ({cp.returncode}):\n{cp.stdout}\n{cp.stderr}")
        return cp

    def kubectl_bg(self, *args: str) -> subprocess.Popen:
        cmd = ["kubectl", "--kubeconfig", str(self.kubeconfig), "--cache-dir", str(self.dir / "kcache"), *args]
        return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def cli(self, *args: str, timeout: float = 200) -> subprocess.CompletedProcess:
        return subprocess.run([CLI, *args, "--kubeconfig", str(self.kubeconfig)], capture_output=True, text=True,
                              timeout=timeout)

    def cli_bg(self, *args: str) -> subprocess.Popen:
        return subprocess.Popen([CLI, *args, "--kubeconfig", str(self.kubeconfig)], stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)

    def apply(self, obj: dict | str) -> None:
        self.kubectl("apply", "-f", "-", input=obj if isinstance(obj, str) else json.dumps(obj))

    def get(self, kind: str, name: str | None = None, *extra: str) -> dict | None:
        cp = self.kubectl("get", kind, *([name] if name else []), "-o", "json", *extra, check=False)
        if cp.returncode != 0:
            if "NotFound" in cp.stderr or "not found" in cp.stderr:
                return None
            raise AssertionError(cp.stderr)
        return json.loads(cp.stdout)

    def ckpt(self, name: str) -> dict | None:
        return self.get("checkpoints.kube32.io", name)

    def ckpts_of(self, pod: str) -> list[dict]:
        items = self.get("checkpoints.kube32.io")["items"]
        return sorted((c for c in items if c["spec"]["podName"] == pod),
                      key=lambda c: c["metadata"]["creationTimestamp"] + c["metadata"]["name"])

    def phase(self, ckpt: str) -> str:
        c = self.ckpt(ckpt)
        return (c or {}).get("status", {}).get("phase", "")

    def raw(self, path: str, check: bool = True, timeout: float = 30) -> subprocess.CompletedProcess:
        return self.kubectl("get", "--raw", path, check=check, timeout=timeout)

    def counters(self, pod: str, timeout: float = 40, ns: str = "default") -> dict:
        """The counter pod's answer through the pod proxy, as a user asks it (retrying 503s)."""
        def ask():
            cp = self.raw(f"/api/v1/namespaces/{ns}/pods/{pod}/proxy/", check=False, timeout=15)
            return json.loads(cp.stdout) if cp.returncode == 0 and cp.stdout.startswith("{") else None
        return wait_for(ask, timeout, 0.3, what=f"pod {pod} to answer")

    @property
    def api(self):
        if self._api is None:
            from kubernetes import config
            self._api = config.new_client_from_config(str(self.kubeconfig))
        return self._api

    def publish(self, topic: str, payload: str, ns: str = "default") -> int:
        """POST .../topics/TOPIC as ``kube32-cli publish`` does, without a process start per event."""
        api = self.api
        m, url, hp, body, _ = api.param_serialize(
            "POST", "/apis/kube32.io/v1/namespaces/{ns}/topics/{t}", path_params={"ns": ns, "t": topic},
            header_params={"Content-Type": "application/octet-stream"}, body=payload.encode(),
            auth_settings=["BearerToken"])
        r = api.call_api(m, url, hp, body, _request_timeout=15)
        r.read()
        return r.status

    def request(self, method: str, path: str, body: bytes | None = None, ctype: str = "application/octet-stream",
                timeout: float = 60):
        api = self.api
        m, url, hp, b, _ = api.param_serialize(method, path, header_params={"Content-Type": ctype}, body=body,
                                               auth_settings=["BearerToken"])
        from kubernetes.client.exceptions import ApiException
        try:
            r = api.call_api(m, url, hp, b, _request_timeout=timeout)
            r.read()
            return r.status, r.data, dict(r.getheaders())
        except ApiException as e:
            return e.status, e.body, dict(e.headers or {})

    def events(self, pod: str, reason: str | None = None) -> list[dict]:
        sel = f"involvedObject.name={pod}" + (f",reason={reason}" if reason else "")
        return self.get("events", None, "--field-selector", sel)["items"]

    def node_of(self, pod: str) -> str | None:
        p = self.get("pod", pod)
        return p and p["spec"].get("nodeName")

    # ---- objects ---------------------------------------------------------------------
    def image(self, path: Path = COUNTER_WASM) -> str:
        cp = self.cli("image", "push", str(path))
        assert cp.returncode == 0, cp.stderr
        return cp.stdout.strip()

    def bare_pod(self, name: str, node: str, image: str, annotations: dict | None = None,
                 labels: dict | None = None, extra_spec: dict | None = None) -> None:
        self.apply({"apiVersion": "v1", "kind": "Pod",
                    "metadata": {"name": name, "labels": labels or {},
                                 "annotations": {"kube32.io/events": "greet", **(annotations or {})}},
                    "spec": {"nodeName": node, "containers": [{"name": "main", "image": image}],
                             **(extra_spec or {})}})
        self.kubectl("wait", "--for=condition=Ready", f"pod/{name}", "--timeout=90s", timeout=100)

    def deployment(self, name: str, node: str, image: str, annotations: dict | None = None) -> str:
        self.apply({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name},
                    "spec": {"replicas": 1, "selector": {"matchLabels": {"app": name}},
                             "template": {"metadata": {"labels": {"app": name},
                                                       "annotations": {"kube32.io/events": "greet",
                                                                       **(annotations or {})}},
                                          "spec": {"nodeName": node,
                                                   "containers": [{"name": "main", "image": image}]}}}})
        self.kubectl("rollout", "status", f"deploy/{name}", "--timeout=90s", timeout=100)
        return self.pods_of(name)[0]

    def pods_of(self, app: str) -> list[str]:
        items = self.get("pods", None, "-l", f"app={app}")["items"]
        return [p["metadata"]["name"] for p in items]

    def move_ckpt(self, name: str, pod: str, target: str | None = None, labels: dict | None = None) -> None:
        spec = {"podName": pod, "action": "Move"}
        if target:
            spec["target"] = {"nodeName": target}
        self.apply({"apiVersion": "kube32.io/v1", "kind": "Checkpoint",
                    "metadata": {"name": name, "labels": labels or {}}, "spec": spec})


class Watch:
    """``kubectl get KIND -l app=X -w --output-watch-events -o json`` in the background: what
    kubectl's own watch saw, object by object."""

    def __init__(self, cluster: Cluster, kind: str, selector: str):
        self.proc = cluster.kubectl_bg("get", kind, "-l", selector, "-w", "--output-watch-events", "-o", "json")
        self.events: list[dict] = []
        self._t = threading.Thread(target=self._read, daemon=True)
        self._t.start()

    def _read(self) -> None:
        dec = json.JSONDecoder()
        buf = ""
        for line in self.proc.stdout:
            buf += line
            while True:
                s = buf.lstrip()
                if not s:
                    buf = ""
                    break
                try:
                    obj, end = dec.raw_decode(s)
                except json.JSONDecodeError:
                    break
                self.events.append(obj)
                buf = s[end:]

    def stop(self) -> list[dict]:
        time.sleep(1.0)
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self._t.join(5)
        return self.events


def live_pod_counts(events: list[dict]) -> list[int]:
    """After each watch event: how many pods exist and are not terminating.  (A name holds one
    object at a time: a move's replacement, written in one write, is a MODIFIED with a new uid.)"""
    live: dict[str, bool] = {}
    counts = []
    for e in events:
        o = e["object"]
        key = o["metadata"]["name"]
        if e["type"] == "DELETED":
            live.pop(key, None)
        else:
            live[key] = not o["metadata"].get("deletionTimestamp")
        counts.append(sum(1 for v in live.values() if v))
    return counts


class Publisher:
    """Publishes greet e1, e2, ... every ``period`` seconds until stopped; counts what it published."""

    def __init__(self, cluster: Cluster, prefix: str = "e", period: float = 0.05, limit: int = 400):
        self.cluster, self.prefix, self.period, self.limit = cluster, prefix, period, limit
        self.sent: list[tuple[float, str, int]] = []
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def _run(self) -> None:
        i = 0
        while not self._stop.is_set() and i < self.limit:
            i += 1
            p = f"{self.prefix}{i}"
            try:
                st = self.cluster.publish("greet", p)
            except Exception as e:  # noqa: BLE001
                st = -1
                self.error = e
            self.sent.append((time.monotonic(), p, st))
            self._stop.wait(self.period)

    def stop(self) -> int:
        self._stop.set()
        self._t.join(30)
        return sum(1 for _, _, st in self.sent if st == 201)
