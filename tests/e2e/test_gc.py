"""Garbage collection (background, foreground, orphan) and namespace deletion, end to end."""
from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest
from kubernetes import client as k8s
from kubernetes.client.rest import ApiException

from tests.conftest import ControlPlane, start_control_plane, wait_for
from tests.e2e.fakenodes import FakeNodes


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> Iterator[tuple[ControlPlane, FakeNodes]]:
    cp = start_control_plane(Path(tmp_path_factory.mktemp("gc")) / "cp", "--no-kubelet")
    try:
        with FakeNodes(cp.client()) as nodes:
            nodes.add("sim-1")
            yield cp, nodes
    finally:
        cp.proc.stop()


def owner_ref(obj, block: bool = False) -> dict:
    return {"apiVersion": "v1", "kind": "ConfigMap", "name": obj.metadata.name, "uid": obj.metadata.uid,
            **({"blockOwnerDeletion": True} if block else {})}


def cm(core: k8s.CoreV1Api, name: str, *owners: dict, ns: str = "default"):
    md: dict = {"name": name}
    if owners:
        md["ownerReferences"] = list(owners)
    return core.create_namespaced_config_map(ns, {"apiVersion": "v1", "kind": "ConfigMap", "metadata": md})


def pod(core: k8s.CoreV1Api, name: str, *owners: dict, node: str | None = None, ns: str = "default"):
    md: dict = {"name": name}
    if owners:
        md["ownerReferences"] = list(owners)
    spec: dict = {"containers": [{"name": "c", "image": "x"}]}
    if node:
        spec["nodeName"] = node
    return core.create_namespaced_pod(ns, {"apiVersion": "v1", "kind": "Pod", "metadata": md, "spec": spec})


def exists(fn, *args) -> bool:
    try:
        fn(*args)
        return True
    except ApiException as e:
        if e.status == 404:
            return False
        raise


def test_background_deletion_cascades_by_uid(cluster) -> None:
    cp, _ = cluster
    core = k8s.CoreV1Api(cp.client())
    owner = cm(core, "bg-owner")
    cm(core, "bg-dep", owner_ref(owner))
    pod(core, "bg-pod", owner_ref(owner), node="sim-1")
    other = cm(core, "bg-other")
    cm(core, "bg-two-owners", owner_ref(owner), owner_ref(other))
    cp.kubectl("delete", "configmap", "bg-owner")
    wait_for(lambda: not exists(core.read_namespaced_config_map, "bg-dep", "default"), 20, what="dependent deleted")
    wait_for(lambda: not exists(core.read_namespaced_pod, "bg-pod", "default"), 20, what="pod deleted")
    # A dependent with another live owner stays, without the reference to the gone one.
    refs = wait_for(lambda: (lambda o: o if len(o) == 1 else None)(
        core.read_namespaced_config_map("bg-two-owners", "default").metadata.owner_references), 20)
    assert refs[0].uid == other.metadata.uid

    # A same-name replacement is another owner: the old owner's dependents still go.
    old = cm(core, "same")
    core.delete_namespaced_config_map("same", "default")
    cm(core, "same")
    cm(core, "same-dep", owner_ref(old))
    wait_for(lambda: not exists(core.read_namespaced_config_map, "same-dep", "default"), 20, what="stale ref collected")


def test_foreground_deletion_waits_for_blocking_dependents(cluster) -> None:
    cp, nodes = cluster
    core = k8s.CoreV1Api(cp.client())
    owner = cm(core, "fg-owner")
    mid = cm(core, "fg-mid", owner_ref(owner, block=True))
    pod(core, "fg-pod", owner_ref(mid, block=True), node="sim-1")
    nodes.kill("sim-1")  # its "kubelet" stops confirming deletions: the chain must wait
    try:
        core.delete_namespaced_config_map("fg-owner", "default", propagation_policy="Foreground")
        wait_for(lambda: core.read_namespaced_pod("fg-pod", "default").metadata.deletion_timestamp, 20,
                 what="grandchild being deleted")
        got = core.read_namespaced_config_map("fg-owner", "default")
        assert got.metadata.deletion_timestamp and "foregroundDeletion" in got.metadata.finalizers
    finally:
        nodes.revive("sim-1")
    wait_for(lambda: not exists(core.read_namespaced_config_map, "fg-owner", "default"), 20, what="owner gone")
    assert not exists(core.read_namespaced_pod, "fg-pod", "default")
    assert not exists(core.read_namespaced_config_map, "fg-mid", "default")


def test_orphan_deletion_keeps_dependents_without_the_reference(cluster) -> None:
    cp, _ = cluster
    core = k8s.CoreV1Api(cp.client())
    owner = cm(core, "or-owner")
    cm(core, "or-dep", owner_ref(owner))
    cp.kubectl("delete", "configmap", "or-owner", "--cascade=orphan")
    wait_for(lambda: not exists(core.read_namespaced_config_map, "or-owner", "default"), 20, what="owner gone")
    assert not core.read_namespaced_config_map("or-dep", "default").metadata.owner_references


def test_namespace_deletion_empties_and_removes_it(cluster) -> None:
    cp, _ = cluster
    core = k8s.CoreV1Api(cp.client())
    core.create_namespace({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "scratch"}})
    cm(core, "data", ns="scratch")
    pod(core, "bound", node="sim-1", ns="scratch")
    pod(core, "unbound", ns="scratch")  # no node fits? it is bound or pending; either way it must go
    out = cp.kubectl("delete", "namespace", "scratch", timeout=60)
    assert 'namespace "scratch" deleted' in out.stdout
    assert not exists(core.read_namespace, "scratch")
    assert "scratch" not in cp.kubectl("get", "namespaces").stdout


def test_a_deleted_namespace_takes_its_accounts_and_rbac_with_it(cluster) -> None:
    """A namespace created again under the same name starts empty: no ServiceAccount, Role
    or RoleBinding of the old one comes back, and the old account's token is dead."""
    cp, _ = cluster
    cp.kubectl("create", "namespace", "again")
    cp.kubectl("create", "serviceaccount", "bot", "-n", "again")
    cp.kubectl("create", "role", "reader", "--verb=get,list", "--resource=pods", "-n", "again")
    cp.kubectl("create", "rolebinding", "bot-reads", "--role=reader", "--serviceaccount=again:bot", "-n", "again")
    token = cp.kubectl("create", "token", "bot", "-n", "again").stdout.strip()
    assert cp.kubectl("--token", token, "get", "pods", "-n", "again").returncode == 0
    cp.kubectl("delete", "namespace", "again", timeout=60)
    cp.kubectl("create", "namespace", "again")
    left = cp.kubectl("get", "serviceaccounts,roles,rolebindings", "-n", "again", "-o", "name").stdout
    assert "bot" not in left and "reader" not in left, left
    refused = cp.kubectl("--token", token, "get", "pods", "-n", "again", check=False)
    assert refused.returncode == 1 and "Unauthorized" in refused.stderr, refused.stderr
    cp.kubectl("delete", "namespace", "again", timeout=60)


def test_every_namespace_has_a_default_service_account(cluster) -> None:
    """As Kubernetes: created with the namespace, back when deleted; kubectl create token
    default works in a new namespace."""
    cp, _ = cluster
    core = k8s.CoreV1Api(cp.client())
    cp.kubectl("create", "namespace", "accounts")
    wait_for(lambda: exists(core.read_namespaced_service_account, "default", "accounts"), 10,
             what="the default ServiceAccount")
    assert cp.kubectl("create", "token", "default", "-n", "accounts").stdout.startswith("k32sa.")
    cp.kubectl("delete", "serviceaccount", "default", "-n", "accounts")
    wait_for(lambda: exists(core.read_namespaced_service_account, "default", "accounts"), 10,
             what="the default ServiceAccount back")
    cp.kubectl("delete", "namespace", "accounts", timeout=60)


def test_the_system_namespaces_may_not_be_deleted(cluster) -> None:
    """As Kubernetes' NamespaceLifecycle: deleting "default" would take every pod with it."""
    cp, _ = cluster
    core = k8s.CoreV1Api(cp.client())
    cm(core, "kept")
    for ns in ("default", "kube-system", "kube-public"):
        out = cp.kubectl("delete", "namespace", ns, check=False)
        assert out.returncode == 1
        assert (f'Error from server (Forbidden): namespaces "{ns}" is forbidden: this namespace may not be '
                "deleted") in out.stderr, out.stderr
    assert core.read_namespace("default").status.phase == "Active"
    assert exists(core.read_namespaced_config_map, "kept", "default")
