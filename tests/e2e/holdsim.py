"""Helpers for tests/e2e/test_service_hold_attacks.py (from attack round 24b): an
outsider's view of issue 24 (Services hold requests through a move).  Only public commands and HTTP are used:
``kube32-sim up``, ``kubectl``, ``kube32-cli``, the API's proxies and NodePorts."""
from __future__ import annotations

import base64
import json
import os
import re
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import requests
import urllib3
import yaml

urllib3.disable_warnings()

ROOT = Path(__file__).resolve().parents[2]
BIN = ROOT / ".venv" / "bin"
PODS = ROOT / "examples" / "pods"
REC_C = PODS / "recorder.c"
REC_WASM = PODS / "recorder.wasm"   # built by `make pods`


def build_rec() -> Path:
    if not REC_WASM.exists() or REC_WASM.stat().st_mtime < REC_C.stat().st_mtime:
        subprocess.run(["make", "-C", str(PODS), "recorder.wasm"], check=True, capture_output=True)
    return REC_WASM


class Cluster:
    """``kube32-sim up`` in a data dir of its own; stopped with SIGINT (Ctrl-C)."""

    def __init__(self, data_dir: str, workers: int = 2, extra: list[str] | None = None) -> None:
        self.dir = Path(data_dir)
        self.workers = workers
        self.extra = extra or []
        self.proc: subprocess.Popen | None = None
        self.kubeconfig = self.dir / "admin.kubeconfig"

    # --- lifecycle -------------------------------------------------------------------
    def start(self, timeout: float = 120) -> "Cluster":
        subprocess.run(["rm", "-rf", str(self.dir)], check=True)
        self.dir.mkdir(parents=True)
        self.logf = open(self.dir.parent / (self.dir.name + ".up.log"), "w")
        self.proc = subprocess.Popen([str(BIN / "kube32-sim"), "up", "--workers", str(self.workers),
                                      "--data-dir", str(self.dir), *self.extra],
                                     stdout=self.logf, stderr=subprocess.STDOUT, cwd=ROOT)
        end = time.time() + timeout
        logp = Path(self.logf.name)
        while time.time() < end:
            if "cluster ready" in logp.read_text():
                break
            if self.proc.poll() is not None:
                raise RuntimeError("kube32-sim up exited: " + logp.read_text()[-2000:])
            time.sleep(0.5)
        else:
            raise RuntimeError("cluster not ready: " + logp.read_text()[-2000:])
        self._load_kubeconfig()
        return self

    def _load_kubeconfig(self) -> None:
        kc = yaml.safe_load(self.kubeconfig.read_text())
        self.server = kc["clusters"][0]["cluster"]["server"]
        ca = base64.b64decode(kc["clusters"][0]["cluster"]["certificate-authority-data"])
        self.ca = self.dir / "ca-attack.crt"
        self.ca.write_bytes(ca)
        self.token = kc["users"][0]["user"]["token"]

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for pid in self.extra_pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    extra_pids: list[int] = []

    def children(self) -> dict[str, int]:
        """name -> pid of the processes kube32-sim up started ("control-plane", "sim-1", ...)."""
        assert self.proc is not None
        out = subprocess.run(["ps", "-ww", "-o", "pid=,args=", "--ppid", str(self.proc.pid)],
                             capture_output=True, text=True).stdout
        found: dict[str, int] = {}
        for line in out.splitlines():
            pid, _, args = line.strip().partition(" ")
            m = re.search(r"--name (\S+)", args)
            if m:
                found[m.group(1)] = int(pid)
            elif "control-plane" in args:
                found["control-plane"] = int(pid)
        return found

    # --- commands ----------------------------------------------------------------------
    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "KUBECONFIG": str(self.kubeconfig), "PATH": f"{BIN}:{os.environ['PATH']}"}

    def kubectl(self, *args: str, input: str | None = None, check: bool = True,
                timeout: float = 120) -> subprocess.CompletedProcess:
        r = subprocess.run(["kubectl", *args], input=input, capture_output=True, text=True, env=self.env,
                           timeout=timeout)
        if check and r.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)}: {r.stdout}{r.stderr}")
        return r

    def cli(self, *args: str, check: bool = True, timeout: float = 180) -> subprocess.CompletedProcess:
        r = subprocess.run([str(BIN / "kube32-cli"), *args], capture_output=True, text=True, env=self.env,
                           timeout=timeout)
        if check and r.returncode != 0:
            raise AssertionError(f"kube32-cli {' '.join(args)}: {r.stdout}{r.stderr}")
        return r

    def move_async(self, pod: str, to: str | None = None, ns: str = "default") -> subprocess.Popen:
        args = [str(BIN / "kube32-cli"), "move", pod, "-n", ns] + (["--to", to] if to else [])
        return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=self.env)

    def apply(self, manifest: Any) -> None:
        text = manifest if isinstance(manifest, str) else yaml.safe_dump_all(
            manifest if isinstance(manifest, list) else [manifest])
        self.kubectl("apply", "-f", "-", input=text)

    # --- HTTP --------------------------------------------------------------------------
    def session(self, token: str | None = None) -> requests.Session:
        s = requests.Session()
        s.trust_env = False   # no proxy, no CA bundle from the environment
        s.verify = str(self.ca)
        s.headers["Authorization"] = f"Bearer {token or self.token}"
        return s

    def url(self, path: str) -> str:
        return self.server + path

    def get_json(self, path: str) -> Any:
        r = self.session().get(self.url(path), timeout=30)
        r.raise_for_status()
        return r.json()

    def svc_url(self, svc: str, rest: str = "", ns: str = "default") -> str:
        return self.url(f"/api/v1/namespaces/{ns}/services/{svc}/proxy/{rest}")

    def pod_url(self, pod: str, rest: str = "", ns: str = "default") -> str:
        return self.url(f"/api/v1/namespaces/{ns}/pods/{pod}/proxy/{rest}")

    def rec_log(self, pod: str, ns: str = "default") -> list[str]:
        r = self.session().get(self.pod_url(pod, "log", ns), headers={"Prefer": "wait=20"}, timeout=60)
        assert r.status_code == 200, (r.status_code, r.text)
        return [line for line in r.text.splitlines() if line]

    def metrics(self) -> dict[tuple[str, str], float]:
        text = self.session().get(self.url("/metrics"), timeout=30).text
        out: dict[tuple[str, str], float] = {}
        for m in re.finditer(r'^kube32_held_requests_total\{([^}]*)\} (\S+)$', text, re.M):
            labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1)))
            out[(labels.get("kind", ""), labels.get("outcome", ""))] = float(m.group(2))
        return out

    # --- objects ---------------------------------------------------------------------
    def push(self, wasm: Path) -> str:
        return self.cli("image", "push", str(wasm)).stdout.strip().splitlines()[-1]

    def pod(self, name: str, image: str, node: str | None = None, labels: dict | None = None,
            ns: str = "default", annotations: dict | None = None) -> dict:
        md: dict[str, Any] = {"name": name, "namespace": ns, "labels": labels or {"app": name}}
        if annotations:
            md["annotations"] = annotations
        spec: dict[str, Any] = {"containers": [{"name": "c", "image": image}], "restartPolicy": "Never"}
        if node:
            spec["nodeName"] = node
        return {"apiVersion": "v1", "kind": "Pod", "metadata": md, "spec": spec}

    def service(self, name: str, selector: dict, ns: str = "default", annotations: dict | None = None,
                node_port: bool = False) -> dict:
        md: dict[str, Any] = {"name": name, "namespace": ns}
        if annotations is not None:
            md["annotations"] = annotations
        spec: dict[str, Any] = {"selector": selector, "ports": [{"port": 80}]}
        if node_port:
            spec["type"] = "NodePort"
        return {"apiVersion": "v1", "kind": "Service", "metadata": md, "spec": spec}

    def wait_ready(self, *pods: str, ns: str = "default", timeout: int = 90) -> None:
        self.kubectl("wait", "-n", ns, "--for=condition=Ready", *[f"pod/{p}" for p in pods],
                     f"--timeout={timeout}s", timeout=timeout + 30)

    def node_of(self, pod: str, ns: str = "default") -> str:
        return self.get_json(f"/api/v1/namespaces/{ns}/pods/{pod}")["spec"].get("nodeName", "")

    def node_port(self, svc: str, ns: str = "default") -> int:
        return int(self.get_json(f"/api/v1/namespaces/{ns}/services/{svc}")["spec"]["ports"][0]["nodePort"])

    def events(self, ns: str = "default", reason: str | None = None, name: str | None = None) -> list[dict]:
        items = self.get_json(f"/api/v1/namespaces/{ns}/events")["items"]
        return [e for e in items if (reason is None or e.get("reason") == reason)
                and (name is None or e.get("involvedObject", {}).get("name") == name)]

    def checkpoints(self, ns: str = "default") -> list[dict]:
        return self.get_json(f"/apis/kube32.io/v1/namespaces/{ns}/checkpoints")["items"]

    def wait_frozen(self, pod: str, ns: str = "default", timeout: float = 30) -> None:
        """Until a Checkpoint of ``pod`` is Saving or Moving (the pod frozen)."""
        end = time.time() + timeout
        while time.time() < end:
            for c in self.checkpoints(ns):
                if c["spec"].get("podName") == pod and c.get("status", {}).get("phase") in ("Saving", "Moving"):
                    return
            time.sleep(0.05)
        raise AssertionError(f"{pod} never frozen")

    def user_token(self, ns: str, name: str, role_rules: list[dict] | None = None) -> str:
        """A ServiceAccount token in ``ns`` with a Role of ``role_rules`` there."""
        self.kubectl("create", "namespace", ns, check=False)
        self.kubectl("-n", ns, "create", "serviceaccount", name, check=False)
        if role_rules is not None:
            self.apply({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
                        "metadata": {"name": name, "namespace": ns}, "rules": role_rules})
            self.apply({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
                        "metadata": {"name": name, "namespace": ns},
                        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
                        "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": ns}]})
        return self.kubectl("-n", ns, "create", "token", name).stdout.strip()


class Load:
    """``n`` client threads, each sending requests one after the other through ``url``
    (with ?c=<client>&i=<seq>), until stopped; every answer kept."""

    def __init__(self, cluster: Cluster, url: str, clients: int = 1, method: str = "GET",
                 body: bytes | None = None, headers: dict | None = None, pause: float = 0.0,
                 session_factory=None, timeout: float = 90, tag: str = "c") -> None:
        self.cluster, self.url, self.clients = cluster, url, clients
        self.method, self.body, self.headers, self.pause = method, body, headers or {}, pause
        self.session_factory = session_factory or cluster.session
        self.timeout = timeout
        self.tag = tag
        self.results: list[tuple[str, int, int, str, float, dict]] = []   # (client, i, status, text, secs, headers)
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(c,), daemon=True) for c in range(clients)]
        self._lock = threading.Lock()

    def _run(self, c: int) -> None:
        s = self.session_factory()
        i = 0
        sep = "&" if "?" in self.url else "?"
        while not self._stop.is_set():
            i += 1
            t0 = time.time()
            try:
                r = s.request(self.method, f"{self.url}{sep}{self.tag}={c}&i={i}", data=self.body,
                              headers=self.headers, timeout=self.timeout)
                with self._lock:
                    self.results.append((f"{self.tag}{c}", i, r.status_code, r.text[:300], time.time() - t0,
                                         dict(r.headers)))
            except Exception as e:  # noqa: BLE001
                with self._lock:
                    self.errors.append(f"{self.tag}{c} {i}: {e!r}")
            if self.pause:
                time.sleep(self.pause)

    def start(self) -> "Load":
        for t in self._threads:
            t.start()
        return self

    def stop(self) -> "Load":
        self._stop.set()
        for t in self._threads:
            t.join(120)
        return self

    def failed(self) -> list:
        return [r for r in self.results if r[2] != 200] + self.errors


def calls_by(log: list[str], key: str = "c") -> dict[str, list[int]]:
    """From a rec24b log: client -> the i's it ran, in the order the pod ran them."""
    out: dict[str, list[int]] = {}
    for line in log:
        m = re.search(rf"[?&]{key}=(\d+)&i=(\d+)", line)
        if m:
            out.setdefault(f"{key}{m.group(1)}", []).append(int(m.group(2)))
    return out


def duplicates(log: list[str]) -> list[str]:
    seen: dict[str, int] = {}
    for line in log:
        parts = line.split(" ", 1)
        if len(parts) == 2:
            seen[parts[1]] = seen.get(parts[1], 0) + 1
    return [k for k, v in seen.items() if v > 1]


def wait_move(p: subprocess.Popen, timeout: float = 120) -> str:
    out, _ = p.communicate(timeout=timeout)
    return out or ""


def dump(obj: Any) -> str:
    return json.dumps(obj, indent=1)[:3000]


def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


class ManualCluster(Cluster):
    """A control plane and workers started one by one (``kube32-sim control-plane`` and
    ``kube32-sim worker``), so that the control plane can be stopped and started again."""

    def start(self, timeout: float = 120) -> "ManualCluster":
        subprocess.run(["rm", "-rf", str(self.dir)], check=True)
        self.dir.mkdir(parents=True)
        self.port = free_port()
        self.procs: dict[str, subprocess.Popen] = {}
        self.start_control_plane()
        for i in range(1, self.workers + 1):
            name = f"sim-{i}"
            log = open(self.dir.parent / f"{self.dir.name}.{name}.log", "w")
            self.procs[name] = subprocess.Popen(
                [str(BIN / "kube32-sim"), "worker", "--kubeconfig", str(self.dir / "node.kubeconfig"),
                 "--name", name, "--address", f"127.0.0.{i + 1}", "--port", "0",
                 "--data-dir", str(self.dir / "nodes" / name)], stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
        end = time.time() + timeout
        while time.time() < end:
            r = self.kubectl("get", "nodes", "--no-headers", check=False)
            ready = [line for line in r.stdout.splitlines() if " Ready" in line]
            if len(ready) >= self.workers + 1:
                return self
            time.sleep(1)
        raise RuntimeError("manual cluster not ready: " + r.stdout + r.stderr)

    def start_control_plane(self, timeout: float = 90) -> None:
        log = open(self.dir.parent / f"{self.dir.name}.cp.log", "a")
        self.procs["control-plane"] = subprocess.Popen(
            [str(BIN / "kube32-sim"), "control-plane", "--data-dir", str(self.dir), "--port", str(self.port)],
            stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
        end = time.time() + timeout
        while time.time() < end:
            if self.kubeconfig.exists():
                try:
                    self._load_kubeconfig()
                    if self.session().get(self.url("/readyz"), timeout=5).status_code == 200:
                        return
                except Exception:  # noqa: BLE001
                    pass
            time.sleep(0.5)
        raise RuntimeError("control plane not ready")

    def stop_control_plane(self, sig: int = signal.SIGTERM) -> None:
        p = self.procs["control-plane"]
        p.send_signal(sig)
        p.wait(60)

    def children(self) -> dict[str, int]:
        return {k: p.pid for k, p in self.procs.items()}

    def stop(self) -> None:
        for _name, p in reversed(list(self.procs.items())):
            if p.poll() is None:
                p.send_signal(signal.SIGINT)
                try:
                    p.wait(40)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
