"""Helpers for test_attack23.py: an outside tester's view of issue 23 (Kubernetes API
fidelity).  The tests expect a running ``kube32-sim up --workers 2 --data-dir DIR``
cluster; DIR is ``$K23_DIR`` (default /tmp/a23).  Only public clients are used: kubectl,
curl-like HTTP (requests), the kubernetes Python client and friends, kube32-cli."""
from __future__ import annotations

import base64
import json
import os
import subprocess
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import requests
import urllib3
import yaml

urllib3.disable_warnings()

ROOT = Path(__file__).resolve().parents[2]
BIN = ROOT / ".venv" / "bin"
DIR = Path(os.environ.get("K23_DIR", "/tmp/a23"))
KUBECONFIG = DIR / "admin.kubeconfig"
NODECLIENT = next((p for p in (ROOT / "tests/e2e/nodeclient", Path("/work/main/tests/e2e/nodeclient"))
                   if (p / "node_modules").is_dir()), ROOT / "tests/e2e/nodeclient")


def env() -> dict[str, str]:
    e = dict(os.environ)
    e["KUBECONFIG"] = str(KUBECONFIG)
    e["PATH"] = f"{BIN}:{e['PATH']}"
    # kubectl's discovery cache is keyed by host:port only: other clusters on 6443 share it
    e["KUBECACHEDIR"] = str(DIR / "kubectl-cache")
    return e


def kubectl(*args: str, check: bool = True, input: str | None = None, timeout: float = 60,
            extra_env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    e = env()
    if extra_env:
        e.update(extra_env)
    p = subprocess.run(["kubectl", *args], capture_output=True, text=True, input=input,
                       timeout=timeout, env=e)
    if check and p.returncode != 0:
        raise AssertionError(f"kubectl {' '.join(args)} -> {p.returncode}\n{p.stdout}\n{p.stderr}")
    return p


def cli(*args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess:
    p = subprocess.run([str(BIN / "kube32-cli"), *args], capture_output=True, text=True,
                       timeout=timeout, env=env(), cwd=ROOT)
    if check and p.returncode != 0:
        raise AssertionError(f"kube32-cli {' '.join(args)} -> {p.returncode}\n{p.stdout}\n{p.stderr}")
    return p


def kubeconfig() -> dict[str, Any]:
    return yaml.safe_load(KUBECONFIG.read_text())


def server() -> str:
    return kubeconfig()["clusters"][0]["cluster"]["server"]


def token() -> str:
    return kubeconfig()["users"][0]["user"]["token"]


def ca_file() -> str:
    p = DIR / "k23-ca.crt"
    if not p.exists():
        p.write_bytes(base64.b64decode(kubeconfig()["clusters"][0]["cluster"]["certificate-authority-data"]))
    return str(p)


class Api:
    """A bare HTTP client with the admin token (what curl would do)."""

    def __init__(self) -> None:
        self.s = requests.Session()
        self.s.headers["Authorization"] = "Bearer " + token()
        self.s.verify = ca_file()
        self.base = server()

    def req(self, method: str, path: str, **kw: Any) -> requests.Response:
        kw.setdefault("timeout", 30)
        kw.setdefault("verify", self.s.verify)
        return self.s.request(method, self.base + path, **kw)

    def get(self, path: str, **kw: Any) -> requests.Response:
        return self.req("GET", path, **kw)

    def post(self, path: str, body: Any, **kw: Any) -> requests.Response:
        return self.req("POST", path, json=body, **kw)


def uniq(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


_IMAGES: dict[str, str] = {}


def image(name: str) -> str:
    if name not in _IMAGES:
        _IMAGES[name] = cli("image", "push", str(ROOT / "examples/pods" / name)).stdout.strip()
    return _IMAGES[name]


def apply_yaml(doc: Any, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    text = doc if isinstance(doc, str) else yaml.safe_dump_all(doc if isinstance(doc, list) else [doc])
    return kubectl("apply", "-f", "-", *args, input=text, check=check)


def create_yaml(doc: Any, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    text = doc if isinstance(doc, str) else yaml.safe_dump_all(doc if isinstance(doc, list) else [doc])
    return kubectl("create", "-f", "-", *args, input=text, check=check)


def get_json(*args: str) -> Any:
    return json.loads(kubectl("get", *args, "-o", "json").stdout)


def counter_pod(name: str, **meta: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": {"k23": name}, **meta},
            "spec": {"restartPolicy": "Never",
                     "containers": [{"name": "main", "image": image("counter.wasm")}]}}


def run_counter(name: str, **meta: Any) -> dict[str, Any]:
    create_yaml(counter_pod(name, **meta))
    kubectl("wait", "--for=condition=Ready", f"pod/{name}", "--timeout=90s", timeout=100)
    return get_json("pod", name)


def wait_until(fn: Any, timeout: float = 60, every: float = 0.5, what: str = "condition") -> Any:
    end = time.time() + timeout
    last: Any = None
    while time.time() < end:
        try:
            last = fn()
        except Exception as exc:  # noqa: BLE001
            last = exc
        else:
            if last:
                return last
        time.sleep(every)
    raise AssertionError(f"timed out waiting for {what}: last={last!r}")


def tmpfile(text: str, suffix: str = ".yaml") -> str:
    f = tempfile.NamedTemporaryFile("w", suffix=suffix, delete=False, dir=str(DIR))
    f.write(text)
    f.close()
    return f.name
