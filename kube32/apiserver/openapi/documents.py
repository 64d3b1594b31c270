"""The OpenAPI v2 document and the v3 root and group-version documents.

Invariants:

* Only kinds the server serves are described: every schema is one of the resource
  table's kinds (kube32.apiserver.resources), their lists or the kinds their requests
  answer, or something such a schema refers to; every ``$ref`` resolves (the vendored
  definitions were cut to that closure, :func:`definitions` adds the Checkpoint's).
* A group version's v3 document holds the schemas its kinds reach, under the names
  kube-apiserver gives them (``io.k8s.api.core.v1.Pod``, ``io.kube32.v1.Checkpoint``),
  a ``$ref`` with a description wrapped in ``allOf`` as kube-apiserver writes it; its
  paths carry each kind's GVK and the ``fieldValidation`` parameter, so kubectl leaves
  validation to the server (``fieldValidation=Strict``), which the registry performs.
* Documents are built once: a v3 document's hash in the root (``?hash=``) changes only
  when the document does.
"""
from __future__ import annotations

import copy
import gzip
import hashlib
import json
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterator

from .. import schema
from ..resources import GROUP_VERSIONS, RESOURCES, Resource

VERSION = "v1.32.4-kube32"
_DATA = Path(__file__).with_name("definitions.json.gz")
_V2_REF = "#/definitions/"
_V3_REF = "#/components/schemas/"
_STATUS = "io.k8s.apimachinery.pkg.apis.meta.v1.Status"
_DELETE_OPTIONS = "io.k8s.apimachinery.pkg.apis.meta.v1.DeleteOptions"
_FIELD_VALIDATION = {"name": "fieldValidation", "in": "query", "type": "string", "uniqueItems": True,
                     "description": "fieldValidation instructs the server on how to handle objects in the "
                                    "request containing unknown or duplicate fields. Valid values are: "
                                    "Ignore, Warn (the default) and Strict."}
_DRY_RUN = {"name": "dryRun", "in": "query", "type": "string", "uniqueItems": True,
            "description": "When present, indicates that modifications should not be persisted. "
                           "The only valid value is All."}


@lru_cache(maxsize=None)
def definitions() -> dict[str, Any]:
    """Every schema, in OpenAPI v2's form: the vendored Kubernetes ones and Kube32's own."""
    vendored = json.loads(gzip.decompress(_DATA.read_bytes()))["definitions"]
    return {**vendored, **copy.deepcopy(schema.DEFINITIONS)}


@lru_cache(maxsize=None)
def _by_gvk() -> dict[tuple[str, str, str], str]:
    out: dict[tuple[str, str, str], str] = {}
    for name, d in definitions().items():
        for gvk in d.get("x-kubernetes-group-version-kind", []):
            out.setdefault((gvk["group"], gvk["version"], gvk["kind"]), name)
    return out


def schema_name(group: str, version: str, kind: str) -> str | None:
    """The definition of a kind (None: the kind has none)."""
    return _by_gvk().get((group, version, kind))


def _refs(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str):
            yield ref.rsplit("/", 1)[-1]
        for v in node.values():
            yield from _refs(v)
    elif isinstance(node, list):
        for v in node:
            yield from _refs(v)


def closure(names: list[str]) -> list[str]:
    """The names and every definition they refer to, sorted."""
    defs, seen, todo = definitions(), set(), list(names)
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo.extend(r for r in _refs(defs[name]) if r not in seen)
    return sorted(seen)


def _kind_schemas(res: Resource) -> list[str]:
    names = [schema_name(res.group, res.version, res.kind), schema_name(res.group, res.version, res.list_kind)]
    return [n for n in names if n]


# --- paths ---------------------------------------------------------------------
def _collection_path(prefix: str, res: Resource) -> str:
    return f"{prefix}/" + (f"namespaces/{{namespace}}/{res.plural}" if res.namespaced else res.plural)


def _operations(res: Resource, v3: bool) -> dict[str, dict[str, dict[str, Any]]]:
    """``{path: {method: operation}}`` for a resource: its collection and its objects."""
    prefix = "/api/v1" if not res.group else f"/apis/{res.group}/{res.version}"
    base = _collection_path(prefix, res)
    gvk = {"group": res.group, "version": res.version, "kind": res.kind}
    one, many = schema_name(res.group, res.version, res.kind), schema_name(res.group, res.version, res.list_kind)

    def op(verb: str, action: str, answer: str | None, params: list[dict[str, Any]]) -> dict[str, Any]:
        return {"operationId": f"{verb}{'Namespaced' if res.namespaced else ''}{res.kind}",
                "x-kubernetes-action": action, "x-kubernetes-group-version-kind": gvk,
                "parameters": [_parameter(p, v3) for p in params], "responses": _responses(answer, v3)}
    writes = [_DRY_RUN, _FIELD_VALIDATION]
    paths: dict[str, dict[str, dict[str, Any]]] = {base: {}}
    if "create" in res.verbs:
        paths[base]["post"] = op("create", "post", one, writes)
    if "list" in res.verbs:
        paths[base]["get"] = op("list", "list", many, [])
        paths[base + "/{name}"] = {"get": op("read", "get", one, []), "put": op("replace", "put", one, writes),
                                   "patch": op("patch", "patch", one, writes),
                                   "delete": op("delete", "delete", _STATUS, [_DRY_RUN])}
    return {p: ops for p, ops in paths.items() if ops}


def _parameter(p: dict[str, Any], v3: bool) -> dict[str, Any]:
    if not v3:
        return dict(p)
    out = {k: v for k, v in p.items() if k not in ("type", "uniqueItems")}
    out["schema"] = {"type": p["type"], "uniqueItems": True}
    return out


def _responses(answer: str | None, v3: bool) -> dict[str, Any]:
    if answer is None:
        return {"200": {"description": "OK"}}
    ref = {"$ref": (_V3_REF if v3 else _V2_REF) + answer}
    if v3:
        return {"200": {"description": "OK", "content": {"application/json": {"schema": ref}}}}
    return {"200": {"description": "OK", "schema": ref}}


# --- v2 ------------------------------------------------------------------------
@lru_cache(maxsize=None)
def v2_document() -> dict[str, Any]:
    """``/openapi/v2``: every path and every definition."""
    paths: dict[str, Any] = {}
    for res in RESOURCES:
        paths.update(_operations(res, v3=False))
    return {"swagger": "2.0", "info": {"title": "Kubernetes", "version": VERSION}, "paths": paths,
            "definitions": {n: definitions()[n] for n in sorted(definitions())}}


# --- v3 ------------------------------------------------------------------------
def _v3_form(node: Any) -> Any:
    """A v2 schema in v3's form: refs to components, a described ref wrapped in allOf."""
    if isinstance(node, list):
        return [_v3_form(v) for v in node]
    if not isinstance(node, dict):
        return node
    if isinstance(node.get("$ref"), str):
        ref = {"$ref": _V3_REF + node["$ref"].rsplit("/", 1)[-1]}
        rest = {k: _v3_form(v) for k, v in node.items() if k != "$ref"}
        return {"allOf": [ref], **rest} if rest else ref
    out = {}
    for k, v in node.items():
        if k == "properties":
            out[k] = {field: _v3_form(s) for field, s in v.items()}
        else:
            out[k] = v if k in ("x-kubernetes-group-version-kind", "enum", "required", "default") else _v3_form(v)
    return out


def _gv_path(gv: str) -> str:
    return f"api/{gv}" if "/" not in gv else f"apis/{gv}"


@lru_cache(maxsize=None)
def v3_document(path: str) -> dict[str, Any] | None:
    """``/openapi/v3/<api/v1|apis/<group>/<version>>`` (None: no such group version)."""
    gv = path[len("api/"):] if path.startswith("api/") else path[len("apis/"):]
    resources = GROUP_VERSIONS.get(gv)
    if resources is None or _gv_path(gv) != path:
        return None
    paths: dict[str, Any] = {}
    roots = [_STATUS, _DELETE_OPTIONS]
    for res in resources:
        paths.update(_operations(res, v3=True))
        roots += _kind_schemas(res)
    defs = definitions()
    return {"openapi": "3.0.0", "info": {"title": "Kubernetes", "version": VERSION}, "paths": paths,
            "components": {"schemas": {n: _v3_form(defs[n]) for n in closure(roots)}}}


@lru_cache(maxsize=None)
def v3_document_bytes(path: str) -> bytes | None:
    doc = v3_document(path)
    return None if doc is None else json.dumps(doc, separators=(",", ":")).encode()


@lru_cache(maxsize=None)
def v3_root() -> dict[str, Any]:
    """``/openapi/v3``: each group version's document, by its hash."""
    paths = {}
    for gv in GROUP_VERSIONS:
        p = _gv_path(gv)
        body = v3_document_bytes(p)
        assert body is not None
        paths[p] = {"serverRelativeURL": f"/openapi/v3/{p}?hash={hashlib.sha512(body).hexdigest()[:128].upper()}"}
    return {"paths": paths}
