"""Workload controllers on a whole ``kube32-sim up --workers 2`` cluster: the real
scheduler binds the pods, the real kubelets run the counter pods and report them
Ready; kubectl drives the rollouts.
"""
from __future__ import annotations

import json

import yaml

from tests.conftest import ControlPlane, wait_for
from tests.e2e.test_sim_cluster import COUNTER, push, raw


def deployment_yaml(image: str, replicas: int = 3, env: str = "1") -> str:
    return yaml.safe_dump_all([
        {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"},
         "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": "web"}},
                  "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
                  "template": {"metadata": {"labels": {"app": "web"}},
                               "spec": {"containers": [{"name": "main", "image": image,
                                                        "env": [{"name": "VERSION", "value": env}]}]}}}},
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web"},
         "spec": {"selector": {"app": "web"}, "ports": [{"port": 80}]}}])


def pods(cluster: ControlPlane) -> list[dict]:
    items = json.loads(cluster.kubectl("get", "pods", "-l", "app=web", "-o", "json").stdout)["items"]
    return [p for p in items if not p["metadata"].get("deletionTimestamp")]


def ready_endpoints(cluster: ControlPlane) -> set[str]:
    ep = json.loads(cluster.kubectl("get", "endpoints", "web", "-o", "json").stdout)
    return {a["targetRef"]["name"] for s in ep.get("subsets") or [] for a in s.get("addresses") or []}


def test_deployment_on_a_real_cluster(sim_cluster: ControlPlane) -> None:
    image = push(sim_cluster, COUNTER)
    sim_cluster.kubectl("apply", "-f", "-", input=deployment_yaml(image))
    out = sim_cluster.kubectl("rollout", "status", "deployment/web", "--timeout=90s", timeout=100).stdout
    assert 'deployment "web" successfully rolled out' in out
    first = pods(sim_cluster)
    assert len(first) == 3 and all(p["spec"].get("nodeName") for p in first)
    wait_for(lambda: ready_endpoints(sim_cluster) == {p["metadata"]["name"] for p in first}, 30,
             what="the three pods in the Service's endpoints")
    assert raw(sim_cluster, "/api/v1/namespaces/default/services/web/proxy/")["requests"] >= 1

    # A rolling update to a new template, then kubectl rollout status again.
    sim_cluster.kubectl("apply", "-f", "-", input=deployment_yaml(image, env="2"))
    sim_cluster.kubectl("rollout", "status", "deployment/web", "--timeout=90s", timeout=100)
    second = pods(sim_cluster)
    assert len(second) == 3 and not {p["metadata"]["name"] for p in first} & {p["metadata"]["name"] for p in second}
    assert all(p["spec"]["containers"][0]["env"][0]["value"] == "2" for p in second)
    row = sim_cluster.kubectl("get", "deploy", "web", "--no-headers").stdout.split()
    assert row[1:4] == ["3/3", "3", "3"]
    wait_for(lambda: ready_endpoints(sim_cluster) == {p["metadata"]["name"] for p in second}, 30,
             what="endpoints follow the new pods")

    # A deleted pod comes back.
    gone = second[0]["metadata"]["name"]
    sim_cluster.kubectl("delete", "pod", gone, timeout=60)
    wait_for(lambda: len(pods(sim_cluster)) == 3 and gone not in {p["metadata"]["name"] for p in pods(sim_cluster)},
             60, what="a replacement pod")
    sim_cluster.kubectl("rollout", "status", "deployment/web", "--timeout=90s", timeout=100)


def test_daemonset_on_a_real_cluster(sim_cluster: ControlPlane) -> None:
    image = push(sim_cluster, COUNTER)
    sim_cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(
        {"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": "agent"},
         "spec": {"selector": {"matchLabels": {"app": "agent"}},
                  "template": {"metadata": {"labels": {"app": "agent"}},
                               "spec": {"containers": [{"name": "main", "image": image}]}}}}))
    nodes = json.loads(sim_cluster.kubectl("get", "nodes", "-o", "json").stdout)["items"]
    eligible = {n["metadata"]["name"] for n in nodes
                if not any(t["effect"] in ("NoSchedule", "NoExecute") and not t["key"].startswith("node.kubernetes.io/")
                           for t in n["spec"].get("taints") or [])}
    assert len(eligible) >= 2

    def status() -> dict:
        return json.loads(sim_cluster.kubectl("get", "ds", "agent", "-o", "json").stdout).get("status") or {}
    wait_for(lambda: status().get("numberReady") == len(eligible) == status().get("desiredNumberScheduled"), 60,
             what="a Ready daemon pod on every node")
    items = json.loads(sim_cluster.kubectl("get", "pods", "-l", "app=agent", "-o", "json").stdout)["items"]
    assert sorted(p["spec"]["nodeName"] for p in items) == sorted(eligible)
    sim_cluster.kubectl("rollout", "status", "daemonset/agent", "--timeout=60s", timeout=70)
