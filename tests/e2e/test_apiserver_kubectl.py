"""The API server driven by the real kubectl 1.32 and the kubernetes Python client."""
from __future__ import annotations

import json
import time

import pytest
import yaml

from tests.conftest import ControlPlane, start_control_plane, wait_for  # noqa: F401

POD = """
apiVersion: v1
kind: Pod
metadata:
  name: web-1
  labels: {app: web, tier: front}
spec:
  containers:
  - name: c
    image: kube32.io/wasm-sha256:%s
""" % ("ab" * 32)

DEPLOYMENT = """
apiVersion: apps/v1
kind: Deployment
metadata: {name: web}
spec:
  replicas: %d
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      containers:
      - name: c
        image: wasm://127.0.0.1/counter.wasm
        env: %s
"""

NODE_INFO = {k: "" for k in ("architecture", "bootID", "containerRuntimeVersion", "kernelVersion",
                             "kubeProxyVersion", "kubeletVersion", "machineID", "operatingSystem",
                             "osImage", "systemUUID")}

CHECKPOINT = """
apiVersion: kube32.io/v1
kind: Checkpoint
metadata: {name: ck1}
spec: {podName: web-1, action: Move, target: {nodeName: sim-2}}
status: {phase: Completed}
"""


def apply(cp: ControlPlane, text: str, *extra: str):
    return cp.kubectl("apply", "-f", "-", *extra, input=text)


def test_kubectl_everyday_commands(control_plane: ControlPlane) -> None:
    cp = control_plane
    assert "pod/web-1 created" in apply(cp, POD).stdout
    out = cp.kubectl("get", "pods", "-o", "wide").stdout
    header = out.splitlines()[0].split()
    assert header[:5] == ["NAME", "READY", "STATUS", "RESTARTS", "AGE"] and "NODE" in header
    assert "web-1" in out and "Pending" in out and "0/1" in out

    obj = yaml.safe_load(cp.kubectl("get", "pod", "web-1", "-o", "yaml").stdout)
    assert obj["kind"] == "Pod" and obj["metadata"]["uid"] and obj["status"]["phase"] == "Pending"
    assert "NAMESPACE" in cp.kubectl("get", "pods", "-A").stdout.splitlines()[0]
    assert "web-1" in cp.kubectl("get", "pods", "-l", "app=web").stdout
    assert "No resources found" in cp.kubectl("get", "pods", "-l", "app=db").stderr

    cp.kubectl("label", "pod", "web-1", "color=blue")
    cp.kubectl("annotate", "pod", "web-1", "note=hello")
    shown = cp.kubectl("get", "pods", "--show-labels").stdout
    assert "color=blue" in shown
    cp.kubectl("label", "pod", "web-1", "color-")
    assert "color=blue" not in cp.kubectl("get", "pods", "--show-labels").stdout
    described = cp.kubectl("describe", "pod", "web-1").stdout
    assert "Name:         web-1" in described and "note: hello" in described

    missing = cp.kubectl("get", "pod", "nope", check=False)
    assert missing.returncode == 1
    assert 'Error from server (NotFound): pods "nope" not found' in missing.stderr

    assert 'pod "web-1" deleted' in cp.kubectl("delete", "pod", "web-1", timeout=30).stdout
    assert cp.kubectl("get", "pod", "web-1", check=False).returncode == 1


def test_apply_updates_with_strategic_merge_and_conflicts(control_plane: ControlPlane) -> None:
    cp = control_plane
    apply(cp, DEPLOYMENT % (2, '[{name: A, value: "1"}, {name: B, value: "2"}]'))
    out = apply(cp, DEPLOYMENT % (3, '[{name: B, value: "2"}]')).stdout
    assert "configured" in out
    dep = json.loads(cp.kubectl("get", "deploy", "web", "-o", "json").stdout)
    assert dep["spec"]["replicas"] == 3
    assert dep["spec"]["template"]["spec"]["containers"][0]["env"] == [{"name": "B", "value": "2"}]
    assert dep["metadata"]["generation"] == 2
    header = cp.kubectl("get", "deploy", "-o", "wide").stdout.splitlines()[0].split()
    assert header[:5] == ["NAME", "READY", "UP-TO-DATE", "AVAILABLE", "AGE"]

    # A replace with a stale resourceVersion is refused with the Kubernetes message.
    stale = cp.kubectl("get", "deploy", "web", "-o", "json").stdout
    cp.kubectl("scale", "deploy", "web", "--replicas=4")
    refused = cp.kubectl("replace", "-f", "-", input=stale, check=False)
    assert refused.returncode == 1
    assert ('Error from server (Conflict)' in refused.stderr
            and "the object has been modified; please apply your changes to the latest version" in refused.stderr)

    # kubectl scale owns the replicas now (as on Kubernetes): a server-side apply that
    # changes them conflicts, until it forces them.
    refused = cp.kubectl("apply", "--server-side", "-f", "-", input=DEPLOYMENT % (5, "[]"), check=False)
    assert refused.returncode != 0 and ".spec.replicas" in refused.stderr and "conflict" in refused.stderr, refused.stderr
    ssa = cp.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-", input=DEPLOYMENT % (5, "[]"))
    assert "serverside-applied" in ssa.stdout
    dep = json.loads(cp.kubectl("get", "deploy", "web", "-o", "json", "--show-managed-fields").stdout)
    assert dep["spec"]["replicas"] == 5
    assert any(m["manager"] == "kubectl" and m["operation"] == "Apply" for m in dep["metadata"]["managedFields"])


def test_server_side_apply_conflicts_with_a_plain_write_as_kubernetes_does(control_plane: ControlPlane) -> None:
    """Issue 23 item 6: apply replicas 3, ``kubectl scale --replicas=2``, apply again:
    the conflict names the scale's manager; ``--force-conflicts`` takes the field back;
    every write is recorded in managedFields with its manager and operation."""
    cp = control_plane
    text = DEPLOYMENT.replace("name: web}", "name: ssa}").replace("app: web", "app: ssa")
    cp.kubectl("apply", "--server-side", "-f", "-", input=text % (3, "[]"))
    cp.kubectl("scale", "deploy", "ssa", "--replicas=2")
    cp.kubectl("label", "deploy", "ssa", "team=blue")
    dep = json.loads(cp.kubectl("get", "deploy", "ssa", "-o", "json", "--show-managed-fields").stdout)
    entries = {(m["manager"], m["operation"], m.get("subresource", "")): m for m in dep["metadata"]["managedFields"]}
    scale = next(m for (_, op, sub), m in entries.items() if op == "Update" and sub == "scale")
    assert scale["fieldsV1"] == {"f:spec": {"f:replicas": {}}}, scale
    assert entries[("kubectl-label", "Update", "")]["fieldsV1"] == {"f:metadata": {"f:labels": {"f:team": {}}}}
    assert "f:replicas" not in entries[("kubectl", "Apply", "")]["fieldsV1"]["f:spec"]
    refused = cp.kubectl("apply", "--server-side", "-f", "-", input=text % (3, "[]"), check=False)
    assert refused.returncode != 0, refused.stdout
    assert (f'conflict with "{scale["manager"]}" with subresource "scale" using apps/v1: .spec.replicas'
            in refused.stderr), refused.stderr
    assert json.loads(cp.kubectl("get", "deploy", "ssa", "-o", "json").stdout)["spec"]["replicas"] == 2
    # The same value is no conflict; force takes the field.
    cp.kubectl("apply", "--server-side", "-f", "-", input=text % (2, "[]"))
    cp.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-", input=text % (3, "[]"))
    dep = json.loads(cp.kubectl("get", "deploy", "ssa", "-o", "json", "--show-managed-fields").stdout)
    assert dep["spec"]["replicas"] == 3 and dep["metadata"]["labels"]["team"] == "blue"
    managers = {(m["manager"], m.get("subresource", "")) for m in dep["metadata"]["managedFields"]}
    assert ("kubectl", "") in managers and not any(sub == "scale" for _, sub in managers), managers
    # Through the kubernetes Python client: its writes carry its own manager.
    from kubernetes import client, config
    api = client.AppsV1Api(config.new_client_from_config(str(cp.kubeconfig)))
    api.patch_namespaced_deployment("ssa", "default", {"spec": {"replicas": 1}})
    dep = api.read_namespaced_deployment("ssa", "default")
    assert any(m.manager.startswith("OpenAPI-Generator") and m.operation == "Update"
               for m in dep.metadata.managed_fields), [m.manager for m in dep.metadata.managed_fields]
    cp.kubectl("delete", "deploy", "ssa")


def test_bad_input_is_refused_by_name_and_nothing_is_stored(control_plane: ControlPlane, tmp_path) -> None:
    cp = control_plane
    unknown = cp.kubectl("apply", "-f", "-", input=POD.replace("image:", "foo: 1\n    image:"), check=False)
    assert 'strict decoding error: unknown field "spec.containers[0].foo"' in unknown.stderr
    bad_name = cp.kubectl("apply", "-f", "-", input=POD.replace("name: web-1", "name: Web_1"), check=False)
    assert 'metadata.name: Invalid value: "Web_1"' in bad_name.stderr
    no_image = cp.kubectl("apply", "-f", "-", input=POD.split("    image:")[0], check=False)
    assert "spec.containers[0].image: Required value" in no_image.stderr
    raw = cp.kubectl("create", "--raw", "/api/v1/namespaces/default/pods", "-f", "-",
                     input="{not json", check=False)
    assert raw.returncode == 1 and "not valid JSON" in raw.stderr
    for extra, said in (
            ("    resources: {limits: {memory: 64Kx}}\n",
             'spec.containers[0].resources.limits[memory]: Invalid value: "64Kx": quantities must match the '
             "regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"),
            ("    resources: {limits: {memory: 64Ki}, requests: {memory: 1Mi}}\n",
             'spec.containers[0].resources.requests: Invalid value: "1Mi": must be less than or equal to memory '
             "limit of 64Ki"),
            ("    env: [{name: A=B, value: x}]\n",
             'spec.containers[0].env[0].name: Invalid value: "A=B": a valid environment variable name must '
             "consist only of printable ASCII characters other than '='"),
            ("  terminationGracePeriodSeconds: -5\n",
             "spec.terminationGracePeriodSeconds: Invalid value: -5: must be greater than or equal to 0")):
        refused = cp.kubectl("apply", "-f", "-", input=POD + extra, check=False)
        assert refused.returncode == 1 and said in refused.stderr, refused.stderr
    assert "No resources found" in cp.kubectl("get", "pods").stderr
    big = tmp_path / "k"
    big.write_text("x" * ((1 << 20) + 1))
    too_big = cp.kubectl("create", "configmap", "big", f"--from-file={big}", check=False)
    assert 'ConfigMap "big" is invalid: Too long: must have at most 1048576 bytes' in too_big.stderr
    too_big = cp.kubectl("create", "secret", "generic", "big", f"--from-file={big}", check=False)
    assert 'Secret "big" is invalid: data: Too long: must have at most 1048576 bytes' in too_big.stderr
    assert "big" not in cp.kubectl("get", "configmaps,secrets", "-o", "name").stdout
    assert cp.kubectl("get", "--raw", "/healthz").stdout == "ok"


def test_a_pod_with_several_containers_is_taken_with_a_warning(control_plane: ControlPlane) -> None:
    """Kube32 runs a pod's first container only (docs/reference.md): kubectl says so."""
    cp = control_plane
    two = POD.replace("  containers:\n", "  containers:\n  - name: side\n    image: kube32.io/wasm-sha256:" + "0" * 64
                      + "\n", 1)
    out = cp.kubectl("apply", "-f", "-", input=two)
    assert "Warning: spec.containers: Kube32 runs only the first container of a pod (side); c will not run" \
        in out.stderr, out.stderr
    dep = cp.kubectl("create", "deployment", "pair", "--image=a", "--image=b")
    assert "Warning: spec.template.spec.containers: Kube32 runs only the first container of a pod (a); b will not " \
        "run" in dep.stderr, dep.stderr
    assert "Warning" not in cp.kubectl("apply", "-f", "-", input=POD.replace("web-1", "web-one")).stderr
    cp.kubectl("delete", "pod", "web-1", "web-one", "--wait=false")
    cp.kubectl("delete", "deployment", "pair")


def test_service_types_show_as_kubernetes_shows_them(control_plane: ControlPlane) -> None:
    cp = control_plane
    cp.kubectl("create", "service", "externalname", "ext", "--external-name=example.com")
    cp.kubectl("create", "service", "loadbalancer", "lb", "--tcp=80:80")
    rows = {line.split()[0]: line.split() for line in cp.kubectl("get", "svc", "ext", "lb").stdout.splitlines()[1:]}
    assert rows["ext"][1:4] == ["ExternalName", "<none>", "example.com"], rows
    assert rows["lb"][1] == "LoadBalancer" and rows["lb"][3] == "<pending>", rows
    no_name = cp.kubectl("create", "-f", "-", check=False, input=json.dumps(
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "noname"}, "spec": {"type": "ExternalName"}}))
    assert 'The Service "noname" is invalid: spec.externalName: Required value' in no_name.stderr, no_name.stderr
    cp.kubectl("delete", "service", "ext", "lb")


def test_get_watch_sees_a_change(control_plane: ControlPlane) -> None:
    cp = control_plane
    apply(cp, POD)
    watcher = cp.kubectl_bg("get", "pods", "-w", "-o", "custom-columns=NAME:.metadata.name,COLOR:.metadata.labels.color")
    try:
        time.sleep(1.5)
        cp.kubectl("label", "pod", "web-1", "color=green")
        deadline = time.monotonic() + 15
        seen = ""
        import os
        os.set_blocking(watcher.stdout.fileno(), False)
        while time.monotonic() < deadline and "green" not in seen:
            seen += watcher.stdout.read() or ""
            time.sleep(0.1)
        assert "green" in seen, seen
    finally:
        watcher.kill()


def test_nodes_cordon_uncordon_and_table(control_plane: ControlPlane) -> None:
    cp = control_plane
    api = cp.client()
    from kubernetes import client
    core = client.CoreV1Api(api)
    core.create_node({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "sim-1",
                      "labels": {"node-role.kubernetes.io/worker": ""}},
                      "status": {"conditions": [{"type": "Ready", "status": "True"}],
                                 "nodeInfo": {k: "" for k in (
                                     "architecture", "bootID", "containerRuntimeVersion", "kernelVersion",
                                     "kubeProxyVersion", "machineID", "operatingSystem", "osImage",
                                     "systemUUID")} | {"kubeletVersion": "v1.32.4-kube32"}}})
    out = cp.kubectl("get", "nodes").stdout.splitlines()
    assert out[0].split() == ["NAME", "STATUS", "ROLES", "AGE", "VERSION"]
    assert out[1].split()[:3] == ["sim-1", "Ready", "worker"]
    assert "cordoned" in cp.kubectl("cordon", "sim-1").stdout
    assert "Ready,SchedulingDisabled" in cp.kubectl("get", "nodes").stdout
    assert "uncordoned" in cp.kubectl("uncordon", "sim-1").stdout
    node = json.loads(cp.kubectl("get", "node", "sim-1", "-o", "json").stdout)
    assert "unschedulable" not in node["spec"]


def test_checkpoints_table_and_status_rules(control_plane: ControlPlane) -> None:
    cp = control_plane
    ck = json.loads(cp.kubectl("create", "-f", "-", "-o", "json", input=CHECKPOINT).stdout)
    assert ck["status"] == {"phase": "Pending"}, "status is kept out of creates"
    # The Checkpoint controller then fails it: its pod does not exist.
    wait_for(lambda: "Failed" in cp.kubectl("get", "ckpt", "ck1").stdout, 10, what="the controller's verdict")
    out = cp.kubectl("get", "checkpoints").stdout.splitlines()
    assert out[0].split() == ["NAME", "POD", "ACTION", "PHASE", "NODE", "SIZE", "AGE"]
    assert out[1].split()[:4] == ["ck1", "web-1", "Move", "Failed"]
    assert 'pod "web-1" not found' in cp.kubectl("get", "ckpt", "-o", "wide").stdout
    wide = cp.kubectl("get", "ckpt", "-o", "wide").stdout.splitlines()[0]
    assert wide.split()[-4:] == ["TARGET", "NEW", "POD", "MESSAGE"]

    from kubernetes import client
    custom = client.CustomObjectsApi(cp.client())
    custom.patch_namespaced_custom_object("kube32.io", "v1", "default", "checkpoints", "ck1",
                                          {"status": {"phase": "Saved"}})
    assert custom.get_namespaced_custom_object("kube32.io", "v1", "default", "checkpoints", "ck1")["status"]["phase"] == "Failed"
    custom.patch_namespaced_custom_object_status("kube32.io", "v1", "default", "checkpoints", "ck1",
                                                 {"status": {"phase": "Failed", "message": "no room"},
                                                  "spec": {"podName": "other"}})
    got = custom.get_namespaced_custom_object("kube32.io", "v1", "default", "checkpoints", "ck1")
    assert got["status"]["phase"] == "Failed" and got["spec"]["podName"] == "web-1"
    assert "no room" in cp.kubectl("get", "ckpt", "-o", "wide").stdout


def test_python_client_lists_creates_watches_and_patches(control_plane: ControlPlane) -> None:
    from kubernetes import client, watch
    core = client.CoreV1Api(control_plane.client())
    core.create_namespaced_config_map("default", {"metadata": {"name": "cfg"}, "data": {"a": "1"}})
    names = [c.metadata.name for c in core.list_namespaced_config_map("default").items]
    assert names == ["cfg"]
    rv = core.list_namespaced_config_map("default").metadata.resource_version
    core.patch_namespaced_config_map("cfg", "default", {"data": {"b": "2"}})
    w = watch.Watch()
    events = []
    for ev in w.stream(core.list_namespaced_config_map, "default", resource_version=rv, timeout_seconds=5):
        events.append((ev["type"], ev["object"].data))
        w.stop()
    assert events == [("MODIFIED", {"a": "1", "b": "2"})]
    with pytest.raises(client.ApiException) as err:
        core.create_namespaced_config_map("default", {"metadata": {"name": "cfg"}})
    assert err.value.status == 409 and json.loads(err.value.body)["reason"] == "AlreadyExists"


def test_objects_survive_a_restart(tmp_path) -> None:
    cp = start_control_plane(tmp_path / "cp")
    try:
        apply(cp, POD)
        uid = json.loads(cp.kubectl("get", "pod", "web-1", "-o", "json").stdout)["metadata"]["uid"]
    finally:
        assert cp.proc.stop() == 0
    cp2 = start_control_plane(tmp_path / "cp")
    try:
        pod = json.loads(cp2.kubectl("get", "pod", "web-1", "-o", "json").stdout)
        assert pod["metadata"]["uid"] == uid
        cp2.kubectl("label", "pod", "web-1", "after=restart")
        assert int(json.loads(cp2.kubectl("get", "pod", "web-1", "-o", "json").stdout)["metadata"]["resourceVersion"]) > int(pod["metadata"]["resourceVersion"])
    finally:
        cp2.proc.stop()


def test_requests_without_a_token_are_refused(control_plane: ControlPlane) -> None:
    import ssl
    import urllib.request
    import urllib.error
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(f"{control_plane.server}/api/v1/pods", context=ctx)
    assert err.value.code == 401
    with urllib.request.urlopen(f"{control_plane.server}/version", context=ctx) as r:
        assert json.load(r)["minor"] == "32"


def test_pod_replacement_is_one_write_with_a_new_uid(control_plane: ControlPlane) -> None:
    """What a move does: same name, new uid, new node, and watchers filtered by node see it move."""
    cp = control_plane
    from kubernetes import client as k8s
    for node in ("sim-1", "sim-2"):  # pods bound to nodes that do not exist are garbage
        k8s.CoreV1Api(cp.client()).create_node({"metadata": {"name": node}, "status": {
            "conditions": [{"type": "Ready", "status": "True"}], "nodeInfo": NODE_INFO}})
    apply(cp, POD.replace("spec:\n", "spec:\n  nodeName: sim-1\n"))
    old = json.loads(cp.kubectl("get", "pod", "web-1", "-o", "json").stdout)
    api = cp.client()
    sim2 = []
    import threading
    from kubernetes import client, watch
    core = client.CoreV1Api(api)
    rv = core.list_namespaced_pod("default").metadata.resource_version

    def watch_node(node: str, out: list) -> None:
        for ev in watch.Watch().stream(core.list_namespaced_pod, "default", field_selector=f"spec.nodeName={node}",
                                       resource_version=rv, timeout_seconds=5):
            out.append((ev["type"], ev["object"].metadata.uid))
            if len(out) >= 1:
                break
    sim1: list = []
    threads = [threading.Thread(target=watch_node, args=("sim-1", sim1)),
               threading.Thread(target=watch_node, args=("sim-2", sim2))]
    for t in threads:
        t.start()
    time.sleep(1)
    new = dict(old)
    new["spec"] = dict(old["spec"], nodeName="sim-2")
    new["metadata"] = {**old["metadata"], "annotations": {"kube32.io/restore-from": "ck1"}}
    out = replace(cp, old["metadata"]["uid"], new)
    for t in threads:
        t.join(10)
    assert out["metadata"]["uid"] != old["metadata"]["uid"] and out["spec"]["nodeName"] == "sim-2"
    assert out["status"]["phase"] == "Pending"
    assert sim1 == [("DELETED", old["metadata"]["uid"])] and sim2 == [("ADDED", out["metadata"]["uid"])]
    from kube32.client import ApiError
    with pytest.raises(ApiError) as err:  # the old uid is gone: a second replace conflicts
        replace(cp, old["metadata"]["uid"], new)
    assert err.value.code == 409


def replace(cp: ControlPlane, uid: str, pod: dict) -> dict:
    import asyncio
    from kube32.client import Client

    async def call() -> dict:
        async with Client.from_kubeconfig(cp.kubeconfig) as c:
            return await c._json("POST", "/api/v1/namespaces/default/pods/web-1/replacement",
                                 params={"uid": uid}, body=pod)
    return asyncio.run(call())
