"""kube32.apiserver.celrules and cellib: CRDs' x-kubernetes-validations (CEL) checked at CRD
write time and evaluated on objects as kube-apiserver v1.32 does (messages in its words),
transition rules, optionalOldSelf, ratcheting, the Kubernetes extension functions, the
estimated cost limits, and the runtime bound (steps and time) that keeps a hostile rule
or object from holding the API server."""
from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from kube32.apiserver import celrules, errors
from kube32.apiserver.strategies.apiextensions import CustomResourceDefinitionStrategy, custom_strategy

ROOT = "spec.versions[0].schema.openAPIV3Schema"


def schema(*rules: dict[str, Any], **props: Any) -> dict[str, Any]:
    """A root schema whose spec carries ``rules``; spec's properties ``props`` (defaults below)."""
    properties = props or {
        "replicas": {"type": "integer"}, "max": {"type": "integer"},
        "name": {"type": "string", "maxLength": 64},
        "tags": {"type": "array", "maxItems": 16, "items": {"type": "string", "maxLength": 32}},
        "labels": {"type": "object", "maxProperties": 16, "additionalProperties": {"type": "string", "maxLength": 64}},
        "size": {"x-kubernetes-int-or-string": True},
        "memory": {"type": "string", "maxLength": 32},
        "namespace": {"type": "string", "maxLength": 63},
        "my-field": {"type": "integer"},
        "when": {"type": "string", "format": "date-time"}}
    return {"type": "object", "properties": {"spec": {"type": "object", "properties": properties,
                                                      "x-kubernetes-validations": list(rules)}}}


def obj(**spec: Any) -> dict[str, Any]:
    return {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w1", "namespace": "default"},
            "spec": spec}


def run(rule: dict[str, Any], new: dict[str, Any], old: Any = celrules.ABSENT) -> list[tuple[str, str]]:
    s = schema(rule)
    assert celrules.check(s, ROOT) == []
    return celrules.evaluate(celrules.compiled(s), new, old)


# --- evaluation: what users write, and Kubernetes' words when it fails ----------------------------
@pytest.mark.parametrize("rule,spec,expected", [
    ("self.replicas <= self.max", {"replicas": 3, "max": 5}, []),
    ("self.replicas <= self.max", {"replicas": 6, "max": 5}, [("spec", 'Invalid value: "object": failed rule: '
                                                                      "self.replicas <= self.max")]),
    ("size(self.name) <= 5 && self.name.size() > 0", {"name": "abc"}, []),
    ("has(self.name) || has(self.replicas)", {"max": 1}, [("spec", 'Invalid value: "object": failed rule: '
                                                                   "has(self.name) || has(self.replicas)")]),
    ("self.tags.all(t, t.startsWith('a'))", {"tags": ["ab", "ac"]}, []),
    ("self.tags.exists(t, t.endsWith('z'))", {"tags": ["ab"]}, [("spec", 'Invalid value: "object": failed rule: '
                                                                         "self.tags.exists(t, t.endsWith('z'))")]),
    ("self.tags.exists_one(t, t == 'a')", {"tags": ["a", "b"]}, []),
    ("self.tags.map(t, t.size()).sum() == 3", {"tags": ["ab", "c"]}, []),
    ("self.tags.filter(t, t.contains('x')).size() == 1", {"tags": ["ax", "b"]}, []),
    ("'a' in self.tags && 'k' in self.labels", {"tags": ["a"], "labels": {"k": "v"}}, []),
    ("self.labels.all(k, k.matches('^[a-z]+$'))", {"labels": {"Bad": "v"}},
     [("spec", "Invalid value: \"object\": failed rule: self.labels.all(k, k.matches('^[a-z]+$'))")]),
    ("self.name.lowerAscii() == 'abc' && self.name.upperAscii() == 'ABC'", {"name": "aBc"}, []),
    ("self.name.split('-').size() == 2 && self.name.indexOf('-') == 1 && self.name.substring(2) == 'b'",
     {"name": "a-b"}, []),
    ("self.name.replace('-', '.') == 'a.b' && ['a', 'b'].join('-') == self.name && self.name.trim() == 'a-b'",
     {"name": "a-b"}, []),
    ("quantity(self.memory).isGreaterThan(quantity('1Gi')) && isQuantity(self.memory)", {"memory": "2Gi"}, []),
    ("quantity(self.memory).compareTo(quantity('1000M')) == 1", {"memory": "1Gi"}, []),
    ("self.tags.isSorted() && self.tags.max() == 'c'", {"tags": ["a", "b", "c"]}, []),
    ("self.__namespace__ == 'x' && self.my__dash__field == 1", {"namespace": "x", "my-field": 1}, []),
    ("self.when < timestamp('2030-01-01T00:00:00Z')", {"when": "2024-05-01T00:00:00Z"}, []),
    ("int(2.7) == 2 && string(self.replicas) == '3' && type(self.replicas) == int", {"replicas": 3}, []),
    ("self.size == 3 || self.size == '3'", {"size": "3"}, []),
])
def test_rules_evaluate_as_kubernetes(rule: str, spec: dict[str, Any], expected: list[tuple[str, str]]) -> None:
    assert run({"rule": rule}, obj(**spec)) == expected


def test_a_rule_at_the_root_sees_metadata_name_and_fails_as_nil() -> None:
    s = {"type": "object", "properties": {"spec": {"type": "object", "properties": {"a": {"type": "integer"}}}},
         "x-kubernetes-validations": [{"rule": "self.metadata.name.startsWith('my-')"}]}
    assert celrules.check(s, ROOT) == []
    assert celrules.evaluate(celrules.compiled(s), obj(a=1)) == [
        ("<nil>", "Invalid value: \"object\": failed rule: self.metadata.name.startsWith('my-')")]
    bad = {**s, "x-kubernetes-validations": [{"rule": "self.metadata.namespace == 'x'"}]}
    assert "undefined field 'namespace'" in celrules.check(bad, ROOT)[0][1]


@pytest.mark.parametrize("extra,expected", [
    ({"message": "replicas must not exceed max"}, ("spec", 'Invalid value: "object": replicas must not exceed max')),
    ({"message": "m", "reason": "FieldValueForbidden"}, ("spec", "Forbidden: m")),
    ({"message": "m", "reason": "FieldValueRequired"}, ("spec", "Required value: m")),
    ({"message": "m", "reason": "FieldValueDuplicate"}, ("spec", 'Duplicate value: "object"')),
    ({"message": "m", "fieldPath": ".replicas"}, ("spec.replicas", 'Invalid value: "object": m')),
    ({"message": "m", "fieldPath": ".labels['a.b']"}, ("spec.labels[a.b]", 'Invalid value: "object": m')),
    ({"messageExpression": "'replicas ' + string(self.replicas) + ' > ' + string(self.max)"},
     ("spec", 'Invalid value: "object": replicas 6 > 5')),
    # a messageExpression that fails falls back to the message
    ({"message": "fallback", "messageExpression": "self.name + 'x'"}, ("spec", 'Invalid value: "object": fallback')),
])
def test_message_reason_field_path(extra: dict[str, Any], expected: tuple[str, str]) -> None:
    assert run({"rule": "self.replicas <= self.max", **extra}, obj(replicas=6, max=5)) == [expected]


def test_runtime_errors_are_field_errors_naming_the_rule() -> None:
    assert run({"rule": "self.name == 'a'", "message": "name is a"}, obj(replicas=1)) == [
        ("spec", 'Invalid value: "object": no such key: name evaluating rule: name is a')]
    assert run({"rule": "self.replicas / self.max > 0"}, obj(replicas=1, max=0)) == [
        ("spec", 'Invalid value: "object": division by zero evaluating rule: self.replicas / self.max > 0')]
    assert run({"rule": "self.tags[3] == 'a'"}, obj(tags=["a"])) == [
        ("spec", "Invalid value: \"object\": index out of bounds evaluating rule: self.tags[3] == 'a'")]


def test_a_rule_on_list_items_and_map_values_names_each() -> None:
    s = {"type": "object", "properties": {"spec": {"type": "object", "properties": {
        "tags": {"type": "array", "maxItems": 8, "items": {"type": "string", "maxLength": 8,
                                                           "x-kubernetes-validations": [{"rule": "self != 'bad'"}]}},
        "labels": {"type": "object", "maxProperties": 8, "additionalProperties": {
            "type": "string", "maxLength": 8, "x-kubernetes-validations": [{"rule": "self.size() < 3"}]}}}}}}
    assert celrules.check(s, ROOT) == []
    assert celrules.evaluate(celrules.compiled(s), obj(tags=["ok", "bad"], labels={"k": "long"})) == [
        ("spec.tags[1]", "Invalid value: \"string\": failed rule: self != 'bad'"),
        ("spec.labels[k]", 'Invalid value: "string": failed rule: self.size() < 3')]
    assert celrules.evaluate(celrules.compiled(s), obj(tags=None)) == []   # null values are not checked


# --- transition rules -------------------------------------------------------------------------
IMMUTABLE = {"rule": "self.name == oldSelf.name", "message": "name is immutable"}
NO_SHRINK = {"rule": "self.replicas >= oldSelf.replicas", "message": "may not scale down",
             "reason": "FieldValueForbidden"}


def test_a_transition_rule_runs_only_on_update() -> None:
    assert run(IMMUTABLE, obj(name="a")) == []                              # create: no oldSelf
    assert run(IMMUTABLE, obj(name="a"), obj(name="a")) == []
    assert run(IMMUTABLE, obj(name="b"), obj(name="a")) == [("spec", 'Invalid value: "object": name is immutable')]
    assert run(NO_SHRINK, obj(replicas=1), obj(replicas=2)) == [("spec", "Forbidden: may not scale down")]


def test_a_transition_rule_on_a_field_added_later_does_not_run() -> None:
    s = schema(**{"spec": {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8}}}})
    s["properties"]["spec"]["properties"]["spec"]["x-kubernetes-validations"] = [IMMUTABLE]
    s["properties"]["spec"]["properties"]["spec"]["properties"]["name"] = {"type": "string", "maxLength": 8}
    node = celrules.compiled(s)
    assert celrules.evaluate(node, obj(spec={"name": "b"}), obj()) == []   # no old spec.spec: not checked
    assert celrules.evaluate(node, obj(spec={"name": "b"}), obj(spec={"name": "a"})) == [
        ("spec.spec", 'Invalid value: "object": name is immutable')]


def test_optional_old_self_runs_on_create_with_an_optional() -> None:
    rule = {"rule": "!oldSelf.hasValue() || self.replicas >= oldSelf.value().replicas",
            "optionalOldSelf": True, "message": "no shrinking"}
    assert run(rule, obj(replicas=1)) == []
    assert run(rule, obj(replicas=1), obj(replicas=2)) == [("spec", 'Invalid value: "object": no shrinking')]
    create_only = {"rule": "oldSelf.hasValue() || self.replicas == 1", "optionalOldSelf": True}
    assert run(create_only, obj(replicas=2)) == [
        ("spec", 'Invalid value: "object": failed rule: oldSelf.hasValue() || self.replicas == 1')]
    assert run({"rule": "oldSelf.orValue(self).replicas <= self.replicas", "optionalOldSelf": True},
               obj(replicas=2), obj(replicas=3)) != []


def test_an_unchanged_value_ratchets_and_a_map_list_correlates_by_key() -> None:
    rule = {"rule": "self.replicas <= self.max"}
    assert run(rule, obj(replicas=6, max=5), obj(replicas=6, max=5)) == []     # stored before the rule
    assert run(rule, obj(replicas=7, max=5), obj(replicas=6, max=5)) != []
    s = {"type": "object", "properties": {"spec": {"type": "object", "properties": {"ports": {
        "type": "array", "maxItems": 8, "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"],
        "items": {"type": "object", "required": ["name"], "properties": {
            "name": {"type": "string", "maxLength": 8}, "port": {"type": "integer"}},
            "x-kubernetes-validations": [{"rule": "self.port == oldSelf.port", "message": "port is immutable"}]}}}}}}
    assert celrules.check(s, ROOT) == []
    node = celrules.compiled(s)
    old = obj(ports=[{"name": "a", "port": 1}, {"name": "b", "port": 2}])
    assert celrules.evaluate(node, obj(ports=[{"name": "b", "port": 2}, {"name": "a", "port": 1}]), old) == []
    assert celrules.evaluate(node, obj(ports=[{"name": "b", "port": 3}, {"name": "c", "port": 9}]), old) == [
        ("spec.ports[0]", 'Invalid value: "object": port is immutable')]


# --- refused at CRD write time ----------------------------------------------------------------
PATH = f"{ROOT}.properties[spec].x-kubernetes-validations[0]"


@pytest.mark.parametrize("rule,field,expected", [
    ({"rule": "self.nope > 1"}, "rule",
     "Invalid value: \"self.nope > 1\": compilation failed: ERROR: <input>:1:5: undefined field 'nope'"),
    ({"rule": "self.replicas <"}, "rule",
     'Invalid value: "self.replicas <": compilation failed: ERROR: <input>:1:15: Syntax error: unexpected input "<"'),
    ({"rule": "self.replicas"}, "rule", 'Invalid value: "self.replicas": cel expression must evaluate to a bool'),
    ({"rule": "self.name.reverse() == 'a'"}, "rule", "undeclared reference to 'reverse' (Kube32 supports "),
    ({"rule": "url(self.name).getHost() == 'a'"}, "rule", "undeclared reference to 'url' (Kube32 supports "),
    ({"rule": "self.tags.reduce(a, b, 0, a + b) == 1"}, "rule", "undeclared reference to 'reduce'"),
    ({"rule": "other == 1"}, "rule", "undeclared reference to 'other'"),
    ({"rule": "self.?name.orValue('') == ''"}, "rule", "Kube32's CEL has no optional field selection"),
    ({"rule": "self.replicas.foo == 1"}, "rule", "type 'int' does not support field selection"),
    ({"rule": "self.replicas > 0", "reason": "Bad"}, "reason",
     'Unsupported value: "Bad": supported values: "FieldValueDuplicate", "FieldValueForbidden", '
     '"FieldValueInvalid", "FieldValueRequired"'),
    ({"rule": "self.replicas > 0", "fieldPath": ".nope"}, "fieldPath", "refers to an existing field"),
    ({"rule": "self.replicas > 0", "optionalOldSelf": True}, "optionalOldSelf",
     "Invalid value: true: may not be set if rule does not use oldSelf"),
    ({"rule": "self.replicas > 0", "message": "two\nlines"}, "message", "message must not contain line breaks"),
    ({"rule": "self.replicas > 0 &&\nself.max > 0"}, "message",
     "Required value: message must be specified if rule contains line breaks"),
    ({"rule": "self.replicas > 0", "messageExpression": "self.replicas"}, "messageExpression",
     "must evaluate to a string"),
    ({"rule": "self.replicas > 0", "messageExpression": "'a' +"}, "messageExpression",
     "messageExpression compilation failed"),
    ({"rule": "  "}, "rule", "Required value: rule is not specified"),
    ({"rule": "(" * 40 + "true" + ")" * 40}, "rule", "nests brackets more than 32 deep"),
    ({"rule": "self.replicas > 0", "extra": 1}, "extra", "Forbidden: unknown field"),
])
def test_a_bad_rule_is_refused_at_crd_write_naming_it(rule: dict[str, Any], field: str, expected: str) -> None:
    errs = celrules.check(schema(rule), ROOT)
    assert any(f == f"{PATH}.{field}" and expected in m for f, m in errs), errs


def test_old_self_under_a_plain_list_is_refused() -> None:
    s = schema(tags={"type": "array", "maxItems": 4, "items": {
        "type": "string", "maxLength": 4, "x-kubernetes-validations": [{"rule": "self == oldSelf"}]}})
    errs = celrules.check(s, ROOT)
    assert "oldSelf cannot be used on the uncorrelatable portion of the schema" in errs[0][1], errs


def test_the_crd_strategy_refuses_a_bad_rule_with_a_422() -> None:
    crd = {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
           "metadata": {"name": "widgets.example.com"},
           "spec": {"group": "example.com", "scope": "Namespaced",
                    "names": {"plural": "widgets", "kind": "Widget"},
                    "versions": [{"name": "v1", "served": True, "storage": True,
                                  "schema": {"openAPIV3Schema": schema({"rule": "self.nope == 1"})}}]}}
    assert CustomResourceDefinitionStrategy().validate(crd) == []      # the spec is fine; its rule is not:
    errs = asyncio.run(CustomResourceDefinitionStrategy().validate_async(crd, None))
    assert errs == [(f"{PATH}.rule", "Invalid value: \"self.nope == 1\": compilation failed: ERROR: <input>:1:5: "
                                     "undefined field 'nope'")]
    text = errors.invalid("CustomResourceDefinition", "widgets.example.com", errs, "apiextensions.k8s.io").message
    assert "x-kubernetes-validations[0].rule: Invalid value" in text


# --- the bound ----------------------------------------------------------------------------------
def test_estimated_cost_refuses_unbounded_lists_and_accepts_bounded_ones() -> None:
    quadratic = {"rule": "self.tags.all(a, self.tags.exists(b, a.matches(b)))"}
    unbounded = schema(quadratic, tags={"type": "array", "items": {"type": "string"}})
    errs = celrules.check(unbounded, ROOT)
    assert errs == [(f"{PATH}.rule", "Forbidden: estimated rule cost exceeds budget by factor of more than 100x "
                                     "(try simplifying the rule, or adding maxItems, maxProperties, and maxLength "
                                     "where arrays, maps, and strings are declared)")]
    bounded = schema(quadratic, tags={"type": "array", "maxItems": 10, "items": {"type": "string", "maxLength": 10}})
    assert celrules.check(bounded, ROOT) == []
    # a cheap rule on each item of an unbounded list of unbounded lists adds up past the CRD's limit
    nested = schema(tags={"type": "array", "items": {"type": "array", "items": {
        "type": "string", "x-kubernetes-validations": [{"rule": "self.matches('^a')"}]}}})
    errs = celrules.check(nested, ROOT)
    assert errs[-1][0] == ROOT and "x-kubernetes-validations estimated rule cost total for entire OpenAPIv3 " \
                                   "schema exceeds budget by factor of" in errs[-1][1], errs
    assert "contributed to estimated rule & messageExpression cost total exceeding cost limit" in errs[0][1]


def test_a_request_runs_out_of_budget_and_says_so() -> None:
    s = schema({"rule": "self.tags.all(a, self.tags.all(b, a == b || a != b))"},
               tags={"type": "array", "maxItems": 1000, "items": {"type": "string", "maxLength": 2}})
    assert celrules.check(s, ROOT) == []
    node = celrules.compiled(s)
    errs = celrules.evaluate(node, obj(tags=["a"] * 1000), meter=celrules.Meter(seconds=120))   # steps, not time
    assert errs == [("<nil>", 'Invalid value: "object": validation failed due to running out of cost budget, no '
                              "further validation rules will be run (Kube32's budget is "
                              f"{celrules.REQUEST_BUDGET} CEL steps per request)")]
    assert celrules.evaluate(node, obj(tags=["a"] * 10)) == []      # the same rule on a small object


def test_the_time_limit_stops_a_request_too() -> None:
    s = schema({"rule": "self.tags.all(a, self.tags.all(b, a == b || a != b))"},
               tags={"type": "array", "maxItems": 1000, "items": {"type": "string", "maxLength": 2}})
    meter = celrules.Meter(budget=10**9, seconds=0.2)
    started = time.monotonic()
    errs = celrules.evaluate(celrules.compiled(s), obj(tags=["a"] * 1000), meter=meter)
    assert time.monotonic() - started < 2
    assert errs and "running out of cost budget" in errs[0][1] and "it took more than 0.2s" in errs[0][1]


def test_big_values_charge_their_size() -> None:
    """Building large strings in a loop spends the budget (and memory stays bounded)."""
    s = schema({"rule": "self.tags.all(t, (self.name + self.name + self.name).size() > 0)"},
               tags={"type": "array", "maxItems": 16, "items": {"type": "string", "maxLength": 1}},
               name={"type": "string", "maxLength": 100_000})
    assert celrules.check(s, ROOT) == []
    errs = celrules.evaluate(celrules.compiled(s), obj(tags=["a"] * 16, name="x" * 100_000))
    assert errs and "running out of cost budget" in errs[0][1]
    huge = schema({"rule": "self.name.replace('x', self.name).size() > 0"},
                  name={"type": "string", "maxLength": 100_000})
    errs = celrules.evaluate(celrules.compiled(huge), obj(name="x" * 100_000))
    assert errs and "string too long" in errs[0][1]


def test_evaluation_runs_off_the_event_loop() -> None:
    s = schema({"rule": "self.tags.all(a, self.tags.all(b, a == b || a != b))"},
               tags={"type": "array", "maxItems": 1000, "items": {"type": "string", "maxLength": 2}})
    async def main() -> tuple[int, list[tuple[str, str]]]:
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1
        task = asyncio.create_task(ticker())
        errs = await celrules.evaluate_off_loop(s, obj(tags=["a"] * 1000))
        task.cancel()
        return ticks, errs
    ticks, errs = asyncio.run(main())
    assert errs and ticks >= 5      # the loop kept running while the rules were evaluated


# --- the strategy ------------------------------------------------------------------------------------
def test_a_custom_strategy_evaluates_its_rules_async() -> None:
    crd = {"spec": {"group": "example.com", "names": {"kind": "Widget", "plural": "widgets"}}}
    version = {"name": "v1", "served": True, "storage": True,
               "schema": {"openAPIV3Schema": schema({"rule": "self.replicas <= 3", "message": "at most 3"})}}
    strategy = custom_strategy(crd, version)
    assert asyncio.run(strategy.validate_async(obj(replicas=4), None)) == [
        ("spec", 'Invalid value: "object": at most 3')]
    assert asyncio.run(strategy.validate_async(obj(replicas=2), None)) == []


def test_a_rule_stored_without_the_check_reports_its_compile_error_on_each_write() -> None:
    node = celrules.compiled(schema({"rule": "self.nope == 1"}))
    assert celrules.evaluate(node, obj(replicas=1)) == [
        ("spec", "Invalid value: \"object\": rule compile error: compilation failed: ERROR: <input>:1:5: "
                 "undefined field 'nope'")]


def test_field_error_reasons_follow_their_words() -> None:
    e = errors.invalid("Widget", "w1", [("spec", "Forbidden: no"), ("spec.a", "Required value"),
                                        ("spec.b", 'Invalid value: "object": x')], "example.com")
    assert [c["reason"] for c in e.details["causes"]] == ["FieldValueForbidden", "FieldValueRequired",
                                                          "FieldValueInvalid"]


def test_without_a_cel_engine_rules_are_refused_never_ignored(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(celrules, "ENGINE_MISSING", "this API server has no CEL engine (test)")
    s = schema({"rule": "self.replicas >= 0 && self.max >= -1"})
    assert celrules.check(s, ROOT) == [(f"{PATH}.rule", "Forbidden: this API server has no CEL engine (test)")]
    assert celrules.evaluate(celrules.compiled(s), obj(replicas=1)) == [
        ("spec", 'Invalid value: "object": rule compile error: this API server has no CEL engine (test)')]
