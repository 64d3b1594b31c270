"""Tests for kube32.apiserver.patch: RFC 7386, RFC 6902, strategic merge patch, SSA."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from hypothesis import given, settings, strategies as st

from kube32.apiserver.patch import (
    ApplyConflict,
    PatchError,
    is_strategic_kind,
    json_merge_patch,
    json_patch,
    record_update,
    rules_from_openapi,
    server_side_apply,
    strategic_merge_patch,
)

J = json.loads


# ----------------------------------------------------------------- RFC 7386

RFC7386_EXAMPLES = [  # RFC 7386 appendix A, verbatim
    ('{"a":"b"}', '{"a":"c"}', '{"a":"c"}'),
    ('{"a":"b"}', '{"b":"c"}', '{"a":"b","b":"c"}'),
    ('{"a":"b"}', '{"a":null}', '{}'),
    ('{"a":"b","b":"c"}', '{"a":null}', '{"b":"c"}'),
    ('{"a":["b"]}', '{"a":"c"}', '{"a":"c"}'),
    ('{"a":"c"}', '{"a":["b"]}', '{"a":["b"]}'),
    ('{"a":{"b":"c"}}', '{"a":{"b":"d","c":null}}', '{"a":{"b":"d"}}'),
    ('{"a":[{"b":"c"}]}', '{"a":[1]}', '{"a":[1]}'),
    ('["a","b"]', '["c","d"]', '["c","d"]'),
    ('{"a":"b"}', '["c"]', '["c"]'),
    ('{"a":"foo"}', 'null', 'null'),
    ('{"a":"foo"}', '"bar"', '"bar"'),
    ('{"e":null}', '{"a":1}', '{"e":null,"a":1}'),
    ('[1,2]', '{"a":"b","c":null}', '{"a":"b"}'),
    ('{}', '{"a":{"bb":{"ccc":null}}}', '{"a":{"bb":{}}}'),
]


@pytest.mark.parametrize("target,patch,expected", RFC7386_EXAMPLES)
def test_json_merge_patch_rfc7386_examples(target: str, patch: str, expected: str) -> None:
    t, p = J(target), J(patch)
    t0, p0 = copy.deepcopy(t), copy.deepcopy(p)
    assert json_merge_patch(t, p) == J(expected)
    assert (t, p) == (t0, p0)


def test_json_merge_patch_result_shares_nothing_with_inputs() -> None:
    target, patch = {"a": {"b": [1]}}, {"c": {"d": [2]}}
    result = json_merge_patch(target, patch)
    result["a"]["b"].append(9)
    result["c"]["d"].append(9)
    assert target == {"a": {"b": [1]}} and patch == {"c": {"d": [2]}}


def test_kubectl_annotate_and_label_bodies() -> None:
    live = {"metadata": {"name": "ck1", "annotations": {"foo": "bar", "keep": "1"}}}
    added = json_merge_patch(live, {"metadata": {"annotations": {"new": "x"}}})
    assert added["metadata"]["annotations"] == {"foo": "bar", "keep": "1", "new": "x"}
    removed = json_merge_patch(live, {"metadata": {"annotations": {"foo": None}}})
    assert removed["metadata"]["annotations"] == {"keep": "1"}


# ----------------------------------------------------------------- RFC 6902

RFC6902_EXAMPLES = [  # RFC 6902 appendix A (A.13 is about JSON parsing, not applicable)
    ('{"foo":"bar"}', '[{"op":"add","path":"/baz","value":"qux"}]', '{"baz":"qux","foo":"bar"}'),
    ('{"foo":["bar","baz"]}', '[{"op":"add","path":"/foo/1","value":"qux"}]',
     '{"foo":["bar","qux","baz"]}'),
    ('{"baz":"qux","foo":"bar"}', '[{"op":"remove","path":"/baz"}]', '{"foo":"bar"}'),
    ('{"foo":["bar","qux","baz"]}', '[{"op":"remove","path":"/foo/1"}]', '{"foo":["bar","baz"]}'),
    ('{"baz":"qux","foo":"bar"}', '[{"op":"replace","path":"/baz","value":"boo"}]',
     '{"baz":"boo","foo":"bar"}'),
    ('{"foo":{"bar":"baz","waldo":"fred"},"qux":{"corge":"grault"}}',
     '[{"op":"move","from":"/foo/waldo","path":"/qux/thud"}]',
     '{"foo":{"bar":"baz"},"qux":{"corge":"grault","thud":"fred"}}'),
    ('{"foo":["all","grass","cows","eat"]}', '[{"op":"move","from":"/foo/1","path":"/foo/3"}]',
     '{"foo":["all","cows","eat","grass"]}'),
    ('{"baz":"qux","foo":["a",2,"c"]}',
     '[{"op":"test","path":"/baz","value":"qux"},{"op":"test","path":"/foo/1","value":2}]',
     '{"baz":"qux","foo":["a",2,"c"]}'),
    ('{"foo":"bar"}', '[{"op":"add","path":"/child","value":{"grandchild":{}}}]',
     '{"foo":"bar","child":{"grandchild":{}}}'),
    ('{"foo":"bar"}', '[{"op":"add","path":"/baz","value":"qux","xyz":123}]',
     '{"foo":"bar","baz":"qux"}'),
    ('{"/":9,"~1":10}', '[{"op":"test","path":"/~01","value":10}]', '{"/":9,"~1":10}'),
    ('{"foo":["bar"]}', '[{"op":"add","path":"/foo/-","value":["abc","def"]}]',
     '{"foo":["bar",["abc","def"]]}'),
    # beyond the appendix
    ('{"a/b":1,"m~n":2}', '[{"op":"replace","path":"/a~1b","value":3},'
     '{"op":"remove","path":"/m~0n"}]', '{"a/b":3}'),
    ('{"a":{"b":[1,2]}}', '[{"op":"copy","from":"/a/b","path":"/c"},'
     '{"op":"add","path":"/c/0","value":0}]', '{"a":{"b":[1,2]},"c":[0,1,2]}'),
    ('{"a":1}', '[{"op":"test","path":"/a","value":1.0}]', '{"a":1}'),
    ('{"a":1}', '[{"op":"replace","path":"","value":{"b":2}}]', '{"b":2}'),
    ('{"a":{"b":1}}', '[{"op":"move","from":"/a","path":"/a"}]', '{"a":{"b":1}}'),
    ('{"spec":{"unschedulable":true}}', '[{"op":"remove","path":"/spec/unschedulable"}]',
     '{"spec":{}}'),
]


@pytest.mark.parametrize("target,ops,expected", RFC6902_EXAMPLES)
def test_json_patch_examples(target: str, ops: str, expected: str) -> None:
    t, o = J(target), J(ops)
    t0 = copy.deepcopy(t)
    assert json_patch(t, o) == J(expected)
    assert t == t0


RFC6902_ERRORS = [
    ('{"baz":"qux"}', '[{"op":"test","path":"/baz","value":"bar"}]', "test operation 0 failed"),
    ('{"foo":"bar"}', '[{"op":"add","path":"/baz/bat","value":"qux"}]', "'/baz' does not exist"),
    ('{"/":9,"~1":10}', '[{"op":"test","path":"/~01","value":"10"}]', "test operation 0 failed"),
    ('{"a":true}', '[{"op":"test","path":"/a","value":1}]', "test operation 0 failed"),
    ('{"a":[1]}', '[{"op":"add","path":"/a/01","value":2}]', "not a valid array index"),
    ('{"a":[1]}', '[{"op":"add","path":"/a/2","value":2}]', "out of range"),
    ('{"a":[1]}', '[{"op":"remove","path":"/a/-"}]', "not a valid array index"),
    ('{"a":1}', '[{"op":"remove","path":"/b"}]', "'/b' does not exist"),
    ('{"a":1}', '[{"op":"replace","path":"/b","value":2}]', "'/b' does not exist"),
    ('{"a":{"b":1}}', '[{"op":"move","from":"/a","path":"/a/b/c"}]', "its own child"),
    ('{"a":1}', '[{"op":"frobnicate","path":"/a"}]', "unknown op 'frobnicate'"),
    ('{"a":1}', '[{"op":"add","path":"/b"}]', "missing 'value'"),
    ('{"a":1}', '[{"op":"add","value":1}]', "missing 'path'"),
    ('{"a":1}', '[{"op":"add","path":"b","value":1}]', "must start with '/'"),
    ('{"a":1}', '[{"op":"add","path":"/a/x","value":1}]', "not an object or array"),
    ('{"a":1}', '[{"op":"replace","path":"","value":[1]}]', "not a JSON object"),
    ('{"a":1}', '{"op":"add"}', "JSON array"),
    ('{"a":1}', '[42]', "not a JSON object"),
]


@pytest.mark.parametrize("target,ops,message", RFC6902_ERRORS)
def test_json_patch_errors_name_the_problem(target: str, ops: str, message: str) -> None:
    t = J(target)
    t0 = copy.deepcopy(t)
    with pytest.raises(PatchError, match=message.replace("(", r"\(")):
        json_patch(t, J(ops))
    assert t == t0


def test_json_patch_is_all_or_nothing() -> None:
    target = {"a": 1}
    with pytest.raises(PatchError):
        json_patch(target, [{"op": "add", "path": "/b", "value": 2},
                            {"op": "test", "path": "/a", "value": 5}])
    assert target == {"a": 1}


# ------------------------------------------------------------ strategic merge patch

KUBECTL_APPLY_BODY = (
    '{"metadata":{"annotations":{"kubectl.kubernetes.io/last-applied-configuration":"{}\\n"},'
    '"labels":{"b":null}},"spec":{"replicas":2,"template":{"spec":{'
    '"$setElementOrder/containers":[{"name":"c"}],"containers":[{"$setElementOrder/env":'
    '[{"name":"Y"}],"env":[{"$patch":"delete","name":"X"}],"image":"nginx:2","name":"c"},'
    '{"$patch":"delete","name":"side"}]}}}}'
)


def _deployment(kind: str = "Deployment") -> dict:
    return {
        "apiVersion": "apps/v1", "kind": kind,
        "metadata": {"name": "web", "labels": {"a": "1", "b": "2"},
                     "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "old"}},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "web"}},
                 "template": {"metadata": {"labels": {"app": "web"}}, "spec": {"containers": [
                     {"name": "c", "image": "nginx:1",
                      "env": [{"name": "X", "value": "1"}, {"name": "Y", "value": "2"}]},
                     {"name": "side", "image": "busybox"}]}}},
    }


@pytest.mark.parametrize("kind", ["Deployment", "ReplicaSet", "DaemonSet"])
def test_kubectl_client_side_apply_body(kind: str) -> None:
    live = _deployment(kind)
    live0 = copy.deepcopy(live)
    patch = J(KUBECTL_APPLY_BODY)
    result = strategic_merge_patch(live, patch, kind)
    expected = copy.deepcopy(live0)
    expected["metadata"]["labels"] = {"a": "1"}
    expected["metadata"]["annotations"] = {"kubectl.kubernetes.io/last-applied-configuration": "{}\n"}
    expected["spec"]["replicas"] = 2
    expected["spec"]["template"]["spec"]["containers"] = [
        {"name": "c", "image": "nginx:2", "env": [{"name": "Y", "value": "2"}]}]
    assert result == expected
    assert live == live0 and patch == J(KUBECTL_APPLY_BODY)


def test_cordon_and_uncordon_bodies() -> None:
    node = {"kind": "Node", "metadata": {"name": "node1"}, "spec": {"podCIDR": "10.0.0.0/24"}}
    cordoned = strategic_merge_patch(node, {"spec": {"unschedulable": True}}, "Node")
    assert cordoned["spec"] == {"podCIDR": "10.0.0.0/24", "unschedulable": True}
    uncordoned = strategic_merge_patch(cordoned, {"spec": {"unschedulable": None}}, "Node")
    assert uncordoned == node


def test_null_for_an_absent_key_is_not_stored() -> None:
    result = strategic_merge_patch({"spec": {}}, {"spec": {"x": None, "y": {"z": None}}}, "Pod")
    assert result == {"spec": {"y": {}}}


def test_maps_merge_recursively() -> None:
    live = {"spec": {"nodeSelector": {"a": "1", "b": "2"}, "hostname": "h"}}
    patch = {"spec": {"nodeSelector": {"b": "3", "c": "4"}}}
    result = strategic_merge_patch(live, patch, "Pod")
    assert result == {"spec": {"nodeSelector": {"a": "1", "b": "3", "c": "4"}, "hostname": "h"}}


def _nest(path: tuple, value: Any) -> dict:
    """Build a document holding ``value`` at ``path``; a (field, name) pair is a
    one-container list keyed by name."""
    for step in reversed(path):
        if isinstance(step, tuple):
            field_name, item = step
            value = {field_name: [{"name": item, **value}]}
        else:
            value = {step: value}
    return value


_C = ("containers", "c")
MERGE_KEY_CASES = [  # kind, path to the list, merge key, example key values
    ("Pod", ("spec", "containers"), "name", ("a", "b", "c")),
    ("Pod", ("spec", "initContainers"), "name", ("a", "b", "c")),
    ("Pod", ("spec", "ephemeralContainers"), "name", ("a", "b", "c")),
    ("Pod", ("spec", "volumes"), "name", ("a", "b", "c")),
    ("Pod", ("spec", "imagePullSecrets"), "name", ("a", "b", "c")),
    ("Pod", ("spec", _C, "env"), "name", ("A", "B", "C")),
    ("Pod", ("spec", _C, "volumeMounts"), "mountPath", ("/a", "/b", "/c")),
    ("Pod", ("spec", _C, "ports"), "containerPort", (80, 81, 82)),
    ("Pod", ("spec", ("initContainers", "c"), "env"), "name", ("A", "B", "C")),
    ("Pod", ("metadata", "ownerReferences"), "uid", ("u1", "u2", "u3")),
    ("Pod", ("status", "conditions"), "type", ("Ready", "Initialized", "Scheduled")),
    ("Deployment", ("spec", "template", "spec", "containers"), "name", ("a", "b", "c")),
    ("Deployment", ("spec", "template", "spec", _C, "env"), "name", ("A", "B", "C")),
    ("Deployment", ("status", "conditions"), "type", ("Available", "Progressing", "X")),
    ("ReplicaSet", ("spec", "template", "spec", "volumes"), "name", ("a", "b", "c")),
    ("ReplicaSet", ("metadata", "ownerReferences"), "uid", ("u1", "u2", "u3")),
    ("DaemonSet", ("spec", "template", "spec", _C, "ports"), "containerPort", (1, 2, 3)),
    ("DaemonSet", ("spec", "template", "metadata", "ownerReferences"), "uid", ("u1", "u2", "u3")),
    ("Service", ("spec", "ports"), "port", (80, 443, 8080)),
    ("Node", ("status", "conditions"), "type", ("Ready", "MemoryPressure", "DiskPressure")),
    ("Node", ("status", "addresses"), "type", ("InternalIP", "Hostname", "ExternalIP")),
    ("ConfigMap", ("metadata", "ownerReferences"), "uid", ("u1", "u2", "u3")),
]


@pytest.mark.parametrize("kind,path,key,keys", MERGE_KEY_CASES,
                         ids=[f"{c[0]}:{c[2]}:{i}" for i, c in enumerate(MERGE_KEY_CASES)])
def test_lists_merge_by_their_merge_key(kind: str, path: tuple, key: str, keys: tuple) -> None:
    a, b, c = keys
    live = _nest(path, [{key: a, "v": "old", "w": "kept"}, {key: b, "v": "untouched"}])
    patch = _nest(path, [{key: a, "v": "new"}, {key: c, "v": "added"}])
    expected = _nest(path, [{key: a, "v": "new", "w": "kept"}, {key: b, "v": "untouched"},
                            {key: c, "v": "added"}])
    assert strategic_merge_patch(live, patch, kind) == expected
    deleted = strategic_merge_patch(live, _nest(path, [{"$patch": "delete", key: b}]), kind)
    assert deleted == _nest(path, [{key: a, "v": "old", "w": "kept"}])


REPLACED_LIST_CASES = [
    ("Pod", ("spec", "tolerations")),
    ("Pod", ("spec", _C, "args")),
    ("Pod", ("spec", _C, "envFrom")),
    ("Pod", ("spec", "ports")),             # "ports" merges only on containers/Services
    ("Node", ("spec", "taints")),
    ("Service", ("spec", "containers")),    # a merge key in one kind is not one in another
    ("Deployment", ("spec", "containers")),
    ("Pod", ("unknown", "list")),
]


@pytest.mark.parametrize("kind,path", REPLACED_LIST_CASES)
def test_lists_without_a_merge_key_are_replaced(kind: str, path: tuple) -> None:
    live = _nest(path, [{"name": "a", "v": 1}, {"name": "b"}])
    patch = _nest(path, [{"name": "a", "w": 2}])
    assert strategic_merge_patch(live, patch, kind) == patch


def test_finalizers_merge_as_a_set() -> None:
    live = {"metadata": {"finalizers": ["a", "b"]}}
    result = strategic_merge_patch(live, {"metadata": {"finalizers": ["b", "c"]}}, "Pod")
    assert result == {"metadata": {"finalizers": ["a", "b", "c"]}}
    node = strategic_merge_patch({"spec": {"podCIDRs": ["x"]}}, {"spec": {"podCIDRs": ["y"]}}, "Node")
    assert node == {"spec": {"podCIDRs": ["x", "y"]}}


def test_delete_from_primitive_list() -> None:
    live = {"metadata": {"finalizers": ["a", "b", "c"]}}
    patch = {"metadata": {"$deleteFromPrimitiveList/finalizers": ["b", "zzz"], "finalizers": ["d"]}}
    assert strategic_merge_patch(live, patch, "Deployment") == {"metadata": {"finalizers": ["a", "c", "d"]}}
    # a field that isn't there is simply left absent
    assert strategic_merge_patch({}, {"metadata": {"$deleteFromPrimitiveList/finalizers": ["a"]}},
                                 "Pod") == {"metadata": {}}


def test_patch_delete_element_that_does_not_exist_is_a_no_op() -> None:
    live = {"spec": {"containers": [{"name": "c"}]}}
    patch = {"spec": {"containers": [{"$patch": "delete", "name": "nope"}]}}
    assert strategic_merge_patch(live, patch, "Pod") == live


def test_patch_delete_in_a_map_removes_the_map() -> None:
    live = {"spec": {"strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1}},
                     "replicas": 3}}
    result = strategic_merge_patch(live, {"spec": {"strategy": {"$patch": "delete"}}}, "Deployment")
    assert result == {"spec": {"replicas": 3}}
    assert strategic_merge_patch(live, {"$patch": "delete"}, "Deployment") == {}


def test_patch_replace_in_a_map() -> None:
    live = {"spec": {"nodeSelector": {"a": "1", "b": "2"}}}
    patch = {"spec": {"nodeSelector": {"$patch": "replace", "c": "3"}}}
    assert strategic_merge_patch(live, patch, "Pod") == {"spec": {"nodeSelector": {"c": "3"}}}


def test_patch_replace_on_a_keyed_list_element_replaces_that_element() -> None:
    live = {"spec": {"containers": [{"name": "c", "image": "i", "args": ["x"]}, {"name": "d"}]}}
    patch = {"spec": {"containers": [{"$patch": "replace", "name": "c", "image": "j"}]}}
    result = strategic_merge_patch(live, patch, "Pod")
    assert result == {"spec": {"containers": [{"name": "c", "image": "j"}, {"name": "d"}]}}


def test_patch_replace_in_a_list() -> None:
    live = {"spec": {"containers": [{"name": "a", "image": "1"}, {"name": "b"}]}}
    patch = {"spec": {"containers": [{"$patch": "replace"}, {"name": "only", "image": "2"}]}}
    result = strategic_merge_patch(live, patch, "Pod")
    assert result == {"spec": {"containers": [{"name": "only", "image": "2"}]}}
    fin = strategic_merge_patch({"metadata": {"finalizers": ["a"]}},
                                {"metadata": {"finalizers": [{"$patch": "replace"}, "b"]}}, "Pod")
    assert fin == {"metadata": {"finalizers": ["b"]}}


def test_set_element_order_reorders_and_is_stripped() -> None:
    live = {"spec": {"containers": [{"name": "a"}, {"name": "b"}, {"name": "c"}]}}
    patch = {"spec": {"$setElementOrder/containers": [{"name": "c"}, {"name": "a"}, {"name": "b"}],
                      "containers": [{"name": "a", "image": "x"}]}}
    result = strategic_merge_patch(live, patch, "Pod")
    assert result == {"spec": {"containers": [{"name": "c"}, {"name": "a", "image": "x"}, {"name": "b"}]}}


def test_set_element_order_leaves_server_only_elements_in_place() -> None:
    live = {"spec": {"containers": [{"name": "a"}, {"name": "server"}, {"name": "b"}]}}
    patch = {"spec": {"$setElementOrder/containers": [{"name": "b"}, {"name": "a"}]}}
    result = strategic_merge_patch(live, patch, "Pod")
    assert [c["name"] for c in result["spec"]["containers"]] == ["b", "server", "a"]


def test_set_element_order_on_a_primitive_list() -> None:
    live = {"metadata": {"finalizers": ["a", "b"]}}
    patch = {"metadata": {"$setElementOrder/finalizers": ["c", "b", "a"], "finalizers": ["c"]}}
    assert strategic_merge_patch(live, patch, "Pod") == {"metadata": {"finalizers": ["c", "b", "a"]}}


def test_retain_keys() -> None:
    live = {"spec": {"strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1}}}}
    patch = {"spec": {"strategy": {"$retainKeys": ["type"], "type": "Recreate"}}}
    assert strategic_merge_patch(live, patch, "Deployment") == {"spec": {"strategy": {"type": "Recreate"}}}
    with pytest.raises(PatchError, match="rollingUpdate.*not listed in \\$retainKeys"):
        strategic_merge_patch(live, {"spec": {"strategy": {"$retainKeys": ["type"],
                                                           "rollingUpdate": {"maxSurge": 2}}}},
                              "Deployment")


def test_directives_never_reach_the_result() -> None:
    live = {"spec": {"containers": [{"name": "a"}]}}
    patch = {"spec": {"containers": [{"name": "new", "$setElementOrder/env": [{"name": "E"}],
                                      "env": [{"name": "E", "value": "1"}, {"$patch": "delete", "name": "Z"}],
                                      "resources": {"$patch": "replace", "limits": {"cpu": "1"}}}],
                      "tolerations": [{"key": "k", "x": {"$patch": "replace", "y": 1}}]}}
    result = strategic_merge_patch(live, patch, "Pod")
    assert "$" not in json.dumps(result)
    assert result["spec"]["containers"][1] == {"name": "new", "env": [{"name": "E", "value": "1"}],
                                               "resources": {"limits": {"cpu": "1"}}}


def test_unknown_kinds_behave_as_json_merge_patch() -> None:
    live = {"spec": {"items": [{"name": "a"}], "x": 1}, "metadata": {"finalizers": ["f"]}}
    patch = {"spec": {"items": [{"name": "b"}], "x": None}, "metadata": {"finalizers": ["g"]}}
    assert strategic_merge_patch(live, patch, "Checkpoint") == json_merge_patch(live, patch)
    assert not is_strategic_kind("Checkpoint")
    assert all(is_strategic_kind(k) for k in ("Pod", "Deployment", "Service", "Node", "ConfigMap"))


SMP_ERRORS = [
    ({"spec": {"containers": [{"image": "x"}]}}, "does not contain the merge key 'name'"),
    ({"spec": {"containers": ["c"]}}, "list elements must be objects"),
    ({"spec": {"$patch": "explode"}}, "unknown \\$patch directive 'explode'"),
    ({"spec": {"containers": [{"name": "c", "$patch": "explode"}]}}, "unknown \\$patch directive"),
    ({"spec": {"$setElementOrder/containers": [{"image": "x"}]}}, "merge key 'name'"),
    ({"spec": {"$setElementOrder/containers": "c"}}, "needs a list"),
    ({"metadata": {"$deleteFromPrimitiveList/finalizers": "a"}}, "needs a list"),
    ({"metadata": {"finalizers": [{"a": 1}]}}, "expected a list of scalars"),
    ({"spec": {"$retainKeys": "type"}}, "must be a list"),
    ({"spec": {"containers": {"name": "c"}}}, "spec.containers: expected a list"),
    ({"metadata": {"finalizers": "a"}}, "metadata.finalizers: expected a list"),
]


@pytest.mark.parametrize("patch,message", SMP_ERRORS)
def test_strategic_merge_patch_errors(patch: dict, message: str) -> None:
    live = {"metadata": {}, "spec": {"containers": [{"name": "c"}]}}
    with pytest.raises(PatchError, match=message):
        strategic_merge_patch(live, patch, "Pod")


def test_strategic_merge_patch_rejects_non_objects() -> None:
    with pytest.raises(PatchError, match="must be a JSON object"):
        strategic_merge_patch({}, [1], "Pod")  # type: ignore[arg-type]


# ----------------------------------------------------------- hypothesis round trip

_keys = st.sampled_from(["a", "b", "c", "d"])
_scalars = st.one_of(st.booleans(), st.integers(-5, 5), st.text("xyz", max_size=2))
_values = st.recursive(
    _scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(_keys, inner, max_size=3)),
    max_leaves=12,
)
_objects = st.dictionaries(_keys, _values, max_size=4)


def merge_diff(a: dict, b: dict) -> dict:
    """The merge patch that turns ``a`` into ``b`` (``b`` has no nulls)."""
    patch: dict = {k: None for k in a if k not in b}
    for key, value in b.items():
        if key in a and isinstance(a[key], dict) and isinstance(value, dict):
            sub = merge_diff(a[key], value)
            if sub:
                patch[key] = sub
        elif key not in a or a[key] != value or type(a[key]) is not type(value):
            patch[key] = value
    return patch


@settings(max_examples=150, deadline=None)
@given(_objects, _objects)
def test_merge_patch_of_a_diff_reproduces_the_target(a: dict, b: dict) -> None:
    assert json_merge_patch(a, merge_diff(a, b)) == b
    # without lists under merge keys, SMP of a built-in kind agrees with RFC 7386
    assert strategic_merge_patch(a, merge_diff(a, b), "ConfigMap") == b


# ----------------------------------------------------------------- server-side apply

NOW = "2026-01-02T03:04:05Z"


def _pod(image: str = "nginx:1", labels: dict | None = None, containers: list | None = None) -> dict:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "web", "namespace": "default", "labels": {"app": "web"} if labels is None else labels},
            "spec": {"containers": containers or [{"name": "c", "image": image}]}}


def _entries(obj: dict) -> dict[tuple[str, str], dict]:
    return {(e["manager"], e["operation"]): e["fieldsV1"] for e in obj["metadata"]["managedFields"]}


def test_ssa_creates_when_missing_and_records_ownership() -> None:
    applied = _pod()
    applied["spec"]["containers"][0]["ports"] = [{"containerPort": 80}]
    created = server_side_apply(None, applied, "kubectl", False, "Pod", now=NOW)
    # the port's keys are containerPort and protocol (Kubernetes' list-map-keys), protocol defaulted
    assert created["spec"]["containers"][0]["ports"] == [{"containerPort": 80, "protocol": "TCP"}]
    assert created["metadata"]["labels"] == {"app": "web"}
    assert created["metadata"]["managedFields"] == [{
        "manager": "kubectl", "operation": "Apply", "apiVersion": "v1", "time": NOW,
        "fieldsType": "FieldsV1",
        "fieldsV1": {"f:metadata": {"f:labels": {"f:app": {}}},
                     "f:spec": {"f:containers": {'k:{"name":"c"}': {
                         ".": {}, "f:image": {}, "f:name": {},
                         "f:ports": {'k:{"containerPort":80,"protocol":"TCP"}': {
                             ".": {}, "f:containerPort": {}, "f:protocol": {}}}}}}},
    }]
    assert "managedFields" not in applied["metadata"]  # input untouched


def test_ssa_update_merges_into_live_and_keeps_other_fields() -> None:
    live = server_side_apply(None, _pod(), "kubectl", False, "Pod", now=NOW)
    live["metadata"]["uid"] = "u-1"
    live["status"] = {"phase": "Running"}
    live["spec"]["containers"].append({"name": "injected", "image": "sidecar"})  # plain write
    updated = server_side_apply(live, _pod(image="nginx:2"), "kubectl", False, "Pod", now="later")
    assert updated["spec"]["containers"] == [{"name": "c", "image": "nginx:2"},
                                             {"name": "injected", "image": "sidecar"}]
    assert updated["metadata"]["uid"] == "u-1" and updated["status"] == {"phase": "Running"}
    [entry] = updated["metadata"]["managedFields"]
    assert entry["time"] == "later"


def test_ssa_is_idempotent() -> None:
    once = server_side_apply(None, _pod(), "kubectl", False, "Pod", now=NOW)
    assert server_side_apply(once, _pod(), "kubectl", False, "Pod", now=NOW) == once


def test_ssa_removes_fields_dropped_from_the_applied_config() -> None:
    v1 = _pod(labels={"app": "web", "tier": "front"},
              containers=[{"name": "c", "image": "i", "env": [{"name": "A", "value": "1"}]},
                          {"name": "side", "image": "s"}])
    live = server_side_apply(None, v1, "kubectl", False, "Pod", now=NOW)
    v2 = _pod(labels={"app": "web"}, containers=[{"name": "c", "image": "i"}])
    result = server_side_apply(live, v2, "kubectl", False, "Pod", now=NOW)
    assert result["metadata"]["labels"] == {"app": "web"}
    assert result["spec"]["containers"] == [{"name": "c", "image": "i"}]
    assert _entries(result)[("kubectl", "Apply")] == _entries(
        server_side_apply(None, v2, "kubectl", False, "Pod", now=NOW))[("kubectl", "Apply")]


def test_ssa_a_dropped_leaf_that_became_a_parent_keeps_its_new_children() -> None:
    live = server_side_apply(None, _pod(labels={}), "kubectl", False, "Pod", now=NOW)
    assert _entries(live)[("kubectl", "Apply")]["f:metadata"] == {"f:labels": {}}
    result = server_side_apply(live, _pod(labels={"app": "x"}), "kubectl", False, "Pod", now=NOW)
    assert result["metadata"]["labels"] == {"app": "x"}
    assert _entries(result)[("kubectl", "Apply")]["f:metadata"] == {"f:labels": {"f:app": {}}}


def test_ssa_keeps_dropped_fields_another_manager_owns() -> None:
    live = server_side_apply(None, _pod(labels={"app": "web", "tier": "front"}), "a", False, "Pod", now=NOW)
    live = server_side_apply(live, {"apiVersion": "v1", "kind": "Pod", "metadata": {
        "name": "web", "labels": {"tier": "front"}}}, "b", False, "Pod", now=NOW)
    result = server_side_apply(live, _pod(labels={"app": "web"}), "a", False, "Pod", now=NOW)
    assert result["metadata"]["labels"] == {"app": "web", "tier": "front"}
    # a container another manager added a field to survives its applier dropping it,
    # but loses the fields only the dropping applier owned
    live = server_side_apply(None, _pod(containers=[{"name": "c", "image": "i"}, {"name": "d", "image": "j"}]),
                             "a", False, "Pod", now=NOW)
    live = server_side_apply(live, {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "web"},
                                    "spec": {"containers": [{"name": "d", "args": ["x"]}]}},
                             "b", False, "Pod", now=NOW)
    result = server_side_apply(live, _pod(), "a", False, "Pod", now=NOW)
    assert result["spec"]["containers"] == [{"name": "c", "image": "nginx:1"},
                                            {"name": "d", "args": ["x"]}]


def test_ssa_conflict_with_another_apply_manager() -> None:
    def deployment(replicas: int, container: dict) -> dict:
        return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"},
                "spec": {"replicas": replicas, "template": {"spec": {"containers": [container]}}}}
    live = server_side_apply(None, deployment(1, {"name": "c"}), "helm", False, "Deployment", now=NOW)
    mine = deployment(3, {"name": "c", "image": "x"})
    with pytest.raises(ApplyConflict) as caught:
        server_side_apply(live, mine, "kubectl", False, "Deployment", now=NOW)
    assert caught.value.conflicts == [(".spec.replicas", "helm", '"helm"')]
    assert 'conflict with "helm": .spec.replicas' in str(caught.value)
    assert isinstance(caught.value, PatchError)


def test_ssa_ports_of_one_number_and_two_protocols_are_two_items() -> None:
    """A CoreDNS Service: 53/UDP and 53/TCP (Kubernetes keys Service ports by port and
    protocol, container ports by containerPort and protocol)."""
    svc = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "dns"},
           "spec": {"ports": [{"port": 53, "protocol": "UDP", "name": "dns"},
                              {"port": 53, "name": "dns-tcp"}]}}
    live = server_side_apply(None, svc, "a", False, "Service", now=NOW)
    assert set(_entries(live)[("a", "Apply")]["f:spec"]["f:ports"]) == {
        'k:{"port":53,"protocol":"TCP"}', 'k:{"port":53,"protocol":"UDP"}'}
    again = server_side_apply(live, {**svc, "spec": {"ports": [{"port": 53, "protocol": "UDP", "name": "dns"}]}},
                              "a", False, "Service", now=NOW)
    assert again["spec"]["ports"] == [{"port": 53, "protocol": "UDP", "name": "dns"}]


def test_ssa_several_conflicts_read_as_kubernetes_words_them() -> None:
    cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cm"}}
    live = server_side_apply(None, {**cm, "data": {"a": "1", "b": "1"}}, "m1", False, "ConfigMap", now=NOW)
    live["data"]["c"] = "1"
    record_update(dict(live, data={"a": "1", "b": "1"}), live, "kubectl-edit", "ConfigMap", now=NOW)
    with pytest.raises(ApplyConflict) as caught:
        server_side_apply(live, {**cm, "data": {"a": "2", "b": "2", "c": "2"}}, "m2", False, "ConfigMap", now=NOW)
    assert str(caught.value) == ('Apply failed with 3 conflicts: conflicts with "kubectl-edit" using v1:\n'
                                 '- .data.c\nconflicts with "m1":\n- .data.a\n- .data.b')


def test_ssa_conflicts_are_reported_together_with_paths_into_lists() -> None:
    live = server_side_apply(None, _pod(labels={"app": "web"}), "helm", False, "Pod", now=NOW)
    mine = _pod(image="other", labels={"app": "api"})
    with pytest.raises(ApplyConflict) as caught:
        server_side_apply(live, mine, "kubectl", False, "Pod", now=NOW)
    assert [(f, m) for f, m, _ in caught.value.conflicts] == [('.metadata.labels.app', "helm"),
                                                              ('.spec.containers[name="c"].image', "helm")]


def test_ssa_same_value_is_shared_not_a_conflict() -> None:
    live = server_side_apply(None, _pod(), "helm", False, "Pod", now=NOW)
    result = server_side_apply(live, _pod(), "kubectl", False, "Pod", now=NOW)
    entries = _entries(result)
    assert entries[("helm", "Apply")] == entries[("kubectl", "Apply")]
    # the shared field stays when one owner drops it
    slim = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "web"}}
    after = server_side_apply(result, slim, "kubectl", False, "Pod", now=NOW)
    assert after["spec"] == _pod()["spec"] and after["metadata"]["labels"] == {"app": "web"}
    assert ("kubectl", "Apply") not in _entries(after)


def test_ssa_force_moves_ownership() -> None:
    live = server_side_apply(None, _pod(), "helm", False, "Pod", now=NOW)
    forced = server_side_apply(live, _pod(image="nginx:9"), "kubectl", True, "Pod", now=NOW)
    assert forced["spec"]["containers"] == [{"name": "c", "image": "nginx:9"}]
    helm = _entries(forced)[("helm", "Apply")]
    assert "f:image" not in helm["f:spec"]["f:containers"]['k:{"name":"c"}']
    assert "f:image" in _entries(forced)[("kubectl", "Apply")]["f:spec"]["f:containers"]['k:{"name":"c"}']
    # helm no longer owns the image, so it cannot take it back without force
    with pytest.raises(ApplyConflict):
        server_side_apply(forced, _pod(), "helm", False, "Pod", now=NOW)


def test_ssa_force_drops_an_entry_left_with_nothing() -> None:
    small = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "web", "labels": {"app": "a"}}}
    live = server_side_apply(None, small, "helm", False, "Pod", now=NOW)
    mine = {**small, "metadata": {"name": "web", "labels": {"app": "b"}}}
    forced = server_side_apply(live, mine, "kubectl", True, "Pod", now=NOW)
    assert list(_entries(forced)) == [("kubectl", "Apply")]


def test_ssa_conflicts_with_an_update_manager_and_force_takes_its_fields() -> None:
    """As Kubernetes: fields a plain write set (here a client-side apply) conflict with
    an apply that changes them; ``force`` moves them to the applier."""
    live = _pod()
    live["metadata"]["managedFields"] = [{
        "manager": "kubectl-client-side-apply", "operation": "Update", "apiVersion": "v1",
        "time": NOW, "fieldsType": "FieldsV1",
        "fieldsV1": {"f:spec": {"f:containers": {'k:{"name":"c"}': {".": {}, "f:image": {}, "f:name": {}}}}}}]
    with pytest.raises(ApplyConflict) as caught:
        server_side_apply(live, _pod(image="nginx:2"), "kubectl", False, "Pod", now=NOW)
    assert caught.value.conflicts == [('.spec.containers[name="c"].image', "kubectl-client-side-apply",
                                       '"kubectl-client-side-apply" using v1')]
    result = server_side_apply(live, _pod(image="nginx:2"), "kubectl", True, "Pod", now=NOW)
    assert result["spec"]["containers"][0]["image"] == "nginx:2"
    by = {e["manager"]: e["fieldsV1"] for e in result["metadata"]["managedFields"]}
    assert "f:image" not in by["kubectl-client-side-apply"]["f:spec"]["f:containers"]['k:{"name":"c"}']
    assert "f:image" in by["kubectl"]["f:spec"]["f:containers"]['k:{"name":"c"}']
    # The same value is no conflict: the field is shared.
    shared = server_side_apply(live, _pod(), "kubectl", False, "Pod", now=NOW)
    assert [e["manager"] for e in shared["metadata"]["managedFields"]] == ["kubectl-client-side-apply", "kubectl"]


def test_ssa_last_applied_follow_up_keeps_the_main_appliers_fields() -> None:
    live = server_side_apply(None, _pod(), "kubectl", False, "Pod", now=NOW)
    annotation = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "web", "annotations": {
        "kubectl.kubernetes.io/last-applied-configuration": "{}"}}}
    result = server_side_apply(live, annotation, "kubectl-last-applied", False, "Pod", now=NOW)
    assert result["spec"] == live["spec"]
    assert result["metadata"]["annotations"] == annotation["metadata"]["annotations"]
    assert set(_entries(result)) == {("kubectl", "Apply"), ("kubectl-last-applied", "Apply")}


def test_ssa_lists_are_atomic_for_custom_resources() -> None:
    ck = {"apiVersion": "kube32.io/v1", "kind": "Checkpoint", "metadata": {"name": "ck1"},
          "spec": {"pod": "web-1", "targets": [{"name": "a"}, {"name": "b"}]}}
    live = server_side_apply(None, ck, "kubectl", False, "Checkpoint", now=NOW)
    assert _entries(live)[("kubectl", "Apply")] == {"f:spec": {"f:pod": {}, "f:targets": {}}}
    again = {**ck, "spec": {"pod": "web-1", "targets": [{"name": "c"}]}}
    assert server_side_apply(live, again, "kubectl", False, "Checkpoint", now=NOW)["spec"]["targets"] == [
        {"name": "c"}]


# A custom resource's schema with every marker structured-merge-diff reads.
_LT_SCHEMA = {"type": "object", "properties": {"spec": {"type": "object", "properties": {
    "tags": {"type": "array", "x-kubernetes-list-type": "set", "items": {"type": "string"}},
    "ports": {"type": "array", "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["port", "proto"],
              "items": {"type": "object", "required": ["port"], "properties": {
                  "port": {"type": "integer"}, "proto": {"type": "string", "default": "TCP"},
                  "note": {"type": "string"}}}},
    "kv": {"type": "object", "x-kubernetes-map-type": "atomic", "additionalProperties": {"type": "string"}},
    "groups": {"type": "object", "additionalProperties": {
        "type": "array", "x-kubernetes-list-type": "set", "items": {"type": "string"}}},
    "plain": {"type": "array", "items": {"type": "string"}},
}}}}
_LT = rules_from_openapi(_LT_SCHEMA)


def _lt(spec: dict) -> dict:
    return {"apiVersion": "k.example.com/v1", "kind": "Lt", "metadata": {"name": "o"}, "spec": spec}


def test_ssa_of_a_custom_resource_merges_map_and_set_lists_between_managers() -> None:
    live = server_side_apply(None, _lt({"tags": ["x"], "ports": [{"port": 80, "note": "a"}]}), "a", False, _LT,
                             now=NOW)
    assert live["spec"]["ports"] == [{"port": 80, "note": "a", "proto": "TCP"}]   # the key's default
    result = server_side_apply(live, _lt({"tags": ["y"], "ports": [{"port": 81, "note": "b"}]}), "b", False,
                               _LT, now=NOW)
    assert result["spec"]["tags"] == ["x", "y"]
    assert [p["port"] for p in result["spec"]["ports"]] == [80, 81]
    a = _entries(result)[("a", "Apply")]["f:spec"]
    assert a["f:tags"] == {'v:"x"': {}}
    assert a["f:ports"] == {'k:{"port":80,"proto":"TCP"}': {".": {}, "f:note": {}, "f:port": {}, "f:proto": {}}}
    # an item with another key value is another item, and a's note conflicts only with a's item
    result = server_side_apply(result, _lt({"ports": [{"port": 80, "proto": "UDP", "note": "u"}]}), "c", False,
                               _LT, now=NOW)
    assert len(result["spec"]["ports"]) == 3
    with pytest.raises(ApplyConflict) as caught:
        server_side_apply(result, _lt({"ports": [{"port": 80, "note": "z"}]}), "c", False, _LT, now=NOW)
    assert [(f, m) for f, m, _ in caught.value.conflicts] == [('.spec.ports[port=80,proto="TCP"].note', "a")]
    # a drops its item: it goes; b's stays
    result = server_side_apply(result, _lt({"tags": ["x"]}), "a", False, _LT, now=NOW)
    assert [(p["port"], p["proto"]) for p in result["spec"]["ports"]] == [(81, "TCP"), (80, "UDP")]


def test_ssa_of_a_custom_resource_map_list_needs_its_keys_once_each() -> None:
    with pytest.raises(PatchError, match="does not contain the merge key 'port'"):
        server_side_apply(None, _lt({"ports": [{"note": "a"}]}), "a", False, _LT, now=NOW)
    with pytest.raises(PatchError, match=r'duplicate entries for key \[port=1,proto="TCP"\]'):
        server_side_apply(None, _lt({"ports": [{"port": 1}, {"port": 1, "proto": "TCP"}]}), "a", False, _LT,
                          now=NOW)


def test_ssa_of_a_custom_resource_atomic_map_is_one_field() -> None:
    live = server_side_apply(None, _lt({"kv": {"a": "1"}}), "a", False, _LT, now=NOW)
    assert _entries(live)[("a", "Apply")] == {"f:spec": {"f:kv": {}}}
    with pytest.raises(ApplyConflict) as caught:
        server_side_apply(live, _lt({"kv": {"b": "2"}}), "b", False, _LT, now=NOW)
    assert [f for f, _, _ in caught.value.conflicts] == [".spec.kv"]
    forced = server_side_apply(live, _lt({"kv": {"b": "2"}}), "b", True, _LT, now=NOW)
    assert forced["spec"]["kv"] == {"b": "2"}   # replaced whole, not merged
    assert ("a", "Apply") not in _entries(forced)


def test_ssa_of_a_custom_resource_additional_properties_carry_their_rules() -> None:
    live = server_side_apply(None, _lt({"groups": {"g": ["x"]}, "plain": ["p"]}), "a", False, _LT, now=NOW)
    result = server_side_apply(live, _lt({"groups": {"g": ["y"]}}), "b", False, _LT, now=NOW)
    assert result["spec"]["groups"] == {"g": ["x", "y"]}
    with pytest.raises(ApplyConflict):   # an atomic list: one field
        server_side_apply(result, _lt({"plain": ["q"]}), "b", False, _LT, now=NOW)


def test_ssa_dropping_ones_own_keys_from_a_map_another_applied_empty_is_no_conflict() -> None:
    cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cm"}}
    live = server_side_apply(None, {**cm, "data": {}}, "a", False, "ConfigMap", now=NOW)
    live = server_side_apply(live, {**cm, "data": {"k": "v"}}, "b", False, "ConfigMap", now=NOW)
    result = server_side_apply(live, {**cm, "data": {}}, "b", False, "ConfigMap", now=NOW)
    assert result["data"] == {}
    # a value another manager set still conflicts
    live = server_side_apply(None, {**cm, "data": {"k": "v"}}, "a", False, "ConfigMap", now=NOW)
    with pytest.raises(ApplyConflict):
        server_side_apply(live, {**cm, "data": {"k": "w"}}, "b", False, "ConfigMap", now=NOW)


def test_managed_fields_of_a_custom_resource_update_follow_its_schema() -> None:
    new = _lt({"ports": [{"port": 80, "proto": "TCP"}], "tags": ["x"], "kv": {"a": "1"}})
    record_update(None, new, "kubectl-create", _LT, now=NOW)
    spec = _entries(new)[("kubectl-create", "Update")]["f:spec"]
    assert set(spec["f:ports"]) == {'k:{"port":80,"proto":"TCP"}'}
    assert spec["f:tags"] == {'v:"x"': {}}
    assert spec["f:kv"] == {}


@pytest.mark.parametrize("n", [200, 2000])
def test_ssa_of_a_long_map_list_costs_in_proportion_to_its_items(n: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two managers own a map list of n items, a plain write follows, one manager drops
    every item and the other forces them: the comparisons made grow with n, not n^2 (an
    outside tester's 2000 items once took 10-24 s an apply)."""
    import kube32.apiserver.patch as patch_module
    calls = [0]
    real_token, real_equal = patch_module._token, patch_module._json_equal

    def token(value: Any) -> str:
        calls[0] += 1
        return real_token(value)

    def equal(a: Any, b: Any) -> bool:
        calls[0] += 1
        return real_equal(a, b)
    monkeypatch.setattr(patch_module, "_token", token)
    monkeypatch.setattr(patch_module, "_json_equal", equal)
    items = [{"port": i, "note": "x"} for i in range(n)]
    live = server_side_apply(None, _lt({"ports": items}), "a", False, _LT, now=NOW)
    live = server_side_apply(live, _lt({"ports": items}), "b", False, _LT, now=NOW)
    new = json_merge_patch(live, {"spec": {"tags": ["t"]}})
    record_update(live, new, "mp", _LT, now=NOW)
    dropped = server_side_apply(new, _lt({"tags": ["t"]}), "a", False, _LT, now=NOW)
    assert len(dropped["spec"]["ports"]) == n   # b still owns them
    gone = server_side_apply(dropped, _lt({"tags": ["t"]}), "b", False, _LT, now=NOW)
    assert "ports" not in gone["spec"]
    forced = server_side_apply(new, _lt({"ports": [dict(i, note="y") for i in items]}), "c", True, _LT, now=NOW)
    assert {p["note"] for p in forced["spec"]["ports"]} == {"y"}
    assert calls[0] <= 60 * n, calls[0]


def test_ssa_nulls_mean_unspecified_and_finalizers_are_a_set() -> None:
    applied = _pod()
    applied["metadata"]["finalizers"] = ["a"]
    applied["spec"]["nodeName"] = None
    live = server_side_apply(None, applied, "x", False, "Pod", now=NOW)
    assert "nodeName" not in live["spec"]
    assert _entries(live)[("x", "Apply")]["f:metadata"]["f:finalizers"] == {'v:"a"': {}}
    live["metadata"]["finalizers"].append("controller")  # plain write
    applied["metadata"]["finalizers"] = ["b"]
    result = server_side_apply(live, applied, "x", False, "Pod", now=NOW)
    assert result["metadata"]["finalizers"] == ["controller", "b"]


SSA_ERRORS = [
    ({"spec": {"containers": [{"image": "x"}]}}, "does not contain the merge key 'name'"),
    ({"spec": {"containers": [{"name": "c"}, {"name": "c"}]}}, 'duplicate entries for key \\[name="c"\\]'),
    ({"metadata": {"finalizers": [{"a": 1}]}}, "expected a list of scalars"),
    ({"metadata": "x"}, "metadata of an applied configuration must be an object"),
    ({"spec": {"containers": "c"}}, "spec.containers: expected a list"),
]


@pytest.mark.parametrize("applied,message", SSA_ERRORS)
def test_ssa_rejects_bad_applied_configs(applied: dict, message: str) -> None:
    with pytest.raises(PatchError, match=message):
        server_side_apply(None, applied, "kubectl", False, "Pod", now=NOW)


def test_ssa_requires_a_manager_and_an_object() -> None:
    with pytest.raises(PatchError, match="fieldManager is required"):
        server_side_apply(None, _pod(), "", False, "Pod")
    with pytest.raises(PatchError, match="must be a JSON object"):
        server_side_apply(None, [], "m", False, "Pod")  # type: ignore[arg-type]


def test_ssa_default_time_is_rfc3339_utc() -> None:
    created = server_side_apply(None, _pod(), "kubectl", False, "Pod")
    stamp = created["metadata"]["managedFields"][0]["time"]
    assert len(stamp) == 20 and stamp.endswith("Z") and stamp[10] == "T"


def test_ssa_does_not_mutate_inputs() -> None:
    live = server_side_apply(None, _pod(labels={"app": "web", "x": "1"}), "kubectl", False, "Pod", now=NOW)
    live0, applied = copy.deepcopy(live), _pod(image="nginx:3")
    applied0 = copy.deepcopy(applied)
    result = server_side_apply(live, applied, "kubectl", False, "Pod", now=NOW)
    result["spec"]["containers"][0]["image"] = "mutated"
    assert live == live0 and applied == applied0


# ----------------------------------------------------------------- plain writes (Update)

def _deploy(replicas: int = 1, image: str = "a", labels: dict | None = None) -> dict:
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "web", "namespace": "default", "labels": labels or {"app": "web"}},
            "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": "web"}},
                     "template": {"metadata": {"labels": {"app": "web"}},
                                  "spec": {"containers": [{"name": "c", "image": image}]}}}}


def _written(obj: dict, manager: str, operation: str = "Update") -> set[str]:
    """The owned leaves of one entry as dotted paths, for short assertions."""
    from kube32.apiserver.patch import _path_string, _tree_to_fields  # noqa: PLC0415 - test-only view
    entry = next(e for e in obj["metadata"]["managedFields"]
                 if e["manager"] == manager and e["operation"] == operation)
    return {_path_string(p) for p in _tree_to_fields(entry["fieldsV1"]) if p[-1] != "."}


def test_a_create_records_every_field_the_creator_set() -> None:
    obj = _deploy()
    record_update(None, obj, "kubectl-create", "Deployment", now=NOW)
    (entry,) = obj["metadata"]["managedFields"]
    assert (entry["manager"], entry["operation"], entry["apiVersion"], entry["time"]) == (
        "kubectl-create", "Update", "apps/v1", NOW)
    assert _written(obj, "kubectl-create") == {
        ".metadata.labels.app", ".spec.replicas", ".spec.selector.matchLabels.app",
        ".spec.template.metadata.labels.app", '.spec.template.spec.containers[name="c"].name',
        '.spec.template.spec.containers[name="c"].image'}


def test_an_update_takes_what_it_changed_from_every_other_manager() -> None:
    live = server_side_apply(None, _deploy(3), "kubectl", False, "Deployment", now=NOW)
    scaled = copy.deepcopy(live)
    scaled["spec"]["replicas"] = 2
    record_update(live, scaled, "kubectl", "Deployment", subresource="scale", now=NOW)
    scale = next(e for e in scaled["metadata"]["managedFields"] if e.get("subresource") == "scale")
    assert scale["fieldsV1"] == {"f:spec": {"f:replicas": {}}} and scale["operation"] == "Update"
    assert ".spec.replicas" not in _written(scaled, "kubectl", "Apply")
    with pytest.raises(ApplyConflict) as caught:
        server_side_apply(scaled, _deploy(3), "kubectl", False, "Deployment", now=NOW)
    assert str(caught.value) == ('Apply failed with 1 conflict: conflict with "kubectl" with subresource '
                                 '"scale" using apps/v1: .spec.replicas')
    forced = server_side_apply(scaled, _deploy(3), "kubectl", True, "Deployment", now=NOW)
    assert forced["spec"]["replicas"] == 3
    assert [e.get("subresource") for e in forced["metadata"]["managedFields"]] == [None]   # scale's entry owned nothing


def test_an_update_keeps_what_it_owned_drops_what_is_gone_and_unchanged_fields_stay_shared() -> None:
    old = _deploy(labels={"app": "web", "tier": "x"})
    record_update(None, old, "creator", "Deployment", now=NOW)
    new = copy.deepcopy(old)
    new["metadata"]["labels"] = {"app": "web", "team": "y"}      # tier removed, team added
    record_update(old, new, "labeller", "Deployment", now=NOW)
    assert _written(new, "labeller") == {".metadata.labels.team"}
    assert ".metadata.labels.tier" not in _written(new, "creator")
    assert ".metadata.labels.app" in _written(new, "creator")


def test_a_writer_that_sends_managed_fields_sets_them_and_one_that_sends_none_keeps_them() -> None:
    old = _deploy()
    record_update(None, old, "creator", "Deployment", now=NOW)
    reset = copy.deepcopy(old)
    reset["metadata"]["managedFields"] = [{}]
    record_update(old, reset, "resetter", "Deployment", now=NOW)
    assert reset["metadata"]["managedFields"] == [{}]


def test_lists_without_their_merge_key_are_owned_whole() -> None:
    old = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
           "spec": {"containers": [{"image": "a"}, {"image": "b"}]}}
    record_update(None, old, "w", "Pod", now=NOW)
    assert _written(old, "w") == {".spec.containers"}


def test_update_managers_are_capped_at_ten_into_ancient_changes() -> None:
    """As kube-apiserver's capManagers: past 10 Update entries the oldest merge, per
    apiVersion, into one `ancient-changes` entry; Apply entries do not count."""
    cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cm"}, "data": {}}
    obj = server_side_apply(None, {**cm, "data": {"applied": "x"}}, "applier", False, "ConfigMap", now=NOW)
    for i in range(30):
        new = json.loads(json.dumps(obj))
        new["data"][f"k{i}"] = str(i)
        record_update(obj, new, f"m{i:02}", "ConfigMap", now=f"2026-12-03T10:{i:02}:00Z")
        obj = new
    entries = obj["metadata"]["managedFields"]
    updates = [e for e in entries if e["operation"] == "Update"]
    assert len(updates) == 10 and ("applier", "Apply") in {(e["manager"], e["operation"]) for e in entries}
    ancient = [e for e in updates if e["manager"] == "ancient-changes"]
    assert len(ancient) == 1
    assert {f"f:k{i}" for i in range(21)} <= set(ancient[0]["fieldsV1"]["f:data"])
    assert [e["manager"] for e in updates if e["manager"] != "ancient-changes"] == [f"m{i}" for i in range(21, 30)]


# A plain write's changed leaves, found with and without skipping the subtrees whose JSON
# text is the same in both versions: the same set (numbers of another type, lists keyed by
# a merge key, set lists, items added and removed; managedFields are read the same way).
_SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-2, 2), st.sampled_from([0.0, 1.0, 1.5, -0.0]),
                     st.sampled_from(["a", "b", "1"]))
_VALUES = st.recursive(_SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.sampled_from(["a", "b", "name", "c"]), inner, max_size=3)),
    max_leaves=8)
_CONTAINERS = st.lists(st.fixed_dictionaries({"name": st.sampled_from(["x", "y", 1, 1.0, True])},
                                             optional={"image": _SCALARS, "ports": _VALUES}), max_size=3)
_PODS = st.fixed_dictionaries({"apiVersion": st.just("v1"), "kind": st.just("Pod"),
                               "metadata": st.fixed_dictionaries({"name": st.just("p")}, optional={
                                   "labels": st.dictionaries(st.sampled_from(["a", "b"]), _SCALARS, max_size=2),
                                   "finalizers": st.lists(_SCALARS, max_size=3)}),
                               "spec": st.fixed_dictionaries({}, optional={"containers": _CONTAINERS, "x": _VALUES}),
                               "status": _VALUES})


@settings(max_examples=300, deadline=None)
@given(_PODS, _PODS)
def test_an_update_finds_the_same_changed_leaves_without_walking_unchanged_subtrees(old: Any, new: Any) -> None:
    from kube32.apiserver import patch as patch_module
    schema = patch_module._schema_for("Pod")
    present = patch_module._written_paths(new, schema, (), top=True)
    assert (patch_module._written(old, new, present)
            == patch_module._written(old, new, present, shortcut=False))
    # and on a version that shares most of the old one's text
    new_spec = {**new, "spec": old["spec"]}
    present = patch_module._written_paths(new_spec, schema, (), top=True)
    assert (patch_module._written(old, new_spec, present)
            == patch_module._written(old, new_spec, present, shortcut=False))
