"""A cluster for Service-hold tests (tests/e2e/test_service_hold_adversarial.py and the
attack round's tests/attack/test_attack24.py, whence it came): clients of a Service through
the API server's Service proxy and through NodePorts, as an outside user would run them.

Only public surfaces: the kubeconfig a cluster writes, kubectl, kube32-cli, HTTP."""
from __future__ import annotations

import asyncio
import base64
import json
import os
import socket
import ssl
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from tests.conftest import wait_for

ROOT = Path(__file__).resolve().parent.parent.parent
CLI = [sys.executable, "-m", "kube32.cli.main"]


@dataclass
class Api:
    server: str
    token: str
    ca_file: str

    @classmethod
    def from_kubeconfig(cls, path: Path | str, token: str | None = None) -> "Api":
        cfg = yaml.safe_load(Path(path).read_text())
        cluster = cfg["clusters"][0]["cluster"]
        ca = base64.b64decode(cluster["certificate-authority-data"])
        fd, ca_file = tempfile.mkstemp(suffix=".crt")
        os.write(fd, ca)
        os.close(fd)
        return cls(cluster["server"], token or cfg["users"][0]["user"]["token"], ca_file)

    def ssl(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=self.ca_file)
        return ctx

    @property
    def host(self) -> str:
        return self.server.split("//", 1)[1].rsplit(":", 1)[0]

    @property
    def port(self) -> int:
        return int(self.server.rsplit(":", 1)[1])

    def svc_path(self, ns: str, svc: str, path: str = "/") -> str:
        return f"/api/v1/namespaces/{ns}/services/{svc}/proxy{path}"

    def pod_path(self, ns: str, pod: str, path: str = "/") -> str:
        return f"/api/v1/namespaces/{ns}/pods/{pod}/proxy{path}"


@dataclass
class Answer:
    status: int
    headers: dict
    body: bytes
    started: float
    ended: float
    error: str | None = None

    def json(self):
        return json.loads(self.body)


async def raw_request(host: str, port: int, method: str, path: str, *, headers: dict | None = None,
                      body: bytes | None = None, tls: ssl.SSLContext | None = None,
                      chunks: list[bytes] | None = None, chunk_delay: float = 0.0,
                      timeout: float = 60.0, server_hostname: str | None = None) -> Answer:
    """One HTTP/1.1 request on a connection of its own; reads the whole answer.

    ``chunks`` sends a chunked body, ``chunk_delay`` seconds between the chunks (a slow client)."""
    t0 = time.monotonic()
    try:
        return await asyncio.wait_for(_raw(host, port, method, path, headers or {}, body, tls, chunks,
                                           chunk_delay, server_hostname, t0), timeout)
    except Exception as e:  # noqa: BLE001 - a client error is an answer too
        return Answer(0, {}, b"", t0, time.monotonic(), f"{type(e).__name__}: {e}")


async def _raw(host, port, method, path, headers, body, tls, chunks, chunk_delay, server_hostname, t0):
    reader, writer = await asyncio.open_connection(host, port, ssl=tls,
                                                   server_hostname=server_hostname if tls else None)
    try:
        h = {"Host": f"{host}:{port}", "Connection": "close", **headers}
        if chunks is not None:
            h["Transfer-Encoding"] = "chunked"
        elif body is not None:
            h["Content-Length"] = str(len(body))
        head = f"{method} {path} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in h.items()) + "\r\n"
        writer.write(head.encode())
        if chunks is not None:
            for c in chunks:
                if chunk_delay:
                    await writer.drain()
                    await asyncio.sleep(chunk_delay)
                writer.write(f"{len(c):x}\r\n".encode() + c + b"\r\n")
            writer.write(b"0\r\n\r\n")
        elif body is not None:
            writer.write(body)
        await writer.drain()
        data = await reader.read(-1)
    finally:
        writer.close()
    head, _, rest = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    hdrs: dict = {}
    for line in lines[1:]:
        k, _, v = line.partition(":")
        hdrs[k.strip().lower()] = v.strip()
    if hdrs.get("transfer-encoding", "").lower() == "chunked":
        rest = _dechunk(rest)
    return Answer(status, hdrs, rest, t0, time.monotonic())


def _dechunk(data: bytes) -> bytes:
    out = b""
    while data:
        size_line, _, data = data.partition(b"\r\n")
        n = int(size_line.split(b";")[0] or b"0", 16)
        if n == 0:
            break
        out += data[:n]
        data = data[n + 2:]
    return out


class Client:
    """Requests through the Service proxy (TLS + token) or a NodePort (plain HTTP)."""

    def __init__(self, api: Api):
        self.api = api
        self.tls = api.ssl()

    async def svc(self, ns: str, svc: str, path: str = "/", method: str = "GET", **kw) -> Answer:
        headers = {"Authorization": f"Bearer {self.api.token}", **kw.pop("headers", {})}
        return await raw_request(self.api.host, self.api.port, method, self.api.svc_path(ns, svc, path),
                                 headers=headers, tls=self.tls, server_hostname=self.api.host, **kw)

    async def pod(self, ns: str, pod: str, path: str = "/", method: str = "GET", **kw) -> Answer:
        headers = {"Authorization": f"Bearer {self.api.token}", **kw.pop("headers", {})}
        return await raw_request(self.api.host, self.api.port, method, self.api.pod_path(ns, pod, path),
                                 headers=headers, tls=self.tls, server_hostname=self.api.host, **kw)

    async def api_get(self, path: str, **kw) -> Answer:
        headers = {"Authorization": f"Bearer {self.api.token}", **kw.pop("headers", {})}
        return await raw_request(self.api.host, self.api.port, "GET", path, headers=headers, tls=self.tls,
                                 server_hostname=self.api.host, **kw)

    @staticmethod
    async def nodeport(address: str, port: int, path: str = "/", method: str = "GET", **kw) -> Answer:
        return await raw_request(address, port, method, path, **kw)


def kubectl(kubeconfig: Path | str, *args: str, input: str | None = None, check: bool = True,
            timeout: float = 90) -> subprocess.CompletedProcess:
    cmd = ["kubectl", "--kubeconfig", str(kubeconfig), *args]
    cp = subprocess.run(cmd, capture_output=True, text=True, input=input, timeout=timeout)
    if check and cp.returncode != 0:
        raise AssertionError(f"kubectl {' '.join(args)} failed ({cp.returncode}):\n{cp.stdout}\n{cp.stderr}")
    return cp


def cli(kubeconfig: Path | str, *args: str, check: bool = False, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {**os.environ, "KUBECONFIG": str(kubeconfig)}
    cp = subprocess.run([*CLI, *args], capture_output=True, text=True, env=env, cwd=ROOT, timeout=timeout)
    if check and cp.returncode != 0:
        raise AssertionError(f"kube32-cli {' '.join(args)} failed ({cp.returncode}):\n{cp.stdout}\n{cp.stderr}")
    return cp


def cli_bg(kubeconfig: Path | str, *args: str) -> subprocess.Popen:
    env = {**os.environ, "KUBECONFIG": str(kubeconfig)}
    return subprocess.Popen([*CLI, *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env, cwd=ROOT)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Load:
    """Clients that each send requests one after another until stopped."""
    answers: list = field(default_factory=list)
    stop: bool = False

    async def run_client(self, send, idx: int, pause: float = 0.02):
        while not self.stop:
            a = await send()
            a.client = idx  # type: ignore[attr-defined]
            self.answers.append(a)
            await asyncio.sleep(pause)

    def failures(self):
        return [a for a in self.answers if a.status != 200]


def summarize(answers) -> str:
    from collections import Counter
    c = Counter((a.status, a.error.split(":")[0] if a.error else None) for a in answers)
    return ", ".join(f"{k}: {v}" for k, v in sorted(c.items(), key=str))


# --- a cluster of separate processes: a control plane that can be restarted alone, and
# workers (some with fault hooks) on addresses of their own, so NodePorts do not collide
# with other clusters on this machine.

def sim_args(*args: str) -> list[str]:
    return [sys.executable, "-m", "kube32.sim.main", *args]


def start_process(args: list[str], log: Path) -> subprocess.Popen:
    f = open(log, "ab")
    return subprocess.Popen(args, stdout=f, stderr=subprocess.STDOUT, cwd=ROOT,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"}, start_new_session=True)


def stop_process(p: subprocess.Popen, sig: int = 15, timeout: float = 30) -> None:
    if p.poll() is None:
        p.send_signal(sig)
        try:
            p.wait(timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(5)


WORKERS = {  # name: (address, fault)
    "w1": ("127.24.0.11", None),
    "w2": ("127.24.0.12", None),
    "slow": ("127.24.0.13", "slow-snapshots"),  # a move's snapshot pauses 8 s: a board's slow move
    "hang": ("127.24.0.14", "hang-restores"),   # a replacement never runs: rolled back after the timeout
    "bad": ("127.24.0.15", "corrupt-restores"),  # a restore fails: rolled back at once
}
FAULTY = ("slow", "hang", "bad")


class Cluster:
    def __init__(self, root: Path, rollback_timeout: str = "12s"):
        self.root = root
        self.cp_dir = root / "cp"
        self.kubeconfig = self.cp_dir / "admin.kubeconfig"
        self.rollback_timeout = rollback_timeout
        self.port = 0
        self.cp: subprocess.Popen | None = None
        self.workers: dict[str, subprocess.Popen] = {}
        self.images: dict[str, str] = {}

    # control plane
    def start_control_plane(self) -> None:
        self.cp_dir.mkdir(parents=True, exist_ok=True)
        if self.kubeconfig.exists() and not self.port:
            self.kubeconfig.unlink()
        first = not self.port
        self.cp = start_process(sim_args("control-plane", "--data-dir", str(self.cp_dir), "--port", str(self.port),
                              "--no-kubelet", "--move-rollback-timeout", self.rollback_timeout),
                         self.root / "control-plane.log")
        if first:
            wait_for(lambda: self.kubeconfig.exists() or self.cp.poll() is not None, 60, what="kubeconfig")
            self.port = int(yaml.safe_load(self.kubeconfig.read_text())["clusters"][0]["cluster"]["server"]
                            .rsplit(":", 1)[1])
        wait_for(lambda: self.cp.poll() is not None or self.kubectl("get", "--raw", "/readyz", check=False,
                                                                    timeout=10).returncode == 0,
                 60, what="the API server")
        if self.cp.poll() is not None:
            raise AssertionError("control plane exited:\n" + (self.root / "control-plane.log").read_text()[-3000:])

    def restart_control_plane(self) -> None:
        stop_process(self.cp)
        self.start_control_plane()

    # workers
    def start_worker(self, name: str) -> None:
        address, fault = WORKERS[name]
        args = ["worker", "--kubeconfig", str(self.cp_dir / "node.kubeconfig"), "--name", name,
                "--address", address, "--data-dir", str(self.root / f"node-{name}"), "--interp-mops", "100",
                "--backoff", "1"]
        if fault:
            args += ["--fault", fault]
        self.workers[name] = start_process(sim_args(*args), self.root / f"{name}.log")

    def wait_nodes_ready(self, names) -> None:
        def ready():
            out = self.kubectl("get", "nodes", "-o", "json", check=False).stdout
            items = json.loads(out)["items"] if out else []
            st = {n["metadata"]["name"]: any(c["type"] == "Ready" and c["status"] == "True"
                                             for c in n["status"].get("conditions", [])) for n in items}
            return all(st.get(n) for n in names)
        wait_for(ready, 90, 0.5, what=f"nodes {names} Ready")

    def stop(self) -> None:
        for p in self.workers.values():
            if p.poll() is None:
                p.send_signal(15)
        for p in self.workers.values():
            stop_process(p, timeout=30)
        if self.cp:
            stop_process(self.cp)

    # clients
    def kubectl(self, *args: str, **kw) -> subprocess.CompletedProcess:
        kw.setdefault("check", True)
        return kubectl(self.kubeconfig, "--cache-dir", str(self.root / "kubectl-cache"), *args, **kw)

    def apply(self, manifest: str, ns: str = "default", token: str | None = None) -> None:
        extra = ["--token", token] if token else []
        self.kubectl(*extra, "-n", ns, "apply", "-f", "-", input=manifest)

    def api(self, token: str | None = None) -> Api:
        return Api.from_kubeconfig(self.kubeconfig, token)

    def push(self, path: Path | str) -> str:
        key = str(path)
        if key not in self.images:
            self.images[key] = cli(self.kubeconfig, "image", "push", str(path), check=True).stdout.strip()
        return self.images[key]

    def json(self, *args: str):
        return json.loads(self.kubectl(*args, "-o", "json").stdout)

    def node_of(self, pod: str, ns: str = "default") -> str:
        return self.json("get", "pod", pod, "-n", ns)["spec"].get("nodeName", "")

    def nodeport(self, svc: str, ns: str = "default") -> int:
        return self.json("get", "svc", svc, "-n", ns)["spec"]["ports"][0]["nodePort"]


def pod_manifest(name: str, image: str, node: str, labels: dict | None = None, annotations: dict | None = None) -> str:
    return yaml.safe_dump({"apiVersion": "v1", "kind": "Pod",
                           "metadata": {"name": name, "labels": labels or {"app": name},
                                        "annotations": annotations or {}},
                           "spec": {"nodeName": node, "containers": [{"name": "main", "image": image}]}})


def service_manifest(name: str, selector: dict, hold: str | None = None, nodeport: bool = False) -> str:
    meta: dict = {"name": name}
    if hold is not None:
        meta["annotations"] = {"kube32.io/hold-requests": hold}
    spec: dict = {"selector": selector, "ports": [{"port": 80}]}
    if nodeport:
        spec["type"] = "NodePort"
    return yaml.safe_dump({"apiVersion": "v1", "kind": "Service", "metadata": meta, "spec": spec})


EVIL_POD_C = r"""
/* a pod an attacker writes: its own 503s with the proxies' marker, a trap after an effect */
#include "k32.h"
static unsigned long long requests;
static char out[64];
static int eq(const char *a, int n, const char *b) { int m = k32_strlen(b); if (n != m) return 0;
    for (int i = 0; i < n; i++) if (a[i] != b[i]) return 0; return 1; }
static void hdr(const char *n, const char *v) { k32_resp_header(n, k32_strlen(n), v, k32_strlen(v)); }
K32_EXPORT(k32_handle) void k32_handle(void) {
    char method[16], path[64];
    int mn = k32_req_method(method, sizeof method), pn = k32_req_path(path, sizeof path);
    requests++;
    if (eq(method, mn, "POST") && eq(path, pn, "/trap")) { k32_publish("trapped", 7, "t", 1); __builtin_trap(); }
    if (eq(path, pn, "/fake503")) {
        k32_resp_status(503); hdr("Retry-After", "1"); hdr("X-Kube32-Not-Started", "frozen");
        k32_resp_body("own 503\n", 8); return; }
    if (eq(path, pn, "/spaced-header")) {   /* the ABI forbids CR, LF and ':' in a name, nothing else */
        hdr("X-Spaced Name", "v"); k32_resp_body("ok\n", 3); return; }
    if (eq(path, pn, "/fake503-lower")) {
        k32_resp_status(503); hdr("Retry-After", "1"); hdr("x-kube32-not-started", "moved-away");
        k32_resp_body("own 503\n", 8); return; }
    int n = 0; unsigned long long v = requests; char t[24]; int i = 0;
    do { t[i++] = (char)('0' + v % 10); v /= 10; } while (v);
    const char *pre = "{\"requests\":"; while (*pre) out[n++] = *pre++;
    while (i) out[n++] = t[--i];
    out[n++] = '}'; out[n++] = '\n';
    k32_resp_body(out, n);
}
"""


def build_evil_pod(dest: Path) -> Path | None:
    """Compiles EVIL_POD_C with clang as examples/pods/Makefile does; None without clang."""
    import shutil
    if not shutil.which("clang"):
        return None
    src = dest.with_suffix(".c")
    src.write_text(EVIL_POD_C)
    subprocess.run(["clang", "--target=wasm32", "-nostdlib", "-O2", f"-I{ROOT / 'sdk' / 'c'}",
                    "-Wl,--no-entry", "-Wl,--export-dynamic", "-Wl,-z,stack-size=16384", "-o", str(dest), str(src)],
                   check=True, capture_output=True)
    return dest


# --- what the tests share ---------------------------------------------------------------

COUNTER = ROOT / "examples" / "pods" / "counter.wasm"
ECHO = ROOT / "examples" / "pods" / "echo.wasm"
ADDR = {n: a for n, (a, _) in WORKERS.items()}


def counter(k: Cluster) -> str:
    return k.push(COUNTER)


def make_pod(k: Cluster, name: str, node: str, image: str | None = None, labels: dict | None = None,
             ns: str = "default", token: str | None = None) -> None:
    k.apply(pod_manifest(name, image or counter(k), node, labels), ns, token)
    k.kubectl("-n", ns, "wait", "--for=condition=Ready", f"pod/{name}", "--timeout=60s")


def make_service(k: Cluster, name: str, selector: dict | None = None, hold: str | None = None,
                 nodeport: bool = False, ns: str = "default", token: str | None = None) -> None:
    k.apply(service_manifest(name, selector or {"app": name}, hold, nodeport), ns, token)


def wait_endpoints(k: Cluster, svc: str, ns: str = "default") -> None:
    def ready():
        ep = json.loads(k.kubectl("-n", ns, "get", "endpoints", svc, "-o", "json", check=False).stdout or "{}")
        return any(s.get("addresses") for s in ep.get("subsets") or [])
    wait_for(ready, 30, what=f"endpoints of {svc}")


async def start_move(k: Cluster, pod: str, to: str, ns: str = "default"):
    if to in FAULTY:
        k.kubectl("uncordon", to)
    return await asyncio.create_subprocess_exec(*CLI, "move", pod, "--to", to, "-n", ns,
                                                env={**os.environ, "KUBECONFIG": str(k.kubeconfig)}, cwd=str(ROOT),
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)


async def end_move(k: Cluster, p, to: str) -> str:
    out, _ = await p.communicate()
    if to in FAULTY:
        k.kubectl("cordon", to)
    return out.decode()


def move(k: Cluster, pod: str, to: str, ns: str = "default") -> str:
    async def go():
        return await end_move(k, await start_move(k, pod, to, ns), to)
    return asyncio.run(go())


async def phase_reached(k: Cluster, pod: str, phases=("Saving",), ns: str = "default", timeout: float = 30,
                        settle: float = 0.5) -> str:
    """Waits until a Checkpoint of the pod created in the last minute is in one of the phases (the
    move under way), then ``settle`` seconds more (the node freezes the pod once Saving is written)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        cp = await asyncio.create_subprocess_exec(
            "kubectl", "--kubeconfig", str(k.kubeconfig), "-n", ns, "get", "checkpoints", "-o", "json",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL)
        out = (await cp.communicate())[0]
        items = json.loads(out or b'{"items": []}')["items"]
        mine = sorted((i for i in items if i["spec"].get("podName") == pod),
                      key=lambda i: i["metadata"]["creationTimestamp"])
        if mine and mine[-1].get("status", {}).get("phase") in phases:
            await asyncio.sleep(settle)
            return mine[-1]["metadata"]["name"]
        await asyncio.sleep(0.1)
    raise AssertionError(f"no checkpoint of {pod} reached {phases}")


async def requests_of(c: Client, pod: str, ns: str = "default") -> int:
    a = await c.pod(ns, pod)
    assert a.status == 200, (a.status, a.body)
    return a.json()["requests"]


def describe(a) -> str:
    return f"{a.status} after {a.ended - a.started:.2f}s retry-after={a.headers.get('retry-after')} " \
           f"{a.body[:160]!r} {a.error or ''}"


def namespace_with_editor(k: Cluster, ns: str) -> str:
    k.kubectl("create", "namespace", ns)
    k.apply(f"""
apiVersion: v1
kind: ServiceAccount
metadata: {{name: bot, namespace: {ns}}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {{name: bot-edit, namespace: {ns}}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: edit}}
subjects: [{{kind: ServiceAccount, name: bot, namespace: {ns}}}]
""", ns)
    return k.kubectl("create", "token", "bot", "-n", ns, "--duration", "1h").stdout.strip()


def rss_mib(pid: int) -> float:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS"):
            return int(line.split()[1]) / 1024
    return 0.0


def cp_rss_mib(k: Cluster) -> float:
    for line in open(f"/proc/{k.cp.pid}/status"):
        if line.startswith("VmRSS"):
            return int(line.split()[1]) / 1024
    return 0.0
