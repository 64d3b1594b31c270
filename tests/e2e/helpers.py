"""Helpers shared by the end-to-end tests on a ``kube32-sim up`` cluster."""
from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import yaml

from kube32.client import Client
from tests.conftest import ROOT, ControlPlane


def cli(cluster: ControlPlane, *args: str, input: bytes | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kube32.cli.main", *args, "--kubeconfig", str(cluster.kubeconfig)],
                          capture_output=True, input=input, cwd=ROOT, timeout=60)


def push(cluster: ControlPlane, path: Path) -> str:
    out = cli(cluster, "image", "push", str(path))
    assert out.returncode == 0, out.stderr.decode()
    return out.stdout.decode().strip()


def pod_yaml(name: str, node: str, image: str, annotations: dict | None = None, **spec) -> str:
    return yaml.safe_dump({"apiVersion": "v1", "kind": "Pod",
                           "metadata": {"name": name, "labels": {"app": name}, "annotations": annotations or {}},
                           "spec": {"nodeName": node, "containers": [{"name": "main", "image": image}], **spec}})


def get_json(cluster: ControlPlane, *args: str) -> dict:
    return json.loads(cluster.kubectl("get", *args, "-o", "json").stdout)


def raw(cluster: ControlPlane, path: str) -> dict:
    return json.loads(cluster.kubectl("get", "--raw", path).stdout)


def waiting_or_terminated(cluster: ControlPlane, name: str) -> dict:
    cs = (get_json(cluster, "pod", name).get("status") or {}).get("containerStatuses") or [{}]
    return cs[0]


def api_call(cluster: ControlPlane, method: str, path: str) -> tuple[int, dict[str, str], bytes]:
    """One request through the API server with the admin's credentials: (status, headers, body)."""
    async def go() -> tuple[int, dict[str, str], bytes]:
        async with Client.from_kubeconfig(cluster.kubeconfig) as c:
            async with c.request(method, path) as r:
                return r.status, dict(r.headers), await r.read()
    return asyncio.run(go())
