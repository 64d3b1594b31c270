"""Issue 23 (API fidelity), attacked by an outside tester with the clients people use.

Needs a running cluster: ``kube32-sim up --workers 2 --data-dir /tmp/a23`` (or $K23_DIR).
Run: ``.venv/bin/python -m pytest -q tests/attack/test_attack23.py -p no:cacheprovider``.
Passing tests are regression scenarios; failing ones are findings (see the report)."""
from __future__ import annotations

import asyncio
import base64
import json
import subprocess
import threading
import time

import pytest
import yaml

from tests.attack import k23
from tests.attack.k23 import Api, kubectl, uniq, wait_until

pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module")
def api() -> Api:
    if not k23.KUBECONFIG.exists():
        pytest.skip(f"no cluster at {k23.DIR}")
    return Api()


def watch_lines(api: Api, path: str, seconds: float) -> list[dict]:
    sep = "&" if "?" in path else "?"
    r = api.get(f"{path}{sep}watch=1&timeoutSeconds={int(seconds)}", stream=True, timeout=seconds + 20)
    assert r.status_code == 200, r.text
    return [json.loads(line) for line in r.iter_lines() if line]


class Watcher(threading.Thread):
    def __init__(self, api: Api, path: str, seconds: float) -> None:
        super().__init__(daemon=True)
        self.api, self.path, self.seconds, self.events = api, path, seconds, []

    def run(self) -> None:
        self.events = watch_lines(self.api, self.path, self.seconds)


# --------------------------------------------------------------------------- moves and watches

def test_watch_resumed_at_the_deleted_events_rv_still_sees_the_replacement(api: Api) -> None:
    """client-go's reflector resumes a broken watch at the resourceVersion of the last event
    it got.  A move's DELETED and ADDED share one resourceVersion, so a watch that broke
    right after the DELETED and resumes from its RV must still get the ADDED (in
    Kubernetes every event has its own RV and a watch from N gives every event after N)."""
    name = uniq("rsm")
    pod = k23.run_counter(name)
    w = Watcher(api, f"/api/v1/namespaces/default/pods?fieldSelector=metadata.name={name}"
                     f"&resourceVersion={pod['metadata']['resourceVersion']}", 8)
    w.start()
    time.sleep(0.5)
    k23.cli("move", name)
    w.join()
    deleted = [e for e in w.events if e["type"] == "DELETED"]
    assert deleted, w.events
    rv = deleted[0]["object"]["metadata"]["resourceVersion"]
    resumed = watch_lines(api, f"/api/v1/namespaces/default/pods?fieldSelector=metadata.name={name}"
                               f"&resourceVersion={rv}", 2)
    new_uid = k23.get_json("pod", name)["metadata"]["uid"]
    kubectl("delete", "pod", name, "--wait=false")
    # the reflector now holds no pod (it applied DELETED); it must be told of the new uid
    # by an ADDED (an informer keyed on uid would otherwise never call its add handler)
    assert any(e["type"] == "ADDED" and e["object"]["metadata"]["uid"] == new_uid for e in resumed), \
        [(e["type"], e["object"]["metadata"].get("resourceVersion")) for e in resumed]


def test_deleted_event_in_a_node_filtered_watch_names_the_replacement(api: Api) -> None:
    """moving-pods.md: a watch sees a DELETED event of the old pod 'with the annotation
    kube32.io/replaced-by naming the new uid'.  A kubelet-style watch filtered by
    spec.nodeName sees the pod leave its node: its DELETED should say the same."""
    name = uniq("nfw")
    pod = k23.run_counter(name)
    src = pod["spec"]["nodeName"]
    w = Watcher(api, f"/api/v1/pods?fieldSelector=spec.nodeName={src}"
                     f"&resourceVersion={pod['metadata']['resourceVersion']}", 6)
    w.start()
    time.sleep(0.5)
    k23.cli("move", name)
    w.join()
    new_uid = k23.get_json("pod", name)["metadata"]["uid"]
    kubectl("delete", "pod", name, "--wait=false")
    dels = [e["object"] for e in w.events if e["type"] == "DELETED" and e["object"]["metadata"]["name"] == name]
    assert dels, w.events
    assert dels[0]["metadata"]["uid"] == pod["metadata"]["uid"]
    assert (dels[0]["metadata"].get("annotations") or {}).get("kube32.io/replaced-by") == new_uid, dels[0]["metadata"]


def test_kubectl_wait_for_delete_returns_on_a_move() -> None:
    name = uniq("wfd")
    k23.run_counter(name)
    p = subprocess.Popen(["kubectl", "wait", "--for=delete", f"pod/{name}", "--timeout=40s"],
                         env=k23.env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    time.sleep(1.5)
    k23.cli("move", name)
    out, _ = p.communicate(timeout=60)
    kubectl("delete", "pod", name, "--wait=false")
    assert p.returncode == 0 and "condition met" in out, out


def test_kubectl_get_watch_output_watch_events_through_a_move() -> None:
    name = uniq("kgw")
    k23.run_counter(name)
    p = subprocess.Popen(["kubectl", "get", "pod", name, "-w", "--output-watch-events", "--request-timeout=12s"],
                         env=k23.env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    time.sleep(1.5)
    k23.cli("move", name)
    time.sleep(3)
    p.terminate()
    out, _ = p.communicate(timeout=20)
    kubectl("delete", "pod", name, "--wait=false")
    lines = [ln.split()[0] for ln in out.splitlines()[1:] if ln.strip()]
    assert "DELETED" in lines and "ADDED" in lines[lines.index("DELETED"):], out


def test_kubectl_events_for_a_moved_pod() -> None:
    name = uniq("evf")
    k23.run_counter(name)
    k23.cli("move", name)
    out = wait_until(lambda: (o := kubectl("events", "--for", f"pod/{name}").stdout) and "Moved" in o and o,
                     30, what="Moved event")
    kubectl("delete", "pod", name, "--wait=false")
    assert "Moving" in out and "Moved" in out, out


# --------------------------------------------------------------------------- kubectl verbs

DEP = """apiVersion: apps/v1
kind: Deployment
metadata: {{name: {name}, labels: {{app: {name}}}}}
spec:
  replicas: {replicas}
  selector: {{matchLabels: {{app: {name}}}}}
  template:
    metadata: {{labels: {{app: {name}}}}}
    spec:
      containers: [{{name: main, image: "{image}"}}]
"""


def dep(name: str, replicas: int) -> str:
    return DEP.format(name=name, replicas=replicas, image=k23.image("counter.wasm"))


def test_ssa_conflict_after_kubectl_scale_and_force_conflicts() -> None:
    name = uniq("ssa")
    f = k23.tmpfile(dep(name, 2))
    kubectl("apply", "--server-side", "-f", f)
    kubectl("scale", f"deploy/{name}", "--replicas=1")
    p = kubectl("apply", "--server-side", "-f", f, check=False)
    assert p.returncode != 0 and 'conflict with "kubectl" with subresource "scale" using apps/v1: .spec.replicas' in p.stderr, p.stderr
    kubectl("apply", "--server-side", "--force-conflicts", "-f", f)
    d = k23.get_json("deploy", name, "--show-managed-fields")
    mgrs = {(m["manager"], m["operation"], m.get("subresource", "")) for m in d["metadata"]["managedFields"]}
    kubectl("delete", "deploy", name, "--wait=false")
    assert d["spec"]["replicas"] == 2
    assert ("kubectl", "Apply", "") in mgrs, mgrs


def test_deployment_rollout_restart_history_undo_status() -> None:
    name = uniq("ro")
    kubectl("apply", "-f", "-", input=dep(name, 1))
    kubectl("rollout", "status", f"deploy/{name}", "--timeout=90s", timeout=100)
    kubectl("annotate", f"deploy/{name}", "kubernetes.io/change-cause=first")
    kubectl("rollout", "restart", f"deploy/{name}")
    kubectl("annotate", f"deploy/{name}", "kubernetes.io/change-cause=second", "--overwrite")
    kubectl("rollout", "status", f"deploy/{name}", "--timeout=90s", timeout=100)
    hist = kubectl("rollout", "history", f"deploy/{name}").stdout
    kubectl("rollout", "undo", f"deploy/{name}", "--to-revision=1")
    kubectl("rollout", "status", f"deploy/{name}", "--timeout=90s", timeout=100)
    hist2 = kubectl("rollout", "history", f"deploy/{name}").stdout
    d = k23.get_json("deploy", name)
    kubectl("delete", "deploy", name, "--wait=false")
    assert "1 " in hist and "2 " in hist, hist
    assert d["metadata"]["annotations"]["deployment.kubernetes.io/revision"] == "3", d["metadata"]["annotations"]
    assert "kubectl.kubernetes.io/restartedAt" not in (d["spec"]["template"]["metadata"].get("annotations") or {})
    assert [ln.split()[0] for ln in hist2.splitlines()[2:] if ln.strip()] == ["2", "3"], hist2


def test_patch_three_types_label_resource_version_and_edit() -> None:
    name = uniq("cm")
    kubectl("create", "cm", name, "--from-literal=a=1")
    kubectl("patch", "cm", name, "-p", '{"data":{"b":"2"}}')
    kubectl("patch", "cm", name, "--type=merge", "-p", '{"data":{"c":"3"}}')
    kubectl("patch", "cm", name, "--type=json", "-p", '[{"op":"remove","path":"/data/a"}]')
    assert k23.get_json("cm", name)["data"] == {"b": "2", "c": "3"}
    p = kubectl("label", "cm", name, "x=1", "--resource-version=1", check=False)
    assert p.returncode != 0 and "Conflict" in p.stderr, p.stderr
    kubectl("label", "cm", name, "x=1")
    p = kubectl("label", "cm", name, "x=2", check=False)
    assert "already has a value" in p.stderr
    kubectl("label", "cm", name, "x=2", "--overwrite")
    ed = k23.tmpfile('#!/bin/sh\nsed -i \'s/b: "2"/b: edited/\' "$1"\n', suffix=".sh")
    subprocess.run(["chmod", "+x", ed], check=True)
    kubectl("edit", "cm", name, extra_env={"KUBE_EDITOR": ed, "EDITOR": ed})
    got = k23.get_json("cm", name)
    kubectl("delete", "cm", name)
    assert got["data"]["b"] == "edited" and got["metadata"]["labels"]["x"] == "2"


def test_kubectl_diff_and_apply_prune() -> None:
    lab = uniq("pr")
    docs = [{"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": f"{lab}-{i}", "labels": {"set": lab}},
             "data": {"k": "v"}} for i in range(3)]
    k23.apply_yaml(docs, "-l", f"set={lab}", "--prune")
    docs[0]["data"]["k"] = "changed"
    p = kubectl("diff", "-f", "-", input=yaml.safe_dump_all(docs[:2]), check=False)
    assert p.returncode == 1 and "changed" in p.stdout, (p.returncode, p.stdout, p.stderr)
    out = k23.apply_yaml(docs[:2], "-l", f"set={lab}", "--prune").stdout
    names = kubectl("get", "cm", "-l", f"set={lab}", "-o", "name").stdout.split()
    kubectl("delete", "cm", "-l", f"set={lab}")
    assert f"configmap/{lab}-2 pruned" in out, out
    assert sorted(names) == [f"configmap/{lab}-0", f"configmap/{lab}-1"]


def test_custom_columns_jsonpath_chunk_size() -> None:
    lab = uniq("cc")
    for i in range(5):
        kubectl("create", "cm", f"{lab}-{i}", f"--from-literal=i={i}")
        kubectl("label", "cm", f"{lab}-{i}", f"set={lab}")
    out = kubectl("get", "cm", "-l", f"set={lab}", "--chunk-size=2", "-o",
                  "custom-columns=NAME:.metadata.name,I:.data.i", "--no-headers").stdout.split("\n")
    jp = kubectl("get", "cm", "-l", f"set={lab}", "--chunk-size=1", "-o",
                 "jsonpath={range .items[*]}{.data.i}{end}").stdout
    kubectl("delete", "cm", "-l", f"set={lab}")
    assert [ln.split() for ln in out if ln] == [[f"{lab}-{i}", str(i)] for i in range(5)]
    assert jp == "01234"


def test_wait_for_jsonpath_and_api_resources_wide_and_explain_recursive() -> None:
    name = uniq("wj")
    k23.run_counter(name)
    kubectl("wait", f"pod/{name}", "--for=jsonpath={.status.phase}=Running", "--timeout=20s")
    kubectl("delete", "pod", name, "--wait=false")
    ar = kubectl("api-resources", "-o", "wide").stdout
    assert "checkpoints" in ar and "jobs" in ar and "VERBS" in ar
    ex = kubectl("explain", "pod.spec.containers", "--recursive").stdout
    assert "image\t<string>" in ex or "image <string>" in ex.replace("\t", " "), ex[:400]
    ex = kubectl("explain", "checkpoint.status", "--recursive").stdout
    for f in ("phase", "blockers", "snapshotSha256", "podTimeMs"):
        assert f in ex, ex


def test_auth_can_i_list_for_a_serviceaccount() -> None:
    out = kubectl("auth", "can-i", "--list", "--as=system:serviceaccount:default:default").stdout
    assert "selfsubjectaccessreviews.authorization.k8s.io" in out
    assert kubectl("auth", "can-i", "create", "pods", "--as=system:serviceaccount:default:default",
                   check=False).stdout.strip() == "no"


def test_kubectl_autoscale_is_either_served_or_refused_cleanly() -> None:
    """kubectl autoscale writes an autoscaling/v2 HorizontalPodAutoscaler."""
    name = uniq("hpa")
    kubectl("apply", "-f", "-", input=dep(name, 1))
    p = kubectl("autoscale", f"deploy/{name}", "--min=1", "--max=2", "--cpu-percent=50", check=False)
    kubectl("delete", "deploy", name, "--wait=false")
    # Kube32 lists HorizontalPodAutoscalers but does not run them: a clean refusal saying why
    assert p.returncode == 0 or ("MethodNotAllowed" in p.stderr and "Kube32 does not run" in p.stderr), p.stderr


# --------------------------------------------------------------------------- concurrent writers

def _parallel(fn, n: int, workers: int = 12) -> list:
    import concurrent.futures as cf
    with cf.ThreadPoolExecutor(workers) as ex:
        return list(ex.map(fn, range(n)))


@pytest.mark.parametrize("ptype", ["application/merge-patch+json", "application/json-patch+json",
                                   "application/strategic-merge-patch+json"])
def test_concurrent_patches_without_resource_version_never_conflict(api: Api, ptype: str) -> None:
    """kube-apiserver retries a PATCH that carries no resourceVersion against the latest
    object (GuaranteedUpdate): two `kubectl annotate` or two controllers patching one
    object both succeed.  A 409 is only for a patch that names a stale resourceVersion."""
    name = uniq("hammer")
    # a JSON patch's "add" needs /data to exist (RFC 6902 4.1; kube-apiserver answers 422 too)
    kubectl("create", "cm", name, "--from-literal=seed=1")

    def one(i: int) -> tuple[int, str]:
        body = (f'[{{"op":"add","path":"/data/k{i}","value":"v"}}]' if "json-patch" in ptype
                else f'{{"data":{{"k{i}":"v"}}}}')
        r = api.req("PATCH", f"/api/v1/namespaces/default/configmaps/{name}", data=body,
                    headers={"Content-Type": ptype})
        return r.status_code, r.text[:200]
    res = _parallel(one, 60)
    data = k23.get_json("cm", name).get("data") or {}
    kubectl("delete", "cm", name)
    bad = [r for r in res if r[0] != 200]
    assert not bad, f"{len(bad)} of 60 patches failed, e.g. {bad[0]}"
    assert len(data) == 61


def test_concurrent_server_side_applies_of_disjoint_fields_never_conflict(api: Api) -> None:
    name = uniq("ssah")
    kubectl("create", "cm", name)

    def one(i: int) -> tuple[int, str]:
        body = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": {f"s{i}": "v"}}
        r = api.req("PATCH", f"/api/v1/namespaces/default/configmaps/{name}?fieldManager=m{i}",
                    data=json.dumps(body), headers={"Content-Type": "application/apply-patch+yaml"})
        return r.status_code, r.text[:200]
    res = _parallel(one, 40)
    kubectl("delete", "cm", name)
    bad = [r for r in res if r[0] != 200]
    assert not bad, f"{len(bad)} of 40 applies failed, e.g. {bad[0]}"


def test_concurrent_unconditional_puts_never_conflict(api: Api) -> None:
    """A PUT without metadata.resourceVersion is an unconditional update for ConfigMaps
    (AllowUnconditionalUpdate): kube-apiserver retries it, it never answers 409."""
    name = uniq("puth")
    kubectl("create", "cm", name)

    def one(i: int) -> int:
        body = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": {"p": str(i)}}
        return api.req("PUT", f"/api/v1/namespaces/default/configmaps/{name}", json=body).status_code
    res = _parallel(one, 60)
    kubectl("delete", "cm", name)
    assert res.count(200) == 60, sorted(set(res))


def test_two_kubectl_annotates_at_once_both_succeed() -> None:
    name = uniq("ann")
    kubectl("create", "cm", name)
    procs = [subprocess.Popen(["kubectl", "annotate", "cm", name, f"a{i}=x"], env=k23.env(),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for i in range(8)]
    outs = [(p.wait(60), p.stdout.read()) for p in procs]  # type: ignore[union-attr]
    ann = k23.get_json("cm", name)["metadata"].get("annotations") or {}
    kubectl("delete", "cm", name)
    assert all(rc == 0 for rc, _ in outs), outs
    assert len([k for k in ann if k.startswith("a")]) == 8


def test_pods_written_by_others_while_starting_still_report_running(api: Api) -> None:
    """A controller (or a user's kubectl annotate) writing a pod while its kubelet reports
    its status must not lose the kubelet's write: the pod runs and must say so
    (found: pods that answer through the proxy but stay Pending, never Ready, so a
    Deployment rollout never completes)."""
    lab = uniq("busy")
    names = [f"{lab}-{i}" for i in range(6)]
    for n in names:
        pod = k23.counter_pod(n)
        pod["metadata"]["labels"]["set"] = lab
        k23.create_yaml(pod)
    stop = time.time() + 12

    def churn(i: int) -> None:
        j = 0
        while time.time() < stop:
            api.req("PATCH", f"/api/v1/namespaces/default/pods/{names[i % len(names)]}",
                    data=json.dumps({"metadata": {"annotations": {f"churn{i}": str(j)}}}),
                    headers={"Content-Type": "application/merge-patch+json"})
            j += 1
    _parallel(churn, 6, workers=6)
    time.sleep(8)
    pods = k23.get_json("pods", "-l", f"set={lab}")["items"]
    kubectl("delete", "pods", "-l", f"set={lab}", "--wait=false")
    phases = {p["metadata"]["name"]: p["status"].get("phase") for p in pods}
    assert set(phases.values()) == {"Running"}, phases


# --------------------------------------------------------------------------- lists and watches

def test_paging_is_consistent_and_tokens_are_validated(api: Api) -> None:
    lab = uniq("pg")
    for i in range(7):
        kubectl("create", "cm", f"{lab}-{i}")
    base = "/api/v1/namespaces/default/configmaps"
    first = api.get(f"{base}?limit=3").json()
    tok = first["metadata"]["continue"]
    assert tok and first["metadata"]["remainingItemCount"] >= 4
    kubectl("create", "cm", f"{lab}-zz")   # written between pages: not in this list
    names = [i["metadata"]["name"] for i in first["items"]]
    while tok:
        page = api.get(f"{base}?limit=3&continue={tok}").json()
        names += [i["metadata"]["name"] for i in page["items"]]
        tok = page["metadata"].get("continue")
    garbage = api.get(f"{base}?limit=3&continue=garbage")
    both = api.get(f"{base}?limit=3&continue={first['metadata']['continue']}&resourceVersion=5")
    # a token for another resource's keys
    raw = json.loads(base64.urlsafe_b64decode(first["metadata"]["continue"] + "=="))
    raw["start"] = "../../secrets/default/x"
    forged = base64.urlsafe_b64encode(json.dumps(raw).encode()).decode().rstrip("=")
    fr = api.get(f"{base}?limit=3&continue={forged}")
    kubectl("delete", "cm", *[f"{lab}-{i}" for i in range(7)], f"{lab}-zz")
    assert [n for n in names if n.startswith(lab)] == [f"{lab}-{i}" for i in range(7)]
    assert garbage.status_code == 400 and garbage.json()["reason"] == "BadRequest"
    assert both.status_code == 400, both.text
    assert fr.status_code == 400, fr.text


def test_label_selector_page_has_no_remaining_count(api: Api) -> None:
    r = api.get("/api/v1/namespaces/kube-system/configmaps?limit=1&labelSelector=nope!=x").json()
    assert "remainingItemCount" not in r["metadata"]


def test_watch_bookmarks_and_initial_events_end(api: Api) -> None:
    name = uniq("wl")
    kubectl("create", "cm", name)
    evs = watch_lines(api, "/api/v1/namespaces/default/configmaps?sendInitialEvents=true"
                           "&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true", 3)
    kubectl("delete", "cm", name)
    types = [e["type"] for e in evs]
    assert "ADDED" in types
    bm = [e for e in evs if e["type"] == "BOOKMARK"]
    assert bm and bm[0]["object"]["metadata"]["annotations"]["k8s.io/initial-events-end"] == "true"
    assert types.index("BOOKMARK") > max(i for i, t in enumerate(types) if t == "ADDED")
    assert set(bm[0]["object"]) <= {"kind", "apiVersion", "metadata"}
    bad = api.get("/api/v1/namespaces/default/configmaps?watch=1&sendInitialEvents=true")
    assert bad.status_code == 400, bad.text


def test_watch_from_a_compacted_or_future_rv_errors_like_kube_apiserver(api: Api) -> None:
    r = api.get("/api/v1/namespaces/default/configmaps?watch=1&resourceVersion=999999999&timeoutSeconds=2",
                stream=True, timeout=20)
    body = r.raw.read(4000).decode()
    # kube-apiserver: 200 and an ERROR event ... or a 504 "Too large resource version"
    assert r.status_code in (200, 504), (r.status_code, body)
    if r.status_code == 200:
        assert '"ERROR"' in body or body == "", body


def test_python_client_list_paging_watch_with_rv_and_bookmarks() -> None:
    from kubernetes import client, config, watch
    config.load_kube_config(str(k23.KUBECONFIG))
    v1 = client.CoreV1Api()
    lab = uniq("py")
    for i in range(4):
        v1.create_namespaced_config_map("default", client.V1ConfigMap(metadata=client.V1ObjectMeta(
            name=f"{lab}-{i}", labels={"set": lab})))
    got, cont = [], None
    while True:
        r = v1.list_namespaced_config_map("default", label_selector=f"set={lab}", limit=2, _continue=cont)
        got += [c.metadata.name for c in r.items]
        cont = r.metadata._continue
        if not cont:
            break
    rv = r.metadata.resource_version
    v1.patch_namespaced_config_map(f"{lab}-0", "default", {"data": {"x": "1"}})
    seen = []
    w = watch.Watch()
    for ev in w.stream(v1.list_namespaced_config_map, "default", label_selector=f"set={lab}",
                       resource_version=rv, allow_watch_bookmarks=True, timeout_seconds=3):
        seen.append((ev["type"], ev["object"].metadata.name if ev["type"] != "BOOKMARK" else None))
    v1.delete_collection_namespaced_config_map("default", label_selector=f"set={lab}")
    assert got == [f"{lab}-{i}" for i in range(4)]
    assert ("MODIFIED", f"{lab}-0") in seen, seen


def test_dynamic_client_on_checkpoints_and_deployments_scale() -> None:
    from kubernetes import config, dynamic
    from kubernetes.client import api_client
    dc = dynamic.DynamicClient(api_client.ApiClient(configuration=config.load_kube_config(str(k23.KUBECONFIG))))
    ck = dc.resources.get(api_version="kube32.io/v1", kind="Checkpoint")
    lst = ck.get(namespace="default")
    assert lst.kind == "CheckpointList"
    dep_r = dc.resources.get(api_version="apps/v1", kind="Deployment")
    name = uniq("dyn")
    kubectl("apply", "-f", "-", input=dep(name, 1))
    scale = dep_r.subresources["scale"]
    s = scale.get(name=name, namespace="default")
    assert s.kind == "Scale" and s.spec.replicas == 1
    scale.patch(name=name, namespace="default", body={"spec": {"replicas": 0}},
                content_type="application/merge-patch+json")
    d = dep_r.get(name=name, namespace="default")
    kubectl("delete", "deploy", name, "--wait=false")
    assert d.spec.replicas == 0


def test_kubernetes_asyncio_watch() -> None:
    kubernetes_asyncio = pytest.importorskip("kubernetes_asyncio")
    from kubernetes_asyncio import client, config, watch

    async def main() -> list:
        await config.load_kube_config(str(k23.KUBECONFIG))
        async with client.ApiClient() as ac:
            v1 = client.CoreV1Api(ac)
            name = uniq("aio")
            await v1.create_namespaced_config_map("default", {"metadata": {"name": name}})
            r = await v1.list_namespaced_config_map("default", field_selector=f"metadata.name={name}")
            await v1.patch_namespaced_config_map(name, "default", {"data": {"a": "b"}})
            seen = []
            w = watch.Watch()
            async for ev in w.stream(v1.list_namespaced_config_map, "default", field_selector=f"metadata.name={name}",
                                     resource_version=r.metadata.resource_version, timeout_seconds=2):
                seen.append(ev["type"])
            await v1.delete_namespaced_config_map(name, "default")
            return seen
    seen = asyncio.run(main())
    assert seen[:1] == ["MODIFIED"], seen


def test_lightkube_kr8s_pykube_on_checkpoints() -> None:
    name = uniq("lk")
    k23.run_counter(name)
    ck = {"apiVersion": "kube32.io/v1", "kind": "Checkpoint",
          "metadata": {"name": f"{name}-s"}, "spec": {"podName": name}}
    k23.create_yaml(ck)
    wait_until(lambda: k23.get_json("ckpt", f"{name}-s").get("status", {}).get("phase") == "Saved", 60)
    from lightkube import Client, KubeConfig
    from lightkube.generic_resource import create_namespaced_resource
    Ckpt = create_namespaced_resource("kube32.io", "v1", "Checkpoint", "checkpoints")
    lc = Client(config=KubeConfig.from_file(str(k23.KUBECONFIG)))
    got = lc.get(Ckpt, f"{name}-s", namespace="default")
    assert got.status["phase"] == "Saved"
    assert any(c.metadata.name == f"{name}-s" for c in lc.list(Ckpt, namespace="default"))
    import pykube
    pk = pykube.HTTPClient(pykube.KubeConfig.from_file(str(k23.KUBECONFIG)))
    PC = pykube.object_factory(pk, "kube32.io/v1", "Checkpoint")
    o = PC.objects(pk, namespace="default").get(name=f"{name}-s")
    assert o.obj["spec"]["podName"] == name
    import kr8s
    a = kr8s.api(kubeconfig=str(k23.KUBECONFIG))
    objs = list(a.get("checkpoints", namespace="default"))
    kubectl("delete", "pod", name, "--wait=false")
    kubectl("delete", "ckpt", f"{name}-s", "--wait=false")
    assert any(x.name == f"{name}-s" for x in objs)


# --------------------------------------------------------------------------- CRDs

def gadget_crd(group: str) -> dict:
    return {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": f"gadgets.{group}"},
            "spec": {"group": group, "scope": "Namespaced",
                     "names": {"plural": "gadgets", "singular": "gadget", "kind": "Gadget"},
                     "versions": [{"name": "v1", "served": True, "storage": True,
                                   "subresources": {"status": {}, "scale": {
                                       "specReplicasPath": ".spec.replicas",
                                       "statusReplicasPath": ".status.replicas",
                                       "labelSelectorPath": ".status.selector"}},
                                   "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                                       "spec": {"type": "object",
                                                "x-kubernetes-validations": [
                                                    {"rule": "self.replicas <= self.max",
                                                     "message": "replicas must not exceed max"},
                                                    {"rule": "self.owner == oldSelf.owner",
                                                     "message": "owner is immutable", "fieldPath": ".owner"},
                                                    {"rule": "self.replicas >= oldSelf.replicas || self.replicas > 0",
                                                     "reason": "FieldValueForbidden",
                                                     "messageExpression": "'may not scale ' + string(oldSelf.replicas) + ' down to 0'"}],
                                                "properties": {
                                                    "replicas": {"type": "integer", "minimum": 0},
                                                    "max": {"type": "integer", "default": 5},
                                                    "owner": {"type": "string"},
                                                    "tags": {"type": "array", "items": {"type": "string"},
                                                             "x-kubernetes-list-type": "set"},
                                                    "ports": {"type": "array", "x-kubernetes-list-type": "map",
                                                              "x-kubernetes-list-map-keys": ["name"],
                                                              "items": {"type": "object", "required": ["name"],
                                                                        "properties": {"name": {"type": "string"},
                                                                                       "port": {"type": "integer"}}}}}},
                                       "status": {"type": "object", "properties": {
                                           "replicas": {"type": "integer"}, "selector": {"type": "string"}}}}}}}]}}


@pytest.fixture(scope="module")
def gadgets() -> str:
    group = f"{uniq('g')}.example.com"
    k23.create_yaml(gadget_crd(group))
    kubectl("wait", "--for=condition=Established", f"crd/gadgets.{group}", "--timeout=30s")
    yield group
    kubectl("delete", "crd", f"gadgets.{group}", "--wait=false")


def gadget(group: str, name: str, **spec) -> dict:
    return {"apiVersion": f"{group}/v1", "kind": "Gadget", "metadata": {"name": name},
            "spec": {"replicas": 1, "owner": "me", **spec}}


def test_cel_rules_messages_and_transition_rules(gadgets: str) -> None:
    p = k23.create_yaml(gadget(gadgets, "g1", replicas=9), check=False)
    assert 'The Gadget "g1" is invalid: spec: Invalid value: "object": replicas must not exceed max' in p.stderr, p.stderr
    k23.create_yaml(gadget(gadgets, "g1", replicas=2))
    assert k23.get_json(f"gadgets.{gadgets}", "g1")["spec"]["max"] == 5
    p = kubectl("patch", f"gadgets.{gadgets}", "g1", "--type=merge", "-p", '{"spec":{"owner":"you"}}', check=False)
    assert "spec.owner: Invalid value: \"object\": owner is immutable" in p.stderr, p.stderr
    p = kubectl("patch", f"gadgets.{gadgets}", "g1", "--type=merge", "-p", '{"spec":{"replicas":0}}', check=False)
    assert "spec: Forbidden: may not scale 2 down to 0" in p.stderr, p.stderr


def test_list_type_set_and_map_duplicates_are_refused(gadgets: str, api: Api) -> None:
    """kube-apiserver: `spec.tags[1]: Duplicate value: "a"` and
    `spec.ports[1]: Duplicate value: map[string]interface {}{"name":"http"}` (422)."""
    r = api.post(f"/apis/{gadgets}/v1/namespaces/default/gadgets", gadget(gadgets, "dup1", tags=["a", "a"]))
    r2 = api.post(f"/apis/{gadgets}/v1/namespaces/default/gadgets",
                 gadget(gadgets, "dup2", ports=[{"name": "http", "port": 1}, {"name": "http", "port": 2}]))
    assert r2.status_code == 422 and "spec.ports[1]: Duplicate value" in r2.json()["message"], r2.text
    assert r.status_code == 422 and 'spec.tags[1]: Duplicate value: "a"' in r.json()["message"], r.text


def test_crd_scale_and_status_subresources(gadgets: str, api: Api) -> None:
    k23.create_yaml(gadget(gadgets, "gs", replicas=1))
    base = f"/apis/{gadgets}/v1/namespaces/default/gadgets/gs"
    st = api.req("PATCH", base + "/status", data=json.dumps({"status": {"replicas": 1, "selector": "app=x"}}),
                 headers={"Content-Type": "application/merge-patch+json"})
    assert st.status_code == 200, st.text
    gen = st.json()["metadata"]["generation"]
    sc = api.get(base + "/scale").json()
    assert sc["kind"] == "Scale" and sc["apiVersion"] == "autoscaling/v1", sc
    assert sc["status"] == {"replicas": 1, "selector": "app=x"}, sc
    kubectl("scale", f"gadgets.{gadgets}/gs", "--replicas=3")
    p = kubectl("scale", f"gadgets.{gadgets}/gs", "--replicas=7", check=False)
    assert "replicas must not exceed max" in p.stderr, p.stderr
    o = api.get(base).json()
    assert o["spec"]["replicas"] == 3 and o["metadata"]["generation"] == gen + 1
    # a write of the object ignores status
    o["status"]["replicas"] = 99
    o2 = api.req("PUT", base, json=o).json()
    assert o2["status"]["replicas"] == 1


def test_crd_fieldvalidation_strict_and_warn(gadgets: str) -> None:
    g = gadget(gadgets, "gv")
    g["spec"]["extra"] = 1
    p = k23.create_yaml(g, check=False)
    assert 'strict decoding error: unknown field "spec.extra"' in p.stderr, p.stderr
    p = k23.create_yaml(g, "--validate=warn")
    assert "unknown field" in p.stderr, p.stderr
    assert "extra" not in k23.get_json(f"gadgets.{gadgets}", "gv")["spec"]


def test_crd_in_openapi_v3_and_explain(gadgets: str, api: Api) -> None:
    doc = api.get(f"/openapi/v3/apis/{gadgets}/v1").json()
    rev = ".".join(reversed(gadgets.split(".")))
    assert f"{rev}.v1.Gadget" in doc["components"]["schemas"], list(doc["components"]["schemas"])[:5]
    ex = kubectl("explain", f"gadgets.{gadgets}.spec.replicas").stdout
    assert "integer" in ex, ex


# --------------------------------------------------------------------------- Jobs and CronJobs

def job(name: str, env: dict[str, str], **spec) -> dict:
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name},
            "spec": {"backoffLimit": 2, **spec, "template": {"spec": {
                "restartPolicy": "Never",
                "containers": [{"name": "main", "image": k23.image("exit.wasm"),
                                "env": [{"name": k, "value": v} for k, v in env.items()]}]}}}}


def job_cond(name: str, typ: str, timeout: float = 90) -> dict:
    def f():
        j = k23.get_json("job", name)
        return next((c for c in j.get("status", {}).get("conditions", []) if c["type"] == typ and c["status"] == "True"), None)
    return wait_until(f, timeout, 1, f"job {name} {typ}")


def test_job_pod_failure_policy_failjob_message() -> None:
    name = uniq("pfp")
    k23.create_yaml(job(name, {"EXIT_CODE": "42"}, podFailurePolicy={"rules": [
        {"action": "FailJob", "onExitCodes": {"operator": "In", "values": [42]}}]}))
    c = job_cond(name, "Failed")
    pods = k23.get_json("pods", "-l", f"job-name={name}")["items"]
    kubectl("delete", "job", name, "--wait=false")
    assert c["reason"] == "PodFailurePolicy", c
    assert c["message"] == (f"Container main for pod default/{pods[0]['metadata']['name']} failed with exit code 42 "
                            "matching FailJob rule at index 0"), c
    assert len(pods) == 1


def test_job_ignore_rule_then_success_and_indexed_success_policy() -> None:
    name = uniq("sp")
    k23.create_yaml(job(name, {"EXIT_CODE": "1", "EXIT_CODE_0": "0"}, completionMode="Indexed", completions=3,
                        parallelism=3, successPolicy={"rules": [{"succeededIndexes": "0"}]}))
    c = job_cond(name, "Complete")
    j = k23.get_json("job", name)
    kubectl("delete", "job", name, "--wait=false")
    assert c["reason"] == "SuccessPolicy" and c["message"] == "Matched rules at index 0", c
    assert j["status"]["completedIndexes"] == "0"


@pytest.mark.parametrize("null_backoff", [False, True])
def test_job_backoff_limit_per_index(null_backoff: bool) -> None:
    """With ``backoffLimit: null`` (a YAML key with no value, as Helm templates leave it)
    kube-apiserver drops the null and defaults the field; found: it is stored as null and
    the Job controller fails on it for ever ('int() argument must be ... not NoneType'),
    the Job never starts a pod."""
    name = uniq("bpi")
    spec = dict(completionMode="Indexed", completions=2, parallelism=2, backoffLimitPerIndex=1)
    j = job(name, {"EXIT_CODE": "0", "EXIT_CODE_1": "3"}, **spec)
    if null_backoff:
        j["spec"]["backoffLimit"] = None
    else:
        del j["spec"]["backoffLimit"]
    k23.create_yaml(j)
    c = job_cond(name, "Failed", 150)
    j = k23.get_json("job", name)
    kubectl("delete", "job", name, "--wait=false")
    assert c["reason"] == "FailedIndexes", c
    assert j["status"]["failedIndexes"] == "1" and j["status"]["completedIndexes"] == "0", j["status"]
    assert j["spec"]["backoffLimit"] == 2147483647


def test_job_validation_texts(api: Api) -> None:
    """kube-apiserver 1.32's words for a few invalid Jobs."""
    base = "/apis/batch/v1/namespaces/default/jobs"
    j = job("v1", {}, backoffLimitPerIndex=1)
    r = api.post(base, j).json()
    assert r["code"] == 422 and ('spec.backoffLimitPerIndex: Invalid value: 1: requires indexed completion mode'
                                 in r["message"]), r["message"]
    j = job("v2", {})
    j["spec"]["template"]["spec"]["restartPolicy"] = "Always"
    r = api.post(base, j).json()
    assert 'spec.template.spec.restartPolicy: Unsupported value: "Always": supported values: "OnFailure", "Never"' \
        in r["message"], r["message"]
    j = job("v3", {}, podFailurePolicy={"rules": [{"action": "FailJob", "onExitCodes": {"operator": "In", "values": [0]}}]})
    r = api.post(base, j).json()
    assert "spec.podFailurePolicy.rules[0].onExitCodes.values[0]: Invalid value: 0: must not be 0 for the In operator" \
        in r["message"], r["message"]


def test_create_job_from_cronjob_and_cronjob_columns() -> None:
    name = uniq("cj")
    kubectl("create", "cronjob", name, f"--image={k23.image('exit.wasm')}", "--schedule=*/30 * * * *",
            "--restart=Never")
    out = kubectl("get", "cronjob", name).stdout
    assert out.split("\n")[0].split() == ["NAME", "SCHEDULE", "TIMEZONE", "SUSPEND", "ACTIVE", "LAST", "SCHEDULE", "AGE"], out
    kubectl("create", "job", f"{name}-manual", f"--from=cronjob/{name}")
    job_cond(f"{name}-manual", "Complete")
    j = k23.get_json("job", f"{name}-manual")
    logs = kubectl("logs", f"job/{name}-manual").stdout
    kubectl("delete", "cronjob", name, "--wait=false")
    kubectl("delete", "job", f"{name}-manual", "--wait=false", check=False)
    assert j["metadata"]["annotations"].get("cronjob.kubernetes.io/instantiate") == "manual", j["metadata"]
    assert j["metadata"]["ownerReferences"][0]["kind"] == "CronJob"
    assert "exit: code 0" in logs


# --------------------------------------------------------------------------- /metrics and OpenAPI

def test_metrics_parse_with_prometheus_client(api: Api) -> None:
    from prometheus_client.parser import text_string_to_metric_families
    name = uniq("met")
    k23.run_counter(name)
    k23.cli("move", name)
    kubectl("delete", "pod", name, "--wait=false")
    r = api.get("/metrics")
    assert r.status_code == 200 and r.headers["Content-Type"].startswith("text/plain"), r.headers
    fams = {f.name: f for f in text_string_to_metric_families(r.text)}
    ended = fams["kube32_checkpoints_ended"]
    assert ended.type == "counter"
    assert any(s.labels.get("outcome") == "Completed" and s.value >= 1 for s in ended.samples)
    h = fams["kube32_move_freeze_to_running_seconds"]
    assert h.type == "histogram"
    buckets = [s for s in h.samples if s.name.endswith("_bucket")]
    assert buckets[-1].labels["le"] == "+Inf"
    vals = [s.value for s in buckets]
    assert vals == sorted(vals)
    assert fams["apiserver_request_duration_seconds"].type == "histogram"
    req = fams["apiserver_request"]
    assert any(s.labels.get("verb") == "LIST" and s.labels.get("resource") == "pods" for s in req.samples)


def test_openapi_v3_documents_are_valid_openapi(api: Api) -> None:
    from openapi_spec_validator import validate
    idx = api.get("/openapi/v3").json()
    paths = idx["paths"]
    for p in ("api/v1", "apis/batch/v1", "apis/kube32.io/v1", "apis/apps/v1"):
        doc = api.get("/" + p if not paths[p]["serverRelativeURL"].startswith("/") else paths[p]["serverRelativeURL"]).json()
        validate(doc)
        assert doc["components"]["schemas"], p


def test_openapi_v2_is_valid_swagger(api: Api) -> None:
    from openapi_spec_validator import validate
    doc = api.get("/openapi/v2").json()
    assert doc["swagger"] == "2.0"
    validate(doc)
    assert "io.k8s.api.core.v1.Pod" in doc["definitions"]
    assert any(k.endswith(".Checkpoint") for k in doc["definitions"])


def test_openapi_v3_etag_and_hash_caching(api: Api) -> None:
    """kube-apiserver serves each /openapi/v3/<gv>?hash=H with an ETag and a long
    Cache-Control; kubectl's cache relies on it."""
    idx = api.get("/openapi/v3").json()
    url = idx["paths"]["api/v1"]["serverRelativeURL"]
    assert "hash=" in url, url
    r = api.get(url)
    assert r.status_code == 200
    etag = r.headers.get("ETag")
    assert etag, r.headers
    r2 = api.get(url, headers={"If-None-Match": etag})
    assert r2.status_code == 304, r2.status_code


# --------------------------------------------------------------------------- @kubernetes/client-node

def test_node_client_informer_sees_a_move_as_delete_then_add() -> None:
    import os
    if not (k23.NODECLIENT / "node_modules").is_dir():
        pytest.skip("no node_modules")
    name = uniq("ninf")
    pod = k23.run_counter(name)
    e = k23.env()
    e["NODECLIENT"] = str(k23.NODECLIENT)
    p = subprocess.Popen(["node", str(k23.ROOT / "tests/attack/informer23.mjs"), str(k23.KUBECONFIG),
                          f"k23={name}", "14"], env=e, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(4)
    k23.cli("move", name)
    time.sleep(2)
    k23.cli("move", name)
    out, err = p.communicate(timeout=40)
    new = k23.get_json("pod", name)
    kubectl("delete", "pod", name, "--wait=false")
    calls = [json.loads(ln) for ln in out.splitlines() if ln.startswith("{")]
    hs = [(c["h"], c.get("uid")) for c in calls if c["h"] != "connect"]
    assert not [c for c in calls if c["h"] == "error" and "AbortError" not in c["e"]], (calls, err)
    assert hs[0] == ("add", pod["metadata"]["uid"]), hs
    dels = [u for h, u in hs if h == "delete"]
    adds = [u for h, u in hs if h == "add"]
    assert dels[:1] == [pod["metadata"]["uid"]] and len(dels) == 2, hs
    assert adds[-1] == new["metadata"]["uid"] and len(adds) == 3, hs
    assert os.environ is not None


def test_kubectl_apply_prune_with_an_allowlist() -> None:
    """The same prune with --prune-allowlist (kinds Kube32 serves): the mechanism works;
    test_kubectl_diff_and_apply_prune fails only on kubectl's default allowlist, which
    names PersistentVolumeClaim, PersistentVolume, ReplicationController, StatefulSet and
    Ingress, none of them served."""
    lab = uniq("pra")
    docs = [{"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": f"{lab}-{i}", "labels": {"set": lab}}}
            for i in range(2)]
    k23.apply_yaml(docs, "-l", f"set={lab}", "--prune", "--prune-allowlist=core/v1/ConfigMap")
    out = k23.apply_yaml(docs[:1], "-l", f"set={lab}", "--prune", "--prune-allowlist=core/v1/ConfigMap").stdout
    kubectl("delete", "cm", "-l", f"set={lab}")
    assert f"configmap/{lab}-1 pruned" in out, out
