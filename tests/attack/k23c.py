"""Self-contained helpers for tests/attack/test_attack23c.py (an outsider's tools only)."""

from __future__ import annotations

import base64
import json
import os
import ssl
import subprocess
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any, Iterator

import httpx
import yaml

DIR = Path(os.environ.get("K23C_DIR", "/tmp/atk23c"))
KUBECONFIG = DIR / "admin.kubeconfig"
REPO = Path(__file__).resolve().parents[2]
BIN = REPO / ".venv" / "bin"


def kubeconfig() -> dict[str, Any]:
    return yaml.safe_load(KUBECONFIG.read_text())


def server_and_auth() -> tuple[str, str, str]:
    cfg = kubeconfig()
    cluster = cfg["clusters"][0]["cluster"]
    ca = base64.b64decode(cluster["certificate-authority-data"])
    fd, path = tempfile.mkstemp(prefix="k23c-ca-", suffix=".crt")
    os.write(fd, ca)
    os.close(fd)
    return cluster["server"], cfg["users"][0]["user"]["token"], path


SERVER, TOKEN, CA_PATH = server_and_auth()


def client(token: str | None = None, timeout: float = 30.0) -> httpx.Client:
    ctx = ssl.create_default_context(cafile=CA_PATH)
    return httpx.Client(
        base_url=SERVER,
        verify=ctx,
        headers={"Authorization": f"Bearer {token or TOKEN}"},
        timeout=timeout,
    )


def kubectl(*args: str, check: bool = True, input: str | None = None,
            kubeconfig_path: str | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, KUBECONFIG=kubeconfig_path or str(KUBECONFIG))
    p = subprocess.run(["kubectl", *args], capture_output=True, text=True, env=env,
                       input=input, timeout=timeout)
    if check and p.returncode != 0:
        raise AssertionError(f"kubectl {' '.join(args)} failed rc={p.returncode}\n{p.stdout}\n{p.stderr}")
    return p


def cli(*args: str, check: bool = True, timeout: float = 200) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, KUBECONFIG=str(KUBECONFIG))
    p = subprocess.run([str(BIN / "kube32-cli"), *args], capture_output=True, text=True,
                       env=env, timeout=timeout, cwd=REPO)
    if check and p.returncode != 0:
        raise AssertionError(f"kube32-cli {' '.join(args)} failed rc={p.returncode}\n{p.stdout}\n{p.stderr}")
    return p


_IMAGES: dict[str, str] = {}


def image(name: str = "counter") -> str:
    if name not in _IMAGES:
        out = cli("image", "push", str(REPO / "examples" / "pods" / f"{name}.wasm")).stdout
        _IMAGES[name] = out.strip().splitlines()[-1]
    return _IMAGES[name]


def uniq(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


def make_namespace(c: httpx.Client, prefix: str = "k23c") -> str:
    ns = uniq(prefix)
    r = c.post("/api/v1/namespaces", json={"apiVersion": "v1", "kind": "Namespace",
                                            "metadata": {"name": ns}})
    assert r.status_code == 201, r.text
    return ns


def pod_body(name: str, img: str, node: str | None = None, labels: dict[str, str] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "main", "image": img}], "restartPolicy": "Always"}
    if node:
        spec["nodeName"] = node
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": labels or {"app": name}}, "spec": spec}


def wait_ready(c: httpx.Client, ns: str, name: str, timeout: float = 90) -> dict[str, Any]:
    deadline = time.time() + timeout
    last: Any = None
    while time.time() < deadline:
        r = c.get(f"/api/v1/namespaces/{ns}/pods/{name}")
        if r.status_code == 200:
            last = r.json()
            for cond in last.get("status", {}).get("conditions", []) or []:
                if cond.get("type") == "Ready" and cond.get("status") == "True":
                    return last
        time.sleep(0.5)
    raise AssertionError(f"pod {ns}/{name} not Ready: {json.dumps(last)[:2000]}")


def run_pod(c: httpx.Client, ns: str, name: str, node: str | None = None,
            labels: dict[str, str] | None = None, img: str = "counter") -> dict[str, Any]:
    r = c.post(f"/api/v1/namespaces/{ns}/pods", json=pod_body(name, image(img), node, labels))
    assert r.status_code == 201, r.text
    return wait_ready(c, ns, name)


def move(ns: str, name: str, to: str | None = None) -> str:
    args = ["move", name, "-n", ns, "--timeout", "120"]
    if to:
        args += ["--to", to]
    return cli(*args).stdout


def watch_lines(c: httpx.Client, path: str, params: dict[str, Any], timeout: float = 60) -> Iterator[dict[str, Any]]:
    p = dict(params)
    p["watch"] = "true"
    with c.stream("GET", path, params=p, timeout=httpx.Timeout(timeout)) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if line.strip():
                yield json.loads(line)


def node_of(c: httpx.Client, ns: str, name: str) -> str:
    return str(c.get(f"/api/v1/namespaces/{ns}/pods/{name}").json()["spec"]["nodeName"])


def other_worker(node: str) -> str:
    return "sim-2" if node == "sim-1" else "sim-1"
