"""The bounds on what one request may make the API server do: bounded YAML and JSON
decoding, JSON patch limits, quantities, the stored-object bound, pod fit."""
from __future__ import annotations

import json
import time
from fractions import Fraction

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from kube32.apiserver import bodies, errors, jsonshape, yamlbody
from kube32.apiserver.limits import MAX_DECODED, MAX_DEPTH, MAX_VALUES
from kube32.apiserver.patch import PatchError, PatchLimit, json_patch, nesting
from kube32.apiserver.registry import encode, encode_bounded
from kube32.apiserver.resources import by_plural
from kube32.podfit import allocatable, shortfalls
from kube32.quantity import MAX_QUANTITY, QuantityTooLarge, parse_quantity


def load(text: str | bytes) -> object:
    return yamlbody.load(text, MAX_DECODED, MAX_DEPTH, MAX_VALUES)


def laughs(levels: int) -> str:
    lines = ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    names = "abcdefghijklmnop"
    for prev, name in zip(names, names[1:levels + 1], strict=False):
        lines.append(f"{name}: &{name} [{', '.join(['*' + prev] * 9)}]")
    return "\n".join(lines)


# --- YAML -------------------------------------------------------------------------------
def test_billion_laughs_is_refused_at_once():
    start = time.monotonic()
    with pytest.raises(yamlbody.BodyError) as e:
        load(laughs(8))
    assert e.value.too_large and "aliases" in str(e.value)
    assert time.monotonic() - start < 2


def test_merge_key_bomb_is_refused():
    lines = ["a: &a {x: 1, y: 2}"]
    names = "abcdefghijklmnop"
    for prev, name in zip(names, names[1:], strict=False):
        lines.append(f"{name}: &{name} {{<<: [{', '.join(['*' + prev] * 9)}]}}")
    with pytest.raises(yamlbody.BodyError) as e:
        load("\n".join(lines))
    assert e.value.too_large


def test_small_aliases_and_merges_work_and_share_nothing():
    out = load("a: &x {k: [1, 2]}\nb: *x\nc:\n  <<: [*x, {k: 0, m: 3}]\n  n: 4\n")
    assert out == {"a": {"k": [1, 2]}, "b": {"k": [1, 2]}, "c": {"k": [1, 2], "m": 3, "n": 4}}
    out["a"]["k"].append(9)
    assert out["b"]["k"] == [1, 2] and out["c"]["k"] == [1, 2]


def test_own_keys_win_over_merged_ones():
    assert load("a: &a {k: 1}\nb: {<<: *a, k: 2}\n")["b"] == {"k": 2}


@pytest.mark.parametrize("text, why", [
    ("[" * 101 + "]" * 101, "nests more than 100 levels"),
    ("a: &a [[[[[[[[[[1]]]]]]]]]]\nb: " + "[" * 95 + "*a" + "]" * 95, "nests more than 100 levels"),
    ("a: .nan", "JSON has no NaN"),
    ("a: -.inf", "JSON has no NaN"),
    ("a: 1.0e+999", "out of the range of a 64-bit float"),
    ("a: " + "9" * 400, "out of the range of a 64-bit float"),
    ("? [1]\n: 2", "a mapping key must be a string"),
    ("a: 1\na: 2", 'mapping key "a" already defined'),
    ("a: !!binary aGk=", "no JSON form"),
    ("a: !!set {x}", "no JSON form"),
    ("a: !!python/name:os.system x", "no JSON form"),
    ("a: !custom x", "no JSON form"),
    ("a: &x [*x]", "names no finished anchor"),
    ("a: *nothing", "names no finished anchor"),
    ("--- 1\n--- 2", "a single document"),
    ("a: " + "1" * 5000, "cannot be read as int"),
])
def test_yaml_without_a_bounded_json_form_is_refused(text, why):
    with pytest.raises(yamlbody.BodyError, match=why):
        load(text)


def test_too_many_values_is_too_large():
    with pytest.raises(yamlbody.BodyError) as e:
        yamlbody.load("[" + ",".join(["1"] * 101) + "]", MAX_DECODED, MAX_DEPTH, 100)
    assert e.value.too_large and "values" in str(e.value)


def test_scalars_and_keys_as_sigs_k8s_yaml_gives_them():
    assert load("1: a\ntrue: b\n~: c\nd: 2020-01-02\ne: 0x10\nf: 1.5\ng: ~\nh: yes\n") == {
        "1": "a", "true": "b", "null": "c", "d": "2020-01-02", "e": 16, "f": 1.5, "g": None, "h": True}
    assert load("") is None and load("# only a comment\n") is None


JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers(-2**40, 2**40) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=30)


@settings(max_examples=200, deadline=None)
@given(JSONISH)
def test_alias_free_yaml_reads_as_pyyaml_reads_it(value):
    text = yaml.safe_dump(value)
    assert load(text) == yaml.safe_load(text)


# --- JSON ----------------------------------------------------------------------------------
def test_json_shape_ignores_strings():
    raw = b'{"a": "[[[[,,,,", "b": [{"c": "\\"[[,"}, 2]}'
    assert jsonshape.shape(raw) == jsonshape.Shape(depth=3, values=6)
    assert json.loads(raw)  # valid JSON


@pytest.mark.parametrize("raw, code, why", [
    (b"[" * 100_000 + b"]" * 100_000, 400, "nests 100000 levels deep"),
    (b'{"a": NaN}', 400, "NaN is not a JSON value"),
    (b'{"a": -Infinity}', 400, "-Infinity is not a JSON value"),
    (b'{"a": 1e999}', 400, "the number 1e999 is out of the range of a 64-bit float"),
    (b'{"a": [1, -1E400]}', 400, "the number -1E400 is out of the range of a 64-bit float"),
    (b'{"a": ' + b"9" * 400 + b"}", 400, "(400 characters) is out of the range of a 64-bit float"),
    (b'{"a": ' + b"1" * 5000 + b"}", 400, "not valid JSON"),
    (b"[" + b",".join([b"1"] * (MAX_VALUES + 1)) + b"]", 413, "values"),
])
def test_json_past_a_bound_is_refused_before_parsing(raw, code, why):
    start = time.monotonic()
    with pytest.raises(errors.APIError) as e:
        bodies.decode(raw, "application/json", "cannot create x")
    assert e.value.code == code and why in e.value.message, e.value.message
    assert "use sys." not in e.value.message
    assert time.monotonic() - start < 2


def test_numbers_in_a_floats_range_are_read_as_they_are():
    raw = b'{"a": 1.7976931348623157e308, "b": -5e-324, "c": ' + b"9" * 300 + b', "d": "1e999"}'
    assert bodies.decode(raw, "application/json", "x") == json.loads(raw)


def test_json_sent_as_yaml_with_an_out_of_range_number_is_refused_not_read_as_a_string():
    # YAML would read 1e999 as the string "1e999": a JSON body means the number.
    with pytest.raises(errors.APIError) as e:
        bodies.decode(b'{"spec": {"activeDeadlineSeconds": 1e999}}', "application/apply-patch+yaml", "x")
    assert e.value.code == 400 and "1e999 is out of the range" in e.value.message


def test_json_sent_as_yaml_takes_the_json_path_with_the_same_bounds():
    assert bodies.decode(b'{"a": [1, {"b": null}]}', "application/apply-patch+yaml", "x") == {"a": [1, {"b": None}]}
    assert bodies.decode(b"{a: 1}", "application/yaml", "x") == {"a": 1}   # YAML flow, not JSON
    with pytest.raises(errors.APIError) as e:
        bodies.decode(b"[" * 500 + b"]" * 500, "application/yaml", "x")
    assert e.value.code == 400 and "100 levels" in e.value.message


# --- JSON patch ------------------------------------------------------------------------------
def test_json_patch_copies_are_bounded():
    ops = [{"op": "add", "path": "/a", "value": {"s": "x" * 1000}}]
    ops += [{"op": "copy", "from": "/a", "path": f"/a/c{i}"} for i in range(20)]
    with pytest.raises(PatchLimit) as e:
        json_patch({}, ops)
    assert e.value.too_large and "copy operations" in str(e.value)
    assert json_patch({}, ops[:3])["a"]["c1"]["c0"] == {"s": "x" * 1000}


def test_json_patch_operations_and_depth_are_bounded():
    with pytest.raises(PatchLimit, match="is 10000, got 10001"):
        json_patch({}, [{"op": "test", "path": "", "value": {}}] * 10001)
    ops, path = [], ""
    for _ in range(MAX_DEPTH + 5):
        path += "/n"
        ops.append({"op": "add", "path": path, "value": {}})
    with pytest.raises(PatchLimit) as e:
        json_patch({}, ops)
    assert not e.value.too_large and "levels deep" in str(e.value)
    assert isinstance(e.value, PatchError)
    assert nesting(json_patch({}, ops[:10])) == 11


def test_nesting_counts_containers_without_recursion():
    deep: list = []
    for _ in range(50_000):
        deep = [deep]
    assert nesting(deep) == 50_001 and nesting(1) == 0 and nesting({"a": [1]}) == 2


# --- objects, quantities, fit -------------------------------------------------------------------
def test_a_stored_object_is_bounded():
    cm = by_plural("configmaps")
    assert encode_bounded(cm, {"metadata": {"name": "a"}, "data": {"k": "v"}})
    with pytest.raises(errors.APIError) as e:
        encode_bounded(cm, {"metadata": {"name": "a"}, "x": "y" * (3 << 20)})
    assert e.value.code == 413 and "bytes stored" in e.value.message
    with pytest.raises(errors.APIError) as e:
        encode_bounded(cm, {"metadata": {"name": "a"}, "x": [1] * (MAX_VALUES + 1)})
    assert e.value.code == 413 and "values" in e.value.message


@pytest.mark.parametrize("text", ["1e100", "99999999999999Ei", "8Ei", "9223372036854775808", "1e999999999",
                                  "1" * 30, 1e100, 10**30])
def test_quantities_past_int64_are_too_large_and_cheap(text):
    start = time.monotonic()
    with pytest.raises(QuantityTooLarge, match="9223372036854775807"):
        parse_quantity(text)
    assert time.monotonic() - start < 0.1


def test_quantities_within_bounds_are_exact():
    assert parse_quantity("9223372036854775807") == MAX_QUANTITY
    assert parse_quantity("7Ei") == 7 * 2**60
    assert parse_quantity("1e-999999999") == Fraction(1, 10**9)   # rounded up to 1n, as Kubernetes
    assert parse_quantity("0e999999999") == 0
    assert parse_quantity("1.5Mi") == 1572864 and parse_quantity("100m") == Fraction(1, 10)
    with pytest.raises(ValueError):
        parse_quantity("1" * 5000 + "Mi")


def test_shortfalls_say_what_does_not_fit():
    alloc = allocatable({"memory": str(512 << 20), "pods": "2"})
    pod = {"spec": {"containers": [{"resources": {"requests": {"memory": "1Pi"}}}]}}
    (short,) = shortfalls(pod, alloc, {}, 0)
    assert (short.resource, short.requested, short.used, short.capacity) == ("memory", 1 << 50, 0, 512 << 20)
    assert [s.resource for s in shortfalls({"spec": {}}, alloc, {}, 2)] == ["pods"]
    assert shortfalls({"spec": {}}, alloc, {}, 1) == []


def test_the_store_encoder_refuses_what_json_cannot_hold():
    """The net under every decoder: a NaN or an infinity that reached an object by any
    other way is a 400, never stored as Python's non-JSON ``Infinity``."""
    for bad in (float("inf"), float("-inf"), float("nan")):
        with pytest.raises(errors.APIError) as e:
            encode({"metadata": {"name": "x"}, "spec": {"activeDeadlineSeconds": bad}})
        assert e.value.code == 400 and "JSON cannot hold" in e.value.message
