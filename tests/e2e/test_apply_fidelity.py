"""Server-side apply and managedFields of custom resources and built-in kinds, and the
bindings resource, against a ``kube32-sim control-plane`` with plain HTTPS and the real
kubectl: an outside tester's round d on issue 23 (tests/attack/test_attack23d.py), kept.

Each test's docstring says what Kubernetes (kube-apiserver v1.32, structured-merge-diff
v4) does, and what Kube32 did when the round ran: "holds", or the finding, fixed since
(2026-12-03); every test here passes.
"""

from __future__ import annotations

import base64
import http.client
import json
import os
import ssl
import subprocess
import tempfile
import time
import urllib.parse
import uuid
from pathlib import Path
from typing import Iterator

import pytest
import yaml

from tests.conftest import ControlPlane, start_control_plane
from tests.e2e.helpers import push

pytestmark = pytest.mark.e2e
KUBECONFIG = ""   # the module's control plane's (the cluster fixture)


@pytest.fixture(scope="module", autouse=True)
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    global KUBECONFIG
    cp = start_control_plane(tmp_path_factory.mktemp("applyfidelity") / "cp", "--no-kubelet")
    KUBECONFIG = str(cp.kubeconfig)
    try:
        yield cp
    finally:
        cp.proc.stop()


GROUP = "atk23d.example.com"
CRD_NAME = f"gizmos.{GROUP}"
GZ = f"/apis/{GROUP}/v1/namespaces/default/gizmos"
MORPH_CRD = f"morphs.{GROUP}"
MORPHS = f"/apis/{GROUP}/v1/namespaces/default/morphs"
CRDS = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"


# --------------------------------------------------------------------------- client


class Api:
    def __init__(self) -> None:
        kc = yaml.safe_load(open(KUBECONFIG))
        cluster = kc["clusters"][0]["cluster"]
        self.url = urllib.parse.urlparse(cluster["server"])
        ca = base64.b64decode(cluster["certificate-authority-data"])
        f = tempfile.NamedTemporaryFile(delete=False, suffix=".crt")
        f.write(ca)
        f.close()
        self.ctx = ssl.create_default_context(cafile=f.name)
        self.token = kc["users"][0]["user"]["token"]

    def req(self, method, path, body=None, ctype="application/json", token=None, headers=None, timeout=60):
        c = http.client.HTTPSConnection(self.url.hostname, self.url.port, context=self.ctx, timeout=timeout)
        h = {"Authorization": "Bearer " + (token or self.token), "Accept": "application/json",
             "User-Agent": "atk23d/1.0"}
        if body is not None:
            if not isinstance(body, (bytes, str)):
                body = json.dumps(body)
            if isinstance(body, str):
                body = body.encode()
            h["Content-Type"] = ctype
        h.update(headers or {})
        c.request(method, path, body=body, headers=h)
        r = c.getresponse()
        data = r.read()
        c.close()
        try:
            out = json.loads(data)
        except ValueError:
            out = data.decode(errors="replace")
        return r.status, out

    def apply(self, path, obj, manager, force=False, timeout=60):
        q = ("&" if "?" in path else "?") + "fieldManager=" + manager + ("&force=true" if force else "")
        body = obj if isinstance(obj, str) else json.dumps(obj)
        return self.req("PATCH", path + q, body, ctype="application/apply-patch+yaml", timeout=timeout)

    def merge(self, path, patch, manager, timeout=60):
        return self.req("PATCH", path + "?fieldManager=" + manager, patch,
                        ctype="application/merge-patch+json", timeout=timeout)


def mf(obj):
    """managedFields as {(manager, operation, subresource): fieldsV1}."""
    return {(m["manager"], m["operation"], m.get("subresource") or ""): m.get("fieldsV1")
            for m in obj["metadata"].get("managedFields") or []}


def msg(o):
    return o.get("message", "") if isinstance(o, dict) else str(o)


def kubectl(*args, stdin=None, check=False):
    env = dict(os.environ, KUBECONFIG=KUBECONFIG)
    p = subprocess.run(["kubectl", *args], input=stdin, capture_output=True, text=True, env=env, timeout=120)
    if check:
        assert p.returncode == 0, p.stderr
    return p


def gz(name, spec, **extra):
    o = {"apiVersion": f"{GROUP}/v1", "kind": "Gizmo", "metadata": {"name": name}, "spec": spec}
    o.update(extra)
    return o


def uniq(prefix):
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


def wait_established(api, name):
    for _ in range(60):
        s, o = api.req("GET", f"{CRDS}/{name}")
        if s == 200 and any(c["type"] == "Established" and c["status"] == "True"
                            for c in (o.get("status") or {}).get("conditions", [])):
            return
        time.sleep(0.5)
    raise AssertionError(f"CRD {name} never Established")


GIZMO_SCHEMA = {
    "type": "object",
    "properties": {
        "spec": {
            "type": "object",
            "properties": {
                "replicas": {"type": "integer"},
                "ports": {  # two keys, one with a default
                    "type": "array", "x-kubernetes-list-type": "map",
                    "x-kubernetes-list-map-keys": ["port", "protocol"],
                    "items": {"type": "object", "required": ["port"], "properties": {
                        "port": {"type": "integer"}, "protocol": {"type": "string", "default": "TCP"},
                        "name": {"type": "string"}}}},
                "containers": {  # map list with a nested map list
                    "type": "array", "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"],
                    "items": {"type": "object", "required": ["name"], "properties": {
                        "name": {"type": "string"}, "image": {"type": "string"},
                        "env": {"type": "array", "x-kubernetes-list-type": "map",
                                "x-kubernetes-list-map-keys": ["name"],
                                "items": {"type": "object", "required": ["name"], "properties": {
                                    "name": {"type": "string"}, "value": {"type": "string"}}}}}}},
                "tags": {"type": "array", "x-kubernetes-list-type": "set", "items": {"type": "string"}},
                "args": {"type": "array", "x-kubernetes-list-type": "atomic", "items": {"type": "string"}},
                "plain": {"type": "array", "items": {"type": "string"}},
                "selector": {"type": "object", "x-kubernetes-map-type": "atomic",
                             "additionalProperties": {"type": "string"}},
                "labelsg": {"type": "object", "x-kubernetes-map-type": "granular",
                            "additionalProperties": {"type": "string"}},
                "groups": {"type": "object", "additionalProperties": {  # map lists under additionalProperties
                    "type": "array", "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["id"],
                    "items": {"type": "object", "required": ["id"], "properties": {
                        "id": {"type": "string"}, "w": {"type": "integer"}}}}},
                "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
                "template": {"type": "object", "x-kubernetes-embedded-resource": True,
                             "x-kubernetes-preserve-unknown-fields": True},
            },
        },
        "status": {"type": "object", "properties": {"replicas": {"type": "integer"}, "phase": {"type": "string"}}},
    },
}


@pytest.fixture(scope="module")
def api():
    a = Api()
    crd = {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
           "metadata": {"name": CRD_NAME},
           "spec": {"group": GROUP, "scope": "Namespaced",
                    "names": {"plural": "gizmos", "singular": "gizmo", "kind": "Gizmo"},
                    "versions": [{"name": "v1", "served": True, "storage": True,
                                  "subresources": {"status": {}, "scale": {
                                      "specReplicasPath": ".spec.replicas",
                                      "statusReplicasPath": ".status.replicas"}},
                                  "schema": {"openAPIV3Schema": GIZMO_SCHEMA}}]}}
    s, o = a.req("GET", f"{CRDS}/{CRD_NAME}")
    if s == 404:
        s, o = a.req("POST", CRDS, crd)
        assert s == 201, o
    wait_established(a, CRD_NAME)
    return a


# --------------------------------------------------------------------------- 1. SSA on custom resources


def test_crd_apply_fieldsets_for_every_list_and_map_type(api):
    """Kubernetes records, for one Apply: map list items as k:{...} with every key (a defaulted
    key with its default, `protocol":"TCP"`), nested map lists inside them, sets as v:"...",
    atomic lists and atomic maps as the bare field, granular maps per key, map lists under
    additionalProperties per key, preserve-unknown-fields and embedded resources field by field.
    Kube32 did the same (holds)."""
    name = uniq("fs")
    spec = {"ports": [{"port": 80}, {"port": 80, "protocol": "UDP", "name": "u"}],
            "containers": [{"name": "a", "image": "x", "env": [{"name": "E", "value": "1"}]}],
            "tags": ["a", "b"], "args": ["x"], "selector": {"a": "1"}, "labelsg": {"k": "v"},
            "groups": {"g": [{"id": "i1", "w": 1}]}, "free": {"q": {"r": 1}},
            "template": {"apiVersion": "v1", "kind": "X", "metadata": {"name": "n"}, "spec": {"z": 1}}}
    s, o = api.apply(f"{GZ}/{name}", gz(name, spec), "m1")
    assert s == 201, o
    assert o["spec"]["ports"][0] == {"port": 80, "protocol": "TCP"}
    f = mf(o)[("m1", "Apply", "")]["f:spec"]
    assert set(f["f:ports"]) == {'k:{"port":80,"protocol":"TCP"}', 'k:{"port":80,"protocol":"UDP"}'}
    assert f["f:containers"]['k:{"name":"a"}']["f:env"]['k:{"name":"E"}'] == {".": {}, "f:name": {}, "f:value": {}}
    assert f["f:tags"] == {'v:"a"': {}, 'v:"b"': {}}
    assert f["f:args"] == {} and f["f:selector"] == {}
    assert f["f:labelsg"] == {"f:k": {}}
    assert f["f:groups"] == {"f:g": {'k:{"id":"i1"}': {".": {}, "f:id": {}, "f:w": {}}}}
    assert f["f:free"] == {"f:q": {"f:r": {}}}
    assert f["f:template"]["f:spec"] == {"f:z": {}}


def test_crd_two_managers_share_and_drop(api):
    """Kubernetes: m2 applying the same map-list item, set value and granular key as m1 co-owns
    them; when m1 then drops them they stay (m2 still owns them) and only leave when m2 drops
    them too; m2 applying `spec: {}` keeps only f:spec. Kube32 did the same (holds)."""
    name = uniq("share")
    p = f"{GZ}/{name}"
    base = {"ports": [{"port": 80, "name": "a"}, {"port": 81, "name": "b"}], "tags": ["a", "b"],
            "args": ["x"], "selector": {"a": "1"}, "labelsg": {"k": "v", "k2": "v2"}, "replicas": 1}
    assert api.apply(p, gz(name, base), "m1")[0] == 201
    s, o = api.apply(p, gz(name, {"ports": [{"port": 80, "name": "a"}], "tags": ["a", "c"],
                                  "labelsg": {"k": "v"}}), "m2")
    assert s == 200, o
    s, o = api.apply(p, gz(name, {"ports": [{"port": 81, "name": "b"}], "tags": ["b"], "args": ["x"],
                                  "selector": {"a": "1"}, "labelsg": {"k2": "v2"}, "replicas": 1}), "m1")
    assert s == 200, o
    assert sorted(x["port"] for x in o["spec"]["ports"]) == [80, 81]
    assert sorted(o["spec"]["tags"]) == ["a", "b", "c"]
    assert o["spec"]["labelsg"] == {"k": "v", "k2": "v2"}
    s, o = api.apply(p, gz(name, {}), "m2")
    assert s == 200, o
    assert [x["port"] for x in o["spec"]["ports"]] == [81]
    assert o["spec"]["tags"] == ["b"] and o["spec"]["labelsg"] == {"k2": "v2"}
    assert mf(o)[("m2", "Apply", "")] == {"f:spec": {}}


def test_crd_conflict_message_of_apply_manager_names_no_apiversion(api):
    """Kubernetes (apimachinery managedfields/internal/conflict.go printManager): an Apply
    manager is printed by name only, `Apply failed with 1 conflict: conflict with "m1":
    .spec.args`, and the cause's message is `conflict with "m1"`; only Update managers get
    `using <apiVersion>`. Kube32 said `conflict with "m1" using atk23d.example.com/v1: .spec.args`."""
    name = uniq("cmsg")
    p = f"{GZ}/{name}"
    assert api.apply(p, gz(name, {"args": ["a"]}), "m1")[0] == 201
    s, o = api.apply(p, gz(name, {"args": ["b"]}), "m2")
    assert s == 409, o
    assert o["message"] == 'Apply failed with 1 conflict: conflict with "m1": .spec.args', o["message"]
    assert o["details"]["causes"][0]["message"] == 'conflict with "m1"'


def test_crd_several_conflicts_message_format(api):
    """Kubernetes words several conflicts grouped by manager, one path a line:
    `Apply failed with 2 conflicts: conflicts with "m1":\\n- .spec.args\\n- .spec.replicas`
    (what kubectl prints, and what tools that read the conflicting paths parse).
    Kube32 joined them with `; conflict with "m1" using ...: `."""
    name = uniq("cmany")
    p = f"{GZ}/{name}"
    assert api.apply(p, gz(name, {"args": ["a"], "replicas": 1}), "m1")[0] == 201
    s, o = api.apply(p, gz(name, {"args": ["b"], "replicas": 2}), "m2")
    assert s == 409, o
    assert o["message"] == 'Apply failed with 2 conflicts: conflicts with "m1":\n- .spec.args\n- .spec.replicas', \
        o["message"]


def test_crd_update_then_apply_conflicts_and_force(api):
    """Kubernetes: a PUT by `editor` that changes spec.replicas records editor/Update owning it
    and takes it away from m1; m1 re-applying its old value conflicts with `"editor" using
    <group>/v1`; with force it wins and editor's entry goes. Kube32 did the same (holds)."""
    name = uniq("upd")
    p = f"{GZ}/{name}"
    assert api.apply(p, gz(name, {"replicas": 1, "tags": ["x"]}), "m1")[0] == 201
    s, o = api.req("GET", p)
    o["spec"]["replicas"] = 5
    s, o = api.req("PUT", p + "?fieldManager=editor", o)
    assert s == 200, o
    assert mf(o)[("editor", "Update", "")] == {"f:spec": {"f:replicas": {}}}
    assert "f:replicas" not in mf(o)[("m1", "Apply", "")]["f:spec"]
    s, o = api.apply(p, gz(name, {"replicas": 1, "tags": ["x"]}), "m1")
    assert s == 409 and ".spec.replicas" in o["message"] and '"editor"' in o["message"], o
    s, o = api.apply(p, gz(name, {"replicas": 1, "tags": ["x"]}), "m1", force=True)
    assert s == 200 and o["spec"]["replicas"] == 1
    assert ("editor", "Update", "") not in mf(o)


def test_crd_kubectl_scale_between_applies(api):
    """Kubernetes: apply replicas 3, `kubectl scale --replicas=2` (Update, subresource scale,
    owns f:spec.f:replicas), apply again: 409 `conflict with "kubectl" with subresource "scale"
    using <group>/v1: .spec.replicas`; --force-conflicts wins. Kube32 did the same (holds)."""
    name = uniq("scl")
    man = f"apiVersion: {GROUP}/v1\nkind: Gizmo\nmetadata: {{name: {name}, namespace: default}}\nspec: {{replicas: 3}}\n"
    kubectl("apply", "--server-side", "-f", "-", stdin=man, check=True)
    kubectl("scale", f"gizmos.{GROUP}", name, "--replicas=2", check=True)
    s, o = api.req("GET", f"{GZ}/{name}")
    assert mf(o)[("kubectl", "Update", "scale")] == {"f:spec": {"f:replicas": {}}}
    p = kubectl("apply", "--server-side", "-f", "-", stdin=man)
    assert p.returncode != 0
    assert f'conflict with "kubectl" with subresource "scale" using {GROUP}/v1: .spec.replicas' in p.stderr
    kubectl("apply", "--server-side", "--force-conflicts", "-f", "-", stdin=man, check=True)
    s, o = api.req("GET", f"{GZ}/{name}")
    assert o["spec"]["replicas"] == 3 and ("kubectl", "Update", "scale") not in mf(o)


@pytest.mark.parametrize("spec,words", [
    ({"ports": [{"name": "x"}]}, "port"),
    ({"ports": [{"port": 1}, {"port": 1}]}, "duplicate"),
    ({"ports": [{"port": 1}, {"port": 1, "protocol": "TCP"}]}, "duplicate"),
    ({"tags": ["a", "a"]}, "Duplicate"),
    ({"ports": {"port": 1}}, "array"),
    ({"ports": ["x"]}, "ports"),
    ({"ports": [{"port": None}]}, "port"),
    ({"containers": [{"name": "a", "env": [{"name": "E"}, {"name": "E"}]}]}, "duplicate"),
    ({"groups": {"g": [{"id": "i"}, {"id": "i"}]}}, "duplicate"),
    ({"tags": [{"a": 1}]}, "tags"),
    ({"selector": ["a"]}, "object"),
], ids=["missing-key", "dup-key", "dup-key-default", "dup-set", "list-as-object", "scalar-item", "null-key",
        "dup-nested", "dup-under-additionalProperties", "object-in-set", "atomic-map-as-list"])
def test_crd_malformed_apply_is_4xx_and_changes_nothing(api, spec, words):
    """Kubernetes refuses each malformed apply (missing map key, duplicate key, duplicate set
    value, wrong types) with a 4xx naming the field and stores nothing.
    Kube32 did the same (holds)."""
    name = "malformed"
    p = f"{GZ}/{name}"
    s, o = api.req("GET", p)
    if s == 404:
        s, o = api.apply(p, gz(name, {"replicas": 1, "ports": [{"port": 1, "name": "x"}]}), "m1")
    rv = o["metadata"]["resourceVersion"]
    s, o = api.apply(p, gz(name, spec), "m2")
    assert 400 <= s < 500 and s != 409, (s, o)
    assert words.lower() in msg(o).lower(), msg(o)
    s, o = api.req("GET", p)
    assert o["metadata"]["resourceVersion"] == rv


def test_crd_apply_wrong_type_on_owned_field_names_the_type(api):
    """Kubernetes converts the applied configuration to its schema type before it looks for
    conflicts, so `replicas: "x"` on a field another manager owns is refused for its type
    (`.spec.replicas: expected numeric (int or float), got string`), not reported as a
    conflict. Kube32 answered 409 `Apply failed with 1 conflict ... .spec.replicas`, which
    invites --force-conflicts; only then did it name the type (422)."""
    name = uniq("wt")
    p = f"{GZ}/{name}"
    assert api.apply(p, gz(name, {"replicas": 1}), "m1")[0] == 201
    s, o = api.apply(p, gz(name, {"replicas": "x"}), "m2")
    assert s in (400, 422), (s, msg(o))
    assert "string" in msg(o) or "integer" in msg(o)


def test_crd_duplicate_json_and_yaml_keys_refused(api):
    """Kubernetes' YAML decoder refuses a mapping key given twice in an apply patch (goyaml:
    `key "replicas" already set in map`), JSON or YAML. Kube32: 400 `mapping key "replicas"
    already defined` (holds)."""
    name = uniq("dupk")
    p = f"{GZ}/{name}"
    body = f'{{"apiVersion":"{GROUP}/v1","kind":"Gizmo","metadata":{{"name":"{name}"}},' \
           '"spec":{"replicas":2,"replicas":3}}'
    s, o = api.apply(p, body, "m1")
    assert s == 400 and "replicas" in msg(o)
    assert api.req("GET", p)[0] == 404


def test_crd_apply_with_managed_fields_in_body_is_400(api):
    """Kubernetes (managedfields/internal/structuredmerge.go Apply): an apply configuration
    holding metadata.managedFields is a 400 `metadata.managedFields must be nil`.
    Kube32 answered 200 and silently ignored them."""
    name = uniq("mfb")
    p = f"{GZ}/{name}"
    assert api.apply(p, gz(name, {"replicas": 1}), "m1")[0] == 201
    g = gz(name, {"replicas": 2})
    g["metadata"]["managedFields"] = [{"manager": "zz", "operation": "Apply", "fieldsType": "FieldsV1",
                                       "fieldsV1": {"f:spec": {"f:replicas": {}}}}]
    s, o = api.apply(p, g, "m1")
    assert s == 400, (s, msg(o))
    assert "managedFields" in msg(o)


def test_crd_status_subresource_apply_records_its_manager(api):
    """Kubernetes: `kubectl apply --server-side --subresource=status --field-manager=op1`
    records op1/Apply with subresource `status` owning f:status.f:phase; op2 applying another
    phase gets 409 `conflict with "op1" with subresource "status": .status.phase`.
    Kube32 stored the status but recorded no manager at all, so op2 silently overwrote it."""
    name = uniq("st")
    p = f"{GZ}/{name}"
    assert api.apply(p, gz(name, {"replicas": 1}), "m1")[0] == 201
    st = {"apiVersion": f"{GROUP}/v1", "kind": "Gizmo", "metadata": {"name": name}, "status": {"phase": "Up"}}
    s, o = api.apply(p + "/status", st, "op1")
    assert s == 200, o
    s, o = api.req("GET", p)
    assert mf(o).get(("op1", "Apply", "status")) == {"f:status": {"f:phase": {}}}, mf(o)
    st["status"]["phase"] = "Down"
    s, o = api.apply(p + "/status", st, "op2")
    assert s == 409 and ".status.phase" in msg(o), (s, msg(o))


def test_crd_main_apply_does_not_own_status_it_ignores(api):
    """Kubernetes: with the status subresource a write of the object ignores `status`, and the
    field manager drops those reset fields from the applier's set (ResetFieldsStrategy), so
    m1 applying `status.phase` to the main resource owns no f:status. Kube32 ignored the value
    but recorded m1 owning f:status.f:phase (a field it never set)."""
    name = uniq("rst")
    p = f"{GZ}/{name}"
    assert api.apply(p, gz(name, {"replicas": 1}), "m1")[0] == 201
    s, o = api.apply(p, gz(name, {"replicas": 1}, status={"phase": "ignored"}), "m1")
    assert s == 200, o
    assert (o.get("status") or {}).get("phase") != "ignored"
    assert "f:status" not in mf(o)[("m1", "Apply", "")], mf(o)


def test_crd_two_managers_large_map_list_is_fast(api):
    """Kubernetes (structured-merge-diff) applies and updates an object whose 2000-item map
    list two managers own in well under a second (3 s allowed here). Kube32 took time that
    grows about quadratically with the list: ~2 s at 500 items, 10-24 s at 2000, 95 s at 4000
    for the second manager's apply, and every later write of the object cost as much, even a
    merge patch of spec.replicas or a PUT adding a label (8-23 s at 2000). While such writes
    ran the controllers' Lease lapsed once (`stopped leading: the Lease was not renewed within
    10s` in the control plane's log): whoever may write one custom resource can tie up the
    control plane."""
    name = uniq("big")
    p = f"{GZ}/{name}"
    items = [{"port": i} for i in range(2000)]
    assert api.apply(p, gz(name, {"ports": items}), "a", timeout=300)[0] == 201
    t = time.monotonic()
    s, o = api.apply(p, gz(name, {"ports": items}), "b", timeout=300)
    apply_s = time.monotonic() - t
    assert s == 200
    t = time.monotonic()
    s, o = api.merge(p, {"spec": {"replicas": 7}}, "mp", timeout=300)
    merge_s = time.monotonic() - t
    assert s == 200
    assert apply_s < 3 and merge_s < 3, f"second manager's apply {apply_s:.1f}s, merge patch {merge_s:.1f}s"


# --------------------------------------------------------------------------- CRD changed under its objects


@pytest.fixture()
def morph_crd(api):
    s, o = api.req("GET", f"{CRDS}/{MORPH_CRD}")
    if s == 200:
        api.req("DELETE", f"{CRDS}/{MORPH_CRD}")
        for _ in range(60):
            if api.req("GET", f"{CRDS}/{MORPH_CRD}")[0] == 404:
                break
            time.sleep(0.5)
    crd = {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
           "metadata": {"name": MORPH_CRD},
           "spec": {"group": GROUP, "scope": "Namespaced",
                    "names": {"plural": "morphs", "singular": "morph", "kind": "Morph"},
                    "versions": [{"name": "v1", "served": True, "storage": True, "schema": {"openAPIV3Schema": {
                        "type": "object", "properties": {"spec": {"type": "object", "properties": {
                            "items": {"type": "array", "items": {
                                "type": "object", "required": ["name"],
                                "properties": {"name": {"type": "string"}, "v": {"type": "string"}}}}}}}}}}]}}
    s, o = api.req("POST", CRDS, crd)
    assert s == 201, o
    wait_established(api, MORPH_CRD)

    def to_map_list():
        s, o = api.req("GET", f"{CRDS}/{MORPH_CRD}")
        it = o["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["items"]
        it["x-kubernetes-list-type"] = "map"
        it["x-kubernetes-list-map-keys"] = ["name"]
        s, o = api.req("PUT", f"{CRDS}/{MORPH_CRD}", o)
        assert s == 200, o
        time.sleep(2)

    yield to_map_list
    api.req("DELETE", f"{CRDS}/{MORPH_CRD}")


def morph(name, items):
    return {"apiVersion": f"{GROUP}/v1", "kind": "Morph", "metadata": {"name": name}, "spec": {"items": items}}


def test_crd_list_becomes_map_list_ownership_carries_on(api, morph_crd):
    """Kubernetes: m1 owned the atomic list (f:items); once the CRD makes it a map list, m2
    applying item b adds it beside a (no conflict), and m1 re-applying a and c owns them per
    key. Kube32 did the same (holds)."""
    p = f"{MORPHS}/m1"
    assert api.apply(p, morph("m1", [{"name": "a", "v": "1"}]), "m1")[0] == 201
    s, o = api.apply(p, morph("m1", [{"name": "b", "v": "2"}]), "m2")
    assert s == 409  # atomic: m1 owns the whole list
    morph_crd()
    s, o = api.apply(p, morph("m1", [{"name": "b", "v": "2"}]), "m2")
    assert s == 200, o
    assert [i["name"] for i in o["spec"]["items"]] == ["a", "b"]
    s, o = api.apply(p, morph("m1", [{"name": "a", "v": "1"}, {"name": "c", "v": "3"}]), "m1")
    assert s == 200, o
    assert set(mf(o)[("m1", "Apply", "")]["f:spec"]["f:items"]) == {'k:{"name":"a"}', 'k:{"name":"c"}'}


def test_crd_list_becomes_map_list_old_duplicates_stay_writable(api, morph_crd):
    """Kubernetes ratchets list-type validation (apiextensions customResourceStrategy.
    ValidateUpdate validates x-kubernetes-list-type on the new object only when the old one
    passed it), and SSA reads live objects with duplicates (AllowDuplicates): an object stored
    with two items named `a` before the list became a map list can still get a label by merge
    patch or PUT, and another manager can apply item `b`. Kube32 refused every write of it,
    422 `spec.items[1]: Duplicate value: map[string]interface {}{"name":"a"}`, a label change
    included: the object can only be deleted."""
    p = f"{MORPHS}/d1"
    s, o = api.req("POST", f"{MORPHS}?fieldManager=creator",
                   morph("d1", [{"name": "a", "v": "1"}, {"name": "a", "v": "2"}]))
    assert s == 201, o
    morph_crd()
    s, o = api.merge(p, {"metadata": {"labels": {"l": "2"}}}, "mp")
    assert s == 200, (s, msg(o))
    s, o = api.req("GET", p)
    o["metadata"]["labels"] = {"l": "3"}
    s, o = api.req("PUT", p + "?fieldManager=putter", o)
    assert s == 200, (s, msg(o))
    s, o = api.apply(p, morph("d1", [{"name": "b", "v": "2"}]), "m3")
    assert s == 200, (s, msg(o))
    # a new object with duplicates is still refused
    s, o = api.req("POST", MORPHS, morph("d2", [{"name": "a"}, {"name": "a"}]))
    assert s == 422


# --------------------------------------------------------------------------- 2. SSA on built-in kinds


def test_builtin_service_ports_keyed_by_port_and_protocol(api):
    """Kubernetes keys Service ports by (port, protocol) and container ports by
    (containerPort, protocol), as Kube32's own /openapi/v3 says (x-kubernetes-list-map-keys
    [port, protocol]): a DNS Service or Deployment with 53/UDP and 53/TCP applies fine.
    Kube32 refused both server-side applies with 422 `the applied configuration is invalid:
    .spec.ports: duplicate entries for key [port=53]` (a CoreDNS manifest cannot be applied
    server-side), and a plain create of such a Service recorded f:ports atomically."""
    name = uniq("dns")
    svc = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name},
           "spec": {"selector": {"app": name}, "ports": [{"port": 53, "protocol": "UDP", "name": "dns"},
                                                         {"port": 53, "protocol": "TCP", "name": "dns-tcp"}]}}
    s, o = api.apply(f"/api/v1/namespaces/default/services/{name}", svc, "m1")
    try:
        assert s == 201, (s, msg(o))
        assert set(mf(o)[("m1", "Apply", "")]["f:spec"]["f:ports"]) == {
            'k:{"port":53,"protocol":"UDP"}', 'k:{"port":53,"protocol":"TCP"}'}
    finally:
        api.req("DELETE", f"/api/v1/namespaces/default/services/{name}")
    dep = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name},
           "spec": {"replicas": 0, "selector": {"matchLabels": {"app": name}},
                    "template": {"metadata": {"labels": {"app": name}}, "spec": {"containers": [
                        {"name": "c", "image": "wasm://example.invalid/x.wasm",
                         "ports": [{"containerPort": 53, "protocol": "UDP"},
                                   {"containerPort": 53, "protocol": "TCP"}]}]}}}}
    s, o = api.apply(f"/apis/apps/v1/namespaces/default/deployments/{name}", dep, "m1")
    api.req("DELETE", f"/apis/apps/v1/namespaces/default/deployments/{name}")
    assert s == 201, (s, msg(o))


def test_builtin_container_port_managed_key_has_protocol(api):
    """Kubernetes records a container port applied as {containerPort: 81, protocol: TCP} under
    `k:{"containerPort":81,"protocol":"TCP"}`. Kube32 recorded `k:{"containerPort":81}`
    (protocol dropped from the key, kept as f:protocol)."""
    name = uniq("cport")
    dep = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name},
           "spec": {"replicas": 0, "selector": {"matchLabels": {"app": name}},
                    "template": {"metadata": {"labels": {"app": name}}, "spec": {"containers": [
                        {"name": "c", "image": "wasm://example.invalid/x.wasm",
                         "ports": [{"containerPort": 81, "protocol": "TCP"}]}]}}}}
    p = f"/apis/apps/v1/namespaces/default/deployments/{name}"
    s, o = api.apply(p, dep, "m1")
    api.req("DELETE", p)
    assert s == 201, o
    c = mf(o)[("m1", "Apply", "")]["f:spec"]["f:template"]["f:spec"]["f:containers"]['k:{"name":"c"}']
    assert list(c["f:ports"]) == ['k:{"containerPort":81,"protocol":"TCP"}'], c["f:ports"]


def test_builtin_deployment_drop_coowned_fields(api):
    """Kubernetes: m1 and m2 both apply env A, port 80 and label a; m1 drops them: they stay
    (m2 owns them); m2 drops them: they go, B (m1's) stays. Kube32 did the same (holds)."""
    name = uniq("co")
    p = f"/apis/apps/v1/namespaces/default/deployments/{name}"

    def dep(container, **md):
        return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, **md},
                "spec": {"replicas": 0, "selector": {"matchLabels": {"app": name}},
                         "template": {"metadata": {"labels": {"app": name}}, "spec": {"containers": [container]}}}}
    img = "wasm://example.invalid/x.wasm"
    try:
        s, o = api.apply(p, dep({"name": "c", "image": img, "env": [{"name": "A", "value": "1"},
                                                                   {"name": "B", "value": "2"}],
                                 "ports": [{"containerPort": 80}]}, labels={"a": "1"}), "m1")
        assert s == 201, o
        m2 = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, "labels": {"a": "1"}},
              "spec": {"template": {"spec": {"containers": [{"name": "c", "env": [{"name": "A", "value": "1"}],
                                                             "ports": [{"containerPort": 80}]}]}}}}
        assert api.apply(p, m2, "m2")[0] == 200
        s, o = api.apply(p, dep({"name": "c", "image": img, "env": [{"name": "B", "value": "2"}]}), "m1")
        c = o["spec"]["template"]["spec"]["containers"][0]
        assert [e["name"] for e in c["env"]] == ["A", "B"] and c["ports"][0]["containerPort"] == 80
        assert o["metadata"]["labels"] == {"a": "1"}
        s, o = api.apply(p, {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name},
                             "spec": {"template": {"spec": {"containers": [{"name": "c"}]}}}}, "m2")
        c = o["spec"]["template"]["spec"]["containers"][0]
        assert [e["name"] for e in c["env"]] == ["B"] and "ports" not in c
        assert "labels" not in o["metadata"]
    finally:
        api.req("DELETE", p)


def test_builtin_configmap_drop_coowned_keys(api):
    """Kubernetes: data key a and label x co-owned by m1 and m2 stay when m1 drops them and go
    when m2 drops them too; m2's entry goes once it owns nothing. Kube32 did the same (holds)."""
    name = uniq("cm")
    p = f"/api/v1/namespaces/default/configmaps/{name}"

    def cm(data=None, **md):
        o = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, **md}}
        if data is not None:
            o["data"] = data
        return o
    try:
        assert api.apply(p, cm({"a": "1", "b": "2"}, labels={"x": "y", "z": "w"}), "m1")[0] == 201
        assert api.apply(p, cm({"a": "1"}, labels={"x": "y"}, annotations={"k": "v"}), "m2")[0] == 200
        s, o = api.apply(p, cm({"b": "2"}), "m1")
        assert o["data"] == {"a": "1", "b": "2"} and o["metadata"]["labels"] == {"x": "y"}
        s, o = api.apply(p, cm(), "m2")
        assert o["data"] == {"b": "2"} and "labels" not in o["metadata"] and "annotations" not in o["metadata"]
        assert ("m2", "Apply", "") not in mf(o)
    finally:
        api.req("DELETE", p)



def test_builtin_empty_maps_are_omitted_as_kubernetes_does(api):
    """Kubernetes stores built-in kinds as Go structs whose maps are `omitempty`: a ConfigMap
    applied with `data: {}` and `metadata.annotations: {}` comes back without `data` and
    without `annotations` (the manager still owns f:data and f:metadata.f:annotations).
    Kube32 answered `data: {}` and `annotations: {}`."""
    name = uniq("empty")
    p = f"/api/v1/namespaces/default/configmaps/{name}"
    s, o = api.apply(p, {"apiVersion": "v1", "kind": "ConfigMap",
                         "metadata": {"name": name, "annotations": {}}, "data": {}}, "m1")
    api.req("DELETE", p)
    assert s == 201, o
    assert mf(o)[("m1", "Apply", "")] == {"f:data": {}, "f:metadata": {"f:annotations": {}}}
    assert "data" not in o and "annotations" not in o["metadata"], (o.get("data"), o["metadata"].get("annotations"))


# --------------------------------------------------------------------------- 3. bindings


@pytest.fixture(scope="module")
def image(api, cluster):
    return push(cluster, Path(__file__).resolve().parents[2] / "examples" / "pods" / "counter.wasm")


@pytest.fixture()
def unbound(api, image):
    """Pods that no scheduler binds (schedulerName my-sched) in namespace atk23d-b."""
    ns = "atk23d-b"
    api.req("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    made = []

    def make():
        name = uniq("p")
        s, o = api.req("POST", f"/api/v1/namespaces/{ns}/pods",
                       {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
                        "spec": {"schedulerName": "my-sched", "containers": [{"name": "c", "image": image}]}})
        assert s == 201, o
        made.append(name)
        return ns, name, o
    yield make
    for n in made:
        api.req("PATCH", f"/api/v1/namespaces/{ns}/pods/{n}", {"metadata": {"finalizers": None}},
                ctype="application/merge-patch+json")
        api.req("DELETE", f"/api/v1/namespaces/{ns}/pods/{n}?gracePeriodSeconds=0")


def binding(pod, node, kind="Node", **md):
    return {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": pod, **md},
            "target": {"apiVersion": "v1", "kind": kind, "name": node}}


def node_of(api, ns, name):
    return api.req("GET", f"/api/v1/namespaces/{ns}/pods/{name}")[1]["spec"].get("nodeName")


def test_bindings_basics(api, unbound):
    """Kubernetes: GET/PUT/DELETE of bindings are 405 (only create); POST binds (201 Status
    Success); a second binding is 409 `already assigned to node`; a missing pod 404; a
    namespace in the body other than the URL's 400; dryRun=All binds nothing; a pod being
    deleted is refused (`is being deleted, cannot be assigned to a host`).
    Kube32 did the same (holds)."""
    ns, name, _ = unbound()
    base = f"/api/v1/namespaces/{ns}"
    assert api.req("GET", f"{base}/bindings")[0] == 405
    assert api.req("GET", f"{base}/bindings/{name}")[0] == 405
    assert api.req("PUT", f"{base}/bindings/{name}", binding(name, "sim-1"))[0] == 405
    assert api.req("DELETE", f"{base}/bindings/{name}")[0] == 405
    s, o = api.req("POST", f"{base}/bindings?dryRun=All", binding(name, "sim-1"))
    assert s == 201 and node_of(api, ns, name) is None
    s, o = api.req("POST", f"{base}/bindings", binding(name, "sim-1", namespace="kube-system"))
    assert s == 400
    s, o = api.req("POST", f"{base}/bindings", binding(name, "sim-1"))
    assert s == 201 and o.get("status") == "Success", o
    assert node_of(api, ns, name) == "sim-1"
    s, o = api.req("POST", f"{base}/bindings", binding(name, "sim-2"))
    assert s == 409 and "already assigned" in msg(o)
    s, o = api.req("POST", f"{base}/pods/{name}/binding", binding(name, "sim-2"))
    assert s == 409
    assert api.req("POST", f"{base}/bindings", binding("no-such-pod", "sim-1"))[0] == 404
    ns, name2, _ = unbound()
    s, o = api.req("POST", f"{base}/pods/{name2}/binding", binding("other", "sim-1"))
    assert s == 400
    api.merge(f"{base}/pods/{name2}", {"metadata": {"finalizers": ["example.com/hold"]}}, "t")
    api.req("DELETE", f"{base}/pods/{name2}")
    s, o = api.req("POST", f"{base}/bindings", binding(name2, "sim-1"))
    assert s == 409 and "being deleted" in msg(o)


def test_bindings_invalid_node_name(api, unbound):
    """Kube32 documents (security.md) that a Binding's target.name must be a node name: 422
    naming target.name; target.name empty is `target.name: Required value` as in Kubernetes.
    Kube32 did so (holds)."""
    ns, name, _ = unbound()
    s, o = api.req("POST", f"/api/v1/namespaces/{ns}/bindings", binding(name, "Bad_Node!"))
    assert s == 422 and "target.name" in msg(o)
    s, o = api.req("POST", f"/api/v1/namespaces/{ns}/bindings",
                   {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": name}, "target": {}})
    assert s == 422 and "target.name: Required value" in msg(o)
    assert node_of(api, ns, name) is None


def test_bindings_namespace_scoped_user(api, unbound):
    """Kubernetes: a ServiceAccount with a Role granting create on `bindings` in its namespace
    binds there, is 403 in another namespace, and is 403 on `pods/binding` (another resource)
    without a rule for it. Kube32 did the same (holds)."""
    ns, name, _ = unbound()
    ns2, name2, _ = unbound()
    kubectl("apply", "-f", "-", check=True, stdin=f"""
apiVersion: v1
kind: ServiceAccount
metadata: {{name: binder, namespace: {ns}}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {{name: binder, namespace: {ns}}}
rules: [{{apiGroups: [""], resources: ["bindings"], verbs: ["create"]}}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {{name: binder, namespace: {ns}}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: binder}}
subjects: [{{kind: ServiceAccount, name: binder, namespace: {ns}}}]
""")
    tok = kubectl("create", "token", "binder", "-n", ns, check=True).stdout.strip()
    s, o = api.req("POST", f"/api/v1/namespaces/{ns}/pods/{name2}/binding", binding(name2, "sim-1"), token=tok)
    assert s == 403
    s, o = api.req("POST", "/api/v1/namespaces/default/bindings", binding(name, "sim-1"), token=tok)
    assert s == 403
    s, o = api.req("POST", f"/api/v1/namespaces/{ns}/bindings", binding(name, "sim-1"), token=tok)
    assert s == 201, o


def test_bindings_target_kind_must_be_node(api, unbound):
    """Kubernetes (ValidatePodBinding): target.kind other than "" or "Node" is 422
    `target.kind: Unsupported value: "Service": supported values: "Node", "<empty>"`.
    Kube32 answered 201 and bound the pod to node sim-1."""
    ns, name, _ = unbound()
    s, o = api.req("POST", f"/api/v1/namespaces/{ns}/bindings", binding(name, "sim-1", kind="Service"))
    assert s == 422 and "target.kind" in msg(o), (s, o)
    assert node_of(api, ns, name) is None


def test_bindings_body_must_be_a_binding(api, unbound):
    """Kubernetes refuses a body whose kind is not Binding at the bindings URL (400, the object
    provided is not a Binding). Kube32 took `kind: Pod` and bound the pod (201)."""
    ns, name, _ = unbound()
    s, o = api.req("POST", f"/api/v1/namespaces/{ns}/bindings",
                   {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "target": {"name": "sim-1"}})
    assert s == 400, (s, o)
    assert node_of(api, ns, name) is None


def test_bindings_uid_precondition(api, unbound):
    """Kubernetes (BindingREST.setPodHostAndAnnotations): binding.metadata.uid is a precondition
    on the pod (kube-scheduler sends the pod's uid so a pod deleted and recreated under the
    same name is not bound): a wrong uid is 409 `Precondition failed: UID in precondition:
    ...`. Kube32 ignored the uid and bound the pod (201)."""
    ns, name, _ = unbound()
    s, o = api.req("POST", f"/api/v1/namespaces/{ns}/bindings",
                   binding(name, "sim-1", uid="00000000-0000-0000-0000-000000000000"))
    assert s == 409 and "recondition" in msg(o), (s, o)
    assert node_of(api, ns, name) is None


def test_bindings_copy_annotations_and_set_pod_scheduled(api, unbound):
    """Kubernetes (setPodHostAndAnnotations): the Binding's annotations are copied onto the pod
    and the same write sets condition PodScheduled=True. Kube32 dropped the annotations, and
    the pod read right after the binding had no PodScheduled condition."""
    ns, name, _ = unbound()
    s, o = api.req("POST", f"/api/v1/namespaces/{ns}/bindings",
                   binding(name, "sim-1", annotations={"scheduler.example.com/score": "7"}))
    assert s == 201
    s, o = api.req("GET", f"/api/v1/namespaces/{ns}/pods/{name}")
    conds = {c["type"]: c["status"] for c in o["status"].get("conditions", [])}
    problems = []
    if (o["metadata"].get("annotations") or {}).get("scheduler.example.com/score") != "7":
        problems.append(f"annotations {o['metadata'].get('annotations')}")
    if conds.get("PodScheduled") != "True":
        problems.append(f"conditions {conds}")
    assert not problems, problems


# --------------------------------------------------------------------------- 4. other points of issue 23


def test_paging_and_bookmarks_on_custom_resources(api):
    """Kubernetes: limit pages a custom resource list with remainingItemCount and an opaque
    continue token; a garbage token is 400; a watch with allowWatchBookmarks and
    timeoutSeconds=2 gets a BOOKMARK before it ends; WatchList ends its initial events with a
    BOOKMARK annotated k8s.io/initial-events-end. Kube32 did the same (holds)."""
    for i in range(3):
        n = f"page-{i}"
        api.apply(f"{GZ}/{n}", gz(n, {"replicas": 1}), "pager")
    s, o = api.req("GET", f"{GZ}?limit=2")
    assert s == 200 and len(o["items"]) == 2 and o["metadata"].get("continue")
    assert o["metadata"].get("remainingItemCount", 0) >= 1
    s, o2 = api.req("GET", f"{GZ}?limit=2&continue=" + urllib.parse.quote(o["metadata"]["continue"]))
    assert s == 200 and {i["metadata"]["name"] for i in o2["items"]}.isdisjoint(
        {i["metadata"]["name"] for i in o["items"]})
    assert api.req("GET", f"{GZ}?limit=2&continue=garbage")[0] == 400
    c = http.client.HTTPSConnection(api.url.hostname, api.url.port, context=api.ctx, timeout=30)
    c.request("GET", f"{GZ}?watch=1&allowWatchBookmarks=true&timeoutSeconds=2&resourceVersion="
              + o["metadata"]["resourceVersion"], headers={"Authorization": "Bearer " + api.token})
    ev = [json.loads(x) for x in c.getresponse().read().decode().splitlines() if x]
    assert "BOOKMARK" in [e["type"] for e in ev]
    c = http.client.HTTPSConnection(api.url.hostname, api.url.port, context=api.ctx, timeout=30)
    c.request("GET", f"{GZ}?watch=1&sendInitialEvents=true&resourceVersionMatch=NotOlderThan"
              "&allowWatchBookmarks=true&timeoutSeconds=2", headers={"Authorization": "Bearer " + api.token})
    ev = [json.loads(x) for x in c.getresponse().read().decode().splitlines() if x]
    ends = [e for e in ev if e["type"] == "BOOKMARK" and
            (e["object"]["metadata"].get("annotations") or {}).get("k8s.io/initial-events-end") == "true"]
    assert len(ends) == 1


def test_metrics_label_custom_resource_requests(api):
    """Kubernetes labels apiserver_request_total for a custom resource with its group and
    resource (`verb="APPLY",group="atk23d.example.com",resource="gizmos"`); Kube32's
    reference says `resource` is a kind the server serves. Kube32 counted every request to
    a custom resource (APPLY, GET, LIST, DELETE) under group="" resource="" with the
    unknown paths."""
    n = uniq("met")
    api.apply(f"{GZ}/{n}", gz(n, {"replicas": 1}), "metrics")
    s, text = api.req("GET", "/metrics", headers={"Accept": "text/plain"})
    assert s == 200
    lines = [x for x in text.splitlines() if x.startswith("apiserver_request_total{") and 'verb="APPLY"' in x]
    assert any(f'group="{GROUP}"' in x and 'resource="gizmos"' in x for x in lines), "\n".join(lines)
