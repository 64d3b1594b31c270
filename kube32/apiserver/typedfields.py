"""Unknown fields of a built-in kind's body, found and dropped by its OpenAPI schema.

kube-apiserver decodes a body of a built-in kind into its Go types: a field the type
does not have is dropped (``fieldValidation=Ignore``), reported with a warning (``Warn``,
the default) or refused (``Strict``, what kubectl sends: ``strict decoding error:
unknown field "spec.replica"``).  Here the same types are the vendored Kubernetes
schemas (:mod:`.openapi.documents`): :func:`prune_unknown` walks a body against its
kind's schema and removes, in place, every member the schema does not name, returning
their paths as kube-apiserver writes them (``spec.ports[0].targetport``).  With
``omit_empty`` it also drops every empty map (``data: {}``, ``labels: {}``): the Go types'
maps are ``omitempty``, so kube-apiserver never stores or answers one.

Invariants: only kinds described by a vendored ``io.k8s.*`` schema are walked (a custom
resource is pruned by its own structural schema; the Checkpoint by its strategy); an
object schema without ``properties`` (``FieldsV1``, ``RawExtension``) or a map
(``additionalProperties``) takes any member; the walk goes no deeper than
:data:`MAX_DEPTH` (the body decoder already bounds a body's depth).
"""
from __future__ import annotations

from typing import Any

from .openapi.documents import definitions, schema_name
from .resources import Resource

MAX_DEPTH = 100
_REF = "#/definitions/"


def prune_unknown(res: Resource, obj: dict[str, Any], *, omit_empty: bool = False) -> list[str] | None:
    """Remove from ``obj`` the fields its kind does not have (and, ``omit_empty``, its empty
    maps); the unknown fields' paths.  None: the kind has no vendored schema (its strategy
    judges its fields)."""
    name = schema_name(res.group, res.version, res.kind)
    if res.custom or name is None or not name.startswith("io.k8s."):
        return None
    unknown: list[str] = []
    _walk(obj, definitions()[name], "", unknown, 0, omit_empty)
    return unknown


def _is_map(schema: dict[str, Any]) -> bool:
    return isinstance(schema.get("additionalProperties"), dict) and not isinstance(schema.get("properties"), dict)


def _resolve(schema: dict[str, Any]) -> dict[str, Any]:
    defs = definitions()
    for _ in range(16):
        ref = schema.get("$ref")
        if not isinstance(ref, str):
            all_of = schema.get("allOf")
            if isinstance(all_of, list) and len(all_of) == 1 and isinstance(all_of[0], dict):
                schema = all_of[0]
                continue
            return schema
        schema = defs.get(ref[len(_REF):], {}) if ref.startswith(_REF) else {}
    return {}


def _walk(value: Any, schema: dict[str, Any], path: str, unknown: list[str], depth: int,
          omit_empty: bool) -> None:
    if depth > MAX_DEPTH:
        return
    schema = _resolve(schema)
    if isinstance(value, dict):
        props = schema.get("properties")
        if isinstance(props, dict):
            for key in list(value):
                here = f"{path}.{key}" if path else key
                if key not in props:
                    unknown.append(here)
                    del value[key]
                elif omit_empty and value[key] == {} and _is_map(_resolve(props[key])):
                    del value[key]
                else:
                    _walk(value[key], props[key], here, unknown, depth + 1, omit_empty)
        elif isinstance(schema.get("additionalProperties"), dict):
            for key, item in value.items():
                _walk(item, schema["additionalProperties"], f"{path}.{key}", unknown, depth + 1, omit_empty)
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(value):
            _walk(item, schema["items"], f"{path}[{i}]", unknown, depth + 1, omit_empty)
