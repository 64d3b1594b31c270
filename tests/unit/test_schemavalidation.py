"""kube32.apiserver.schemavalidation against Kubernetes' documented behaviour of structural
schemas (validation messages as kube-apiserver words them, pruning, defaulting), and the
CRD strategy's checks of a CRD's spec."""
from __future__ import annotations

import copy
from typing import Any

import pytest

from kube32.apiserver import schemavalidation as sv
from kube32.apiserver.strategies.apiextensions import (CustomResourceDefinitionStrategy, custom_strategy,
                                                       simple_path)

SCHEMA: dict[str, Any] = {"type": "object", "properties": {"spec": {"type": "object", "properties": {
    "replicas": {"type": "integer", "minimum": 1, "maximum": 10},
    "ratio": {"type": "number", "minimum": 0, "exclusiveMinimum": True},
    "name": {"type": "string", "minLength": 3, "maxLength": 5, "pattern": "^[a-z]+$"},
    "mode": {"type": "string", "enum": ["a", "b"]},
    "tags": {"type": "array", "minItems": 1, "maxItems": 2, "items": {"type": "string"}},
    "port": {"x-kubernetes-int-or-string": True},
    "note": {"type": "string", "nullable": True},
    "on": {"type": "boolean"},
    "map": {"type": "object", "additionalProperties": {"type": "integer"}},
    "nested": {"type": "object", "required": ["x"], "properties": {"x": {"type": "integer"}}},
    "template": {"type": "object", "x-kubernetes-embedded-resource": True,
                 "x-kubernetes-preserve-unknown-fields": True}}}}}


@pytest.mark.parametrize("spec,expected", [
    ({"replicas": 3}, []),
    ({"replicas": "x"}, [("spec.replicas", 'Invalid value: "string": spec.replicas in body must be of type '
                                           'integer: "string"')]),
    ({"replicas": 1.5}, [("spec.replicas", 'Invalid value: "number": spec.replicas in body must be of type '
                                           'integer: "number"')]),
    ({"replicas": True}, [("spec.replicas", 'Invalid value: "boolean": spec.replicas in body must be of type '
                                            'integer: "boolean"')]),
    ({"replicas": 0}, [("spec.replicas", "Invalid value: 0: spec.replicas in body should be greater than or "
                                         "equal to 1")]),
    ({"replicas": 11}, [("spec.replicas", "Invalid value: 11: spec.replicas in body should be less than or "
                                          "equal to 10")]),
    ({"ratio": 0}, [("spec.ratio", "Invalid value: 0: spec.ratio in body should be greater than 0")]),
    ({"ratio": 2}, []),
    ({"name": "ab"}, [("spec.name", 'Invalid value: "ab": spec.name in body should be at least 3 chars long')]),
    ({"name": "abcdef"}, [("spec.name", "Too long: may not be longer than 5")]),
    ({"name": "AbC"}, [("spec.name", "Invalid value: \"AbC\": spec.name in body should match '^[a-z]+$'")]),
    ({"mode": "c"}, [("spec.mode", 'Unsupported value: "c": supported values: "a", "b"')]),
    ({"tags": []}, [("spec.tags", "Invalid value: 0: spec.tags in body should have at least 1 items")]),
    ({"tags": ["a", "b", "c"]}, [("spec.tags", "Too many: 3: must have at most 2 items")]),
    ({"tags": ["a", 1]}, [("spec.tags[1]", 'Invalid value: "integer": spec.tags[1] in body must be of type '
                                           'string: "integer"')]),
    ({"port": 80}, []), ({"port": "http"}, []),
    ({"port": 1.5}, [("spec.port", 'Invalid value: "number": spec.port in body must be of type integer or '
                                   'string: "number"')]),
    ({"note": None}, []),
    ({"on": None}, [("spec.on", 'Invalid value: "null": spec.on in body must be of type boolean: "null"')]),
    ({"map": {"a": 1, "b": "x"}}, [("spec.map.b", 'Invalid value: "string": spec.map.b in body must be of '
                                                  'type integer: "string"')]),
    ({"nested": {}}, [("spec.nested.x", "Required value")]),
    ({"template": {"kind": "Pod"}}, [("spec.template.apiVersion", "Required value: must not be empty")]),
    ({"template": {"kind": "Pod", "apiVersion": "v1", "anything": 1}}, []),
])
def test_validation_words_errors_as_kubernetes(spec: dict, expected: list) -> None:
    assert sv.validate({"apiVersion": "x/v1", "kind": "X", "metadata": {}, "spec": spec}, SCHEMA) == expected


def test_pruning_drops_what_the_schema_does_not_name_and_keeps_what_it_preserves() -> None:
    obj = {"apiVersion": "x/v1", "kind": "X", "metadata": {"name": "a"}, "top": 1,
           "spec": {"replicas": 1, "extra": {"deep": 1}, "map": {"k": 1},
                    "template": {"apiVersion": "v1", "kind": "Pod", "metadata": {}, "free": 2},
                    "nested": {"x": 1, "y": 2}}}
    dropped = sv.prune(obj, SCHEMA)
    assert sorted(dropped) == ["spec.extra", "spec.nested.y", "top"]
    assert obj["metadata"] == {"name": "a"} and obj["spec"]["template"]["free"] == 2
    assert obj["spec"]["map"] == {"k": 1}


def test_defaults_fill_absent_fields_only() -> None:
    schema = {"type": "object", "properties": {"spec": {"type": "object", "default": {}, "properties": {
        "color": {"type": "string", "default": "red"},
        "items": {"type": "array", "items": {"type": "object", "properties": {
            "w": {"type": "integer", "default": 1}}}}}}}}
    obj: dict[str, Any] = {"spec": {"items": [{}, {"w": 5}]}}
    sv.apply_defaults(obj, schema)
    assert obj == {"spec": {"color": "red", "items": [{"w": 1}, {"w": 5}]}}
    empty: dict[str, Any] = {}
    sv.apply_defaults(empty, schema)
    assert empty == {"spec": {"color": "red"}}


@pytest.mark.parametrize("schema,fragment", [
    ({"type": "string"}, 'the root schema must be of type "object"'),
    ({"type": "object", "properties": {"a": {"type": "array"}}}, "must be specified for an array"),
    ({"type": "object", "properties": {"a": {"properties": {"b": {"type": "string"}}}}},
     "must not be empty for specified object fields"),
    ({"type": "object", "properties": {"a": {"type": "strin"}}}, 'Unsupported value: "strin"'),
    ({"type": "object", "properties": {"a": {"$ref": "#/x"}}}, "not allowed in a structural schema"),
    ({"type": "object", "properties": {"a": {"type": "string", "pattern": "("}}}, "valid regular expression"),
    ({"type": "object", "properties": {"a": {"type": "integer", "default": "x"}}}, "must be of type integer"),
    ({"type": "object", "properties": {"a": {"type": "string", "pattern": "^(a+)+$"}}}, "backtracking engine"),
    ({"type": "object", "properties": {"a": {"type": "integer", "x-kubernetes-int-or-string": True}}},
     "must be empty if x-kubernetes-int-or-string is true"),
])
def test_schemas_that_are_not_structural_are_refused(schema: dict, fragment: str) -> None:
    errs = sv.check_schema(schema, "spec.versions[0].schema.openAPIV3Schema")
    assert any(fragment in m for _, m in errs), errs


def test_patterns_kubernetes_users_write_are_accepted() -> None:
    for pattern in ("^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", "^([a-z]+\\.)?[a-z]+$", "^(ab){2,3}$", "^v[0-9]+$"):
        assert sv.check_schema({"type": "object", "properties": {"a": {"type": "string", "pattern": pattern}}},
                               "s") == [], pattern


def test_schema_size_and_depth_are_bounded() -> None:
    deep: dict[str, Any] = {"type": "object"}
    node = deep
    for _ in range(sv.MAX_SCHEMA_DEPTH + 2):
        node["properties"] = {"a": {"type": "object"}}
        node = node["properties"]["a"]
    assert any("nests more than" in m for _, m in sv.check_schema(deep, "s"))
    big = {"type": "object", "description": "x" * (sv.MAX_SCHEMA_BYTES + 1)}
    assert any("Too long" in m for _, m in sv.check_schema(big, "s"))


def _crd(**spec_changes: Any) -> dict:
    spec = {"group": "example.com", "scope": "Namespaced",
            "names": {"plural": "widgets", "kind": "Widget"},
            "versions": [{"name": "v1", "served": True, "storage": True,
                          "schema": {"openAPIV3Schema": {"type": "object"}}}]}
    spec.update(spec_changes)
    return {"metadata": {"name": "widgets.example.com"}, "spec": spec}


@pytest.mark.parametrize("changes,fragment", [
    ({"group": "nodots"}, "should be a domain with at least one dot"),
    ({"scope": "Global"}, "Unsupported value"),
    ({"versions": []}, "must have at least one version"),
    ({"names": {"plural": "Widgets", "kind": "Widget"}}, "RFC 1123 label"),
    ({"names": {"plural": "widgets"}}, "spec.names.kind"),
    ({"versions": [{"name": "v1", "served": True, "storage": False,
                    "schema": {"openAPIV3Schema": {"type": "object"}}}]}, "exactly one version"),
    ({"versions": [{"name": "v1", "served": True, "storage": True}]}, "schemas are required"),
    ({"versions": [{"name": "v1", "served": True, "storage": True, "schema": {"openAPIV3Schema": {"type": "object"}},
                    "additionalPrinterColumns": [{"name": "X", "type": "string", "jsonPath": "spec"}]}]},
     "simple JSON path"),
])
def test_the_crd_strategy_refuses_bad_specs(changes: dict, fragment: str) -> None:
    strategy = CustomResourceDefinitionStrategy()
    obj = _crd(**changes)
    strategy.default(obj)
    errs = strategy.validate(obj)
    assert any(fragment in f"{f}: {m}" for f, m in errs), errs


def test_a_good_crd_passes_and_gets_its_status() -> None:
    strategy = CustomResourceDefinitionStrategy()
    obj = _crd()
    strategy.prepare_for_create(obj)
    assert strategy.validate(obj) == []
    assert obj["spec"]["names"]["singular"] == "widget" and obj["spec"]["names"]["listKind"] == "WidgetList"
    assert obj["status"]["storedVersions"] == ["v1"]
    assert {c["type"]: c["status"] for c in obj["status"]["conditions"]} == {"NamesAccepted": "True",
                                                                             "Established": "False"}
    assert obj["metadata"]["finalizers"] == ["customresourcecleanup.apiextensions.k8s.io"]


def test_custom_strategy_generation_status_and_columns() -> None:
    version = {"name": "v1", "served": True, "storage": True, "subresources": {"status": {}},
               "additionalPrinterColumns": [{"name": "R", "type": "integer", "jsonPath": ".spec.r"},
                                            {"name": "T", "type": "string", "jsonPath": ".status.c[0].type"}],
               "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}}}
    s = custom_strategy(_crd(), version)
    old = {"metadata": {"name": "a"}, "spec": {"r": 1}, "status": {"c": [{"type": "Ready"}]}}
    new = copy.deepcopy(old)
    new["status"] = {"c": []}
    assert not s.spec_changed(new, old)
    new["spec"]["r"] = 2
    assert s.spec_changed(new, old)
    assert s.row(old)[:3] == ["a", 1, "Ready"]
    assert [c.name for c in s.columns] == ["Name", "R", "T"]
    assert simple_path(".a.b[2]['c.d']") == ["a", "b", 2, "c.d"] and simple_path("a.b") is None


def test_list_type_set_and_map_refuse_duplicates_in_kube_apiservers_words() -> None:
    """apiextensions' listtype validation: each later duplicate of a set, and each item of a
    map whose keys another item has, is ``Duplicate value: <Go %#v>`` (attack round 23)."""
    schema = {"type": "object", "properties": {"spec": {"type": "object", "properties": {
        "tags": {"type": "array", "x-kubernetes-list-type": "set", "items": {"type": "string"}},
        "nums": {"type": "array", "x-kubernetes-list-type": "set", "items": {"type": "integer"}},
        "ports": {"type": "array", "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"],
                  "items": {"type": "object", "properties": {"name": {"type": "string"},
                                                             "port": {"type": "integer"}}}},
        "pairs": {"type": "array", "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["a", "b"],
                  "items": {"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "integer"}}}},
    }}}}

    def errs(spec: dict) -> list:
        return sv.validate({"apiVersion": "x/v1", "kind": "X", "metadata": {}, "spec": spec}, schema)
    assert errs({"tags": ["a", "b"], "nums": [1, 2], "ports": [{"name": "x"}, {"name": "y"}]}) == []
    assert errs({"tags": ["a", "b", "a", "a"]}) == [("spec.tags[2]", 'Duplicate value: "a"'),
                                                     ("spec.tags[3]", 'Duplicate value: "a"')]
    assert errs({"nums": [1, 1]}) == [("spec.nums[1]", "Duplicate value: 1")]
    assert errs({"ports": [{"name": "http", "port": 1}, {"name": "http", "port": 2}]}) == \
        [("spec.ports[1]", 'Duplicate value: map[string]interface {}{"name":"http"}')]
    assert errs({"pairs": [{"a": "x", "b": 1}, {"a": "x", "b": 2}, {"b": 1, "a": "x"}]}) == \
        [("spec.pairs[2]", 'Duplicate value: map[string]interface {}{"a":"x", "b":1}')]
