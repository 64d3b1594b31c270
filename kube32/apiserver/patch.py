"""Patch semantics of the API server: JSON merge patch, JSON patch, strategic merge
patch and a practical server-side apply.

Everything here is a pure function over plain JSON values (dict/list/str/int/float/
bool/None).  No I/O and no kube32 import but the bounds of :mod:`.limits`, so the API
server's handlers decide the HTTP status: every refusal is a ``PatchError`` whose
message names the problem (the API answers 422 or 400 with it); ``PatchLimit`` is a
bound a JSON patch went past (413 when it is about size, else 400); ``ApplyConflict``
is the 409 case and carries one ``(field path, other manager)`` pair per conflicting
field for Status causes.

Invariants
----------
* Inputs are never mutated; results share no mutable structure with the inputs
  (callers may store and later edit a result freely).
* Patch directives (``$patch``, ``$setElementOrder/…``, ``$deleteFromPrimitiveList/…``,
  ``$retainKeys``) never reach a result.

JSON merge patch (RFC 7386)
    ``json_merge_patch(target, patch)``: a non-object patch replaces the target;
    ``null`` deletes a key; objects merge recursively; arrays are replaced.

JSON patch (RFC 6902)
    ``json_patch(target, ops)``: add/remove/replace/move/copy/test with RFC 6901
    pointers (``~0`` = ``~``, ``~1`` = ``/``, ``-`` appends).  The operations are
    applied to a copy one by one; the first failing one raises ``PatchError`` and
    nothing is returned (all or nothing).  ``test`` compares JSON values (``1 ==
    1.0`` but ``true != 1``).  The result must still be a JSON object.  Bounded as
    kube-apiserver bounds it: at most ``MAX_JSON_PATCH_OPERATIONS`` operations, and
    ``copy`` operations that add at most ``JSON_PATCH_MAX_COPY_BYTES`` together (a
    copy of a copy of ... doubles the object each time); and the result may nest no
    deeper than ``MAX_DEPTH`` (or the target, if it already did).

Strategic merge patch (Kubernetes SMP for built-in kinds)
    Field strategies come from a small schema table per kind (``_KIND_SCHEMAS``) that
    mirrors the ``patchStrategy``/``patchMergeKey`` struct tags of k8s.io/api:
    containers/initContainers/ephemeralContainers/volumes/imagePullSecrets/env by
    ``name``, volumeMounts by ``mountPath``, container ports by ``containerPort``,
    Service ports by ``port``, ownerReferences by ``uid``, status conditions and Node
    addresses by ``type``; ``finalizers`` (and Node ``podCIDRs``) are primitive lists
    merged as a union.  Every list not in the table (tolerations, args, taints, …) is
    replaced.  Pod specs are found under ``spec`` (Pod), ``spec.template.spec``
    (Deployment, ReplicaSet, DaemonSet, StatefulSet, Job) and
    ``spec.jobTemplate.spec.template.spec`` (CronJob).  Other built-in kinds
    (``BUILTIN_KINDS``) get the ObjectMeta rules only.  Kinds outside
    ``BUILTIN_KINDS`` (custom resources) are patched as RFC 7386 merge patch; the
    real API server refuses SMP for them with 415, which the handler may prefer
    (``is_strategic_kind`` tells it).

    Directives, as in k8s.io/apimachinery/pkg/util/strategicpatch:
    * ``null`` deletes a key (a null for an absent key is dropped, not stored);
    * ``{"$patch": "replace", ...}`` in a map: the map becomes the rest of the patch
      map; ``{"$patch": "replace"}`` as a list element: the list becomes the other
      patch elements;
    * ``{"$patch": "delete", <key>: v}`` in a merge list removes the element with that
      key; ``{"$patch": "delete"}`` as a map value removes that key from its parent
      (the whole document becomes ``{}`` at top level; upstream leaves ``{}`` in the
      parent, deleting is what callers mean and is equivalent for defaulted fields);
    * ``$setElementOrder/<f>``: after merging list ``f``, the elements named in the
      order list are put in that order within the positions they occupy; elements
      only on the server keep their positions;
    * ``$deleteFromPrimitiveList/<f>``: those values are removed from primitive
      list ``f`` before ``f`` itself is merged;
    * ``$retainKeys``: keys of the live map not listed are dropped before merging;
      a patch key missing from the list is an error (as upstream);
    * any other ``$patch`` value is an error, except ``merge`` (the default, accepted
      as a no-op where upstream is stricter).  A patch element of a merge list
      without the merge key, or a non-list where a list is merged, is an error.

Server-side apply (practical subset of structured-merge-diff)
    ``server_side_apply(live, applied, manager, force, kind)`` upserts: with no live
    object the applied config (minus nulls) is the object.  Otherwise the applied
    config is merged into live with the kind's field rules: a built-in kind's are the
    SMP table's (``rules_for_kind``), a custom resource's come from its schema
    (``rules_from_openapi``: ``x-kubernetes-list-type`` map/set, ``x-kubernetes-map-type``
    atomic).  Maps merge recursively, keyed lists item by item (live order kept, new
    items appended), set lists as a set union, atomic maps and every other list are
    replaced.

    Ownership is recorded in ``metadata.managedFields`` exactly in the Kubernetes
    wire form: one entry per (manager, operation) with ``fieldsType: FieldsV1`` and a
    ``fieldsV1`` tree whose keys are ``f:<field>``, ``k:<compact JSON of the merge
    key>`` for keyed-list items, ``v:<JSON value>`` for set-list values and ``.``
    for "the item itself".  An applier owns every leaf it sets (scalars, replaced
    lists, atomic maps, empty maps), plus each keyed item (``.``) and each set value it lists.
    Identity and server-owned fields (apiVersion, kind, metadata.name/namespace/uid/
    resourceVersion/generation/creationTimestamp/managedFields …) are never owned.

    Rules:
    * a leaf the applier sets, owned by another manager (operation ``Apply``, or
      ``Update``: a plain write, ``kubectl scale``, a client-side apply), whose value
      in live merged with the config differs from live's, is a conflict (judged
      before the pruning below, as structured-merge-diff does: dropping one's own
      fields never conflicts).  Without ``force`` all conflicts are
      raised together in one ``ApplyConflict``; with ``force`` the other managers
      lose those fields (and anything below them).
    * a field this manager owned before and no longer applies is deleted from the
      object unless another manager (any operation) owns it or something below it;
      maps and lists that such a deletion leaves empty are pruned (top-level
      fields are kept).
    * entries that end up owning nothing are dropped (the caller's own too).
    * ``null`` in an applied config means "not specified".
    Keyed lists use all their keys, as Kubernetes' list-map-keys (container ports
    ``containerPort`` + ``protocol``, Service ports ``port`` + ``protocol``, a custom
    resource's its x-kubernetes-list-map-keys), a key with a default (``protocol: TCP``,
    the schema's) filled in where an applied item leaves it out; strategic merge patch
    merges on the first key alone, as upstream's single patchMergeKey.  Status
    handling, resourceVersion checks and the ``kubectl-last-applied`` follow-up request
    are the caller's business.

Plain writes (``record_update``)
    Every other write (create, update, merge/JSON/strategic patch, a subresource's)
    is recorded as Kubernetes' fieldmanager does: the writer's entry, operation
    ``Update`` (with ``subresource`` when it wrote one), owns what it owned before and
    still exists plus every leaf its write changed or added; every other manager loses
    the leaves this write changed (an Update always wins) and every entry loses what no
    longer exists; an entry left owning nothing goes.  A write whose object carries
    managedFields other than the stored ones sets them as given (how a client resets
    them, and how kubectl migrates client-side apply to server-side apply); one that
    carries none keeps the stored ones.  A keyed list whose items lack their key (or
    repeat it) is owned whole.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import AbstractSet as Set, Any, Iterable, Mapping

from .. import objects
from . import gostrings
from .jsoncopy import copy_json, drop_nulls
from .limits import JSON_PATCH_MAX_COPY_BYTES, MAX_DEPTH, MAX_JSON_PATCH_OPERATIONS

__all__ = [
    "PatchError",
    "PatchLimit",
    "nesting",
    "ApplyConflict",
    "json_merge_patch",
    "json_patch",
    "strategic_merge_patch",
    "server_side_apply",
    "record_update",
    "is_strategic_kind",
    "FieldRules",
    "rules_for_kind",
    "rules_from_openapi",
    "BUILTIN_KINDS",
]


class PatchError(Exception):
    """A patch that cannot be applied; ``str(err)`` names the problem."""


class PatchLimit(PatchError):
    """A JSON patch past a bound; ``too_large`` when the bound is about size."""

    def __init__(self, message: str, too_large: bool) -> None:
        super().__init__(message)
        self.too_large = too_large


class ApplyConflict(PatchError):
    """Server-side apply touched fields another manager owns (HTTP 409).

    ``conflicts``: (field, manager, whom) with ``whom`` as Kubernetes words the owner
    (apimachinery's printManager: ``"kubectl" with subresource "scale" using apps/v1``; an
    Apply manager without ``using``).  The message is Kubernetes' (its conflict.go): one
    conflict on one line, several grouped by owner, one field a line."""

    def __init__(self, conflicts: list[tuple[str, str, str]]) -> None:
        self.conflicts = list(conflicts)
        n = len(self.conflicts)
        super().__init__(f"Apply failed with {n} conflict{'s' if n != 1 else ''}: {self._detail()}")

    def _detail(self) -> str:
        if len(self.conflicts) == 1:
            field, _, whom = self.conflicts[0]
            return f"conflict with {whom}: {field}"
        by_owner: dict[str, list[str]] = {}
        for field, _, whom in self.conflicts:
            by_owner.setdefault(whom, []).append(field)
        lines = []
        for whom in sorted(by_owner):
            lines.append(f"conflicts with {whom}:")
            lines += [f"- {field}" for field in by_owner[whom]]
        return "\n".join(lines)


# --------------------------------------------------------------------------- helpers

def _deep_copy(value: Any) -> Any:
    return copy_json(value)


def nesting(value: Any) -> int:
    """How many levels of objects and arrays ``value`` holds (a scalar: 0), found
    without recursion."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        node, level = stack.pop()
        children = node.values() if isinstance(node, dict) else node if isinstance(node, list) else None
        if children is None:
            continue
        deepest = max(deepest, level)
        stack.extend((child, level + 1) for child in children if isinstance(child, (dict, list)))
    return deepest


def _json_equal(a: Any, b: Any) -> bool:
    """JSON value equality: numbers by value, but booleans are not numbers."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_json_equal(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_json_equal(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and a == b


# ------------------------------------------------------------- JSON merge patch (7386)

def json_merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 merge of ``patch`` into ``target``; inputs are not mutated."""
    return _merge_patch(_deep_copy(target), patch)


def _merge_patch(target: Any, patch: Any) -> Any:
    # ``target`` is already a private copy, so it is edited in place.
    if not isinstance(patch, dict):
        return _deep_copy(patch)
    result = target if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = _merge_patch(result.get(key), value)
    return result


# ----------------------------------------------------------------- JSON patch (6902)

def _parse_pointer(pointer: Any, what: str) -> list[str]:
    if not isinstance(pointer, str):
        raise PatchError(f"{what} must be a JSON pointer string, got {pointer!r}")
    if pointer == "":
        return []
    if not pointer.startswith("/"):
        raise PatchError(f"{what} {pointer!r} is not a JSON pointer (must start with '/')")
    return [t.replace("~1", "/").replace("~0", "~") for t in pointer[1:].split("/")]


def _array_index(token: str, length: int, pointer: str, allow_end: bool) -> int:
    if allow_end and token == "-":
        return length
    if not token.isdigit() or not token.isascii() or (len(token) > 1 and token[0] == "0"):
        raise PatchError(f"path {pointer!r}: {token!r} is not a valid array index")
    index = int(token)
    limit = length if allow_end else length - 1
    if index > limit:
        raise PatchError(f"path {pointer!r}: index {index} is out of range (array length {length})")
    return index


def _resolve(doc: Any, tokens: list[str], pointer: str) -> Any:
    node = doc
    for depth, token in enumerate(tokens):
        if isinstance(node, dict):
            if token not in node:
                missing = "/" + "/".join(t.replace("~", "~0").replace("/", "~1")
                                         for t in tokens[: depth + 1])
                context = "" if missing == pointer else f" (needed by {pointer!r})"
                raise PatchError(f"path {missing!r} does not exist{context}")
            node = node[token]
        elif isinstance(node, list):
            node = node[_array_index(token, len(node), pointer, allow_end=False)]
        else:
            raise PatchError(f"path {pointer!r} goes through a value that is not an object or array")
    return node


def _jp_add(doc: Any, tokens: list[str], value: Any, pointer: str) -> Any:
    if not tokens:
        return value
    parent = _resolve(doc, tokens[:-1], pointer)
    last = tokens[-1]
    if isinstance(parent, dict):
        parent[last] = value
    elif isinstance(parent, list):
        parent.insert(_array_index(last, len(parent), pointer, allow_end=True), value)
    else:
        raise PatchError(f"path {pointer!r}: parent is not an object or array")
    return doc


def _jp_remove(doc: Any, tokens: list[str], pointer: str) -> tuple[Any, Any]:
    if not tokens:
        raise PatchError("cannot remove the whole document (path '')")
    parent = _resolve(doc, tokens[:-1], pointer)
    last = tokens[-1]
    if isinstance(parent, dict):
        if last not in parent:
            raise PatchError(f"path {pointer!r} does not exist")
        return doc, parent.pop(last)
    if isinstance(parent, list):
        return doc, parent.pop(_array_index(last, len(parent), pointer, allow_end=False))
    raise PatchError(f"path {pointer!r}: parent is not an object or array")


def _op_field(op: dict, name: str, index: int) -> Any:
    if name not in op:
        raise PatchError(f"operation {index} ({op.get('op')!r}) is missing {name!r}")
    return op[name]


class _CopyBudget:
    """What a JSON patch's copy operations have added so far."""

    def __init__(self, limit: int) -> None:
        self.limit, self.used = limit, 0

    def charge(self, value: Any, index: int) -> None:
        self.used += len(json.dumps(value, separators=(",", ":")))
        if self.used > self.limit:
            raise PatchLimit(f"operation {index}: the copy operations of the patch add {self.used} bytes, "
                             f"more than the limit of {self.limit} bytes", too_large=True)


def _apply_op(doc: Any, op: Any, index: int, copies: _CopyBudget) -> Any:
    if not isinstance(op, dict):
        raise PatchError(f"operation {index} is not a JSON object")
    kind = op.get("op")
    path = _op_field(op, "path", index)
    tokens = _parse_pointer(path, f"operation {index} path")
    if kind == "add":
        return _jp_add(doc, tokens, _deep_copy(_op_field(op, "value", index)), path)
    if kind == "remove":
        return _jp_remove(doc, tokens, path)[0]
    if kind == "replace":
        value = _deep_copy(_op_field(op, "value", index))
        if not tokens:
            return value
        _resolve(doc, tokens, path)  # the target must exist
        doc, _ = _jp_remove(doc, tokens, path)
        return _jp_add(doc, tokens, value, path)
    if kind in ("move", "copy"):
        source = _op_field(op, "from", index)
        from_tokens = _parse_pointer(source, f"operation {index} from")
        if kind == "move":
            if from_tokens == tokens:
                _resolve(doc, tokens, path)
                return doc
            if tokens[: len(from_tokens)] == from_tokens:
                raise PatchError(f"operation {index}: cannot move {source!r} into its own child {path!r}")
            doc, value = _jp_remove(doc, from_tokens, source)
        else:
            value = _resolve(doc, from_tokens, source)
            copies.charge(value, index)
            value = _deep_copy(value)
        return _jp_add(doc, tokens, value, path)
    if kind == "test":
        expected = _op_field(op, "value", index)
        actual = _resolve(doc, tokens, path)
        if not _json_equal(actual, expected):
            raise PatchError(f"test operation {index} failed: value at {path!r} is "
                             f"{json.dumps(actual)}, expected {json.dumps(expected)}")
        return doc
    raise PatchError(f"operation {index} has unknown op {kind!r} "
                     "(expected add, remove, replace, move, copy or test)")


def json_patch(target: dict, ops: list, *, max_operations: int = MAX_JSON_PATCH_OPERATIONS,
               max_copy_bytes: int = JSON_PATCH_MAX_COPY_BYTES, max_depth: int = MAX_DEPTH) -> dict:
    """RFC 6902: apply ``ops`` to a copy of ``target``; all or nothing, within the bounds."""
    if not isinstance(ops, list):
        raise PatchError("a JSON patch must be a JSON array of operations")
    if len(ops) > max_operations:
        raise PatchLimit(f"the allowed number of operations in a JSON patch is {max_operations}, "
                         f"got {len(ops)}", too_large=True)
    doc = _deep_copy(target)
    copies = _CopyBudget(max_copy_bytes)
    try:
        for index, op in enumerate(ops):
            doc = _apply_op(doc, op, index, copies)
    except RecursionError:
        raise PatchLimit(f"the patch nests the object deeper than {max_depth} levels", too_large=False) from None
    if not isinstance(doc, dict):
        raise PatchError("the patched document is not a JSON object")
    depth = nesting(doc)
    if depth > max_depth and depth > nesting(target):
        raise PatchLimit(f"the patched object would nest {depth} levels deep, more than the limit of "
                         f"{max_depth} levels", too_large=False)
    return doc


# ------------------------------------------------------------------ schema table

@dataclass(frozen=True, eq=False)
class _Struct:
    """A map whose named fields have special strategies (``other``: the strategy of
    every field not named, a schema's additionalProperties); other fields are plain."""
    fields: Mapping[str, "_Rule"] = field(default_factory=dict)
    other: "_Rule | None" = None


@dataclass(frozen=True, eq=False)
class _KeyedList:
    """A list of maps merged item by item on their merge keys: patchStrategy=merge with
    patchMergeKey (strategic merge patch merges on the first key only, as upstream's
    single patchMergeKey), or x-kubernetes-list-type map with its list-map-keys.
    ``defaults``: a key's value where an applied item leaves it out (the schema's
    default; a key without one must be given)."""
    keys: tuple[str, ...]
    item: _Struct = field(default_factory=_Struct)
    defaults: Mapping[str, Any] = field(default_factory=dict)

    @property
    def key(self) -> str:
        return self.keys[0]


@dataclass(frozen=True, eq=False)
class _SetList:
    """patchStrategy=merge on a list of scalars (x-kubernetes-list-type set): set union."""


@dataclass(frozen=True, eq=False)
class _AtomicMap:
    """x-kubernetes-map-type atomic: one field, owned and applied whole."""


_Rule = _Struct | _KeyedList | _SetList | _AtomicMap
FieldRules = _Struct
"""How a kind's fields merge and are owned: :func:`rules_for_kind` (built-in kinds),
:func:`rules_from_openapi` (a custom resource's schema)."""
_PLAIN = _Struct()


def _child_rule(rule: _Rule | None, name: str) -> _Rule | None:
    return rule.fields.get(name, rule.other) if isinstance(rule, _Struct) else None


def _as_struct(rule: _Rule | None) -> _Struct:
    return rule if isinstance(rule, _Struct) else _PLAIN


_CONDITIONS = _KeyedList(("type",))
_META = _Struct({"ownerReferences": _KeyedList(("uid",)), "finalizers": _SetList()})
_CONTAINER = _Struct({
    "env": _KeyedList(("name",)),
    "ports": _KeyedList(("containerPort", "protocol"), defaults={"protocol": "TCP"}),
    "volumeMounts": _KeyedList(("mountPath",)),
    "volumeDevices": _KeyedList(("devicePath",)),
    "resizePolicy": _KeyedList(("resourceName",)),
})
_POD_SPEC = _Struct({
    "containers": _KeyedList(("name",), _CONTAINER),
    "initContainers": _KeyedList(("name",), _CONTAINER),
    "ephemeralContainers": _KeyedList(("name",), _CONTAINER),
    "volumes": _KeyedList(("name",)),
    "imagePullSecrets": _KeyedList(("name",)),
    "hostAliases": _KeyedList(("ip",)),
    "topologySpreadConstraints": _KeyedList(("topologyKey",)),
    "resourceClaims": _KeyedList(("name",)),
    "schedulingGates": _KeyedList(("name",)),
})
_POD_TEMPLATE = _Struct({"metadata": _META, "spec": _POD_SPEC})
_STATUS_WITH_CONDITIONS = _Struct({"conditions": _CONDITIONS})


def _workload(spec: _Struct) -> _Struct:
    return _Struct({"metadata": _META, "spec": spec, "status": _STATUS_WITH_CONDITIONS})


_TEMPLATED = _workload(_Struct({"template": _POD_TEMPLATE}))
_KIND_SCHEMAS: dict[str, _Struct] = {
    "Pod": _Struct({
        "metadata": _META,
        "spec": _POD_SPEC,
        "status": _Struct({"conditions": _CONDITIONS, "podIPs": _KeyedList(("ip",)),
                           "hostIPs": _KeyedList(("ip",))}),
    }),
    "PodTemplate": _Struct({"metadata": _META, "template": _POD_TEMPLATE}),
    "Deployment": _TEMPLATED,
    "ReplicaSet": _TEMPLATED,
    "DaemonSet": _TEMPLATED,
    "StatefulSet": _TEMPLATED,
    "ReplicationController": _TEMPLATED,
    "Job": _TEMPLATED,
    "CronJob": _workload(_Struct({"jobTemplate": _Struct({"metadata": _META, "spec": _Struct(
        {"template": _POD_TEMPLATE})})})),
    "Service": _Struct({
        "metadata": _META,
        "spec": _Struct({"ports": _KeyedList(("port", "protocol"), defaults={"protocol": "TCP"})}),
        "status": _STATUS_WITH_CONDITIONS,
    }),
    "Node": _Struct({
        "metadata": _META,
        "spec": _Struct({"podCIDRs": _SetList()}),
        "status": _Struct({"conditions": _CONDITIONS, "addresses": _KeyedList(("type",))}),
    }),
    "Namespace": _workload(_PLAIN),
    "ServiceAccount": _Struct({"metadata": _META, "secrets": _KeyedList(("name",))}),
}
_META_ONLY = _Struct({"metadata": _META})
BUILTIN_KINDS: frozenset[str] = frozenset(_KIND_SCHEMAS) | {
    "ConfigMap", "Secret", "Event", "Endpoints", "EndpointSlice", "Lease", "Eviction",
    "LimitRange", "ResourceQuota", "PersistentVolume", "PersistentVolumeClaim",
    "PodDisruptionBudget", "Binding", "ComponentStatus",
}


def is_strategic_kind(kind: str) -> bool:
    """True when strategic merge patch applies to ``kind`` (built-in kinds)."""
    return kind in BUILTIN_KINDS


def rules_for_kind(kind: str) -> FieldRules:
    """The field rules of a built-in kind (ObjectMeta's alone for a kind not in the
    table; none but plain maps and atomic lists for any other kind)."""
    return _KIND_SCHEMAS.get(kind, _META_ONLY if kind in BUILTIN_KINDS else _PLAIN)


def _schema_for(kind: str | FieldRules) -> FieldRules:
    return kind if isinstance(kind, _Struct) else rules_for_kind(kind)


def rules_from_openapi(schema: Any) -> FieldRules:
    """Server-side apply's field rules of a custom resource, from its structural
    openAPIV3Schema, as structured-merge-diff reads one: an array with
    ``x-kubernetes-list-type: map`` is a keyed list on its ``x-kubernetes-list-map-keys``
    (a key's ``default`` fills an applied item that leaves it out), ``set`` a set list,
    any other array atomic (a CRD's default); an object with ``x-kubernetes-map-type:
    atomic`` is one field; other objects are granular maps, their additionalProperties'
    rules applying to every key.  ObjectMeta has its built-in rules.  Only what differs
    from a plain map is kept, so a schema with no such markers costs nothing at apply."""
    rules = _rule_from_openapi(schema, 0)
    top = rules if isinstance(rules, _Struct) else _PLAIN
    return _Struct({**top.fields, "metadata": _META}, top.other)


_MAX_SCHEMA_DEPTH = 64   # deeper schemas are plain below (a CRD's body is bounded anyway)


def _rule_from_openapi(schema: Any, depth: int) -> _Rule | None:
    """The rule of one schema node, None where it is plain (a scalar, an atomic list, a
    granular map with nothing special below)."""
    if not isinstance(schema, dict) or depth > _MAX_SCHEMA_DEPTH:
        return None
    if schema.get("x-kubernetes-map-type") == "atomic":
        return _AtomicMap()
    list_type = schema.get("x-kubernetes-list-type")
    if list_type == "set":
        return _SetList()
    items = schema.get("items")
    if list_type == "map":
        keys = schema.get("x-kubernetes-list-map-keys")
        if not isinstance(keys, list) or not keys or not all(isinstance(k, str) for k in keys):
            return None   # not structural: the CRD's validation refuses it
        item = _rule_from_openapi(items, depth + 1)
        props = items.get("properties") if isinstance(items, dict) else None
        defaults = {k: props[k]["default"] for k in keys
                    if isinstance(props, dict) and isinstance(props.get(k), dict) and "default" in props[k]}
        return _KeyedList(tuple(keys), item if isinstance(item, _Struct) else _PLAIN, defaults)
    fields: dict[str, _Rule] = {}
    props = schema.get("properties")
    for name, child in (props.items() if isinstance(props, dict) else ()):
        rule = _rule_from_openapi(child, depth + 1)
        if rule is not None:
            fields[name] = rule
    extra = schema.get("additionalProperties")
    other = _rule_from_openapi(extra, depth + 1) if isinstance(extra, dict) else None
    return _Struct(fields, other) if fields or other is not None else None


# ------------------------------------------------------------ strategic merge patch

_PATCH = "$patch"
_RETAIN_KEYS = "$retainKeys"
_ORDER = "$setElementOrder/"
_DELETE_PRIMITIVE = "$deleteFromPrimitiveList/"
_DELETE_ME = object()  # sentinel: "remove this key from the parent"


def strategic_merge_patch(target: dict, patch: dict, kind: str) -> dict:
    """Kubernetes strategic merge patch of ``patch`` into ``target`` for ``kind``."""
    if not isinstance(patch, dict):
        raise PatchError("a strategic merge patch must be a JSON object")
    if not isinstance(target, dict):
        raise PatchError("the object to patch is not a JSON object")
    if not is_strategic_kind(kind):
        return json_merge_patch(target, patch)
    result = _merge_map(_deep_copy(target), patch, _schema_for(kind), "")
    return {} if result is _DELETE_ME else result


def _is_directive(key: str) -> bool:
    return key in (_PATCH, _RETAIN_KEYS) or key.startswith((_ORDER, _DELETE_PRIMITIVE))


def _merge_map(original: dict, patch: dict, rule: _Struct, where: str) -> Any:
    """Merge ``patch`` into ``original`` (a private copy, edited in place)."""
    directive = patch.get(_PATCH)
    if directive == "delete":
        return _DELETE_ME
    if directive == "replace":
        return _merge_map({}, {k: v for k, v in patch.items() if k != _PATCH}, rule, where)
    if directive not in (None, "merge"):
        raise PatchError(f"{where or 'patch'}: unknown $patch directive {directive!r} in a map")

    if _RETAIN_KEYS in patch:
        original = _retain_keys(original, patch, where)
    for key, values in patch.items():
        if key.startswith(_DELETE_PRIMITIVE):
            _delete_from_primitive_list(original, key[len(_DELETE_PRIMITIVE):], values, where)

    for key, value in patch.items():
        if _is_directive(key):
            continue
        path = f"{where}.{key}"
        if value is None:
            original.pop(key, None)
            continue
        merged = _merge_value(original.get(key), value, _child_rule(rule, key), path)
        if merged is _DELETE_ME:
            original.pop(key, None)
        else:
            original[key] = merged

    for key, order in patch.items():
        if key.startswith(_ORDER):
            name = key[len(_ORDER):]
            _set_element_order(original, name, order, _child_rule(rule, name), f"{where}.{name}")
    return original


def _merge_value(original: Any, patch: Any, rule: _Rule | None, where: str) -> Any:
    if isinstance(rule, (_KeyedList, _SetList)) and not isinstance(patch, list):
        raise PatchError(f"{where}: expected a list, got {json.dumps(patch)}")
    if isinstance(patch, dict):
        return _merge_map(original if isinstance(original, dict) else {}, patch, _as_struct(rule), where)
    if isinstance(patch, list):
        items = original if isinstance(original, list) else []
        if isinstance(rule, _KeyedList):
            return _merge_keyed_list(items, patch, rule, where)
        if isinstance(rule, _SetList):
            return _merge_set_list(items, patch, where)
        return _replace_list(patch, where)
    return _deep_copy(patch)


def _replace_list(patch: list, where: str) -> list:
    # A replaced list may still carry directives for its own maps; cleaning it
    # against an empty original drops them and the nulls.
    return [_merge_value(None, item, None, where) for item in patch
            if not (isinstance(item, dict) and item.get(_PATCH) == "delete")]


def _split_list_directives(patch: list, where: str) -> tuple[bool, list]:
    replace = False
    items = []
    for item in patch:
        if isinstance(item, dict) and item.get(_PATCH) == "replace" and len(item) == 1:
            replace = True
        else:
            items.append(item)
    return replace, items


def _item_key(item: Any, key: str, where: str) -> Any:
    if not isinstance(item, dict):
        raise PatchError(f"{where}: list elements must be objects (merged by {key!r}), got {item!r}")
    if key not in item:
        raise PatchError(f"{where}: element {json.dumps(item)} does not contain the merge key {key!r}")
    return item[key]


def _find_keyed(items: list, key: str, value: Any) -> int | None:
    return _find_item(items, {key: value})


def _find_item(items: list, keys: Mapping[str, Any]) -> int | None:
    """The index of the first map of ``items`` with every one of ``keys``' values."""
    for index, item in enumerate(items):
        if isinstance(item, dict) and all(k in item and _json_equal(item[k], v) for k, v in keys.items()):
            return index
    return None


def _keys_of(item: dict, rule: _KeyedList) -> dict[str, Any]:
    return {k: item[k] for k in rule.keys}


def _keys_string(keys: Mapping[str, Any]) -> str:
    return "[" + ",".join(f"{k}={json.dumps(v)}" for k, v in keys.items()) + "]"


def _merge_keyed_list(original: list, patch: list, rule: _KeyedList, where: str) -> list:
    replace, items = _split_list_directives(patch, where)
    result = [] if replace else original
    for item in items:
        value = _item_key(item, rule.key, where)
        directive = item.get(_PATCH)
        index = _find_keyed(result, rule.key, value)
        item_where = f"{where}[{rule.key}={json.dumps(value)}]"
        if directive == "delete":
            if index is not None:
                del result[index]
            continue
        if directive not in (None, "merge", "replace"):
            raise PatchError(f"{item_where}: unknown $patch directive {directive!r}")
        base = result[index] if index is not None and isinstance(result[index], dict) else {}
        merged = _merge_map(base, item, rule.item, item_where)
        if merged is _DELETE_ME:
            continue
        if index is None:
            result.append(merged)
        else:
            result[index] = merged
    return result


def _merge_set_list(original: list, patch: list, where: str) -> list:
    replace, items = _split_list_directives(patch, where)
    result = [] if replace else original
    for item in items:
        if isinstance(item, (dict, list)):
            raise PatchError(f"{where}: expected a list of scalars, got element {json.dumps(item)}")
        if not any(_json_equal(item, have) for have in result):
            result.append(item)
    return result


def _retain_keys(original: dict, patch: dict, where: str) -> dict:
    keep = patch[_RETAIN_KEYS]
    if not isinstance(keep, list) or not all(isinstance(k, str) for k in keep):
        raise PatchError(f"{where or 'patch'}: $retainKeys must be a list of field names")
    missing = [k for k in patch if not _is_directive(k) and patch[k] is not None and k not in keep]
    if missing:
        raise PatchError(f"{where or 'patch'}: field(s) {', '.join(sorted(missing))} "
                         "are set in the patch but not listed in $retainKeys")
    return {k: v for k, v in original.items() if k in keep}


def _delete_from_primitive_list(original: dict, name: str, values: Any, where: str) -> None:
    if not isinstance(values, list):
        raise PatchError(f"{where}.{name}: $deleteFromPrimitiveList needs a list of values")
    current = original.get(name)
    if not isinstance(current, list):
        return
    original[name] = [v for v in current if not any(_json_equal(v, d) for d in values)]


def _set_element_order(original: dict, name: str, order: Any, rule: _Rule | None,
                       where: str) -> None:
    if not isinstance(order, list):
        raise PatchError(f"{where}: $setElementOrder needs a list")
    current = original.get(name)
    if not isinstance(current, list):
        return
    if isinstance(rule, _KeyedList):
        wanted = [_item_key(item, rule.key, where) for item in order]

        def identity(element: Any) -> Any:
            return element.get(rule.key) if isinstance(element, dict) else None
    elif isinstance(rule, _SetList):
        wanted = list(order)

        def identity(element: Any) -> Any:
            return element
    else:
        return  # replaced lists keep the patch's order
    rank = {json.dumps(v, sort_keys=True): i for i, v in reversed(list(enumerate(wanted)))}

    def rank_of(element: Any) -> int | None:
        ident = identity(element)
        return None if ident is None else rank.get(json.dumps(ident, sort_keys=True))

    # Listed elements are permuted among the slots they occupy; server-only
    # elements keep their positions (a simplification of upstream's interleave).
    slots = [i for i, element in enumerate(current) if rank_of(element) is not None]
    ordered = sorted((current[i] for i in slots), key=lambda e: rank_of(e) or 0)   # all ranked
    for slot, element in zip(slots, ordered, strict=True):
        current[slot] = element


# ----------------------------------------------------------------- server-side apply

# Paths are tuples of FieldsV1 path elements: "f:<name>", "k:<json>", "v:<json>", ".".
_Path = tuple[str, ...]
_UNOWNED_TOP = {"apiVersion", "kind"}
_UNOWNED_META = {"name", "namespace", "uid", "resourceVersion", "generation",
                 "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds",
                 "managedFields", "selfLink", "generateName"}


def _now_rfc3339() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _compact(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), sort_keys=True)


def _drop_nulls(value: Any) -> Any:
    """A copy of ``value`` without its objects' null members."""
    out = copy_json(value)
    drop_nulls(out)
    return out


def _owned_paths(value: Any, rule: _Rule | None, prefix: _Path, top: bool = False,
                 lenient: bool = False) -> set[_Path]:
    """The FieldsV1 leaf paths an applier of ``value`` owns (``lenient``: of any stored
    object; a keyed list it cannot key, or a set list of non-scalars, is one leaf)."""
    paths: set[_Path] = set()
    for name, child in value.items():
        if top and name in _UNOWNED_TOP:
            continue
        path = prefix + (f"f:{name}",)
        child_rule = _child_rule(rule, name)
        if top and name == "metadata" and isinstance(child, dict):
            child = {k: v for k, v in child.items() if k not in _UNOWNED_META}
            if not child:
                continue
        if isinstance(child, dict) and child and not isinstance(child_rule, _AtomicMap):
            paths |= _owned_paths(child, _as_struct(child_rule), path, lenient=lenient)
        elif (isinstance(child, list) and child and isinstance(child_rule, _KeyedList)
              and (not lenient or _keyed(child, child_rule.keys))):
            for item in child:
                item_path = path + (f"k:{_compact(_keys_of(item, child_rule))}",)
                paths.add(item_path + (".",))
                paths |= _owned_paths(item, child_rule.item, item_path, lenient=lenient)
        elif (isinstance(child, list) and child and isinstance(child_rule, _SetList)
              and (not lenient or not any(isinstance(v, (dict, list)) for v in child))):
            paths |= {path + (f"v:{_compact(item)}",) for item in child}
        else:
            paths.add(path)
    return paths


def _check_applied_lists(value: Any, rule: _Rule | None, where: str) -> None:
    """Keyed lists in an applied config need all their merge keys on every element
    (a key the schema defaults is filled in, in place: ``value`` is the caller's own
    copy), no two elements alike."""
    if isinstance(value, dict):
        if isinstance(rule, _AtomicMap):
            return
        for name, child in value.items():
            _check_applied_lists(child, _child_rule(_as_struct(rule), name), f"{where}.{name}")
    elif isinstance(rule, (_KeyedList, _SetList)) and not isinstance(value, list):
        raise PatchError(f"{where}: expected a list, got {json.dumps(value)}")
    elif isinstance(value, list) and isinstance(rule, _KeyedList):
        seen: set[str] = set()
        for item in value:
            keys = _applied_keys(item, rule, where)
            if _token(keys) in seen:
                raise PatchError(f"{where}: duplicate entries for key {_keys_string(keys)}")
            seen.add(_token(keys))
            _check_applied_lists(item, rule.item, f"{where}{_keys_string(keys)}")
    elif isinstance(value, list) and isinstance(rule, _SetList):
        for item in value:
            if isinstance(item, (dict, list)):
                raise PatchError(f"{where}: expected a list of scalars, got {json.dumps(item)}")


def _applied_keys(item: Any, rule: _KeyedList, where: str) -> dict[str, Any]:
    """An applied item's merge keys, its defaulted ones filled in."""
    if not isinstance(item, dict):
        raise PatchError(f"{where}: list elements must be objects (merged by "
                         f"{', '.join(map(repr, rule.keys))}), got {json.dumps(item)}")
    for key in rule.keys:
        if key not in item and key in rule.defaults:
            item[key] = copy_json(rule.defaults[key])
        if key not in item:
            raise PatchError(f"{where}: element {json.dumps(item)} does not contain the merge key {key!r}"
                             f"{'' if len(rule.keys) == 1 else ' (and it has no default value)'}")
        if isinstance(item[key], (dict, list)):
            raise PatchError(f"{where}: the merge key {key!r} of element {json.dumps(item)} is not a scalar")
    return _keys_of(item, rule)


def _fields_to_tree(paths: Iterable[_Path]) -> dict:
    tree: dict = {}
    for path in sorted(paths):
        node = tree
        for element in path:
            node = node.setdefault(element, {})
    return tree


def _tree_to_fields(tree: Any, prefix: _Path = ()) -> set[_Path]:
    paths: set[_Path] = set()
    if not isinstance(tree, dict):
        return paths
    for element, child in tree.items():
        path = prefix + (element,)
        if isinstance(child, dict) and child:
            paths |= _tree_to_fields(child, path)
        else:
            paths.add(path)
    return paths


def _path_string(path: _Path) -> str:
    out = []
    for element in path:
        if element.startswith("f:"):
            out.append("." + element[2:])
        elif element.startswith("k:"):
            out.append(_keys_string(json.loads(element[2:])))
        elif element.startswith("v:"):
            out.append(f"[={element[2:]}]")
    return "".join(out)


_MISSING = object()


def _path_keys(element: str) -> dict[str, Any] | None:
    """The merge keys of a ``k:`` path element (from a stored entry: anything may be
    there; None when it is not a JSON object of scalars)."""
    try:
        keys = json.loads(element[2:])
    except ValueError:
        return None
    if not isinstance(keys, dict) or not keys or any(isinstance(v, (dict, list)) for v in keys.values()):
        return None
    return keys


def _path_value(element: str) -> Any:
    """The value of a ``v:`` path element, or ``_MISSING``."""
    try:
        return json.loads(element[2:])
    except ValueError:
        return _MISSING


def _normal(value: Any) -> Any:
    """``value`` with its integral floats as ints: JSON equality (``1 == 1.0``) as equal tokens."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {k: _normal(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_normal(v) for v in value]
    return value


def _token(value: Any) -> str:
    """A JSON value's identity as merge keys and set values compare it (``1 == 1.0``,
    ``true != 1``): equal tokens for equal values."""
    return _compact(_normal(value))


class _Finder:
    """Keyed items and set values found through an index of each list, built the first
    time that list is searched: a walk over every path of an object costs O(paths), not
    O(paths x items).  Only for lists that do not change while the finder is used."""

    def __init__(self) -> None:
        # (id of the list, key names) -> (the list, held so its id stays its own; token -> first index)
        self._items: dict[tuple[int, tuple[str, ...]], tuple[list, dict[str, int]]] = {}
        self._values: dict[int, tuple[list, dict[str, list[int]]]] = {}

    def item(self, items: list, keys: Mapping[str, Any]) -> int | None:
        """The index of the first map of ``items`` with every one of ``keys``' values."""
        names = tuple(sorted(keys))
        entry = self._items.get((id(items), names))
        if entry is None:
            index: dict[str, int] = {}
            for i, item in enumerate(items):
                if isinstance(item, dict) and all(k in item for k in names):
                    index.setdefault(_token([item[k] for k in names]), i)
            entry = self._items[(id(items), names)] = (items, index)
        return entry[1].get(_token([keys[k] for k in names]))

    def values(self, items: list, value: Any) -> list[int]:
        """The indices of ``items`` equal to ``value``."""
        entry = self._values.get(id(items))
        if entry is None:
            index: dict[str, list[int]] = {}
            for i, item in enumerate(items):
                index.setdefault(_token(item), []).append(i)
            entry = self._values[id(items)] = (items, index)
        return entry[1].get(_token(value), [])


def _locate(obj: Any, path: _Path, finder: _Finder | None = None) -> Any:
    """The value at a FieldsV1 path, or ``_MISSING`` (``finder``: one shared by many
    calls over objects that do not change meanwhile)."""
    node = obj
    for element in path:
        if element == ".":
            continue
        if element.startswith("f:") and isinstance(node, dict):
            node = node.get(element[2:], _MISSING)
        elif element.startswith("k:") and isinstance(node, list):
            keys = _path_keys(element)
            index = None if keys is None else (finder or _Finder()).item(node, keys)
            node = _MISSING if index is None else node[index]
        elif element.startswith("v:") and isinstance(node, list):
            value = _path_value(element)
            found = value is not _MISSING and (finder or _Finder()).values(node, value)
            node = value if found else _MISSING
        else:
            return _MISSING
        if node is _MISSING:
            return _MISSING
    return node


def _prefixes(paths: Iterable[_Path]) -> set[_Path]:
    """Every non-empty prefix of every path (a path is its own prefix)."""
    return {path[:i] for path in paths for i in range(1, len(path) + 1)}


def _item_prefix(path: _Path) -> _Path:
    return path[:-1] if path and path[-1] == "." else path


def _remove_paths(obj: dict, targets: list[_Path]) -> None:
    """Delete the fields/items/values at ``targets`` (item paths without their ``.``),
    then prune the maps and lists the removals left empty.  Everything is found before
    anything goes (one index per list); list items and set values go in one pass per
    list, so removing many items of a long list is not quadratic."""
    finder = _Finder()
    doomed: dict[int, tuple[list, set[int]]] = {}
    for target in targets:
        parent, last = _locate(obj, target[:-1], finder), target[-1]
        if last.startswith("f:") and isinstance(parent, dict):
            parent.pop(last[2:], None)   # a dict's key: no list index moves
        elif last.startswith("k:") and isinstance(parent, list):
            keys = _path_keys(last)
            index = None if keys is None else finder.item(parent, keys)
            if index is not None:
                doomed.setdefault(id(parent), (parent, set()))[1].add(index)
        elif last.startswith("v:") and isinstance(parent, list):
            value = _path_value(last)
            if value is not _MISSING:
                doomed.setdefault(id(parent), (parent, set()))[1].update(finder.values(parent, value))
    for parent, indices in doomed.values():
        parent[:] = [v for i, v in enumerate(parent) if i not in indices]
    # Maps and lists emptied by the removals go too; top-level fields (spec, metadata) stay.
    finder = _Finder()
    for target in targets:
        prefix = target[:-1]
        while len(prefix) > 1 and prefix[-1].startswith("f:"):
            node = _locate(obj, prefix, finder)
            holder = _locate(obj, prefix[:-1], finder)
            if not (isinstance(node, (dict, list)) and not node and isinstance(holder, dict)):
                break
            holder.pop(prefix[-1][2:], None)
            prefix = prefix[:-1]


def _apply_merge(live: Any, applied: Any, rule: _Rule | None) -> Any:
    """Merge an applied config (nulls already dropped) into a private copy of live."""
    if isinstance(applied, dict):
        if not isinstance(live, dict) or isinstance(rule, _AtomicMap):
            return _deep_copy(applied)
        struct = _as_struct(rule)
        for name, value in applied.items():
            live[name] = _apply_merge(live.get(name, _MISSING), value, _child_rule(struct, name))
        return live
    if isinstance(applied, list) and isinstance(live, list):
        if isinstance(rule, _KeyedList):
            index: dict[str, int] = {}
            for i, have in enumerate(live):
                if isinstance(have, dict) and all(k in have for k in rule.keys):
                    index.setdefault(_token(_keys_of(have, rule)), i)
            for item in applied:
                token = _token(_keys_of(item, rule))
                if token not in index:
                    index[token] = len(live)
                    live.append(_deep_copy(item))
                else:
                    live[index[token]] = _apply_merge(live[index[token]], item, rule.item)
            return live
        if isinstance(rule, _SetList):
            seen = {_token(have) for have in live}
            return live + [v for v in applied if _token(v) not in seen]
    return _deep_copy(applied)


@dataclass(frozen=True)
class _Entry:
    """One managedFields entry; ``fields`` is None for entries we don't interpret."""
    raw: dict
    manager: str
    operation: str
    fields: frozenset[_Path] | None

    @property
    def key(self) -> tuple[str, str, str]:
        """Who the entry is: (manager, operation, subresource)."""
        return (self.manager, self.operation, str(self.raw.get("subresource") or ""))


def _sub(subresource: str | None) -> dict | None:
    """The fields an entry of a write to ``subresource`` carries beside the ones it manages."""
    return {"subresource": subresource} if subresource else None


def _interpreted(raw: Any) -> bool:
    """Whether a managedFields entry's fields are read (FieldsV1, an object); an entry
    of any other shape is kept as it is."""
    return (isinstance(raw, dict) and raw.get("fieldsType", "FieldsV1") == "FieldsV1"
            and isinstance(raw.get("fieldsV1"), dict))


def _read_entries(live: dict) -> list[_Entry]:
    entries = []
    raw_entries = objects.meta(live).get("managedFields") or []
    for raw in raw_entries if isinstance(raw_entries, list) else []:
        if not isinstance(raw, dict):
            continue
        fields = frozenset(_tree_to_fields(raw["fieldsV1"])) if _interpreted(raw) else None
        entries.append(_Entry(raw, str(raw.get("manager", "")), str(raw.get("operation", "")), fields))
    return entries


def _entry(manager: str, operation: str, api_version: Any, now: str, fields: Iterable[_Path],
           base: dict | None = None) -> dict:
    raw: dict[str, Any] = {"manager": manager, "operation": operation}
    if api_version is not None:
        raw["apiVersion"] = api_version
    raw.update({"time": now, "fieldsType": "FieldsV1", "fieldsV1": _fields_to_tree(fields)})
    for key, value in (base or {}).items():
        raw.setdefault(key, value)  # keep fields we don't manage (e.g. subresource)
    return raw


def server_side_apply(live: dict | None, applied: dict, manager: str, force: bool,
                      kind: str | FieldRules, *, subresource: str | None = None, now: str | None = None) -> dict:
    """Apply ``applied`` as ``manager``; returns the new object (see module docstring).

    ``kind``: a built-in kind's name, or a custom resource's rules (:func:`rules_from_openapi`).
    ``subresource``: the apply went to it (``status``): the manager's entry is its own
    (manager, Apply, subresource), as Kubernetes keeps one.  Which fields the write may
    change is the caller's: ``applied`` holds those alone.

    ``now`` (RFC 3339) stamps the entry this call writes; defaults to the UTC clock.
    Raises ``ApplyConflict`` (409) or ``PatchError`` (bad applied config).
    """
    if not isinstance(applied, dict):
        raise PatchError("an applied configuration must be a JSON object")
    if not isinstance(manager, str) or not manager:
        raise PatchError("fieldManager is required for apply requests")
    if live is not None and not isinstance(live, dict):
        raise PatchError("the live object is not a JSON object")
    stamp = now or _now_rfc3339()
    schema = _schema_for(kind)
    config = _drop_nulls(applied)
    if not isinstance(config.get("metadata", {}), dict):
        raise PatchError("metadata of an applied configuration must be an object")
    config.get("metadata", {}).pop("managedFields", None)
    _check_applied_lists(config, schema, "")
    mine = _owned_paths(config, schema, (), top=True)
    api_version = config.get("apiVersion", (live or {}).get("apiVersion"))

    if live is None:
        result = _deep_copy(config)
        result.setdefault("metadata", {})["managedFields"] = [
            _entry(manager, "Apply", api_version, stamp, mine, _sub(subresource))] if mine else []
        return result

    entries = _read_entries(live)
    own = (manager, "Apply", subresource or "")
    others = [e for e in entries if e.key != own]
    previous = next((e for e in entries if e.key == own), None)

    # As structured-merge-diff's Updater.Apply: conflicts are judged on live merged with
    # the config, before what this manager stopped applying is pruned, so dropping
    # one's own fields never conflicts (``data: {}`` over another's ``data: {}``).
    result = _apply_merge(_deep_copy(live), config, schema)
    conflicts = _conflicts(live, result, mine, others)
    if conflicts and not force:
        unique = {(p, e.manager, _whom(e)) for p, e in conflicts}
        raise ApplyConflict([(_path_string(p), manager, whom) for p, manager, whom in
                             sorted(unique, key=lambda c: (_path_order(c[0]), c[2]))])
    lost: dict[int, set[_Path]] = {}
    for path, other in conflicts:
        lost.setdefault(id(other), set()).add(path)

    new_others = [_without(e, lost.get(id(e), set())) for e in others]
    if previous is not None and previous.fields is not None:
        _remove_dropped(result, previous.fields - mine, mine, new_others)

    mine_entry = _entry(manager, "Apply", api_version, stamp, mine,
                        previous.raw if previous is not None else _sub(subresource))
    replacement = {id(old): new for old, new in zip(others, new_others, strict=True)}
    managed = []
    for entry in entries:
        if entry.key == own:
            if entry is previous and mine:
                managed.append(mine_entry)  # an updated entry keeps its position
            continue
        updated = replacement[id(entry)]
        if updated.fields is None or updated.fields:
            managed.append(updated.raw)
    if previous is None and mine:
        managed.append(mine_entry)
    result.setdefault("metadata", {})["managedFields"] = _capped(managed)
    return result


def _conflicts(live: dict, merged: dict, mine: set[_Path],
               others: list[_Entry]) -> list[tuple[_Path, _Entry]]:
    """Each (path, other owner) where a path this manager applies, owned by another,
    has a value in ``merged`` (live with the config merged in) other than live's."""
    found: list[tuple[_Path, _Entry]] = []
    in_merged, in_live = _Finder(), _Finder()
    for path in sorted(mine):
        if path[-1] == ".":
            continue  # an item itself never conflicts; its fields do
        owners = [e for e in others if e.fields is not None and path in e.fields]
        if not owners:
            continue
        if _json_equal(_locate(merged, path, in_merged), _locate(live, path, in_live)):
            continue
        found.extend((path, owner) for owner in owners)
    return found


def _value_order(value: Any) -> tuple[int, Any]:
    if value is None:
        return (0, 0)
    if isinstance(value, bool):
        return (1, value)
    if isinstance(value, (int, float)):
        return (2, value)
    return (3, str(value))


def _element_order(element: str) -> tuple[int, Any]:
    """structured-merge-diff's PathElement order: field names, then keys (their fields
    by name, values by type and value: 2 before 10), then set values."""
    if element.startswith("f:"):
        return (0, element[2:])
    if element.startswith("k:"):
        keys = _path_keys(element) or {}
        return (1, [(k, _value_order(v)) for k, v in sorted(keys.items())])
    value = _path_value(element)
    return (2, _value_order(None if value is _MISSING else value))


def _path_order(path: _Path) -> tuple:
    """A set of paths in structured-merge-diff's order (its Set.Iterate): at each node the
    fields that end there before those that go deeper, each group in element order."""
    elements = [e for e in path if e != "."]
    return tuple((0 if i == len(elements) - 1 else 1, _element_order(e)) for i, e in enumerate(elements))


def _whom(entry: _Entry) -> str:
    """An owner as Kubernetes' conflicts name it (printManager: an applier's identity has
    no apiVersion, an updater's has)."""
    words = gostrings.quote(entry.manager)
    if entry.raw.get("subresource"):
        words += f" with subresource {gostrings.quote(str(entry.raw['subresource']))}"
    if entry.operation != "Apply" and entry.raw.get("apiVersion"):
        words += f" using {entry.raw['apiVersion']}"
    return words


def _without(entry: _Entry, paths: set[_Path]) -> _Entry:
    if not paths or entry.fields is None:
        return entry
    kept = frozenset(p for p in entry.fields if not any(p[:i] in paths for i in range(1, len(p) + 1)))
    raw = dict(entry.raw)
    raw["fieldsV1"] = _fields_to_tree(kept)
    return _Entry(raw, entry.manager, entry.operation, kept)


def _remove_dropped(result: dict, dropped: Set[_Path], mine: Set[_Path],
                    others: list[_Entry]) -> None:
    # A dropped leaf may now be the parent of fields that are still applied
    # (``labels: {}`` became ``labels: {app: x}``), so our own paths protect too.
    protected = _prefixes(set(mine).union(*(e.fields for e in others if e.fields is not None)))
    # A dropped path goes unless something still owned is at or below it; shallowest
    # first (an item goes with its fields).
    targets = sorted({_item_prefix(p) for p in dropped} - protected, key=len)
    _remove_paths(result, targets)


MAX_UPDATE_MANAGERS = 10
ANCIENT_CHANGES = "ancient-changes"


def _capped(managed: list[dict]) -> list[dict]:
    """At most ``MAX_UPDATE_MANAGERS`` Update entries, as kube-apiserver's capManagers: the
    oldest (by time, then name) are merged, per apiVersion, into an ``ancient-changes``
    entry until no more are left over (the first of each version waits for a second)."""
    if sum(1 for raw in managed if _interpreted(raw) and str(raw.get("operation", "")) != "Apply") \
            <= MAX_UPDATE_MANAGERS:
        return managed   # counted without reading every entry's fields (most writes stop here)
    entries = _read_entries({"metadata": {"managedFields": managed}})
    updaters = [e for e in entries if e.operation != "Apply" and e.fields is not None]
    gone: set[int] = set()
    buckets: dict[str, dict] = {}   # apiVersion -> the ancient-changes entry's fields and time
    for entry in updaters:
        if entry.key == (ANCIENT_CHANGES, "Update", ""):   # an earlier cap's: merged into again
            bucket = buckets.setdefault(str(entry.raw.get("apiVersion") or ""), {"fields": set(), "time": None})
            bucket["fields"] |= entry.fields or set()
            bucket["time"] = max(str(bucket["time"] or ""), str(entry.raw.get("time") or "")) or None
            gone.add(id(entry.raw))
    length = len(updaters) - len(gone) + len(buckets)
    first: dict[str, _Entry] = {}
    for entry in sorted((e for e in updaters if id(e.raw) not in gone),
                        key=lambda e: (str(e.raw.get("time") or ""), e.manager)):
        if length <= MAX_UPDATE_MANAGERS:
            break
        version = str(entry.raw.get("apiVersion") or "")
        if version not in first and version not in buckets:
            first[version] = entry
            continue
        if version not in buckets:
            older = first[version]
            gone.add(id(older.raw))
            buckets[version] = {"fields": set(older.fields or ()), "time": older.raw.get("time")}
        bucket = buckets[version]
        bucket["fields"] |= entry.fields or set()
        bucket["time"] = entry.raw.get("time")
        gone.add(id(entry.raw))
        length -= 1
    kept = [raw for raw in managed if id(raw) not in gone]
    for version, bucket in buckets.items():
        raw = _entry(ANCIENT_CHANGES, "Update", version or None, bucket["time"] or _now_rfc3339(), bucket["fields"])
        kept.append(raw)
    return kept


# ----------------------------------------------------------------- plain writes

def _written_paths(value: Any, rule: _Rule | None, prefix: _Path, top: bool = False) -> set[_Path]:
    """The FieldsV1 leaf paths of a stored object (as `_owned_paths`, but any object:
    a keyed list whose items lack their key, or repeat it, is one leaf)."""
    return _owned_paths(value, rule, prefix, top, lenient=True)


def _keyed(items: list, keys: tuple[str, ...]) -> bool:
    """Every item a map with scalar ``keys``, no two alike: the list can be owned item by item."""
    seen: set[str] = set()
    for item in items:
        if not isinstance(item, dict) or any(k not in item or isinstance(item[k], (dict, list)) for k in keys):
            return False
        seen.add(_compact([item[k] for k in keys]))
    return len(seen) == len(items)


def _same_text(a: Any, b: Any) -> bool:
    """Whether nothing at or under ``a`` and ``b`` differs for :func:`_changed`: equal
    scalars of one type (as :func:`_json_equal`), or objects or arrays of the same JSON
    text (same members in the same order, same literals: ``1`` is not ``1.0``, ``true``
    is not ``1``)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, (dict, list)):
        return a == b and json.dumps(a) == json.dumps(b)
    return bool(a == b)


def _unchanged(old: dict, new: dict, prefix: _Path = ()) -> set[_Path]:
    """The ``f:``-only paths whose value is the same JSON text in ``old`` as in ``new``
    (the first such along each path): no path through one has changed, since every step
    of :func:`_locate` from there (a member, a keyed item, a set value) finds the same
    text in both, and JSON text from a store holds no NaN (the only value not equal to
    itself).  A write changes a few leaves; comparing whole subtrees (in C) spares the
    per-leaf :func:`_locate` of every unchanged one."""
    out: set[_Path] = set()
    for name, child in new.items():
        if name not in old:
            continue
        was, path = old[name], prefix + (f"f:{name}",)
        if _same_text(was, child):
            out.add(path)
        elif isinstance(was, dict) and isinstance(child, dict):
            out |= _unchanged(was, child, path)
    return out


def _under(path: _Path, prefixes: Set[_Path]) -> bool:
    """Whether one of ``prefixes`` (``f:``-only paths) begins ``path``."""
    for i, element in enumerate(path):
        if not element.startswith("f:"):
            return False
        if path[:i + 1] in prefixes:
            return True
    return False


def _float_keyed(present: Set[_Path]) -> bool:
    """Whether an item of ``present`` is keyed by a float (or by what is not read back):
    the one case where a path of an object may not lead back into it (items keyed ``1``
    and ``1.0`` are told apart by their paths, but found by their value, ``1``, so the
    second is not found; :func:`_changed` counts that path changed even when nothing
    changed, and :func:`_unchanged` would not)."""
    seen: set[str] = set()
    for path in present:
        for element in path:
            if element.startswith("k:") and element not in seen:
                seen.add(element)
                keys = _path_keys(element)
                if keys is None or any(isinstance(v, float) for v in keys.values()):
                    return True
    return False


def _written(old: dict | None, new: dict, present: Set[_Path], *, shortcut: bool = True) -> set[_Path]:
    """The paths of ``present`` (``new``'s) that ``new`` changed or added over ``old``
    (``shortcut``: skip the subtrees :func:`_unchanged` finds; the same set either way)."""
    in_old, in_new = _Finder(), _Finder()
    if old is None or not shortcut or _float_keyed(present):
        return {p for p in present if _changed(old, new, p, in_old, in_new)}
    same = _unchanged(old, new)
    return {p for p in present if not _under(p, same) and _changed(old, new, p, in_old, in_new)}


def _changed(old: dict | None, new: dict, path: _Path, in_old: _Finder, in_new: _Finder) -> bool:
    if old is None:
        return True
    if path[-1] == ".":
        return _locate(old, path, in_old) is _MISSING   # an item is written when it is added
    was = _locate(old, path, in_old)
    return was is _MISSING or not _json_equal(was, _locate(new, path, in_new))


def record_update(old: dict | None, new: dict, manager: str, kind: str | FieldRules, *,
                  subresource: str | None = None, now: str | None = None) -> None:
    """Record in ``new``'s metadata.managedFields that ``manager`` wrote ``new`` over
    ``old`` (None: created it); see "Plain writes" in the module docstring."""
    md = new.setdefault("metadata", {})
    stored = (objects.meta(old).get("managedFields") or []) if old is not None else []
    given = md.get("managedFields")
    if given is not None and given != stored:
        return   # the writer sets managedFields as it wants them
    schema = _schema_for(kind)
    present = _written_paths(new, schema, (), top=True)
    written = _written(old, new, present)
    entries = _read_entries(old) if old is not None else []
    mine_key = (manager, "Update", subresource or "")
    previous = next((e for e in entries if e.key == mine_key), None)
    managed: list[dict] = []
    for entry in entries:
        if entry is previous:
            continue
        if entry.fields is None:
            managed.append(entry.raw)
            continue
        kept = frozenset(p for p in entry.fields if p in present and p not in written)
        if kept:
            managed.append(_without(entry, set(entry.fields - kept)).raw if kept != entry.fields else entry.raw)
    owned = written | {p for p in (previous.fields or ()) if p in present} if previous else written
    if owned:
        raw = _entry(manager, "Update", new.get("apiVersion"), now or _now_rfc3339(), owned,
                     previous.raw if previous is not None else None)
        if subresource:
            raw["subresource"] = subresource
        position = entries.index(previous) if previous is not None else len(managed)
        managed.insert(min(position, len(managed)), raw)
    md["managedFields"] = _capped(managed)
