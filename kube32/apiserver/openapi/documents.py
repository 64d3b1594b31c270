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
* Every path names its ``{namespace}``/``{name}``/``{path}`` parameters (on the path
  item, as kube-apiserver's), lists their query parameters, and every subresource the
  resource table gives a kind has its path; operationIds are unique: the documents are
  valid OpenAPI 2.0 / 3.0 (tests/unit/test_openapi.py checks with openapi-spec-validator).
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
from ..strategies.simple import NotRunStrategy

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
    """Every schema, in OpenAPI v2's form: the vendored Kubernetes ones, Kube32's own and
    those of the kinds Kube32 serves but does not run."""
    vendored = json.loads(gzip.decompress(_DATA.read_bytes()))["definitions"]
    return {**vendored, **copy.deepcopy(schema.DEFINITIONS), **_not_run_definitions()}


def _not_run_definitions() -> dict[str, Any]:
    """A kind Kube32 does not run (strategies.simple.NotRunStrategy) is described by its
    type and object metadata and the reason, under kube-apiserver's name for it."""
    out: dict[str, Any] = {}
    for res in RESOURCES:
        if not isinstance(res.strategy, NotRunStrategy):
            continue
        base = f"io.k8s.api.{res.group.split('.')[0] if res.group else 'core'}.{res.version}."
        meta = "io.k8s.apimachinery.pkg.apis.meta.v1."
        out[base + res.kind] = {
            "description": f"{res.kind}: {res.strategy.verb_refusal(res.plural)}. Listed, always empty.",
            "type": "object",
            "properties": {"apiVersion": {"type": "string"}, "kind": {"type": "string"},
                           "metadata": {"$ref": f"{_V2_REF}{meta}ObjectMeta"}},
            "x-kubernetes-group-version-kind": [{"group": res.group, "kind": res.kind, "version": res.version}]}
        out[base + res.list_kind] = {
            "description": f"A list of {res.plural} (always empty).", "type": "object", "required": ["items"],
            "properties": {"apiVersion": {"type": "string"}, "kind": {"type": "string"},
                           "items": {"type": "array", "items": {"$ref": f"{_V2_REF}{base}{res.kind}"}},
                           "metadata": {"$ref": f"{_V2_REF}{meta}ListMeta"}},
            "x-kubernetes-group-version-kind": [{"group": res.group, "kind": res.list_kind, "version": res.version}]}
    return out


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
    """The schemas of a resource's objects, lists and subresources' objects."""
    names = [schema_name(res.group, res.version, res.kind), schema_name(res.group, res.version, res.list_kind)]
    names += [schema_name(res.group if sub.group is None else sub.group, sub.version or res.version, sub.kind)
              for sub in res.subresources]
    return [n for n in names if n]


# --- paths ---------------------------------------------------------------------
def _query(name: str, kind: str, description: str) -> dict[str, Any]:
    return {"name": name, "in": "query", "type": kind, "uniqueItems": True, "description": description}


def _in_path(name: str, description: str) -> dict[str, Any]:
    return {"name": name, "in": "path", "required": True, "type": "string", "uniqueItems": True,
            "description": description}


_NAMESPACE = _in_path("namespace", "object name and auth scope, such as for teams and projects")
_LIST_PARAMS = [
    _query("allowWatchBookmarks", "boolean", "allowWatchBookmarks requests watch events with type \"BOOKMARK\"."),
    _query("continue", "string", "The continue option should be set when retrieving more results from the server."),
    _query("fieldSelector", "string", "A selector to restrict the list of returned objects by their fields."),
    _query("labelSelector", "string", "A selector to restrict the list of returned objects by their labels."),
    _query("limit", "integer", "limit is a maximum number of responses to return for a list call."),
    _query("resourceVersion", "string", "resourceVersion sets a constraint on what resource versions a request "
                                        "may be served from."),
    _query("resourceVersionMatch", "string", "resourceVersionMatch determines how resourceVersion is applied to "
                                             "list calls."),
    _query("sendInitialEvents", "boolean", "`sendInitialEvents=true` may be set together with `watch=true`."),
    _query("timeoutSeconds", "integer", "Timeout for the list/watch call."),
    _query("watch", "boolean", "Watch for changes to the described resources and return them as a stream of add, "
                               "update, and remove notifications."),
]
_PATH_PARAM = _in_path("path", "path to the resource")
# A subresource's verbs as the methods of its path, as kube-apiserver's document names them.
_METHODS = {"get": ("get", "read"), "update": ("put", "replace"), "patch": ("patch", "patch"),
            "create": ("post", "create"), "delete": ("delete", "delete")}


def _collection_path(prefix: str, res: Resource) -> str:
    return f"{prefix}/" + (f"namespaces/{{namespace}}/{res.plural}" if res.namespaced else res.plural)


def resource_paths(res: Resource, own_schema: str) -> dict[str, dict[str, Any]]:
    """A custom resource's v3 paths (kube32.apiserver.crds), its objects' schema named
    ``own_schema``; what they refer to besides is in :func:`components`."""
    return _operations(res, True, own_schema)


def components(names: list[str]) -> dict[str, Any]:
    """The v3 schemas of the named definitions and of all they refer to."""
    defs = definitions()
    return {n: _v3_form(defs[n]) for n in closure([n for n in names if n in defs])}


def referenced(node: Any) -> list[str]:
    """The definitions a document part refers to."""
    return sorted(set(_refs(node)))


def _operations(res: Resource, v3: bool, own_schema: str | None = None) -> dict[str, dict[str, Any]]:
    """``{path: path item}`` for a resource: its collection, its objects and their
    subresources, each path's parameters (``{namespace}``, ``{name}``) on the path item."""
    prefix = "/api/v1" if not res.group else f"/apis/{res.group}/{res.version}"
    base = _collection_path(prefix, res)
    scope = "Namespaced" if res.namespaced else ""
    one = own_schema or schema_name(res.group, res.version, res.kind)
    many = schema_name(res.group, res.version, res.list_kind)

    def op(op_id: str, action: str, answer: str | None, params: list[dict[str, Any]],
           gvk: dict[str, str] | None = None, text: bool = False) -> dict[str, Any]:
        return {"operationId": op_id, "x-kubernetes-action": action,
                "x-kubernetes-group-version-kind": gvk or {"group": res.group, "version": res.version,
                                                           "kind": res.kind},
                "parameters": [_parameter(p, v3) for p in params], "responses": _responses(answer, v3, text)}

    def item(params: list[dict[str, Any]], ops: dict[str, Any]) -> dict[str, Any]:
        return {**ops, "parameters": [_parameter(p, v3) for p in params]} if ops else {}
    writes = [_DRY_RUN, _FIELD_VALIDATION]
    scoped = [_NAMESPACE] if res.namespaced else []
    named = [_in_path("name", f"name of the {res.kind}"), *scoped]
    collection: dict[str, Any] = {}
    if "create" in res.verbs:
        collection["post"] = op(f"create{scope}{res.kind}", "post", one, writes)
    paths: dict[str, dict[str, Any]] = {}
    if "list" in res.verbs:
        collection["get"] = op(f"list{scope}{res.kind}", "list", many, _LIST_PARAMS)
        if "deletecollection" in res.verbs:
            collection["delete"] = op(f"deletecollection{scope}{res.kind}", "deletecollection", _STATUS,
                                      [_DRY_RUN, *_LIST_PARAMS])
        paths[base + "/{name}"] = item(named, {
            "get": op(f"read{scope}{res.kind}", "get", one, []),
            "put": op(f"replace{scope}{res.kind}", "put", one, writes),
            "patch": op(f"patch{scope}{res.kind}", "patch", one, writes),
            "delete": op(f"delete{scope}{res.kind}", "delete", _STATUS, [_DRY_RUN])})
        for sub in res.subresources:
            paths.update(_subresource_paths(res, sub, base + "/{name}", named, op, item, one))
    paths[base] = item(scoped, collection)
    return {p: ops for p, ops in sorted(paths.items()) if ops}


def _subresource_paths(res: Resource, sub: Any, object_path: str, named: list[dict[str, Any]],
                       op: Any, item: Any, own: str | None) -> dict[str, dict[str, Any]]:
    scope = "Namespaced" if res.namespaced else ""
    title = sub.name[:1].upper() + sub.name[1:]
    group = res.group if sub.group is None else sub.group
    version = sub.version or res.version
    gvk = {"group": group, "version": version, "kind": sub.kind}
    if sub.name == "proxy":   # a connection, not an object: every method, with and without a path
        out = {}
        for suffix, params, tail in (("", named, ""), ("/{path}", [*named, _PATH_PARAM], "WithPath")):
            out[f"{object_path}/proxy{suffix}"] = item(params, {
                method: op(f"connect{method.capitalize()}{scope}{res.kind}Proxy{tail}", "connect", None, [],
                           gvk, text=True)
                for method in ("get", "put", "post", "delete", "patch", "head", "options")})
        return out
    answer = own if (group, version, sub.kind) == (res.group, res.version, res.kind) \
        else schema_name(group, version, sub.kind)
    text = sub.name in ("log", "data")
    ops = {}
    for verb in sub.verbs:
        method, action = _METHODS[verb]
        params = [_DRY_RUN, _FIELD_VALIDATION] if method in ("put", "patch", "post") else []
        ops[method] = op(f"{action}{scope}{res.kind}{title}", method if action == "create" else
                         ("get" if action == "read" else method), None if text else answer, params, gvk, text)
    return {f"{object_path}/{sub.name}": item(named, ops)}


def _parameter(p: dict[str, Any], v3: bool) -> dict[str, Any]:
    if not v3:
        return dict(p)
    out = {k: v for k, v in p.items() if k not in ("type", "uniqueItems")}
    out["schema"] = {"type": p["type"], "uniqueItems": True}
    return out


def _responses(answer: str | None, v3: bool, text: bool = False) -> dict[str, Any]:
    if answer is None:
        if not text:
            return {"200": {"description": "OK"}}
        if v3:
            return {"200": {"description": "OK", "content": {"*/*": {"schema": {"type": "string"}}}}}
        return {"200": {"description": "OK", "schema": {"type": "string"}}}
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
