"""More clients nobody here wrote, unchanged, against a sim cluster (issue 23): lightkube
(list with paging, watch through a move, the three patch types, server-side apply and
its conflicts, Checkpoints as a generic resource) and ``@kubernetes/client-node`` on
Node 20 (paging with continue tokens, a Checkpoint's create/status/patch/delete, its
informer through a move).  kubectl, the ``kubernetes`` client, kr8s, pykube-ng and kopf
are in test_api_fidelity.py, test_crds.py and test_apiserver_kubectl.py.

The Node client is pinned in tests/e2e/nodeclient/package.json (package-lock.json);
this module installs it there with ``npm ci`` when it is missing (as `.ci/run` does).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

from tests.conftest import ROOT, ControlPlane, start_cluster, wait_for
from tests.e2e.helpers import cli, push
from tests.e2e.test_moves import counter_pod, running

pytestmark = pytest.mark.e2e

NODE_CLIENT = Path(__file__).resolve().parent / "nodeclient"
COUNTER = ROOT / "examples" / "pods" / "counter.wasm"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    c = start_cluster(tmp_path_factory.mktemp("clients"), 1, "--backoff", "1")
    try:
        yield c
    finally:
        c.proc.stop(timeout=30)


@pytest.fixture(scope="module")
def image(cluster: ControlPlane) -> str:
    return push(cluster, COUNTER)


@pytest.fixture(scope="module")
def lightkube_client(cluster: ControlPlane) -> Any:
    from lightkube import Client, KubeConfig
    return Client(KubeConfig.from_file(str(cluster.kubeconfig)))


@pytest.fixture(scope="module")
def node_client() -> Path:
    """tests/e2e/nodeclient with its node_modules (``npm ci`` from the lock file)."""
    if shutil.which("node") is None or shutil.which("npm") is None:
        pytest.fail("Node.js and npm are needed for the @kubernetes/client-node tests (.ci/run installs them)")
    if not (NODE_CLIENT / "node_modules" / "@kubernetes" / "client-node").is_dir():
        subprocess.run(["npm", "ci", "--no-audit", "--no-fund"], cwd=NODE_CLIENT, check=True,
                       capture_output=True, timeout=300)
    return NODE_CLIENT


def node_run(cluster: ControlPlane, *args: str) -> list[dict]:
    out = subprocess.run(["node", "clients.js", *args], cwd=NODE_CLIENT, capture_output=True, text=True,
                         timeout=60, env={**os.environ, "KUBECONFIG": str(cluster.kubeconfig)})
    lines = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    assert out.returncode == 0, (out.stdout, out.stderr)
    return lines


def start_counter(cluster: ControlPlane, name: str, image: str, node: str = "devkit") -> dict:
    cluster.kubectl("apply", "-f", "-", input=counter_pod(name, node, image))
    return running(cluster, name)


def move(cluster: ControlPlane, name: str) -> None:
    out = cli(cluster, "move", name)
    assert out.returncode == 0, out.stdout.decode() + out.stderr.decode()


# --- lightkube ------------------------------------------------------------------------

def test_lightkube_lists_in_pages_patches_three_ways_and_applies_with_conflicts(lightkube_client: Any) -> None:
    from lightkube import ApiError
    from lightkube.models.meta_v1 import ObjectMeta
    from lightkube.resources.core_v1 import ConfigMap
    from lightkube.types import PatchType

    c = lightkube_client
    for i in range(5):
        c.create(ConfigMap(metadata=ObjectMeta(name=f"lk-{i}", labels={"set": "lk"}), data={"i": str(i)}))
    assert sorted(cm.metadata.name for cm in c.list(ConfigMap, namespace="default", chunk_size=2,
                                                     labels={"set": "lk"})) == [f"lk-{i}" for i in range(5)]
    c.patch(ConfigMap, "lk-0", {"data": {"strategic": "1"}}, namespace="default")
    c.patch(ConfigMap, "lk-0", {"data": {"merge": "1"}}, namespace="default", patch_type=PatchType.MERGE)
    c.patch(ConfigMap, "lk-0", [{"op": "add", "path": "/data/json", "value": "1"}], namespace="default",
            patch_type=PatchType.JSON)
    assert c.get(ConfigMap, "lk-0", namespace="default").data == {"i": "0", "strategic": "1", "merge": "1",
                                                                    "json": "1"}

    mine = ConfigMap(metadata=ObjectMeta(name="lk-applied", namespace="default"), data={"owner": "alpha"})
    c.apply(mine, field_manager="alpha")
    theirs = ConfigMap(metadata=ObjectMeta(name="lk-applied", namespace="default"), data={"owner": "beta"})
    with pytest.raises(ApiError) as refused:
        c.apply(theirs, field_manager="beta")
    assert refused.value.status.code == 409 and "conflict" in refused.value.status.message.lower()
    c.apply(theirs, field_manager="beta", force=True)
    got = c.get(ConfigMap, "lk-applied", namespace="default")
    assert got.data == {"owner": "beta"}
    assert {m.manager for m in got.metadata.managedFields} >= {"beta"}
    for cm in [*c.list(ConfigMap, namespace="default", labels={"set": "lk"}), got]:
        c.delete(ConfigMap, cm.metadata.name, namespace="default")


def test_lightkube_watches_a_move_and_drives_checkpoints_as_a_generic_resource(
        cluster: ControlPlane, image: str, lightkube_client: Any) -> None:
    from lightkube.generic_resource import create_namespaced_resource
    from lightkube.resources.core_v1 import Pod

    c = lightkube_client
    before = start_counter(cluster, "lk-counter", image)
    seen: list[tuple[str, str, str]] = []

    done_watching = threading.Event()

    def watch() -> None:
        try:
            for etype, pod in c.watch(Pod, namespace="default", fields={"metadata.name": "lk-counter"},
                                      resource_version=before["metadata"]["resourceVersion"]):
                seen.append((etype, pod.metadata.uid, pod.spec.nodeName))
                if done_watching.is_set():
                    return
        except Exception:   # noqa: BLE001 - the watch outlives the test only until the cluster stops
            if not done_watching.is_set():
                raise

    threading.Thread(target=watch, daemon=True).start()
    Checkpoint = create_namespaced_resource("kube32.io", "v1", "Checkpoint", "checkpoints")
    c.create(Checkpoint(metadata={"name": "lk-move", "namespace": "default"},
                        spec={"podName": "lk-counter", "action": "Move"}))
    done = wait_for(lambda: (ck := c.get(Checkpoint, "lk-move", namespace="default")).status.get("phase")
                    in ("Completed", "Failed") and ck, 60, what="the lightkube Checkpoint to finish")
    assert done.status["phase"] == "Completed", done.status
    new_uid = done.status["newPodUID"]
    wait_for(lambda: any(t == "ADDED" and u == new_uid for t, u, _ in seen), 15, what="the new pod's ADDED")
    old_uid = before["metadata"]["uid"]
    kinds = [(t, u) for t, u, _ in seen]
    # The old pod ends, then the new one begins (never one uid changing in place).
    assert kinds.index(("DELETED", old_uid)) < kinds.index(("ADDED", new_uid)), seen
    assert all(u != old_uid for t, u in kinds if t == "MODIFIED"), seen
    assert [ck.metadata.name for ck in c.list(Checkpoint, namespace="default")].count("lk-move") == 1
    done_watching.set()
    c.delete(Checkpoint, "lk-move", namespace="default")
    c.delete(Pod, "lk-counter", namespace="default")


# --- @kubernetes/client-node ------------------------------------------------------------

def test_the_node_client_pages_and_drives_a_checkpoint(cluster: ControlPlane, image: str,
                                                        node_client: Path) -> None:
    for i in range(3):
        cluster.kubectl("create", "configmap", f"nc-{i}", f"--from-literal=i={i}")
    try:
        [page] = node_run(cluster, "page")
        assert {f"nc-{i}" for i in range(3)} <= set(page["names"]) and page["pages"] >= 3, page
        assert len(page["names"]) == len(set(page["names"])), page
        start_counter(cluster, "nc-counter", image)
        [saved] = node_run(cluster, "checkpoint", "nc-counter")
        assert saved == {"ev": "checkpoint", "phase": "Saved", "size": saved["size"], "label": "client-node"}
        assert saved["size"] > 0
    finally:
        cluster.kubectl("delete", "configmap", "nc-0", "nc-1", "nc-2", "--ignore-not-found")
        cluster.kubectl("delete", "pod", "nc-counter", "--ignore-not-found", "--wait=false")


def test_the_node_clients_informer_sees_a_move_as_the_old_pod_gone_and_the_new_one_added(
        cluster: ControlPlane, image: str, node_client: Path) -> None:
    old = start_counter(cluster, "nc-moving", image)
    proc = subprocess.Popen(["node", "clients.js", "informer"], cwd=node_client, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "KUBECONFIG": str(cluster.kubeconfig)})
    try:
        assert proc.stdout is not None
        lines: list[dict] = []
        reader = threading.Thread(target=lambda: lines.extend(json.loads(x) for x in proc.stdout
                                                              if x.startswith("{")), daemon=True)
        reader.start()
        wait_for(lambda: any(x["ev"] == "started" for x in lines), 30, what="the informer to start")
        move(cluster, "nc-moving")
        new = running(cluster, "nc-moving")
        wait_for(lambda: any(x["ev"] == "add" and x["uid"] == new["metadata"]["uid"] for x in lines), 15,
                 what="the informer's add of the new pod")
        time.sleep(0.5)
    finally:
        assert proc.stdin is not None and proc.stderr is not None
        proc.stdin.close()   # the script's cue to print its cache and stop
        proc.wait(30)
        err = proc.stderr.read()
    reader.join(5)   # the reader alone reads stdout, to its end
    events = [(x["ev"], x.get("uid")) for x in lines if x.get("name") == "nc-moving"]
    assert ("delete", old["metadata"]["uid"]) in events, lines
    assert events.index(("delete", old["metadata"]["uid"])) < events.index(("add", new["metadata"]["uid"]))
    assert not [x for x in lines if x["ev"] in ("error", "fatal")], (lines, err)
    [end] = [x for x in lines if x["ev"] == "end"]
    assert ["nc-moving", new["metadata"]["uid"]] in end["cache"], end
    cluster.kubectl("delete", "pod", "nc-moving", "--wait=false")
