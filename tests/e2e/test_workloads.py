"""Workload controllers end to end: a real ``kube32-sim control-plane``, kubectl and the
kubernetes client.  Without kubelets in these tests, the test plays the kubelet: it
marks pods Running and Ready (with a podIP) through ``pods/<name>/status``.
"""
from __future__ import annotations

import asyncio
import json
from typing import Iterator

import pytest

from tests.conftest import ControlPlane, start_control_plane, wait_for
from tests.e2e.fakenodes import post_ready

IMAGE = "wasm://127.0.0.1/counter.wasm"

DEPLOYMENT = """
apiVersion: apps/v1
kind: Deployment
metadata: {name: web, namespace: %(ns)s}
spec:
  replicas: 3
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      nodeSelector: {kube32.io/test-only: "true"}  # no node has it: the test is the only kubelet
      containers:
      - name: c
        image: %(image)s
        ports: [{name: http, containerPort: 8080}]
"""


@pytest.fixture(scope="module")
def cp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    plane = start_control_plane(tmp_path_factory.mktemp("workloads") / "cp", "--no-kubelet")
    try:
        yield plane
    finally:
        plane.proc.stop()


def create_namespace(cp: ControlPlane, name: str) -> None:
    cp.kubectl("apply", "-f", "-", input=f"apiVersion: v1\nkind: Namespace\nmetadata: {{name: {name}}}\n")


def core(cp: ControlPlane):
    from kubernetes import client
    return client.CoreV1Api(cp.client())


def apps(cp: ControlPlane):
    from kubernetes import client
    return client.AppsV1Api(cp.client())


def pods_json(cp: ControlPlane, ns: str, selector: str | None = None) -> list[dict]:
    args = ["get", "pods", "-n", ns, "-o", "json"] + (["-l", selector] if selector else [])
    return json.loads(cp.kubectl(*args).stdout)["items"]


def live(pods: list[dict]) -> list[dict]:
    return [p for p in pods if not p["metadata"].get("deletionTimestamp")]


def is_ready(pod: dict) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in (pod.get("status") or {}).get("conditions") or [])


def set_ready(api, pod: dict, ready: bool = True) -> None:
    """What a kubelet reports: Running, a podIP and the Ready condition."""
    status = "True" if ready else "False"
    body = {"status": {"phase": "Running", "podIP": "127.0.0.1", "podIPs": [{"ip": "127.0.0.1"}],
                       "conditions": [{"type": "Ready", "status": status},
                                      {"type": "ContainersReady", "status": status}]}}
    api.patch_namespaced_pod_status(pod["metadata"]["name"], pod["metadata"]["namespace"], body)


def make_ready(cp: ControlPlane, api, ns: str) -> list[dict]:
    pods = live(pods_json(cp, ns))
    for p in pods:
        if not is_ready(p):
            set_ready(api, p)
    return pods


def deployment(cp: ControlPlane, ns: str, name: str = "web") -> dict:
    return json.loads(cp.kubectl("get", "deployment", name, "-n", ns, "-o", "json").stdout)


def replica_sets(cp: ControlPlane, ns: str) -> list[dict]:
    return json.loads(cp.kubectl("get", "rs", "-n", ns, "-o", "json").stdout)["items"]


def rolled_out(d: dict, replicas: int) -> bool:
    st = d.get("status") or {}
    return (st.get("observedGeneration", 0) >= d["metadata"]["generation"]
            and st.get("updatedReplicas") == replicas and st.get("replicas") == replicas
            and st.get("availableReplicas") == replicas)


def test_deployment_rollout_scale_and_self_healing(cp: ControlPlane) -> None:
    ns = "deploy"
    create_namespace(cp, ns)
    api = core(cp)
    cp.kubectl("apply", "-f", "-", input=DEPLOYMENT % {"ns": ns, "image": IMAGE})

    pods = wait_for(lambda: len(live(pods_json(cp, ns))) == 3 and live(pods_json(cp, ns)), 20, what="3 pods")
    (rs,) = replica_sets(cp, ns)
    h = rs["metadata"]["labels"]["pod-template-hash"]
    assert rs["metadata"]["name"] == f"web-{h}"
    assert rs["spec"]["selector"]["matchLabels"] == {"app": "web", "pod-template-hash": h}
    assert rs["metadata"]["annotations"]["deployment.kubernetes.io/revision"] == "1"
    for p in pods:
        ref = p["metadata"]["ownerReferences"][0]
        assert ref["kind"] == "ReplicaSet" and ref["uid"] == rs["metadata"]["uid"]
        assert ref["controller"] is True and ref["blockOwnerDeletion"] is True
        assert p["metadata"]["name"].startswith(f"web-{h}-") and len(p["metadata"]["name"]) == len(f"web-{h}-") + 5
        assert p["metadata"]["labels"] == {"app": "web", "pod-template-hash": h}

    # kubectl rollout status waits until the pods are Ready.
    status = cp.kubectl_bg("rollout", "status", "deployment/web", "-n", ns, "--timeout=60s")
    wait_for(lambda: make_ready(cp, api, ns) and all(is_ready(p) for p in live(pods_json(cp, ns))), 20,
             what="pods ready")
    out, err = status.communicate(timeout=60)
    assert status.returncode == 0, err
    assert 'deployment "web" successfully rolled out' in out
    row = cp.kubectl("get", "deploy", "web", "-n", ns, "--no-headers").stdout.split()
    assert row[1:4] == ["3/3", "3", "3"]
    d = deployment(cp, ns)
    conds = {c["type"]: c for c in d["status"]["conditions"]}
    assert conds["Available"]["status"] == "True"
    assert conds["Progressing"]["reason"] == "NewReplicaSetAvailable"

    # A deleted pod is replaced.
    victim = pods[0]["metadata"]["name"]
    cp.kubectl("delete", "pod", victim, "-n", ns)
    wait_for(lambda: len(live(pods_json(cp, ns))) == 3 and victim not in
             {p["metadata"]["name"] for p in live(pods_json(cp, ns))}, 20, what="replacement pod")
    wait_for(lambda: make_ready(cp, api, ns) and rolled_out(deployment(cp, ns), 3), 20, what="healed")

    # A new image rolls: never more than replicas+maxSurge pods, never fewer than
    # replicas-maxUnavailable ready (defaults 25%: surge 1, unavailable 0 of 3).
    cp.kubectl("set", "image", "deployment/web", "-n", ns, f"c={IMAGE}?v=2")
    most, least = 0, 3

    def step() -> bool:
        nonlocal most, least
        pods = live(pods_json(cp, ns))
        most = max(most, len(pods))
        least = min(least, sum(1 for p in pods if is_ready(p)))
        for p in pods:
            if not is_ready(p):
                set_ready(api, p)
        return rolled_out(deployment(cp, ns), 3) and all(
            p["spec"]["containers"][0]["image"].endswith("v=2") for p in live(pods_json(cp, ns)))
    wait_for(step, 60, interval=0.05, what="rolling update")
    assert most <= 4 and least >= 3, (most, least)
    sets = {r["metadata"]["annotations"]["deployment.kubernetes.io/revision"]: r for r in replica_sets(cp, ns)}
    assert sets["1"]["spec"]["replicas"] == 0 and sets["2"]["spec"]["replicas"] == 3
    assert deployment(cp, ns)["metadata"]["annotations"]["deployment.kubernetes.io/revision"] == "2"
    cp.kubectl("rollout", "status", "deployment/web", "-n", ns, "--timeout=30s")

    # kubectl scale.
    cp.kubectl("scale", "deployment/web", "-n", ns, "--replicas=5")
    wait_for(lambda: make_ready(cp, api, ns) and rolled_out(deployment(cp, ns), 5), 20, what="scaled to 5")
    assert cp.kubectl("get", "deploy", "web", "-n", ns, "--no-headers").stdout.split()[1] == "5/5"
    cp.kubectl("scale", "deployment/web", "-n", ns, "--replicas=2")
    wait_for(lambda: len(live(pods_json(cp, ns))) == 2 and rolled_out(deployment(cp, ns), 2), 20,
             what="scaled to 2")

    # kubectl rollout undo goes back to revision 1's template (and its ReplicaSet).
    cp.kubectl("rollout", "undo", "deployment/web", "-n", ns)

    def undone() -> bool:
        make_ready(cp, api, ns)
        pods = live(pods_json(cp, ns))
        return rolled_out(deployment(cp, ns), 2) and len(pods) == 2 and all(
            p["spec"]["containers"][0]["image"] == IMAGE for p in pods)
    wait_for(undone, 30, interval=0.05, what="rollout undo")
    sets = {r["metadata"]["annotations"]["deployment.kubernetes.io/revision"]: r for r in replica_sets(cp, ns)}
    assert set(sets) == {"2", "3"} and sets["3"]["metadata"]["labels"]["pod-template-hash"] == h

    events = cp.kubectl("get", "events", "-n", ns, "-o", "json").stdout
    reasons = {(e["involvedObject"]["kind"], e["reason"]) for e in json.loads(events)["items"]}
    assert {("Deployment", "ScalingReplicaSet"), ("ReplicaSet", "SuccessfulCreate"),
            ("ReplicaSet", "SuccessfulDelete")} <= reasons
    assert "Scaled up replica set web-" in events


def replace_pod(cp: ControlPlane, pod: dict, node: str) -> dict:
    """A move's one write: same name, labels and owners, a new uid, another node."""
    from kube32.client import Client
    new = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {k: v for k, v in pod["metadata"].items()
                        if k in ("name", "namespace", "labels", "annotations", "ownerReferences")},
           "spec": {**pod["spec"], "nodeName": node}}
    md = pod["metadata"]

    async def call() -> dict:
        async with Client.from_kubeconfig(cp.kubeconfig) as c:
            return await c._json("POST", f"/api/v1/namespaces/{md['namespace']}/pods/{md['name']}/replacement",
                                 params={"uid": md["uid"]}, body=new)
    return asyncio.run(call())


def test_replaced_pod_is_still_one_pod(cp: ControlPlane) -> None:
    ns = "moves"
    create_namespace(cp, ns)
    cp.kubectl("apply", "-f", "-", input=DEPLOYMENT % {"ns": ns, "image": IMAGE})
    pods = wait_for(lambda: len(live(pods_json(cp, ns))) == 3 and live(pods_json(cp, ns)), 20, what="3 pods")
    before = {p["metadata"]["name"] for p in pods}
    add_node(cp, core(cp), "move-target", "core")  # pods bound to a missing node are collected
    out = replace_pod(cp, pods[0], "move-target")
    assert out["metadata"]["uid"] != pods[0]["metadata"]["uid"]
    # Give the controllers a write to react to after the replacement, then look.
    cp.kubectl("annotate", "deployment", "web", "-n", ns, "poke=1")
    wait_for(lambda: (replica_sets(cp, ns)[0].get("status") or {}).get("replicas") == 3, 20, what="rs status")
    after = {p["metadata"]["name"] for p in live(pods_json(cp, ns))}
    assert after == before
    creates = [e for e in json.loads(cp.kubectl("get", "events", "-n", ns, "-o", "json").stdout)["items"]
               if e["reason"] == "SuccessfulCreate"]
    assert sum(e.get("count", 1) for e in creates) == 3


NODE = """
apiVersion: v1
kind: Node
metadata:
  name: %s
  labels: {kubernetes.io/hostname: %s, tier: %s}
"""

def add_node(cp: ControlPlane, api, name: str, tier: str) -> None:
    """A Node that reports Ready (else node lifecycle taints it unreachable, and daemon
    pods do not tolerate unreachable:NoSchedule, as in Kubernetes)."""
    cp.kubectl("apply", "-f", "-", input=NODE % (name, name, tier))
    post_ready(api, name)   # a status PUT that reads again on 409, as a kubelet's


DAEMONSET = """
apiVersion: apps/v1
kind: DaemonSet
metadata: {name: agent, namespace: ds}
spec:
  selector: {matchLabels: {app: agent}}
  template:
    metadata: {labels: {app: agent}}
    spec:
      nodeSelector: {tier: edge}
      containers:
      - name: c
        image: %s
"""


def test_daemonset_one_pod_per_eligible_node(cp: ControlPlane) -> None:
    create_namespace(cp, "ds")
    api = core(cp)
    for name, tier in (("ds-a", "edge"), ("ds-b", "edge"), ("ds-core", "core")):
        add_node(cp, api, name, tier)
    cp.kubectl("apply", "-f", "-", input=DAEMONSET % IMAGE)

    def targets() -> dict[str, dict]:
        out = {}
        for p in live(pods_json(cp, "ds")):
            terms = p["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
            (field,) = terms["nodeSelectorTerms"][0]["matchFields"]
            assert field["key"] == "metadata.name" and field["operator"] == "In"
            out[field["values"][0]] = p
        return out
    wait_for(lambda: set(targets()) == {"ds-a", "ds-b"} and len(live(pods_json(cp, "ds"))) == 2, 20,
             what="a pod on each edge node")
    tolerated = {(t["key"], t["effect"]) for t in targets()["ds-a"]["spec"]["tolerations"]}
    assert ("node.kubernetes.io/unreachable", "NoExecute") in tolerated
    assert ("node.kubernetes.io/unschedulable", "NoSchedule") in tolerated

    add_node(cp, api, "ds-c", "edge")  # joins later
    wait_for(lambda: set(targets()) == {"ds-a", "ds-b", "ds-c"}, 20, what="a pod on the new node")
    ds = wait_for(lambda: (d := json.loads(cp.kubectl("get", "ds", "agent", "-n", "ds", "-o", "json").stdout))
                  ["status"].get("currentNumberScheduled") == 3 and d, 20, what="ds status")
    st = ds["status"]
    assert st["desiredNumberScheduled"] == 3 and st["updatedNumberScheduled"] == 3
    assert st.get("numberMisscheduled", 0) == 0 and st["observedGeneration"] == ds["metadata"]["generation"]

    cp.kubectl("label", "node", "ds-b", "tier=core", "--overwrite")  # no longer eligible
    wait_for(lambda: set(targets()) == {"ds-a", "ds-c"}, 20, what="pod leaves an ineligible node")


SERVICE = """
apiVersion: v1
kind: Service
metadata: {name: web, namespace: svc}
spec:
  selector: {app: web}
  ports: [{name: http, port: 80, targetPort: http}]
"""

POD = """
apiVersion: v1
kind: Pod
metadata: {name: %s, namespace: svc, labels: {app: web}}
spec:
  nodeSelector: {kube32.io/test-only: "true"}
  containers:
  - name: c
    image: %s
    ports: [{name: http, containerPort: 8080}]
"""


def test_service_endpoints_follow_ready_pods(cp: ControlPlane) -> None:
    create_namespace(cp, "svc")
    api = core(cp)
    cp.kubectl("apply", "-f", "-", input=SERVICE)
    for name in ("web-1", "web-2", "web-3"):
        cp.kubectl("apply", "-f", "-", input=POD % (name, IMAGE))
    for p in pods_json(cp, "svc"):
        if p["metadata"]["name"] != "web-3":
            set_ready(api, p)

    def endpoints() -> dict:
        return json.loads(cp.kubectl("get", "endpoints", "web", "-n", "svc", "-o", "json").stdout)

    def ready_names(ep: dict) -> tuple[set[str], set[str]]:
        (subset,) = ep.get("subsets") or [{}]
        return ({a["targetRef"]["name"] for a in subset.get("addresses") or []},
                {a["targetRef"]["name"] for a in subset.get("notReadyAddresses") or []})
    wait_for(lambda: ready_names(endpoints()) == ({"web-1", "web-2"}, set()), 20, what="two ready endpoints")
    (subset,) = endpoints()["subsets"]
    assert subset["ports"] == [{"name": "http", "port": 8080, "protocol": "TCP"}]
    assert [a["ip"] for a in subset["addresses"]] == ["127.0.0.1", "127.0.0.1"]  # same node IP: not deduped
    assert {a["targetRef"]["kind"] for a in subset["addresses"]} == {"Pod"}

    def slices() -> list[dict]:
        return json.loads(cp.kubectl("get", "endpointslices", "-n", "svc", "-l",
                                     "kubernetes.io/service-name=web", "-o", "json").stdout)["items"]

    def slice_state() -> dict[str, bool]:
        (s,) = slices()
        return {e["targetRef"]["name"]: e["conditions"]["ready"] for e in s["endpoints"]}
    wait_for(lambda: slice_state() == {"web-1": True, "web-2": True}, 20, what="slice")
    (s,) = slices()
    assert s["metadata"]["name"].startswith("web-") and s["addressType"] == "IPv4"
    assert s["ports"] == [{"name": "http", "port": 8080, "protocol": "TCP"}]
    assert s["metadata"]["ownerReferences"][0]["kind"] == "Service"

    set_ready(api, [p for p in pods_json(cp, "svc") if p["metadata"]["name"] == "web-3"][0])
    set_ready(api, [p for p in pods_json(cp, "svc") if p["metadata"]["name"] == "web-1"][0], ready=False)
    wait_for(lambda: ready_names(endpoints()) == ({"web-2", "web-3"}, {"web-1"}), 20, what="web-1 not ready")
    wait_for(lambda: slice_state() == {"web-1": False, "web-2": True, "web-3": True}, 20, what="slice update")

    cp.kubectl("delete", "pod", "web-2", "-n", "svc")
    wait_for(lambda: ready_names(endpoints()) == ({"web-3"}, {"web-1"}), 20, what="deleted pod leaves")
    cp.kubectl("delete", "service", "web", "-n", "svc")
    wait_for(lambda: not slices() and cp.kubectl("get", "endpoints", "web", "-n", "svc",
                                                 check=False).returncode != 0, 20, what="cleanup")
