"""Structural OpenAPI v3 schemas of CustomResourceDefinitions: checked, then applied to
custom resources as kube-apiserver applies them (apiextensions-apiserver's
``structuralschema``, ``pruning``, ``defaulting`` and kube-openapi's validator).

Three passes over an object, in Kubernetes' order:

* :func:`prune` drops every field the schema does not name (unless
  ``x-kubernetes-preserve-unknown-fields``) and returns their paths: the registry
  warns of them under ``fieldValidation=Warn`` and refuses them under ``Strict``.
  ``apiVersion``, ``kind`` and ``metadata`` at the root (and of an
  ``x-kubernetes-embedded-resource``) are never pruned.
* :func:`apply_defaults` fills ``default`` values of absent properties (after pruning).
* :func:`validate` returns ``(field, message)`` pairs worded as kube-apiserver words
  them (``spec.replicas: Invalid value: "string": spec.replicas in body must be of
  type integer: "string"``).

Invariants: a schema passed :func:`check_schema` before any object meets it, so the
passes may trust its shape (a ``pattern`` whose backtracking could be exponential is
refused: Python's ``re`` is no RE2); a schema is at most :data:`MAX_SCHEMA_BYTES` of JSON and
:data:`MAX_SCHEMA_DEPTH` levels deep, so no pass recurses without bound (an object
deeper than its schema is only walked where ``x-kubernetes-preserve-unknown-fields``
keeps it, and the registry's MAX_DEPTH bounds that).  Every pattern is compiled once
(:func:`_pattern`, bounded cache).
"""
from __future__ import annotations

import copy
import json
import re
from functools import lru_cache
from typing import Any

Schema = dict[str, Any]
Errors = list[tuple[str, str]]

MAX_SCHEMA_BYTES = 256 * 1024
MAX_SCHEMA_DEPTH = 32
MAX_PATTERN = 1024

TYPES = ("object", "array", "string", "integer", "number", "boolean")
KNOWN = {"type", "properties", "required", "items", "enum", "minimum", "maximum", "exclusiveMinimum",
         "exclusiveMaximum", "minLength", "maxLength", "pattern", "minItems", "maxItems", "uniqueItems",
         "minProperties", "maxProperties", "nullable", "default", "description", "format", "title",
         "additionalProperties", "multipleOf", "example", "externalDocs",
         "x-kubernetes-preserve-unknown-fields", "x-kubernetes-int-or-string",
         "x-kubernetes-embedded-resource", "x-kubernetes-list-type", "x-kubernetes-list-map-keys",
         "x-kubernetes-map-type", "x-kubernetes-validations", "allOf", "anyOf", "oneOf", "not"}
FORBIDDEN = {"$ref", "definitions", "dependencies", "additionalItems", "patternProperties", "id", "$schema"}
META_KEYS = ("apiVersion", "kind", "metadata")
# A group holding a quantifier, itself quantified: (a+)+, (a|b*)*, (x+){2,} - the shapes
# whose backtracking is exponential (kube-apiserver's RE2 has none; Python's re has).
_NESTED_QUANTIFIER = re.compile(r"\((?:[^()\\]|\\.)*[+*}](?:[^()\\]|\\.)*\)[+*{]")
INT_KEYS = ("minLength", "maxLength", "minItems", "maxItems", "minProperties", "maxProperties")


# --- the schema itself ---------------------------------------------------------
def check_schema(schema: Any, path: str) -> Errors:
    """Why ``schema`` is not a structural schema Kube32 accepts (empty: it is)."""
    if not isinstance(schema, dict):
        return [(path, "Required value: must be an object")]
    size = len(json.dumps(schema))
    if size > MAX_SCHEMA_BYTES:
        return [(path, f"Too long: the schema is {size} bytes of JSON, more than the limit of {MAX_SCHEMA_BYTES}")]
    errs: Errors = []
    if schema.get("type") != "object":
        errs.append((f"{path}.type", 'Unsupported value: the root schema must be of type "object"'))
    _check_node(schema, path, 0, errs, root=True)
    return errs


def _check_node(s: Any, path: str, depth: int, errs: Errors, root: bool = False) -> None:
    if not isinstance(s, dict):
        errs.append((path, "Invalid value: a schema must be an object"))
        return
    if depth > MAX_SCHEMA_DEPTH:
        errs.append((path, f"Too long: the schema nests more than {MAX_SCHEMA_DEPTH} levels"))
        return
    for key in s:
        if key in FORBIDDEN:
            errs.append((f"{path}.{key}", "Forbidden: not allowed in a structural schema"))
        elif key not in KNOWN:
            errs.append((f"{path}.{key}", "Forbidden: unknown schema field"))
    _check_type(s, path, errs)
    _check_values(s, path, errs)
    _check_children(s, path, depth, errs)


def _check_children(s: Schema, path: str, depth: int, errs: Errors) -> None:
    props = s.get("properties")
    if props is not None:
        if not isinstance(props, dict):
            errs.append((f"{path}.properties", "Invalid value: must be an object"))
        else:
            for name, sub in props.items():
                _check_node(sub, f"{path}.properties[{name}]", depth + 1, errs)
    for key in ("items", "additionalProperties"):
        sub = s.get(key)
        if isinstance(sub, dict):
            _check_node(sub, f"{path}.{key}", depth + 1, errs)
        elif sub is not None and not (key == "additionalProperties" and isinstance(sub, bool)):
            errs.append((f"{path}.{key}", "Invalid value: must be a schema object"))
    if s.get("type") == "array" and not isinstance(s.get("items"), dict):
        errs.append((f"{path}.items", "Required value: must be specified for an array"))
    if isinstance(props, dict) and props and isinstance(s.get("additionalProperties"), dict):
        errs.append((f"{path}.additionalProperties", "Forbidden: additionalProperties and properties "
                                                     "are mutual exclusive"))
    for key in ("allOf", "anyOf", "oneOf"):
        if key in s:
            if not isinstance(s[key], list):
                errs.append((f"{path}.{key}", "Invalid value: must be a list of schemas"))
            else:
                for i, sub in enumerate(s[key]):
                    _check_node(sub, f"{path}.{key}[{i}]", depth + 1, errs)


def _check_type(s: Schema, path: str, errs: Errors) -> None:
    t = s.get("type")
    int_or_string = s.get("x-kubernetes-int-or-string") is True
    preserve = s.get("x-kubernetes-preserve-unknown-fields") is True
    if t is None:
        if not int_or_string and not preserve and ("properties" in s or "items" in s):
            errs.append((f"{path}.type", "Required value: must not be empty for specified object fields"))
        return
    if t not in TYPES:
        errs.append((f"{path}.type", f'Unsupported value: "{t}": supported values: '
                                     + ", ".join(f'"{x}"' for x in TYPES)))
    if int_or_string:
        errs.append((f"{path}.type", "Invalid value: must be empty if x-kubernetes-int-or-string is true"))
    if s.get("x-kubernetes-embedded-resource") is True and t != "object":
        errs.append((f"{path}.type", 'Invalid value: must be "object" if x-kubernetes-embedded-resource is true'))


def _check_values(s: Schema, path: str, errs: Errors) -> None:
    for key in INT_KEYS:
        if key in s and (not isinstance(s[key], int) or isinstance(s[key], bool) or s[key] < 0):
            errs.append((f"{path}.{key}", "Invalid value: must be a non-negative integer"))
    for key in ("minimum", "maximum", "multipleOf"):
        if key in s and (not isinstance(s[key], (int, float)) or isinstance(s[key], bool)):
            errs.append((f"{path}.{key}", "Invalid value: must be a number"))
    if "required" in s and (not isinstance(s["required"], list)
                            or not all(isinstance(r, str) for r in s["required"])):
        errs.append((f"{path}.required", "Invalid value: must be a list of strings"))
    if "enum" in s and not isinstance(s["enum"], list):
        errs.append((f"{path}.enum", "Invalid value: must be a list"))
    pattern = s.get("pattern")
    if pattern is not None:
        if not isinstance(pattern, str) or len(pattern) > MAX_PATTERN:
            errs.append((f"{path}.pattern", f"Invalid value: must be a string of at most {MAX_PATTERN} characters"))
        elif _pattern(pattern) is None:
            errs.append((f"{path}.pattern", f'Invalid value: "{pattern}": must be a valid regular expression'))
        elif _NESTED_QUANTIFIER.search(pattern):
            errs.append((f"{path}.pattern", f'Invalid value: "{pattern}": a repeated group that itself repeats '
                                            "(such as (a+)+) is not supported: Kube32 matches patterns with a "
                                            "backtracking engine, where it can take exponential time"))
    if "default" in s:
        problems = validate(copy.deepcopy(s["default"]), {k: v for k, v in s.items() if k != "default"}, "default")
        errs.extend((f"{path}.default", m) for _, m in problems)


@lru_cache(maxsize=512)
def _pattern(text: str) -> re.Pattern[str] | None:
    try:
        return re.compile(text)
    except (re.error, RecursionError, OverflowError):
        return None


def _props(s: Schema) -> dict[str, Any]:
    props = s.get("properties")
    return props if isinstance(props, dict) else {}


# --- pruning -------------------------------------------------------------------
def prune(obj: Any, schema: Schema) -> list[str]:
    """Drop from ``obj`` (in place) what ``schema`` does not name; the dropped paths."""
    dropped: list[str] = []
    if isinstance(obj, dict):
        _prune_object(obj, schema, "", dropped, root=True)
    return dropped


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _prune(value: Any, s: Schema, path: str, dropped: list[str]) -> None:
    if isinstance(value, dict):
        _prune_object(value, s, path, dropped, root=s.get("x-kubernetes-embedded-resource") is True)
    elif isinstance(value, list) and isinstance(s.get("items"), dict):
        for i, item in enumerate(value):
            _prune(item, s["items"], f"{path}[{i}]", dropped)


def _prune_object(obj: dict[str, Any], s: Schema, path: str, dropped: list[str], root: bool) -> None:
    props = _props(s)
    extra = s.get("additionalProperties")
    preserve = s.get("x-kubernetes-preserve-unknown-fields") is True
    for key in list(obj):
        if root and key in META_KEYS and key not in props:
            continue
        if key in props:
            _prune(obj[key], props[key], _join(path, key), dropped)
        elif isinstance(extra, dict):
            _prune(obj[key], extra, _join(path, key), dropped)
        elif not (preserve or extra is True):
            del obj[key]
            dropped.append(_join(path, key))


# --- defaulting ----------------------------------------------------------------
def apply_defaults(obj: Any, schema: Schema) -> None:
    """Fill the ``default`` of every absent property that has one, depth first."""
    if isinstance(obj, dict):
        props = _props(schema)
        for key, sub in props.items():
            if key not in obj and isinstance(sub, dict) and "default" in sub:
                obj[key] = copy.deepcopy(sub["default"])
            if key in obj:
                apply_defaults(obj[key], sub)
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict):
            for key, value in obj.items():
                if key not in props:
                    apply_defaults(value, extra)
    elif isinstance(obj, list) and isinstance(schema.get("items"), dict):
        for item in obj:
            apply_defaults(item, schema["items"])


# --- validation ----------------------------------------------------------------
def _type_name(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


def _shown(value: Any) -> str:
    if isinstance(value, str):
        return json.dumps(value)
    text = json.dumps(value, separators=(",", ":")) if value is not None else "null"
    return text if len(text) <= 64 else text[:61] + "..."


def _type_ok(value: Any, s: Schema) -> bool:
    t = s.get("type")
    if s.get("x-kubernetes-int-or-string") is True:
        return (isinstance(value, int) and not isinstance(value, bool)) or isinstance(value, str)
    if t is None:
        return True
    got = _type_name(value)
    return got == t or (t == "number" and got == "integer")


def validate(obj: Any, schema: Schema, path: str = "") -> Errors:
    """Every way ``obj`` fails ``schema``, as kube-apiserver words it."""
    errs: Errors = []
    _validate(obj, schema, path, errs, root=not path)
    return errs


LIST_TYPE_DUPLICATE = "Duplicate value: "   # the start of every x-kubernetes-list-type refusal


TYPE_MISMATCH = " in body must be of type "   # in every refusal of a value of the wrong type


def type_errors(obj: Any, schema: Schema) -> Errors:
    """The errors of :func:`validate` that are a value of the wrong type (what a partial
    object, an applied configuration, can be judged on: it need not hold required fields)."""
    return [e for e in validate(obj, schema) if TYPE_MISMATCH in e[1]]


def is_list_type_error(error: tuple[str, str]) -> bool:
    """Whether an error of :func:`validate` is an ``x-kubernetes-list-type`` duplicate."""
    return error[1].startswith(LIST_TYPE_DUPLICATE)


def _validate(value: Any, s: Schema, path: str, errs: Errors, root: bool = False) -> None:
    where = path or "<root>"
    if value is None:
        if s.get("nullable") is True or ("type" not in s and s.get("x-kubernetes-int-or-string") is not True):
            return
    if not _type_ok(value, s):
        want = "integer or string" if s.get("x-kubernetes-int-or-string") else s.get("type")
        got = _type_name(value)
        errs.append((path, f'Invalid value: "{got}": {where}{TYPE_MISMATCH}{want}: "{got}"'))
        return
    if "enum" in s and isinstance(s["enum"], list) and value not in s["enum"]:
        allowed = ", ".join(_shown(v) for v in s["enum"])
        errs.append((path, f"Unsupported value: {_shown(value)}: supported values: {allowed}"))
    if isinstance(value, bool):
        return
    if isinstance(value, (int, float)):
        _validate_number(value, s, path, where, errs)
    elif isinstance(value, str):
        _validate_string(value, s, path, where, errs)
    elif isinstance(value, list):
        _validate_array(value, s, path, where, errs)
    elif isinstance(value, dict):
        _validate_object(value, s, path, where, errs, root)


def _validate_number(value: int | float, s: Schema, path: str, where: str, errs: Errors) -> None:
    low, high = s.get("minimum"), s.get("maximum")
    if isinstance(low, (int, float)):
        if s.get("exclusiveMinimum") is True and value <= low:
            errs.append((path, f"Invalid value: {_shown(value)}: {where} in body should be greater than {low}"))
        elif value < low:
            errs.append((path, f"Invalid value: {_shown(value)}: {where} in body should be greater than "
                               f"or equal to {low}"))
    if isinstance(high, (int, float)):
        if s.get("exclusiveMaximum") is True and value >= high:
            errs.append((path, f"Invalid value: {_shown(value)}: {where} in body should be less than {high}"))
        elif value > high:
            errs.append((path, f"Invalid value: {_shown(value)}: {where} in body should be less than "
                               f"or equal to {high}"))
    step = s.get("multipleOf")
    if isinstance(step, (int, float)) and step > 0 and not _multiple(value, step):
        errs.append((path, f"Invalid value: {_shown(value)}: {where} in body should be a multiple of {step}"))


def _multiple(value: int | float, step: int | float) -> bool:
    if isinstance(value, int) and isinstance(step, int):
        return value % step == 0
    try:
        quotient = value / step
        return quotient == int(quotient)
    except (OverflowError, ValueError):   # beyond a float: no multiple to speak of
        return False


def _validate_string(value: str, s: Schema, path: str, where: str, errs: Errors) -> None:
    low, high = s.get("minLength"), s.get("maxLength")
    if isinstance(low, int) and len(value) < low:
        errs.append((path, f"Invalid value: {_shown(value)}: {where} in body should be at least {low} chars long"))
    if isinstance(high, int) and len(value) > high:
        errs.append((path, f"Too long: may not be longer than {high}"))
    pattern = s.get("pattern")
    if isinstance(pattern, str):
        compiled = _pattern(pattern)
        if compiled is not None and not compiled.search(value):
            errs.append((path, f"Invalid value: {_shown(value)}: {where} in body should match '{pattern}'"))


def _validate_array(value: list[Any], s: Schema, path: str, where: str, errs: Errors) -> None:
    low, high = s.get("minItems"), s.get("maxItems")
    if isinstance(low, int) and len(value) < low:
        errs.append((path, f"Invalid value: {len(value)}: {where} in body should have at least {low} items"))
    if isinstance(high, int) and len(value) > high:
        errs.append((path, f"Too many: {len(value)}: must have at most {high} items"))
    if s.get("uniqueItems") is True:
        seen = [json.dumps(v, sort_keys=True) for v in value]
        if len(set(seen)) != len(seen):
            errs.append((path, f"Invalid value: {where} in body shouldn't contain duplicates"))
    _validate_list_type(value, s, path, errs)
    items = s.get("items")
    if isinstance(items, dict):
        for i, item in enumerate(value):
            _validate(item, items, f"{path}[{i}]", errs)


def _validate_list_type(value: list[Any], s: Schema, path: str, errs: Errors) -> None:
    """``x-kubernetes-list-type`` set (no item twice) and map (no two items with the same
    values of ``x-kubernetes-list-map-keys``), as apiextensions' ``listtype`` validation:
    each later duplicate is ``Duplicate value: <the item, or its keys>`` (Go's %#v)."""
    kind = s.get("x-kubernetes-list-type")
    if kind == "set":
        seen: set[str] = set()
        for i, item in enumerate(value):
            key = json.dumps(item, sort_keys=True)
            if key in seen:
                errs.append((f"{path}[{i}]", f"{LIST_TYPE_DUPLICATE}{_go_value(item)}"))
            seen.add(key)
    elif kind == "map" and isinstance(s.get("x-kubernetes-list-map-keys"), list):
        names = [k for k in s["x-kubernetes-list-map-keys"] if isinstance(k, str)]
        keyed: set[str] = set()
        for i, item in enumerate(value):
            if not isinstance(item, dict):
                continue   # its type is judged by items
            keys = {k: item.get(k) for k in names if k in item}
            key = json.dumps([[k in item, item.get(k)] for k in names], sort_keys=True)
            if key in keyed:
                errs.append((f"{path}[{i}]", f"{LIST_TYPE_DUPLICATE}{_go_value(keys)}"))
            keyed.add(key)


def _go_value(value: Any) -> str:
    """``value`` as Go's ``%#v`` prints a decoded JSON value (field.Duplicate's words)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if isinstance(value, (int, float)):
        return repr(value)
    if value is None:
        return "interface {}(nil)"
    if isinstance(value, list):
        return "[]interface {}{" + ", ".join(_go_value(v) for v in value) + "}"
    return "map[string]interface {}{" + ", ".join(
        f"{json.dumps(k)}:{_go_value(v)}" for k, v in sorted(value.items())) + "}"


def _validate_object(value: dict[str, Any], s: Schema, path: str, where: str, errs: Errors, root: bool) -> None:
    for req in s.get("required") or []:
        if req not in value:
            errs.append((_join(path, req), "Required value"))
    low, high = s.get("minProperties"), s.get("maxProperties")
    if isinstance(low, int) and len(value) < low:
        errs.append((path, f"Invalid value: {len(value)}: {where} in body should have at least {low} properties"))
    if isinstance(high, int) and len(value) > high:
        errs.append((path, f"Too many: {len(value)}: must have at most {high} items"))
    props = _props(s)
    extra = s.get("additionalProperties")
    embedded = s.get("x-kubernetes-embedded-resource") is True
    for key, item in value.items():
        sub = props.get(key)
        if sub is None and isinstance(extra, dict):
            sub = extra
        if sub is not None and not (root and key in META_KEYS and key not in props):
            _validate(item, sub, _join(path, key), errs)
    if embedded:
        for key in ("apiVersion", "kind"):
            if not value.get(key):
                errs.append((_join(path, key), "Required value: must not be empty"))
