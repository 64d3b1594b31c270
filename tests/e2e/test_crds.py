"""apiextensions.k8s.io/v1 CustomResourceDefinitions with the real kubectl and the
``kubernetes`` Python client (CustomObjectsApi and the dynamic client), against a
``kube32-sim control-plane``: a CRD applied and Established, its custom resources
created, listed, watched, patched (merge, JSON, server-side apply; strategic merge is
415), their status written only through /status, printer columns and a short name,
422s from the schema, pruning, defaults; CEL rules (x-kubernetes-validations) on create,
update (transition rules), status and scale writes, and bad or costly rules refused; the CRD deleted with its custom resources;
and (with etcd) a CRD made through one API server served by another.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest
import yaml

from tests.conftest import ControlPlane, start_control_plane, wait_for
from tests.etcd import need_etcd

pytestmark = pytest.mark.e2e


def crd(group: str = "example.com", plural: str = "widgets", kind: str = "Widget",
        short: list[str] | None = None, **extra: object) -> dict:
    schema = {"type": "object", "properties": {
        "spec": {"type": "object", "required": ["replicas"], "properties": {
            "replicas": {"type": "integer", "minimum": 0, "maximum": 10},
            "color": {"type": "string", "enum": ["red", "blue"], "default": "red"},
            "size": {"x-kubernetes-int-or-string": True},
            "labels": {"type": "object", "additionalProperties": {"type": "string"}},
            "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}}},
        "status": {"type": "object", "properties": {"ready": {"type": "integer"}}}}}
    version = {"name": "v1", "served": True, "storage": True,
               "subresources": {"status": {}, "scale": {"specReplicasPath": ".spec.replicas",
                                                        "statusReplicasPath": ".status.ready"}},
               "additionalPrinterColumns": [
                   {"name": "Replicas", "type": "integer", "jsonPath": ".spec.replicas"},
                   {"name": "Color", "type": "string", "jsonPath": ".spec.color"},
                   {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}],
               "schema": {"openAPIV3Schema": schema}}
    return {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": f"{plural}.{group}"},
            "spec": {"group": group, "scope": "Namespaced", "versions": [version],
                     "names": {"plural": plural, "singular": kind.lower(), "kind": kind,
                               "shortNames": short if short is not None else ["wdg"], "categories": ["all"]},
                     **extra}}


def widget(name: str, **spec: object) -> str:
    return yaml.safe_dump({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": name},
                           "spec": spec})


@pytest.fixture(scope="module")
def cp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    c = start_control_plane(tmp_path_factory.mktemp("crds") / "cp", "--no-kubelet")
    try:
        c.kubectl("apply", "-f", "-", input=yaml.safe_dump(crd()))
        c.kubectl("wait", "--for=condition=Established", "crd/widgets.example.com", "--timeout=20s")
        yield c
    finally:
        c.proc.stop()


def get(cp: ControlPlane, *args: str) -> dict:
    return json.loads(cp.kubectl("get", *args, "-o", "json").stdout)


def test_the_crd_is_established_with_its_names_and_discovered(cp: ControlPlane) -> None:
    obj = get(cp, "crd", "widgets.example.com")
    conditions = {c["type"]: c["status"] for c in obj["status"]["conditions"]}
    assert conditions == {"NamesAccepted": "True", "Established": "True"}
    assert obj["status"]["acceptedNames"]["kind"] == "Widget"
    assert obj["status"]["storedVersions"] == ["v1"]
    assert "customresourcecleanup.apiextensions.k8s.io" in obj["metadata"]["finalizers"]
    out = cp.kubectl("api-resources", "--api-group", "example.com").stdout
    assert "widgets" in out and "wdg" in out and "Widget" in out
    groups = json.loads(cp.kubectl("get", "--raw", "/apis").stdout)["groups"]
    assert any(g["name"] == "example.com" for g in groups)
    listed = json.loads(cp.kubectl("get", "--raw", "/apis/example.com/v1").stdout)["resources"]
    entry = next(r for r in listed if r["name"] == "widgets")
    assert entry["shortNames"] == ["wdg"] and entry["categories"] == ["all"] and "watch" in entry["verbs"]
    assert any(r["name"] == "widgets/status" for r in listed)
    root = json.loads(cp.kubectl("get", "--raw", "/openapi/v3").stdout)["paths"]
    assert "apis/example.com/v1" in root


def test_create_get_list_with_printer_columns_short_name_and_defaults(cp: ControlPlane) -> None:
    cp.kubectl("apply", "-f", "-", input=widget("cols", replicas=3, size="5"))
    out = cp.kubectl("get", "wdg").stdout.splitlines()
    assert out[0].split() == ["NAME", "REPLICAS", "COLOR", "AGE"]
    assert any(line.split()[:3] == ["cols", "3", "red"] for line in out[1:])
    obj = get(cp, "widget", "cols")
    assert obj["spec"] == {"replicas": 3, "color": "red", "size": "5"}   # the default applied
    assert obj["metadata"]["generation"] == 1
    assert "cols" in cp.kubectl("get", "all").stdout   # the "all" category
    names = cp.kubectl("get", "widgets", "--field-selector", "metadata.name=cols", "-o", "name").stdout
    assert names.strip() == "widget.example.com/cols"


def test_the_schema_refuses_with_kubernetes_words_and_prunes(cp: ControlPlane) -> None:
    bad = cp.kubectl("apply", "-f", "-", input=widget("bad", replicas="x"), check=False)
    assert bad.returncode != 0
    assert ('spec.replicas: Invalid value: "string": spec.replicas in body must be of type integer: "string"'
            in bad.stderr), bad.stderr
    high = cp.kubectl("apply", "-f", "-", input=widget("bad", replicas=11), check=False)
    assert "spec.replicas in body should be less than or equal to 10" in high.stderr
    color = cp.kubectl("apply", "-f", "-", input=widget("bad", replicas=1, color="green"), check=False)
    assert 'spec.color: Unsupported value: "green": supported values: "red", "blue"' in color.stderr
    missing = cp.kubectl("apply", "-f", "-", input=widget("bad"), check=False)
    assert "spec.replicas: Required value" in missing.stderr
    strict = cp.kubectl("apply", "-f", "-", input=widget("pruned", replicas=1, extra=1), check=False)
    assert 'strict decoding error: unknown field "spec.extra"' in strict.stderr
    warned = cp.kubectl("apply", "--validate=warn", "-f", "-",
                        input=widget("pruned", replicas=1, extra=1, free={"any": {"thing": 1}}))
    assert 'unknown field "spec.extra"' in warned.stderr
    assert get(cp, "widget", "pruned")["spec"] == {"replicas": 1, "color": "red", "free": {"any": {"thing": 1}}}


def test_patches_apply_status_and_generation(cp: ControlPlane) -> None:
    cp.kubectl("apply", "-f", "-", input=widget("p", replicas=1))
    cp.kubectl("patch", "widget", "p", "--type", "merge", "-p", '{"spec":{"replicas":2},"status":{"ready":5}}')
    obj = get(cp, "widget", "p")
    assert obj["spec"]["replicas"] == 2 and "status" not in obj and obj["metadata"]["generation"] == 2
    cp.kubectl("patch", "widget", "p", "--subresource", "status", "--type", "merge",
               "-p", '{"status":{"ready":5},"spec":{"replicas":9}}')
    obj = get(cp, "widget", "p")
    assert obj["status"] == {"ready": 5} and obj["spec"]["replicas"] == 2 and obj["metadata"]["generation"] == 2
    bad_status = cp.kubectl("patch", "widget", "p", "--subresource", "status", "--type", "merge",
                            "-p", '{"status":{"ready":"many"}}', check=False)
    assert 'status.ready: Invalid value: "string": status.ready in body must be of type integer' in bad_status.stderr
    cp.kubectl("patch", "widget", "p", "--type", "json", "-p", '[{"op":"replace","path":"/spec/replicas","value":4}]')
    smp = cp.kubectl("patch", "widget", "p", "-p", '{"spec":{"replicas":3}}', check=False)
    assert smp.returncode != 0 and "application/strategic-merge-patch+json" in smp.stderr
    cp.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-", input=widget("p", replicas=6, color="blue"))
    obj = get(cp, "widget", "p")
    assert obj["spec"]["replicas"] == 6 and obj["spec"]["color"] == "blue"
    cp.kubectl("scale", "widget", "p", "--replicas=5")
    scale = json.loads(cp.kubectl("get", "--raw", "/apis/example.com/v1/namespaces/default/widgets/p/scale").stdout)
    assert scale["spec"]["replicas"] == 5 and scale["status"]["replicas"] == 5 and scale["kind"] == "Scale"
    cp.kubectl("scale", "widget", "p", "--replicas=6")
    dry = cp.kubectl("patch", "widget", "p", "--dry-run=server", "--type", "merge", "-p", '{"spec":{"replicas":7}}')
    assert dry.returncode == 0 and get(cp, "widget", "p")["spec"]["replicas"] == 6


def lister_crd() -> dict:
    """listers.example.org: every list and map marker server-side apply reads."""
    spec = {"type": "object", "properties": {
        "tags": {"type": "array", "x-kubernetes-list-type": "set", "items": {"type": "string"}},
        "ports": {"type": "array", "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["port", "proto"],
                  "items": {"type": "object", "required": ["port"], "properties": {
                      "port": {"type": "integer"}, "proto": {"type": "string", "default": "TCP"},
                      "note": {"type": "string"}}}},
        "kv": {"type": "object", "x-kubernetes-map-type": "atomic", "additionalProperties": {"type": "string"}}}}
    version = {"name": "v1", "served": True, "storage": True,
               "schema": {"openAPIV3Schema": {"type": "object", "properties": {"spec": spec}}}}
    return {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": "listers.example.org"},
            "spec": {"group": "example.org", "scope": "Namespaced", "versions": [version],
                     "names": {"plural": "listers", "singular": "lister", "kind": "Lister"}}}


def lister(name: str, **spec: object) -> str:
    return yaml.safe_dump({"apiVersion": "example.org/v1", "kind": "Lister", "metadata": {"name": name},
                           "spec": spec})


def test_server_side_apply_follows_the_crds_list_and_map_types(cp: ControlPlane) -> None:
    """Two field managers with kubectl apply --server-side: a list-type map (two keys, one
    defaulted) and a set merge item by item, an atomic map is one field (a conflict, then
    replaced whole with --force-conflicts), and managedFields say so in Kubernetes' form."""
    cp.kubectl("apply", "-f", "-", input=yaml.safe_dump(lister_crd()))
    cp.kubectl("wait", "--for=condition=Established", "crd/listers.example.org", "--timeout=20s")

    def apply(manager: str, *flags: str, **spec: object) -> subprocess.CompletedProcess:
        return cp.kubectl("apply", "--server-side", f"--field-manager={manager}", *flags, "-f", "-",
                          input=lister("l1", **spec), check=False)

    first = apply("a", tags=["x"], ports=[{"port": 80, "note": "a"}], kv={"a": "1"})
    assert first.returncode == 0, first.stderr
    second = apply("b", tags=["z"], ports=[{"port": 81, "note": "b"}])
    assert second.returncode == 0, second.stderr
    obj = get(cp, "lister", "l1", "--show-managed-fields")
    assert obj["spec"]["tags"] == ["x", "z"]
    assert obj["spec"]["ports"] == [{"port": 80, "proto": "TCP", "note": "a"}, {"port": 81, "proto": "TCP", "note": "b"}]
    owned = {m["manager"]: m["fieldsV1"]["f:spec"] for m in obj["metadata"]["managedFields"]}
    assert set(owned["a"]["f:ports"]) == {'k:{"port":80,"proto":"TCP"}'} and set(owned["a"]["f:tags"]) == {'v:"x"'}
    assert owned["a"]["f:kv"] == {}
    clash = apply("b", kv={"b": "2"})
    assert clash.returncode != 0 and 'conflict with "a"' in clash.stderr and ".spec.kv" in clash.stderr, clash.stderr
    forced = apply("b", "--force-conflicts", kv={"b": "2"})
    assert forced.returncode == 0, forced.stderr
    assert get(cp, "lister", "l1")["spec"]["kv"] == {"b": "2"}
    dup = apply("c", ports=[{"port": 1}, {"port": 1, "proto": "TCP"}])
    assert dup.returncode != 0 and 'port=1,proto="TCP"' in dup.stderr, dup.stderr


def test_dropping_ones_own_keys_from_a_map_another_manager_applied_empty_is_no_conflict(cp: ControlPlane) -> None:
    def apply(manager: str, data: dict) -> subprocess.CompletedProcess:
        body = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "shared"}, "data": data}
        return cp.kubectl("apply", "--server-side", f"--field-manager={manager}", "-f", "-",
                          input=yaml.safe_dump(body), check=False)
    assert apply("a", {}).returncode == 0
    assert apply("b", {"k": "v"}).returncode == 0
    dropped = apply("b", {})
    assert dropped.returncode == 0, dropped.stderr
    assert not get(cp, "configmap", "shared").get("data")


def gadget_crd(*rules: dict, spec_rules: list[dict] | None = None) -> dict:
    """gadgets.example.net: CEL rules on its spec (``spec_rules``) and on its root (``rules``)."""
    schema = {"type": "object", "x-kubernetes-validations": list(rules), "properties": {
        "spec": {"type": "object", "x-kubernetes-validations": spec_rules or [], "properties": {
            "replicas": {"type": "integer", "minimum": 0, "maximum": 10},
            "max": {"type": "integer"},
            "owner": {"type": "string", "maxLength": 63},
            "tags": {"type": "array", "maxItems": 8, "items": {"type": "string", "maxLength": 16}}}},
        "status": {"type": "object", "properties": {"ready": {"type": "integer"}}}}}
    version = {"name": "v1", "served": True, "storage": True, "schema": {"openAPIV3Schema": schema},
               "subresources": {"status": {}, "scale": {"specReplicasPath": ".spec.replicas",
                                                        "statusReplicasPath": ".status.ready"}}}
    return {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": "gadgets.example.net"},
            "spec": {"group": "example.net", "scope": "Namespaced", "versions": [version],
                     "names": {"plural": "gadgets", "singular": "gadget", "kind": "Gadget", "shortNames": ["gdg"]}}}


def gadget(name: str, **spec: object) -> str:
    return yaml.safe_dump({"apiVersion": "example.net/v1", "kind": "Gadget", "metadata": {"name": name},
                           "spec": spec})


GADGET_RULES = [
    {"rule": "self.replicas <= self.max", "message": "replicas must not exceed max"},
    {"rule": "self.owner == oldSelf.owner", "message": "owner is immutable", "fieldPath": ".owner"},
    {"rule": "self.replicas >= oldSelf.replicas || self.replicas > 0", "reason": "FieldValueForbidden",
     "messageExpression": "'may not scale ' + string(oldSelf.replicas) + ' down to 0'"},
    {"rule": "!has(self.tags) || self.tags.all(t, t.lowerAscii() == t)", "message": "tags must be lower case"}]
GADGET_ROOT_RULES = [{"rule": "!has(self.status) || self.status.ready <= self.spec.max",
                      "message": "ready may not exceed max"}]


def test_a_crd_with_cel_rules_refuses_what_they_refuse(cp: ControlPlane) -> None:
    """x-kubernetes-validations with kubectl: a violating object, a transition rule on
    update, a rule over a status write and a scale, each refused in Kubernetes' words."""
    cp.kubectl("apply", "-f", "-", input=yaml.safe_dump(gadget_crd(*GADGET_ROOT_RULES, spec_rules=GADGET_RULES)))
    cp.kubectl("wait", "--for=condition=Established", "crd/gadgets.example.net", "--timeout=20s")
    bad = cp.kubectl("apply", "-f", "-", input=gadget("g1", replicas=5, max=3, owner="ann"), check=False)
    assert bad.returncode != 0
    assert 'The Gadget "g1" is invalid: spec: Invalid value: "object": replicas must not exceed max' in bad.stderr, \
        bad.stderr
    upper = cp.kubectl("apply", "-f", "-", input=gadget("g1", replicas=1, max=3, owner="ann", tags=["A"]),
                       check=False)
    assert 'spec: Invalid value: "object": tags must be lower case' in upper.stderr, upper.stderr
    cp.kubectl("apply", "-f", "-", input=gadget("g1", replicas=2, max=3, owner="ann", tags=["a"]))
    moved = cp.kubectl("apply", "-f", "-", input=gadget("g1", replicas=2, max=3, owner="bob"), check=False)
    assert moved.returncode != 0
    assert 'The Gadget "g1" is invalid: spec.owner: Invalid value: "object": owner is immutable' in moved.stderr, \
        moved.stderr
    down = cp.kubectl("patch", "gadget", "g1", "--type", "merge", "-p", '{"spec":{"replicas":0}}', check=False)
    assert 'The Gadget "g1" is invalid: spec: Forbidden: may not scale 2 down to 0' in down.stderr, down.stderr
    assert get(cp, "gadget", "g1")["spec"]["owner"] == "ann"
    # a status write is checked against the rules of the whole object
    status = cp.kubectl("patch", "gadget", "g1", "--subresource", "status", "--type", "merge",
                        "-p", '{"status":{"ready":7}}', check=False)
    assert '<nil>: Invalid value: "object": ready may not exceed max' in status.stderr, status.stderr
    cp.kubectl("patch", "gadget", "g1", "--subresource", "status", "--type", "merge", "-p", '{"status":{"ready":1}}')
    # a scale writes the object: its schema and its rules hold there too
    above = cp.kubectl("scale", "gadget", "g1", "--replicas=5", check=False)
    assert 'The Gadget "g1" is invalid: spec: Invalid value: "object": replicas must not exceed max' in above.stderr, \
        above.stderr
    cp.kubectl("scale", "gadget", "g1", "--replicas=3")
    assert get(cp, "gadget", "g1")["spec"]["replicas"] == 3
    # the Python client sees the 422 and its causes
    from kubernetes import client
    from kubernetes.client.rest import ApiException
    api = client.CustomObjectsApi(cp.client())
    with pytest.raises(ApiException) as e:
        api.patch_namespaced_custom_object("example.net", "v1", "default", "gadgets", "g1",
                                           {"spec": {"replicas": 0}})
    body = json.loads(e.value.body)
    assert e.value.status == 422 and body["details"]["causes"][0]["reason"] == "FieldValueForbidden"
    cp.kubectl("delete", "crd", "gadgets.example.net")


def test_kubectl_scale_above_the_schema_maximum_is_refused(cp: ControlPlane) -> None:
    cp.kubectl("apply", "-f", "-", input=widget("scaled", replicas=2))
    out = cp.kubectl("scale", "widget", "scaled", "--replicas=20", check=False)
    assert out.returncode != 0
    assert ('The Widget "scaled" is invalid: spec.replicas: Invalid value: 20: spec.replicas in body should be '
            "less than or equal to 10") in out.stderr, out.stderr
    patch = cp.kubectl("patch", "widget", "scaled", "--subresource", "scale", "--type", "merge",
                       "-p", '{"spec":{"replicas":11}}', check=False)
    assert "spec.replicas in body should be less than or equal to 10" in patch.stderr, patch.stderr
    assert get(cp, "widget", "scaled")["spec"]["replicas"] == 2
    cp.kubectl("scale", "widget", "scaled", "--replicas=10")
    assert get(cp, "widget", "scaled")["spec"]["replicas"] == 10


def test_a_crd_with_a_bad_or_costly_rule_is_refused(cp: ControlPlane) -> None:
    undefined = gadget_crd(spec_rules=[{"rule": "self.nope > 1"}])
    out = cp.kubectl("apply", "-f", "-", input=yaml.safe_dump(undefined), check=False)
    assert out.returncode != 0
    assert ("spec.versions[0].schema.openAPIV3Schema.properties[spec].x-kubernetes-validations[0].rule: "
            "Invalid value: \"self.nope > 1\": compilation failed: ERROR: <input>:1:5: undefined field 'nope'"
            ) in out.stderr, out.stderr
    unsupported = gadget_crd(spec_rules=[{"rule": "self.owner.reverse() == self.owner"}])
    out = cp.kubectl("apply", "-f", "-", input=yaml.safe_dump(unsupported), check=False)
    assert "undeclared reference to 'reverse' (Kube32 supports" in out.stderr, out.stderr
    costly = gadget_crd(spec_rules=[{"rule": "self.tags.all(a, self.tags.all(b, a.matches(b)))"}])
    costly["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["tags"] = {
        "type": "array", "items": {"type": "string"}}
    out = cp.kubectl("apply", "-f", "-", input=yaml.safe_dump(costly), check=False)
    assert "Forbidden: estimated rule cost exceeds budget by factor of more than 100x" in out.stderr, out.stderr
    webhook = gadget_crd()
    webhook["spec"]["conversion"] = {"strategy": "Webhook", "webhook": {"conversionReviewVersions": ["v1"]}}
    out = cp.kubectl("apply", "-f", "-", input=yaml.safe_dump(webhook), check=False)
    assert ('spec.conversion.strategy: Unsupported value: "Webhook": Kube32 serves no conversion webhook: '
            'supported values: "None"') in out.stderr, out.stderr
    assert cp.kubectl("get", "crd", "gadgets.example.net", check=False).returncode != 0


def test_watch_sees_adds_and_deletes(cp: ControlPlane) -> None:
    watch = cp.kubectl_bg("get", "widgets", "-w", "--output-watch-events", "--request-timeout=4s")
    try:
        wait_for(lambda: True, 0.1)
        cp.kubectl("apply", "-f", "-", input=widget("watched", replicas=1))
        cp.kubectl("delete", "widget", "watched")
        out, _ = watch.communicate(timeout=20)
    finally:
        watch.kill()
    assert any(line.split()[:2] == ["ADDED", "watched"] for line in out.splitlines()), out
    assert any(line.split()[:2] == ["DELETED", "watched"] for line in out.splitlines()), out


def test_names_that_clash_are_refused(cp: ControlPlane) -> None:
    clash = crd(group="example.org", plural="gadgets", kind="Gadget", short=["po"])
    out = cp.kubectl("apply", "-f", "-", input=yaml.safe_dump(clash), check=False)
    assert out.returncode != 0 and '"po": is already in use by the built-in resource pods' in out.stderr
    again = crd(group="example.org", plural="gizmos", kind="Gizmo", short=["wdg"])
    out = cp.kubectl("apply", "-f", "-", input=yaml.safe_dump(again), check=False)
    assert '"wdg": is already in use by CustomResourceDefinition widgets.example.com' in out.stderr
    two_storage = crd(group="example.org", plural="things", kind="Thing", short=[])
    two_storage["spec"]["versions"].append({**two_storage["spec"]["versions"][0], "name": "v2"})
    out = cp.kubectl("apply", "-f", "-", input=yaml.safe_dump(two_storage), check=False)
    assert "must have exactly one version marked as storage version" in out.stderr
    bad_name = crd(group="example.org", plural="things", kind="Thing", short=[])
    bad_name["metadata"]["name"] = "other.example.org"
    out = cp.kubectl("apply", "-f", "-", input=yaml.safe_dump(bad_name), check=False)
    assert 'must be spec.names.plural+"."+spec.group' in out.stderr


def test_deleting_a_namespace_deletes_its_custom_resources(cp: ControlPlane) -> None:
    cp.kubectl("create", "namespace", "crd-ns")
    cp.kubectl("apply", "-n", "crd-ns", "-f", "-", input=widget("inside", replicas=1))
    cp.kubectl("delete", "namespace", "crd-ns", "--wait=false")
    wait_for(lambda: cp.kubectl("get", "namespace", "crd-ns", check=False).returncode != 0, 20,
             what="the namespace emptied of its widgets and gone")


def test_objects_owned_by_a_custom_resource_go_with_it(cp: ControlPlane) -> None:
    cp.kubectl("apply", "-f", "-", input=widget("owner", replicas=1))
    uid = get(cp, "widget", "owner")["metadata"]["uid"]
    cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "owned", "ownerReferences": [
        {"apiVersion": "example.com/v1", "kind": "Widget", "name": "owner", "uid": uid}]}}
    cp.kubectl("create", "-f", "-", input=yaml.safe_dump(cm))
    cp.kubectl("delete", "widget", "owner")
    wait_for(lambda: cp.kubectl("get", "configmap", "owned", check=False).returncode != 0, 20,
             what="the garbage collector to delete the widget's ConfigMap")


def test_the_python_client_custom_objects_and_dynamic(cp: ControlPlane) -> None:
    from kubernetes import client, dynamic

    api = cp.client()
    co = client.CustomObjectsApi(api)
    co.create_namespaced_custom_object("example.com", "v1", "default", "widgets",
                                       {"apiVersion": "example.com/v1", "kind": "Widget",
                                        "metadata": {"name": "py"}, "spec": {"replicas": 2}})
    got = co.get_namespaced_custom_object("example.com", "v1", "default", "widgets", "py")
    assert got["spec"] == {"replicas": 2, "color": "red"}
    co.patch_namespaced_custom_object("example.com", "v1", "default", "widgets", "py", {"spec": {"replicas": 3}})
    co.patch_namespaced_custom_object_status("example.com", "v1", "default", "widgets", "py",
                                             {"status": {"ready": 3}})
    listed = co.list_namespaced_custom_object("example.com", "v1", "default", "widgets")
    mine = next(i for i in listed["items"] if i["metadata"]["name"] == "py")
    assert mine["spec"]["replicas"] == 3 and mine["status"] == {"ready": 3}
    with pytest.raises(client.ApiException) as e:
        co.patch_namespaced_custom_object("example.com", "v1", "default", "widgets", "py",
                                          {"spec": {"replicas": -1}})
    assert e.value.status == 422

    dyn = dynamic.DynamicClient(api)
    widgets = dyn.resources.get(api_version="example.com/v1", kind="Widget")
    dyn_obj = widgets.get(name="py", namespace="default")
    assert dyn_obj.spec.replicas == 3
    widgets.create(body={"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "dyn"},
                         "spec": {"replicas": 1}}, namespace="default")
    assert {i.metadata.name for i in widgets.get(namespace="default").items} >= {"py", "dyn"}
    widgets.delete(name="dyn", namespace="default")
    co.delete_namespaced_custom_object("example.com", "v1", "default", "widgets", "py")


def test_a_served_false_version_and_deleting_the_crd_removes_its_objects(cp: ControlPlane) -> None:
    second = crd(group="example.net", plural="sprockets", kind="Sprocket", short=["spr"])
    second["spec"]["versions"].append({**second["spec"]["versions"][0], "name": "v1beta1", "storage": False})
    cp.kubectl("apply", "-f", "-", input=yaml.safe_dump(second))
    cp.kubectl("wait", "--for=condition=Established", "crd/sprockets.example.net", "--timeout=20s")
    body = {"apiVersion": "example.net/v1", "kind": "Sprocket", "spec": {"replicas": 1}}
    for name in ("s1", "s2"):
        cp.kubectl("create", "-f", "-", input=yaml.safe_dump({**body, "metadata": {"name": name}}))
    assert cp.kubectl("get", "--raw", "/apis/example.net/v1beta1/namespaces/default/sprockets").returncode == 0
    second["spec"]["versions"][1]["served"] = False
    cp.kubectl("apply", "-f", "-", input=yaml.safe_dump(second))
    wait_for(lambda: cp.kubectl("get", "--raw", "/apis/example.net/v1beta1/namespaces/default/sprockets",
                                check=False).returncode != 0, 10, what="v1beta1 no longer served")

    held = {**body, "metadata": {"name": "held", "finalizers": ["example.net/hold"]}}
    cp.kubectl("create", "-f", "-", input=yaml.safe_dump(held))
    cp.kubectl("delete", "crd", "sprockets.example.net", "--wait=false")

    def terminating() -> bool:
        obj = get(cp, "crd", "sprockets.example.net")
        return any(c["type"] == "Terminating" and c["status"] == "True" for c in obj["status"]["conditions"])
    wait_for(terminating, 10, what="the Terminating condition")
    wait_for(lambda: cp.kubectl("get", "sprockets", "-o", "name").stdout.strip() == "sprocket.example.net/held",
             10, what="the objects without finalizers deleted")
    refused = cp.kubectl("create", "-f", "-", input=yaml.safe_dump({**body, "metadata": {"name": "late"}}),
                         check=False)
    assert "create not allowed while custom resource definition is terminating" in refused.stderr
    cp.kubectl("patch", "sprocket", "held", "--type", "json", "-p", '[{"op":"remove","path":"/metadata/finalizers"}]')
    wait_for(lambda: cp.kubectl("get", "crd", "sprockets.example.net", check=False).returncode != 0, 10,
             what="the CRD gone")
    gone = cp.kubectl("get", "--raw", "/apis/example.net/v1/namespaces/default/sprockets", check=False)
    assert gone.returncode != 0 and "NotFound" in gone.stderr


def test_a_crd_made_through_one_api_server_is_served_by_another(tmp_path: Path) -> None:
    need_etcd()
    from kube32.sim.etcd import EtcdCluster

    etcd = EtcdCluster(tmp_path / "etcd", members=1)
    etcd.start()
    planes: list[ControlPlane] = []
    try:
        for i in (1, 2):
            planes.append(start_control_plane(tmp_path / f"cp-{i}", "--store", etcd.store_url, "--no-kubelet"))
        one, two = planes
        one.kubectl("apply", "-f", "-", input=yaml.safe_dump(crd()))
        one.kubectl("wait", "--for=condition=Established", "crd/widgets.example.com", "--timeout=20s")

        def served_by_two() -> bool:
            return two.kubectl("get", "--raw", "/apis/example.com/v1", check=False).returncode == 0
        wait_for(served_by_two, 10, what="the second API server to serve the CRD")
        two.kubectl("create", "-f", "-", input=widget("ha", replicas=1))
        assert get(one, "widget", "ha")["spec"]["replicas"] == 1
    finally:
        for p in planes:
            p.proc.stop()
        etcd.stop()


PEERING = {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
           "metadata": {"name": "clusterkopfpeerings.kopf.dev"},
           "spec": {"scope": "Cluster", "group": "kopf.dev",
                    "names": {"kind": "ClusterKopfPeering", "plural": "clusterkopfpeerings",
                              "singular": "clusterkopfpeering"},
                    "versions": [{"name": "v1", "served": True, "storage": True, "schema": {"openAPIV3Schema": {
                        "type": "object", "properties": {"status": {
                            "type": "object", "x-kubernetes-preserve-unknown-fields": True}}}}}]}}


def test_a_kopf_operator_with_finalizers_and_crd_peering(cp: ControlPlane, tmp_path: Path) -> None:
    pytest.importorskip("kopf")
    gizmos = crd(plural="gizmos", kind="Gizmo", short=[])
    gizmos["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"] = {
        "type": "object", "x-kubernetes-preserve-unknown-fields": True}
    for doc in (gizmos, PEERING):
        cp.kubectl("apply", "-f", "-", input=yaml.safe_dump(doc))
        cp.kubectl("wait", "--for=condition=Established", f"crd/{doc['metadata']['name']}", "--timeout=20s")
    cp.kubectl("apply", "-f", "-", input=yaml.safe_dump({"apiVersion": "kopf.dev/v1", "kind": "ClusterKopfPeering",
                                                         "metadata": {"name": "default"}}))
    log = (tmp_path / "kopf.log").open("wb")
    op = subprocess.Popen([sys.executable, "-m", "kopf", "run", "--all-namespaces", "--verbose",
                           str(Path(__file__).parent / "kopf" / "operator.py")],
                          stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "KUBECONFIG": str(cp.kubeconfig)})
    try:
        body = {"apiVersion": "example.com/v1", "kind": "Gizmo", "metadata": {"name": "g1"}, "spec": {"replicas": 2}}
        cp.kubectl("create", "-f", "-", input=yaml.safe_dump(body))
        wait_for(lambda: (get(cp, "gizmo", "g1").get("status") or {}).get("seen") == 2, 30,
                 what="kopf's create handler")
        assert get(cp, "gizmo", "g1")["metadata"].get("finalizers"), "kopf's finalizer"
        peers = (get(cp, "clusterkopfpeering", "default").get("status") or {})
        assert peers, "kopf announced itself in the ClusterKopfPeering"
        cp.kubectl("delete", "gizmo", "g1", "--timeout=30s")
        wait_for(lambda: "gizmo g1 deleted" in (tmp_path / "kopf.log").read_text(), 10, what="the delete handler")
    finally:
        op.terminate()
        try:
            op.wait(timeout=15)
        except subprocess.TimeoutExpired:
            op.kill()
        log.close()
    text = (tmp_path / "kopf.log").read_text()
    assert "Traceback" not in text and "Patching failed" not in text, text[-3000:]
