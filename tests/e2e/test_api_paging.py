"""Paged lists (issue #23, item 4) as the clients people use drive them: kubectl's
``--chunk-size``, the ``kubernetes`` Python client's ``limit``/``_continue``, and raw
requests for the refusals (a garbage token, a compacted revision) -- against a real
control plane (SQLite, and etcd for compaction, which the test sends etcd itself).
"""
from __future__ import annotations

import asyncio
import base64
import json
import re
import subprocess
from pathlib import Path

import pytest

from kube32.sim.etcd import EtcdCluster
from tests.conftest import ControlPlane, start_control_plane
from tests.etcd import etcd_endpoints

pytestmark = pytest.mark.e2e


def raw(cp: ControlPlane, path: str) -> tuple[int, dict]:
    """GET ``path`` with curl and the admin's token; (HTTP code, decoded body: a refusal's Status too)."""
    token = re.search(r"token: (\S+)", cp.kubeconfig.read_text()).group(1)
    out = subprocess.run(["curl", "-sS", "--max-time", "30", "--cacert", str(cp.data_dir / "pki" / "ca.crt"),
                          "-H", f"Authorization: Bearer {token}", "-w", "\n%{http_code}", cp.server + path],
                         capture_output=True, text=True, timeout=40)
    body, _, code = out.stdout.rpartition("\n")
    return int(code), json.loads(body)


def compact(cluster: EtcdCluster, revision: int) -> None:
    """etcd's Compact(revision), as another API server's compactor would send it."""
    from kube32.store.etcd import EtcdStore

    async def go() -> None:
        store = await EtcdStore.open(etcd_endpoints(cluster), compact_interval=None)
        try:
            await store.compact(revision)
        finally:
            await store.close()
    asyncio.run(go())


def make_configmaps(cp: ControlPlane, ns: str, n: int) -> None:
    cp.kubectl("create", "namespace", ns)
    docs = "\n---\n".join(f"apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: cm-{i:02d}, labels: {{odd: "
                          f"'{i % 2}'}}}}\ndata: {{i: '{i}'}}" for i in range(n))
    cp.kubectl("-n", ns, "apply", "-f", "-", input=docs)


def test_kubectl_chunk_size_pages_a_list(control_plane: ControlPlane) -> None:
    cp = control_plane
    make_configmaps(cp, "paged", 7)
    out = cp.kubectl("-n", "paged", "get", "configmaps", "--chunk-size=2", "-o", "name", "-v=6")
    assert out.stdout.split() == [f"configmap/cm-{i:02d}" for i in range(7)]
    requests = re.findall(r"GET \S+/configmaps\?\S+", out.stderr)
    assert len(requests) == 4 and all("limit=2" in r for r in requests), requests
    assert sum("continue=" in r for r in requests) == 3, requests
    # the table kubectl prints by default, paged the same way
    table = cp.kubectl("-n", "paged", "get", "configmaps", "--chunk-size=3").stdout
    assert [line.split()[0] for line in table.splitlines()[1:]] == [f"cm-{i:02d}" for i in range(7)]


def test_pages_are_one_list_at_one_revision_with_remaining_item_count(control_plane: ControlPlane) -> None:
    cp = control_plane
    make_configmaps(cp, "consistent", 5)
    v1 = cp.client()
    from kubernetes import client
    api = client.CoreV1Api(v1)
    first = api.list_namespaced_config_map("consistent", limit=2)
    assert [c.metadata.name for c in first.items] == ["cm-00", "cm-01"]
    assert first.metadata.remaining_item_count == 3 and first.metadata._continue
    # writes between the pages do not show in them: the list is the state of the first page
    api.delete_namespaced_config_map("cm-03", "consistent")
    cp.kubectl("-n", "consistent", "create", "configmap", "cm-99")
    cp.kubectl("-n", "consistent", "label", "configmap", "cm-99", "odd=1")
    names = [c.metadata.name for c in first.items]
    page = first
    while page.metadata._continue:
        page = api.list_namespaced_config_map("consistent", limit=2, _continue=page.metadata._continue)
        assert page.metadata.resource_version == first.metadata.resource_version
        names += [c.metadata.name for c in page.items]
    assert names == [f"cm-{i:02d}" for i in range(5)]
    assert page.metadata.remaining_item_count is None
    # a selector pages too (how many more match is not known, so no count)
    odd = api.list_namespaced_config_map("consistent", limit=1, label_selector="odd=1")
    assert [c.metadata.name for c in odd.items] == ["cm-01"] and odd.metadata.remaining_item_count is None
    rest = api.list_namespaced_config_map("consistent", limit=5, label_selector="odd=1",
                                          _continue=odd.metadata._continue)
    assert [c.metadata.name for c in rest.items] == ["cm-99"]  # cm-03 was deleted, the list is today's


def test_bad_tokens_and_options_are_400_naming_the_cause(control_plane: ControlPlane) -> None:
    cp = control_plane
    make_configmaps(cp, "tokens", 3)
    base = "/api/v1/namespaces/tokens/configmaps"
    code, body = raw(cp, f"{base}?limit=1&continue=garbage")
    assert code == 400 and "continue key is not valid" in body["message"], body
    forged = base64.urlsafe_b64encode(json.dumps({"v": "meta.k8s.io/v1", "rv": 1,
                                                  "start": "../../secrets/kube-system/"}).encode()).decode()
    code, body = raw(cp, f"{base}?limit=1&continue={forged}")
    assert code == 400 and "does not stay within" in body["message"], body
    code, first = raw(cp, f"{base}?limit=1")
    token = first["metadata"]["continue"]
    code, body = raw(cp, f"{base}?limit=1&continue={token}&resourceVersion=1")
    assert code == 400 and "not allowed when using continue" in body["message"], body
    code, body = raw(cp, f"{base}?limit=x")
    assert code == 400 and "limit" in body["message"], body
    code, body = raw(cp, f"{base}?resourceVersionMatch=Exact")
    assert code == 400 and "unless resourceVersion is provided" in body["message"], body
    code, body = raw(cp, f"{base}?resourceVersionMatch=Sometimes&resourceVersion=1")
    assert code == 400 and "Unsupported value" in body["message"], body
    rv = int(first["metadata"]["resourceVersion"])
    code, body = raw(cp, f"{base}?resourceVersion={rv + 1000}&resourceVersionMatch=NotOlderThan")
    assert code == 504 and "Too large resource version" in body["message"], body
    # Exact: the list as it was at that revision
    cp.kubectl("-n", "tokens", "delete", "configmap", "cm-00")
    code, then = raw(cp, f"{base}?resourceVersion={rv}&resourceVersionMatch=Exact")
    assert code == 200 and [i["metadata"]["name"] for i in then["items"]] == ["cm-00", "cm-01", "cm-02"]
    assert then["metadata"]["resourceVersion"] == str(rv)
    code, now = raw(cp, f"{base}?resourceVersion={rv}&resourceVersionMatch=NotOlderThan")
    assert code == 200 and [i["metadata"]["name"] for i in now["items"]] == ["cm-01", "cm-02"]


def test_compacted_revisions_are_410_expired(tmp_path: Path, etcd_cluster: EtcdCluster) -> None:
    cp = start_control_plane(tmp_path / "cp", "--store", etcd_cluster.store_url, "--no-kubelet")
    try:
        make_configmaps(cp, "etcd-paging", 4)
        base = "/api/v1/namespaces/etcd-paging/configmaps"
        code, first = raw(cp, f"{base}?limit=2")
        assert code == 200 and first["metadata"]["remainingItemCount"] == 2
        old = int(first["metadata"]["resourceVersion"])
        cp.kubectl("-n", "etcd-paging", "create", "configmap", "later")
        code, now = raw(cp, base)
        compact(etcd_cluster, int(now["metadata"]["resourceVersion"]))
        code, body = raw(cp, f"{base}?limit=2&continue={first['metadata']['continue']}")
        assert code == 410 and body["reason"] == "Expired" and "start a new list" in body["message"], body
        # the Status hands out a token that goes on, inconsistently, from today's state
        code, rest = raw(cp, f"{base}?limit=5&continue={body['metadata']['continue']}")
        assert code == 200 and [i["metadata"]["name"] for i in rest["items"]] == ["cm-02", "cm-03", "later"]
        code, body = raw(cp, f"{base}?resourceVersion={old}&resourceVersionMatch=Exact")
        assert code == 410 and body["reason"] == "Expired", body
    finally:
        cp.proc.stop()
