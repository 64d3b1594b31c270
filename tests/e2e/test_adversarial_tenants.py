"""Tenants against each other, on one ``kube32-sim up --workers 2`` cluster: a
ServiceAccount with ``edit`` in namespace ``evil`` (``mallory``), a node that joined with
the bootstrap token, and anyone on the network, against namespace ``victim``'s pods,
Secret and Checkpoint (issue 19, attack round 19b: tests/attack/test_attack19b.py, whose
NodePort scenario stays there; helpers in tenants.py, raw HTTP(S), kubectl and curl).

Findings fixed (docs/security.md, "Snapshots are user data", "Objects stay where the
request names them"):

* A snapshot's small sections hold no more than one pod can have: a data PUT whose
  CHANNELS section has 50,000 entries (once: each opened on restore, the node's channel
  registry keeping them all, 2 GB per round) is 422 naming the section, as are 17
  channels, a handle twice and 20,000 EVENTS; the Checkpoint keeps its data.
* A PUT whose body names another namespace, and JSON or merge patches that change
  ``metadata.namespace`` or ``metadata.name``, are 400 in kube-apiserver's words (they
  were 200, the change dropped in silence).
* Impersonating ``system:serviceaccount:evil:`` (no ServiceAccount name) is impersonating
  a user of that name, which ``edit`` may not (it was served as a ServiceAccount).

And what held in that round: no path encoding reaches another namespace, workload
templates, Checkpoint names and continue tokens stay in their namespace, a node cannot
name a Checkpoint through a pod's status, a kubelet answers nobody but the API server,
and a storm of bad tokens at a kubelet leaves /healthz and its Lease alone.
"""
from __future__ import annotations

import base64
import hashlib
import json
import re
import struct
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

from tests.conftest import start_cluster

from . import tenants as k

VICTIM, EVIL = "victim", "evil"
CHECKPOINTS = f"/apis/kube32.io/v1/namespaces/{EVIL}/checkpoints"


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    cluster = start_cluster(tmp_path_factory.mktemp("tenants"), 2, "--backoff", "1")
    try:
        k.use(cluster.data_dir)
        c = k.cluster()
        img = k.image("counter")
        k.namespace(VICTIM)
        tok = k.sa_token(EVIL, "mallory", "edit")
        k.secret(VICTIM, "topsecret", "hunter2-SECRET")
        k.pod(VICTIM, "vpod", img, labels={"app": "v"}, env_secret=("topsecret", "pw"))
        k.pod(EVIL, "epod", img, labels={"app": "e"})
        ck = k.save(VICTIM, "vsave", "vpod")
        assert ck["status"]["phase"] == "Saved", ck
        yield {"c": c, "img": img, "tok": tok, "cluster": cluster}
    finally:
        cluster.proc.stop(timeout=30)


def as_evil(env, method, path, obj=None, **kw):
    body = json.dumps(obj) if isinstance(obj, (dict, list)) else obj
    return k.raw(method, path, env["tok"], body, **kw)


# --- helpers: a snapshot with extra sections ------------------------------------------
def sections(snap: bytes) -> tuple[bytearray, list[tuple[int, bytes]]]:
    body = snap[:-32]
    hdr, pos = bytearray(body[:68]), 68
    out = []
    for _ in range(struct.unpack_from("<I", hdr, 64)[0]):
        t, ln = struct.unpack_from("<HI", body, pos)
        out.append((t, body[pos:pos + 6 + ln]))
        pos += 6 + ln
    return hdr, out


def rebuild(hdr: bytearray, secs: list[tuple[int, bytes]]) -> bytes:
    struct.pack_into("<I", hdr, 64, len(secs))
    out = bytes(hdr) + b"".join(b for _, b in secs)
    return out + hashlib.sha256(out).digest()


def with_channels(snap: bytes, n: int, name: bytes = b"a", handle: int = 1) -> bytes:
    hdr, secs = sections(snap)
    body = b"".join(struct.pack("<IH", handle, len(name)) + name for _ in range(n))
    secs = [s for s in secs if s[0] != 4]
    at = next(i for i, s in enumerate(secs) if s[0] == 1)
    secs.insert(at, (4, struct.pack("<HI", 4, len(body)) + body))
    return rebuild(hdr, secs)


def evil_snapshot(env, name: str) -> bytes:
    base = f"/apis/kube32.io/v1/namespaces/{EVIL}/checkpoints"
    r = as_evil(env, "POST", base, {"apiVersion": "kube32.io/v1", "kind": "Checkpoint",
                                    "metadata": {"name": name}, "spec": {"podName": "epod"}})
    assert r.status in (201, 409), r
    assert k.wait_for(lambda: (as_evil(env, "GET", f"{base}/{name}").json().get("status") or {}).get("phase")
                      == "Saved", 60)
    snap = as_evil(env, "GET", f"{base}/{name}/data").body
    assert snap[:4] == b"K32S"
    return snap


def restore_pod(env, name: str, ck: str, node: str) -> None:
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": name, "annotations": {"kube32.io/restore-from": ck}},
           "spec": {"nodeName": node, "containers": [{"name": "main", "image": env["img"]}]}}
    r = as_evil(env, "POST", f"/api/v1/namespaces/{EVIL}/pods", pod)
    assert r.status == 201, r


def pod_phase(ns: str, name: str) -> tuple[str, str]:
    p = k.admin("GET", f"/api/v1/namespaces/{ns}/pods/{name}").json()
    st = p.get("status") or {}
    cs = (st.get("containerStatuses") or [{}])[0].get("state") or {}
    reason = next((v.get("reason", "") for v in cs.values() if isinstance(v, dict)), "")
    return st.get("phase", ""), reason


# === snapshots are user data: no more than one pod can have =============================
def put_data(env, name: str, data: bytes):
    return as_evil(env, "PUT", f"{CHECKPOINTS}/{name}/data", data,
                   headers={"Content-Type": "application/octet-stream"}, timeout=120)


def with_events(snap: bytes, n: int) -> bytes:
    hdr, secs = sections(snap)
    body = b"".join(struct.pack("<H", 1) + b"t" + struct.pack("<I", 1) + b"p" for _ in range(n))
    secs = [s for s in secs if s[0] != 5]
    at = next(i for i, s in enumerate(secs) if s[0] == 1)
    secs.insert(at, (5, struct.pack("<HI", 5, len(body)) + body))
    return rebuild(hdr, secs)


def test_a_snapshot_with_more_channels_than_a_pod_can_open_is_refused_at_the_upload(env):
    """50,000 entries on one handle (the ABI allows 16 open channels): 422 naming the
    CHANNELS section, from its length; nothing stored: the Checkpoint keeps the data its
    Save gave it, and a pod restores from that as before."""
    name = k.unique("cb")
    snap = evil_snapshot(env, name)
    r = put_data(env, name, with_channels(snap, 50_000))
    assert r.status == 422 and b"CHANNELS" in r.body and b"what one pod can have" in r.body, r
    seventeen = with_channels_list(snap, [(h, b"c") for h in range(1, 18)])
    r = put_data(env, name, seventeen)
    assert r.status == 422 and b"more than 16 channels" in r.body, r
    twice = with_channels_list(snap, [(3, b"a"), (3, b"b")])
    r = put_data(env, name, twice)
    assert r.status == 422 and b"channel handle 3 appears twice" in r.body, r
    assert as_evil(env, "GET", f"{CHECKPOINTS}/{name}/data").body == snap
    pname = k.unique("rb")
    restore_pod(env, pname, name, "sim-2")
    assert k.wait_for(lambda: pod_phase(EVIL, pname)[0] == "Running", 60), pod_phase(EVIL, pname)
    k.admin("DELETE", f"/api/v1/namespaces/{EVIL}/pods/{pname}")


def test_a_snapshot_with_more_events_than_a_pods_queue_holds_is_refused_at_the_upload(env):
    """The EVENTS section is bounded too (a pod's queue holds 1024): 20,000 are 422."""
    name = k.unique("ce")
    snap = evil_snapshot(env, name)
    r = put_data(env, name, with_events(snap, 20_000))
    assert r.status == 422 and b"EVENTS" in r.body, r
    assert k.admin("GET", "/healthz").status == 200


def with_channels_list(snap: bytes, entries: list[tuple[int, bytes]]) -> bytes:
    hdr, secs = sections(snap)
    body = b"".join(struct.pack("<IH", h, len(n)) + n for h, n in entries)
    secs = [s for s in secs if s[0] != 4]
    at = next(i for i, s in enumerate(secs) if s[0] == 1)
    secs.insert(at, (4, struct.pack("<HI", 4, len(body)) + body))
    return rebuild(hdr, secs)


# === objects stay where the request names them =========================================
NS_WORDS = b"the namespace of the provided object does not match the namespace sent on the request"


def test_an_update_or_patch_cannot_move_an_object_to_another_namespace_or_name(env):
    """kube-apiserver: 400 for a PUT whose body names another namespace, and for a patch
    whose result has another namespace or name; the object stays as it was."""
    base = f"/api/v1/namespaces/{EVIL}/configmaps"
    r = as_evil(env, "POST", base, {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x3"},
                                    "data": {"a": "1"}})
    assert r.status in (201, 409), r
    cm = as_evil(env, "GET", f"{base}/x3").json()
    moved = {**cm, "metadata": {**cm["metadata"], "namespace": VICTIM}, "data": {"a": "2"}}
    r = as_evil(env, "PUT", f"{base}/x3", moved)
    assert r.status == 400 and NS_WORDS in r.body, r
    merge = {"Content-Type": "application/merge-patch+json"}
    jsonp = {"Content-Type": "application/json-patch+json"}
    for body, hdrs, words in (
        ({"metadata": {"namespace": VICTIM}, "data": {"a": "3"}}, merge, NS_WORDS),
        ([{"op": "replace", "path": "/metadata/namespace", "value": VICTIM}], jsonp, NS_WORDS),
        ({"metadata": {"name": "x4"}}, merge, b"the name of the object (x4) does not match the name on the URL (x3)"),
        ([{"op": "replace", "path": "/metadata/name", "value": "x4"}], jsonp,
         b"the name of the object (x4) does not match the name on the URL (x3)"),
    ):
        r = as_evil(env, "PATCH", f"{base}/x3", body, headers=hdrs)
        assert r.status == 400 and words in r.body, (body, r)
    p = k.kubectl("patch", "configmap", "x3", "-n", EVIL, "--type", "merge", "-p",
                  json.dumps({"metadata": {"namespace": VICTIM}}), token=env["tok"])
    assert p.returncode != 0 and "does not match the namespace" in p.stderr, p.stderr
    assert as_evil(env, "GET", f"{base}/x3").json()["data"] == {"a": "1"}
    assert k.admin("GET", f"/api/v1/namespaces/{VICTIM}/configmaps/x3").status == 404
    assert k.admin("GET", f"/api/v1/namespaces/{EVIL}/configmaps/x4").status == 404
    r = as_evil(env, "PATCH", f"{base}/x3", {"metadata": {"namespace": EVIL}, "data": {"a": "5"}}, headers=merge)
    assert r.status == 200 and r.json()["data"] == {"a": "5"}, r


def test_impersonating_an_invalid_service_account_name_is_impersonating_a_user(env):
    """``system:serviceaccount:evil:`` is no ServiceAccount's name (Kubernetes'
    SplitUsername): it needs ``impersonate users``, which ``edit`` does not give."""
    for user in ("system:serviceaccount:evil:", "system:serviceaccount::mallory", "system:serviceaccount:evil:Mallory",
                 "system:serviceaccount:Evil:mallory"):
        r = as_evil(env, "GET", f"/api/v1/namespaces/{EVIL}/configmaps", headers={"Impersonate-User": user})
        assert r.status == 403 and b"cannot impersonate resource" in r.body and b"users" in r.body, (user, r)
    r = as_evil(env, "GET", f"/api/v1/namespaces/{EVIL}/configmaps",
                headers={"Impersonate-User": "system:serviceaccount:evil:mallory"})
    assert r.status == 200, r


# === what held in round 19b =============================================================
CROSS_PATHS = [
    "/api/v1/namespaces/victim/pods",
    "/api/v1/namespaces/evil/../victim/pods",
    "/api/v1/namespaces/evil/%2e%2e/victim/pods",
    "/api/v1/namespaces/evil%2F..%2Fvictim/pods",
    "/api/v1/namespaces/evil/pods/..%2F..%2Fvictim%2Fpods%2Fvpod",
    "/api/v1//namespaces/victim/pods",
    "/api/v1/namespaces//pods",
    "/api/v1/namespaces/victim%2Fpods",
    "/api/v1/namespaces/victim/secrets/topsecret",
    "/apis/kube32.io/v1/namespaces/victim/checkpoints/vsave/data",
    "/api/v1/namespaces/victim/pods/vpod/log",
    "/api/v1/namespaces/victim/events",
    "/api/v1/events",
    "/metrics",
    "/api/v1/nodes/devkit/proxy/checkpoint/victim/vpod/main",
]


@pytest.mark.parametrize("path", CROSS_PATHS)
def test_edit_in_evil_reaches_nothing_of_victim(env, path):
    r = as_evil(env, "GET", path)
    assert r.status in (400, 403, 404), r
    assert b"hunter2" not in r.body and b"K32S" not in r.body[:4]


def test_body_namespace_other_than_the_url_is_refused(env):
    r = as_evil(env, "POST", f"/api/v1/namespaces/{EVIL}/configmaps",
                {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x1", "namespace": VICTIM}})
    assert r.status == 400, r
    r = as_evil(env, "PATCH", f"/api/v1/namespaces/{EVIL}/configmaps/x2?fieldManager=m",
                {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x2", "namespace": VICTIM}},
                headers={"Content-Type": "application/apply-patch+yaml"})
    assert r.status == 400, r
    assert k.admin("GET", f"/api/v1/namespaces/{VICTIM}/configmaps/x2").status == 404


def test_impersonation_stays_within_the_namespace(env):
    for hdrs in ({"Impersonate-User": "system:serviceaccount:evil:default", "Impersonate-Group": "system:masters"},
                 {"Impersonate-User": "system:serviceaccount:victim:default"},
                 {"Impersonate-User": "system:serviceaccount:evil:x:system:masters"},
                 {"Impersonate-User": "system:node:sim-1"}):
        r = as_evil(env, "GET", f"/api/v1/namespaces/{VICTIM}/secrets", headers=hdrs)
        assert r.status == 403, (hdrs, r)


def test_workload_templates_cannot_place_pods_in_another_namespace(env):
    manifest = f"""apiVersion: batch/v1
kind: Job
metadata: {{name: j19b, namespace: evil}}
spec:
  template:
    metadata: {{namespace: victim, labels: {{x: j19b}}}}
    spec:
      restartPolicy: Never
      containers: [{{name: main, image: "{env['img']}"}}]
---
apiVersion: apps/v1
kind: ReplicaSet
metadata: {{name: rs19b, namespace: evil}}
spec:
  replicas: 1
  selector: {{matchLabels: {{x: rs19b}}}}
  template:
    metadata: {{namespace: victim, labels: {{x: rs19b}}}}
    spec:
      containers: [{{name: main, image: "{env['img']}"}}]
"""
    p = k.kubectl("apply", "-f", "-", token=env["tok"], input=manifest)
    assert p.returncode == 0, p.stderr
    time.sleep(6)
    pods = k.admin("GET", f"/api/v1/namespaces/{VICTIM}/pods?labelSelector=x").json()["items"]
    assert pods == [], [p["metadata"]["name"] for p in pods]


def test_checkpoint_names_stay_in_the_namespace(env):
    base = f"/apis/kube32.io/v1/namespaces/{EVIL}/checkpoints"
    for pn in ("../victim/vpod", "vpod%2F..", "epod/../../victim/vpod"):
        r = as_evil(env, "POST", base, {"apiVersion": "kube32.io/v1", "kind": "Checkpoint",
                                        "metadata": {"generateName": "c-"}, "spec": {"podName": pn}})
        assert r.status == 422, r
    r = as_evil(env, "POST", f"/api/v1/namespaces/{EVIL}/pods", {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"generateName": "rf-", "annotations": {"kube32.io/restore-from": "../../victim/checkpoints/vsave"}},
        "spec": {"containers": [{"name": "main", "image": env["img"]}]}})
    assert r.status == 422, r


def test_a_node_cannot_name_a_checkpoint_through_its_pods_status(env):
    """A joined node patches pods/status of a victim pod it runs, adding restore-from for
    another pod's Checkpoint: the status strategy must drop metadata, so the node authorizer
    does not then hand it that Checkpoint's data."""
    tok = k.join_node("evilnode", "127.0.0.9")
    k.register_node("evilnode", tok, "127.0.0.9")
    k.pod(VICTIM, "vpod2", env["img"], node="evilnode", wait=False)
    r = k.raw("PATCH", f"/api/v1/namespaces/{VICTIM}/pods/vpod2/status", tok,
              json.dumps({"metadata": {"annotations": {"kube32.io/restore-from": "vsave"}}}),
              headers={"Content-Type": "application/merge-patch+json"}, source="127.0.0.9")
    assert r.status in (200, 403), r
    r = k.raw("GET", f"/apis/kube32.io/v1/namespaces/{VICTIM}/checkpoints/vsave/data", tok, source="127.0.0.9")
    assert r.status == 403, r
    r = k.raw("GET", f"/api/v1/namespaces/{VICTIM}/secrets/topsecret", tok, source="127.0.0.9")
    assert r.status == 403, r


def _kubelet(node: str) -> tuple[str, int]:
    n = k.admin("GET", f"/api/v1/nodes/{node}").json()
    return n["status"]["addresses"][0]["address"], n["status"]["daemonEndpoints"]["kubeletEndpoint"]["Port"]


def test_kubelet_direct_refuses_everyone_but_the_api_server(env):
    host, port = _kubelet("devkit")
    tok = k.join_node("evilnode", "127.0.0.9")
    for who, t in (("none", None), ("garbage", "x" * 40), ("sa", env["tok"]), ("admin", env["c"]["admin"]),
                   ("node", tok), ("bootstrap", env["c"]["bootstrap"])):
        for path in ("/checkpoint/victim/vpod/main?leave=running", "/pods/victim/vpod/http/",
                     "/containerLogs/victim/vpod/main"):
            r = k.raw("POST" if path.startswith("/checkpoint") else "GET", path, t, host=host, port=port)
            assert r.status in (401, 403), (who, path, r)
            assert not r.body.startswith(b"K32S")


def test_bad_token_storm_at_a_kubelet_keeps_leases(env):
    """Bearer tokens the kubelet does not know are reviewed at the API server each time
    (not cached): 40 connections of random tokens at sim-1 for 20 s.  /healthz stays fast
    and sim-1 keeps renewing its Lease."""
    host, port = _kubelet("sim-1")
    storm = Path(__file__).with_name("tenantstorm.py")
    p = subprocess.run([sys.executable, str(storm), f"https://{host}:{port}", "12", "40", env["c"]["server"],
                        env["c"]["admin"], "sim-1"], capture_output=True, text=True, timeout=90)
    out = p.stdout
    worst = float(re.search(r"worst healthz ([\d.]+)", out).group(1))
    renewals = int(re.search(r"distinct renewals (\d+)", out).group(1))
    assert worst < 1.0 and renewals >= 2, out


@pytest.mark.parametrize("start", ["../victim/vpod", "x/../../victim/vpod", "/registry/core/pods/victim/vpod",
                                   "\x00victim"])
def test_forged_continue_tokens_stay_in_the_namespace(env, start):
    tok = base64.urlsafe_b64encode(json.dumps({"v": "meta.k8s.io/v1", "rv": 1, "start": start}).encode()
                                   ).decode().rstrip("=")
    r = as_evil(env, "GET", f"/api/v1/namespaces/{EVIL}/pods?limit=5&continue={tok}")
    assert r.status in (400, 410), r
    assert b'"victim"' not in r.body
