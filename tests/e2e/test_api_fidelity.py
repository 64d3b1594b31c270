"""Clients nobody here wrote, unchanged, against a sim cluster (issue 23): kubectl explain
(OpenAPI v3, and v2 as protobuf), the `kubernetes` Python client, kr8s, pykube-ng and curl
(trailing slashes, health checks, the data PUT's 415); `kubectl logs -f` of a container
that exits; kube32-cli piped; a control plane whose etcd goes away failing /readyz.
"""
from __future__ import annotations

import base64
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import pytest
import yaml

from kube32.sim.etcd import EtcdCluster
from tests.conftest import ROOT, ControlPlane, start_cluster, start_control_plane, wait_for
from tests.e2e.helpers import cli, push
from tests.etcd import need_etcd

pytestmark = pytest.mark.e2e

CLOCK = ROOT / "examples" / "pods" / "clock.wasm"
ECHO = ROOT / "examples" / "pods" / "echo.wasm"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    c = start_cluster(tmp_path_factory.mktemp("fidelity"), 1, "--backoff", "1")
    try:
        yield c
    finally:
        c.proc.stop(timeout=30)


class Curl:
    """curl with the kubeconfig's token and CA."""

    def __init__(self, cp: ControlPlane, tmp: Path) -> None:
        kc = yaml.safe_load(cp.kubeconfig.read_text())
        self.server = kc["clusters"][0]["cluster"]["server"]
        self.ca = tmp / "ca.crt"
        self.ca.write_bytes(base64.b64decode(kc["clusters"][0]["cluster"]["certificate-authority-data"]))
        self.token = kc["users"][0]["user"]["token"]

    def __call__(self, path: str, *args: str, token: bool = True) -> tuple[int, str]:
        auth = ["-H", f"Authorization: Bearer {self.token}"] if token else []
        out = subprocess.run(["curl", "-sS", "--cacert", str(self.ca), "-w", "\n%{http_code}", *auth, *args,
                              self.server + path], capture_output=True, text=True, timeout=30, check=True).stdout
        body, _, code = out.rpartition("\n")
        return int(code), body


@pytest.fixture(scope="module")
def curl(cluster: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Curl:
    return Curl(cluster, tmp_path_factory.mktemp("curl"))


@pytest.mark.parametrize("path,kind", [
    ("/version/", None), ("/api/", "APIVersions"), ("/apis/", "APIGroupList"), ("/api/v1/", "APIResourceList"),
    ("/apis/kube32.io/", "APIGroup"), ("/apis/kube32.io/v1/", "APIResourceList"),
    ("/apis/apps/v1/", "APIResourceList"), ("/openapi/v3/", None), ("/openapi/v2/", None)])
def test_discovery_answers_with_a_trailing_slash(curl: Curl, path: str, kind: str | None) -> None:
    code, body = curl(path)
    assert code == 200, body
    doc = json.loads(body)
    assert doc.get("kind") == kind
    assert curl(path.rstrip("/"))[1] == body
    if path == "/version/":
        assert doc["minor"] == "32" and curl(path, token=False)[0] == 200   # public, as /version


def test_kubectl_explain_pod_and_checkpoint(cluster: ControlPlane) -> None:
    out = cluster.kubectl("explain", "pod").stdout
    assert "KIND:       Pod" in out and "Pod is a collection of containers" in out
    out = cluster.kubectl("explain", "pod.spec.containers").stdout
    assert "FIELD: containers <[]Container>" in out and "image\t<string>" in out
    out = cluster.kubectl("explain", "checkpoint").stdout
    assert "GROUP:      kube32.io" in out and "spec\t<Object> -required-" in out
    out = cluster.kubectl("explain", "checkpoint.status").stdout
    for field in ("phase", "nodeName", "takenAt", "sizeBytes", "snapshotSha256", "imageSha256", "podTimeMs",
                  "targetNode", "newPodName", "message", "blockers"):
        assert f"  {field}\t<" in out, field
    assert "schedule\t<string>" in cluster.kubectl("explain", "cronjob.spec").stdout   # every kind served
    out = cluster.kubectl("explain", "checkpoint.spec.action").stdout
    assert "`Save` (the default) or `Move`" in out
    # the v2 document, as protobuf (kubectl asks application/com.github.proto-openapi.spec.v2@v1.0+protobuf)
    out = cluster.kubectl("explain", "pod.spec.containers.ports", "--output=plaintext-openapiv2").stdout
    assert "containerPort\t<integer> -required-" in out
    out = cluster.kubectl("explain", "ckpt.spec", "--output=plaintext-openapiv2").stdout
    assert "podName\t<string> -required-" in out


def test_kubectl_apply_still_leaves_validation_to_the_server(cluster: ControlPlane) -> None:
    ck = {"apiVersion": "kube32.io/v1", "kind": "Checkpoint", "metadata": {"name": "val"},
          "spec": {"podName": "none", "bogus": 1}}
    out = cluster.kubectl("apply", "-f", "-", input=json.dumps(ck), check=False)
    assert out.returncode != 0 and 'unknown field "spec.bogus"' in out.stderr


def test_kubectl_apply_prune_with_its_default_list_and_kinds_kube32_does_not_run(cluster: ControlPlane) -> None:
    """kubectl apply --prune's default list names PersistentVolumeClaims, PersistentVolumes,
    ReplicationControllers, StatefulSets and Ingresses (attack round 23: it failed on them);
    they are served for reading, always empty, and a write says why (405), as does
    kubectl autoscale (HorizontalPodAutoscalers)."""
    docs = [{"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": f"prune-{i}", "labels": {"set": "pr"}},
             "data": {"k": "v"}} for i in range(3)]
    cluster.kubectl("apply", "-l", "set=pr", "--prune", "-f", "-", input=yaml.safe_dump_all(docs))
    out = cluster.kubectl("apply", "-l", "set=pr", "--prune", "-f", "-", input=yaml.safe_dump_all(docs[:2])).stdout
    assert "configmap/prune-2 pruned" in out, out
    names = cluster.kubectl("get", "cm", "-l", "set=pr", "-o", "name").stdout.split()
    assert sorted(names) == ["configmap/prune-0", "configmap/prune-1"]
    for kind in ("statefulsets", "pvc", "pv", "rc", "ingresses", "hpa"):
        got = cluster.kubectl("get", kind, "-A")
        assert "No resources found" in got.stderr, (kind, got.stdout, got.stderr)
    sts = {"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": "db"},
           "spec": {"selector": {"matchLabels": {"a": "b"}}, "serviceName": "db",
                    "template": {"metadata": {"labels": {"a": "b"}}, "spec": {"containers": [{"name": "c",
                                                                                            "image": "x"}]}}}}
    made = cluster.kubectl("apply", "-f", "-", input=json.dumps(sts), check=False)
    assert made.returncode != 0 and "MethodNotAllowed" in made.stderr and "Kube32 does not run statefulsets" in \
        made.stderr and "use a Deployment" in made.stderr, made.stderr
    cluster.kubectl("create", "deployment", "scaled", "--image=x")
    auto = cluster.kubectl("autoscale", "deploy/scaled", "--min=1", "--max=2", "--cpu-percent=50", check=False)
    cluster.kubectl("delete", "deployment", "scaled", "--wait=false")
    assert auto.returncode != 0 and "Kube32 does not run horizontalpodautoscalers" in auto.stderr, auto.stderr


def test_a_null_field_of_a_job_is_unset_and_the_job_runs(cluster: ControlPlane) -> None:
    """``backoffLimit: null`` (a YAML key left empty) is the field unset and defaulted, as
    kube-apiserver decodes it (attack round 23: stored as null, it wedged the Job
    controller); the Job runs."""
    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "nulls"},
           "spec": {"backoffLimit": None, "template": {"spec": {"restartPolicy": "Never", "containers": [
               {"name": "c", "image": push(cluster, ROOT / "examples" / "pods" / "exit.wasm")}]}}}}
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(job))
    got = json.loads(cluster.kubectl("get", "job", "nulls", "-o", "json").stdout)
    assert got["spec"]["backoffLimit"] == 6
    wait_for(lambda: json.loads(cluster.kubectl("get", "job", "nulls", "-o", "json").stdout)["status"].get(
        "succeeded") == 1, 60, what="the Job with backoffLimit: null completes")
    cluster.kubectl("delete", "job", "nulls", "--wait=false")


def test_a_typo_in_a_deployment_spec_is_an_error_for_kubectl_and_dropped_when_not_validated(
        cluster: ControlPlane) -> None:
    """kubectl apply sends fieldValidation=Strict: a field the kind does not have is a 400
    (`strict decoding error: unknown field "spec.replica"`, as kube-apiserver); with
    --validate=false (Ignore) it is dropped, never stored (attack round 23c)."""
    dep = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "typo"},
           "spec": {"replica": 3, "selector": {"matchLabels": {"app": "typo"}},
                    "template": {"metadata": {"labels": {"app": "typo"}},
                                 "spec": {"containers": [{"name": "c", "image": "x", "imagePullPolicy": "Never"}]}}}}
    out = cluster.kubectl("apply", "-f", "-", input=json.dumps(dep), check=False)
    assert out.returncode != 0 and 'strict decoding error: unknown field "spec.replica"' in out.stderr, out.stderr
    cluster.kubectl("apply", "--validate=false", "-f", "-", input=json.dumps(dep))
    stored = json.loads(cluster.kubectl("get", "deploy", "typo", "-o", "json").stdout)
    cluster.kubectl("delete", "deploy", "typo", "--wait=false")
    assert "replica" not in stored["spec"] and stored["spec"]["replicas"] == 1


def test_kr8s_and_pykube_ng_reach_checkpoints(cluster: ControlPlane) -> None:
    import kr8s
    import pykube

    api = kr8s.api(kubeconfig=str(cluster.kubeconfig))
    assert api.version()["minor"] == "32"
    p = pykube.HTTPClient(pykube.KubeConfig.from_file(str(cluster.kubeconfig)))
    Checkpoint = pykube.object_factory(p, "kube32.io/v1", "Checkpoint")
    ck = Checkpoint(p, {"apiVersion": "kube32.io/v1", "kind": "Checkpoint",
                        "metadata": {"name": "pk1", "namespace": "default"}, "spec": {"podName": "nothere"}})
    ck.create()
    assert "pk1" in [c.name for c in Checkpoint.objects(p).filter(namespace="default")]
    wait_for(lambda: ck.reload() or ck.obj["status"]["phase"] == "Failed", 20, what="the checkpoint to fail")
    assert 'pod "nothere" not found' in ck.obj["status"]["message"]
    got = list(kr8s.get("checkpoints", "pk1", namespace="default", api=api))
    assert [c.name for c in got] == ["pk1"] and got[0].raw["spec"]["podName"] == "nothere"
    got[0].label({"seen-by": "kr8s"})
    ck.reload()
    assert ck.labels["seen-by"] == "kr8s"
    ck.delete()
    wait_for(lambda: not ck.exists(), 20, what="the checkpoint to go")


def test_the_kubernetes_client_sees_the_defaults(cluster: ControlPlane) -> None:
    from kubernetes import client

    api = client.CoreV1Api(cluster.client())
    assert client.VersionApi(api.api_client).get_code().minor == "32"
    svc = api.create_namespaced_service("default", {
        "apiVersion": "v1", "kind": "Service", "metadata": {"name": "fid"},
        "spec": {"type": "NodePort", "selector": {"app": "fid"}, "ports": [{"port": 80}]}})
    try:
        assert svc.spec.ip_families == ["IPv4"] and svc.spec.ip_family_policy == "SingleStack"
        assert svc.spec.internal_traffic_policy == "Cluster" and svc.spec.external_traffic_policy == "Cluster"
        assert svc.spec.cluster_ips == [svc.spec.cluster_ip] and svc.spec.ports[0].protocol == "TCP"
    finally:
        api.delete_namespaced_service("fid", "default")
    pod = api.create_namespaced_pod("default", {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "fid-ports"},
        "spec": {"nodeName": "nowhere", "containers": [{"name": "c", "image": "kube32.io/wasm-sha256:" + "ab" * 32,
                                                        "ports": [{"containerPort": 8080}]}]}})
    try:
        assert pod.spec.containers[0].ports[0].protocol == "TCP"
    finally:
        api.delete_namespaced_pod("fid-ports", "default", grace_period_seconds=0)


def test_bindings_are_create_only_and_bind_a_pod_as_pods_binding_does(cluster: ControlPlane, curl: Curl) -> None:
    """POST /api/v1/namespaces/<ns>/bindings (the Python client's create_namespaced_binding)
    binds the pod its metadata.name names; a GET is 405 as in kube-apiserver, not 404."""
    from kubernetes import client

    code, body = curl("/api/v1/namespaces/default/bindings")
    assert code == 405 and "MethodNotAllowed" in body, body
    listed = json.loads(cluster.kubectl("get", "--raw", "/api/v1").stdout)["resources"]
    assert {"name": "bindings", "verbs": ["create"], "namespaced": True, "kind": "Binding"}.items() <= next(
        r for r in listed if r["name"] == "bindings").items()
    api = client.CoreV1Api(cluster.client())
    api.create_namespaced_pod("default", {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "fid-bind"},
        "spec": {"schedulerName": "someone-else",
                 "containers": [{"name": "c", "image": "kube32.io/wasm-sha256:" + "ab" * 32}]}})
    try:
        target = {"apiVersion": "v1", "kind": "Node", "name": "nowhere"}
        api.create_namespaced_binding("default", {"apiVersion": "v1", "kind": "Binding",
                                                  "metadata": {"name": "fid-bind"}, "target": target},
                                      _preload_content=False)
        assert api.read_namespaced_pod("fid-bind", "default").spec.node_name == "nowhere"
        again = cluster.kubectl("create", "--raw", "/api/v1/namespaces/default/bindings", "-f", "-", check=False,
                                input=json.dumps({"metadata": {"name": "fid-bind"}, "target": target}))
        assert again.returncode != 0 and 'already assigned to node "nowhere"' in again.stderr, again.stderr
        nameless = cluster.kubectl("create", "--raw", "/api/v1/namespaces/default/bindings", "-f", "-",
                                   check=False, input=json.dumps({"target": target}))
        assert nameless.returncode != 0 and "metadata.name" in nameless.stderr, nameless.stderr
    finally:
        api.delete_namespaced_pod("fid-bind", "default", grace_period_seconds=0)


def test_health_checks_are_listed(cluster: ControlPlane, curl: Curl) -> None:
    code, body = curl("/readyz?verbose", token=False)
    assert code == 200 and body.splitlines() == ["[+]ping ok", "[+]log ok", "[+]etcd ok", "[+]shutdown ok",
                                                 "readyz check passed"]
    code, body = curl("/livez?verbose", token=False)
    assert code == 200 and "[+]etcd ok" in body and body.endswith("livez check passed\n")
    assert curl("/healthz", token=False) == (200, "ok")
    assert cluster.kubectl("get", "--raw", "/readyz/etcd").stdout == "ok"
    assert curl("/readyz/etcd", token=False)[0] == 401   # one check's detail is not public


def test_the_data_put_415_names_octet_stream(cluster: ControlPlane, curl: Curl) -> None:
    ck = {"apiVersion": "kube32.io/v1", "kind": "Checkpoint", "metadata": {"name": "put415"},
          "spec": {"podName": "nothere"}}
    cluster.kubectl("create", "-f", "-", input=json.dumps(ck))
    code, body = curl("/apis/kube32.io/v1/namespaces/default/checkpoints/put415/data", "-X", "PUT",
                      "-H", "Content-Type: application/json", "--data-binary", "{}")
    assert code == 415 and "accepted media types include: application/octet-stream" in json.loads(body)["message"]
    cluster.kubectl("delete", "checkpoint", "put415")


def test_kubectl_logs_follow_ends_when_the_container_exits(cluster: ControlPlane) -> None:
    image = push(cluster, CLOCK)
    cluster.kubectl("run", "clock-f", f"--image={image}", "--restart=Never", "--env=LINES=3",
                    "--env=PERIOD_MS=300")
    wait_for(lambda: cluster.kubectl("get", "pod", "clock-f", "-o", "jsonpath={.status.phase}").stdout
             in ("Running", "Succeeded"), 30, what="the clock pod to run")
    started = time.monotonic()
    out = cluster.kubectl("logs", "-f", "clock-f", timeout=30)
    assert [line.split(" at ")[0] for line in out.stdout.splitlines()] == [
        "clock: tick 1", "clock: tick 2", "clock: tick 3"]
    assert time.monotonic() - started < 20
    assert cluster.kubectl("get", "pod", "clock-f", "-o", "jsonpath={.status.phase}").stdout == "Succeeded"
    cluster.kubectl("delete", "pod", "clock-f")


def test_kube32_cli_output_piped_keeps_a_digest_on_one_line(cluster: ControlPlane, tmp_path: Path) -> None:
    image = push(cluster, ECHO)
    cluster.kubectl("run", "echo-pipe", f"--image={image}", "--restart=Never")
    cluster.kubectl("wait", "--for=condition=Ready", "pod/echo-pipe", "--timeout=60s")
    saved = cli(cluster, "checkpoint", "echo-pipe")
    assert saved.returncode == 0, saved.stderr.decode()
    name = cluster.kubectl("get", "ckpt", "-o", 'jsonpath={.items[?(@.spec.podName=="echo-pipe")].metadata.name}').stdout
    data = subprocess.run(["kubectl", "--kubeconfig", str(cluster.kubeconfig), "get", "--raw",
                           f"/apis/kube32.io/v1/namespaces/default/checkpoints/{name}/data"],
                          capture_output=True, timeout=30, check=True).stdout
    (tmp_path / "s.k32s").write_bytes(data)
    out = subprocess.run([*cli_command(), "snapshot", "inspect", str(tmp_path / "s.k32s")], capture_output=True,
                         text=True, cwd=ROOT, timeout=60, env={"COLUMNS": "40", "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr
    sha = cluster.kubectl("get", "ckpt", name, "-o", "jsonpath={.status.imageSha256}").stdout
    assert len(sha) == 64 and any(sha in line for line in out.stdout.splitlines()), out.stdout
    cluster.kubectl("delete", "pod", "echo-pipe")


def cli_command() -> list[str]:
    return [sys.executable, "-m", "kube32.cli.main"]


def test_readyz_fails_when_the_store_cannot_be_reached(tmp_path: Path) -> None:
    need_etcd()
    etcd = EtcdCluster(tmp_path / "etcd", members=1)
    etcd.start()
    cp = None
    try:
        cp = start_control_plane(tmp_path / "cp", "--store", etcd.store_url, "--no-kubelet")
        wait_for(lambda: cp.kubectl("get", "--raw", "/readyz?verbose").stdout.endswith("readyz check passed\n"),
                 30, what="/readyz")
        etcd.stop()
        said = wait_for(lambda: (lambda r: r.returncode != 0 and r.stdout + r.stderr)(
            cp.kubectl("get", "--raw", "/readyz?verbose", check=False, timeout=20)), 30, what="/readyz to fail")
        assert "[-]etcd failed: reason withheld" in said and "readyz check failed" in said, said
    finally:
        if cp is not None:   # without its store it takes its time to stop: no need to wait for it
            cp.proc.stop(timeout=3)
        etcd.stop()
