"""The generic registry: every kind's create, read, update, patch, delete and watch.

Design (after Kubernetes' ``genericregistry.Store``): objects are JSON dicts in
the store under :meth:`Resource.key`; the store's revision of the last write is
the object's ``metadata.resourceVersion`` (set on the way out, never stored).
A kind's :class:`~kube32.apiserver.strategy.Strategy` supplies what differs.

Invariants:

* Every write is a compare-and-swap against the revision that was read, so
  read-modify-write (patches, status, binding, finalizers) never loses a
  concurrent write; callers that did not name a resourceVersion are retried.
* Nothing is stored before the whole object validated: a refusal leaves the
  store untouched.  ``dry_run`` runs every step but the write.
* ``uid`` is new on every create; ``generation`` counts spec changes; status
  changes only through the status subresource.
* An object with finalizers is only marked (``deletionTimestamp``) by a delete,
  and goes when the last finalizer is removed.
* No create, update or patch stores more than ``limits.MAX_OBJECT`` bytes of JSON or
  ``limits.MAX_VALUES`` values (413): an object can always be read and sent back
  whole, and cannot grow without bound patch after patch.  (A delete's mark is never
  refused.)
* Values a kind's objects hold exclusively across the cluster (a Service's nodePorts)
  are claimed through its :class:`Claims` before an object holding a new one is
  written, kept or undone by the write's outcome, and released when the object is
  removed: no two objects ever hold one.  (Kinds with claims are never replaced:
  :meth:`Registry.replace` is for pods.)
* A write gives the event loop its turn between its passes over the object (decode,
  patch, defaults and validation, managedFields, encode); every pass over a big object
  (stored, or made from a big body: ``BIG_OBJECT``) runs on a worker thread
  (:mod:`.offload`), so no write of one holds the loop that answers ``/healthz`` and
  Lease renewals longer than one C-level decode or encode; and a list or a watch
  decodes each stored version once for all its readers (:meth:`Registry._shared_decode`)
  or, for a plain list, not at all (:func:`encoded`).
* ``kind`` and ``apiVersion`` of a body may be left out (the URL's are used, as
  Kubernetes defaults them on create and update); given, they must be the URL's
  strings.  An apply patch must give both, as kube-apiserver's field manager demands.
"""
from __future__ import annotations

import asyncio
import builtins
import functools
import json
import logging
import secrets
import uuid
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from typing import Any, AsyncGenerator, AsyncIterator, Awaitable, Callable, Iterator, Protocol, TypeVar

from .. import objects
from ..matching import LabelSelector
from ..store import PROGRESS as STORE_PROGRESS
from ..store import (Compacted, Conflict, KeyExists, KeyNotFound, KeyValue, Store, StoreError, Unavailable,
                     WatchEvent)
from ..terms import Annotation, NamespacePhase, PodPhase
from . import errors, meta, nodeindex, offload, paging
from .keylocks import KeyLocks
from . import jsonshape, schemavalidation, typedfields
from .jsoncopy import copy_json, drop_nulls
from .limits import MAX_OBJECT, MAX_VALUES
from .patch import (ApplyConflict, PatchError, PatchLimit, json_merge_patch, json_patch, record_update,
                    server_side_apply, strategic_merge_patch)
from .resources import Resource, by_plural
from .nodeindex import NodeIndex
from .selectors import FieldSelector

log = logging.getLogger("kube32.apiserver.registry")

Obj = dict[str, Any]
T = TypeVar("T")
MAX_RETRIES = 16
# The field a kind's watches are indexed by (a field selector's one value; the store's
# triggered watches): the kubelets' own, one watch a node.
TRIGGER_FIELDS = {"pods": "spec.nodeName", "checkpoints": "status.targetNode"}
WATCH_DECODED_KEPT = 256  # recent versions decoded once for all watchers
BIG_OBJECT = 64 << 10  # bytes (stored, or of the body): every pass over a larger object runs on a worker thread

PATCH_JSON = "application/json-patch+json"
PATCH_MERGE = "application/merge-patch+json"
PATCH_STRATEGIC = "application/strategic-merge-patch+json"
PATCH_APPLY = "application/apply-patch+yaml"
PATCH_TYPES = (PATCH_JSON, PATCH_MERGE, PATCH_STRATEGIC, PATCH_APPLY)


PROGRESS = "PROGRESS"          # a WatchItem: a store event the selectors drop (the watch is at its revision)
INITIAL_END = "INITIAL_END"    # a WatchItem: the initial ADDED events have all been given
EVENT_TYPES = ("ADDED", "MODIFIED", "DELETED")


@dataclass(frozen=True, slots=True)
class WatchItem:
    """One step of a watch: an event (``type`` in EVENT_TYPES, ``object`` the object, shared
    read-only among watchers), or a progress mark.  ``derived``: the object is the previous
    content at this revision (an object that stopped matching), not the stored version;
    ``replaced`` too: the previous content of an object replaced under its name, annotated
    ``kube32.io/replaced-by`` (also for a watcher whose selectors the replacement no
    longer matches).  ``kv``: the stored version ``object`` is the decoding of, when it is
    one (its line is made from those bytes: :func:`encoded`)."""

    type: str
    object: Obj | None
    revision: int
    initial: bool = False
    derived: bool = False
    replaced: bool = False
    kv: KeyValue | None = None


async def _turn() -> None:
    """Let the event loop serve others between two passes over an object (a decode, a
    patch, an encode): no write holds the loop longer than one pass (limits.MAX_VALUES
    bounds each).  Every write is a compare-and-swap, so what runs meanwhile is safe."""
    await asyncio.sleep(0)


async def _pass(big: bool, fn: Callable[..., T], *args: Any) -> T:
    """One pass over an object: on a worker thread when the object is big (its Python
    code cannot hold the loop: :mod:`.offload`), else here, and then the loop's turn."""
    if big:
        return await offload.run(fn, *args)
    out = fn(*args)
    await _turn()
    return out


def decode(kv: KeyValue) -> Obj:
    obj = json.loads(kv.value)
    obj.setdefault("metadata", {})["resourceVersion"] = str(kv.mod_revision)
    return obj


_METADATA = b'"metadata":{'
_HEAD_SCANNED = 4096   # bytes before the metadata scanned in Python at most (apiVersion and kind)


def encoded(kv: KeyValue) -> bytes:
    """The JSON of a stored version as the API answers it (:func:`decode` then JSON), made
    without decoding it: ``"resourceVersion"`` goes into the stored bytes' top-level
    metadata.  The stored JSON is :func:`encode`'s, so ``"metadata":{`` outside a string
    is a key (a string holds no bare quote); the first one is the top-level one when the
    bytes before it (a few, at most ``_HEAD_SCANNED``) close every bracket they open but
    the outer one.  Anything else is decoded and encoded."""
    data = kv.value
    at = data.find(_METADATA)
    if 0 < at <= _HEAD_SCANNED and data[:1] == b"{" and _outer_only(data[:at]):
        at += len(_METADATA)
        rv = b'"resourceVersion":"%d"' % kv.mod_revision
        return data[:at] + rv + (b"" if data[at:at + 1] == b"}" else b",") + data[at:]
    return json.dumps(decode(kv), separators=(",", ":")).encode()


def _outer_only(head: bytes) -> bool:
    """Whether ``head`` (the start of a JSON text, up to a key) is inside the outer object
    only: :func:`_depth` is 1.  Said at once (by bytes methods, in C) for the usual head,
    ``{"apiVersion":"v1","kind":"Pod",``: one bracket, none closed, no escape, its quotes
    paired; a list of a thousand objects scanned every head byte by byte in Python."""
    if (head.count(b"{") == 1 and b"[" not in head and b"}" not in head and b"]" not in head
            and b"\\" not in head and head.count(b'"') % 2 == 0):
        return True
    return _depth(head) == 1


def _depth(head: bytes) -> int:
    """How many brackets ``head`` (the start of a JSON text) leaves open; -1 if it ends in a string."""
    depth, in_string, escaped = 0, False, False
    for c in head:
        if in_string:
            if escaped:
                escaped = False
            elif c == 0x5C:   # backslash
                escaped = True
            elif c == 0x22:   # quote
                in_string = False
        elif c == 0x22:
            in_string = True
        elif c in (0x7B, 0x5B):
            depth += 1
        elif c in (0x7D, 0x5D):
            depth -= 1
    return -1 if in_string else depth


def stored(obj: Obj, kv: KeyValue) -> Obj:
    """``obj``, just written as ``kv`` (its :func:`encode`), as :func:`decode` would read it
    back: encode's JSON holds only what JSON round-trips, so only the resourceVersion is new
    (a big object is not decoded once more on the event loop)."""
    objects.meta(obj)["resourceVersion"] = str(kv.mod_revision)
    return obj


def encode(obj: Obj) -> bytes:
    """The stored JSON of ``obj``; 400 for a NaN or an infinity, which JSON has not (every
    body decoder refuses them: this is the net under them, for any other way in)."""
    md = objects.meta(obj)
    rv = md.pop("resourceVersion", None)
    try:
        return json.dumps(obj, separators=(",", ":"), sort_keys=False, allow_nan=False).encode()
    except ValueError as e:
        raise errors.bad_request(f"the object holds a number that JSON cannot hold (NaN or infinity): {e}") from None
    finally:
        if rv is not None:
            md["resourceVersion"] = rv


def encode_bounded(res: Resource, obj: Obj) -> bytes:
    """:func:`encode` for a create or an update: 413 past ``MAX_OBJECT`` bytes."""
    data = encode(obj)
    if len(data) > MAX_OBJECT:
        raise errors.too_large(f'{res.kind} "{objects.name(obj)}" would be {len(data)} bytes stored, more '
                               f"than the limit of {MAX_OBJECT} bytes for an object")
    if not jsonshape.values_at_most(data, MAX_VALUES):
        values = jsonshape.shape(data).values
        raise errors.too_large(f'{res.kind} "{objects.name(obj)}" would hold about {values} values, more '
                               f"than the limit of {MAX_VALUES} for an object")
    return data


def patch_refusal(e: PatchError) -> errors.APIError:
    """The Status for a patch that cannot be applied (a conflict excepted)."""
    if isinstance(e, PatchLimit):
        return (errors.too_large if e.too_large else errors.bad_request)(f"the patch could not be applied: {e}")
    return errors.APIError(422, "Invalid", f"the patch could not be applied: {e}")


NAMESPACE_MISMATCH = "the namespace of the provided object does not match the namespace sent on the request"


def _check_namespace(res: Resource, ns: str | None, md: dict[str, Any]) -> None:
    """A body (create, update) or patched object of a namespaced kind may name no other
    namespace than the request's: 400, as kube-apiserver's
    EnsureObjectNamespaceMatchesRequestNamespace, never a change dropped in silence."""
    body_ns = md.get("namespace")
    if res.namespaced and body_ns and ns and body_ns != ns:
        raise errors.bad_request(NAMESPACE_MISMATCH)


def _check_patched_name(res: Resource, ns: str | None, name: str, md: dict[str, Any]) -> None:
    """A patch may change neither the object's namespace nor its name (kube-apiserver's
    patcher: the namespace check, then checkName)."""
    _check_namespace(res, ns, md)
    if md.get("name") != name:
        shown = md.get("name") if isinstance(md.get("name"), str) else ""
        raise errors.bad_request(f"the name of the object ({shown}) does not match the name on the URL ({name})")



@contextmanager
def malformed(res: Resource, name: str) -> Iterator[None]:
    """A field of the wrong type or shape that a strategy trips over is the client's
    error, a 422 naming it, never a 500: nothing is stored (found by fuzzing,
    tests/unit/test_fuzz_api_bodies.py)."""
    try:
        yield
    except (TypeError, AttributeError, KeyError, ValueError, IndexError) as e:
        what = str(e) if isinstance(e, (TypeError, ValueError)) else f"{type(e).__name__}: {e}"
        raise errors.invalid(res.kind, name if isinstance(name, str) else "",
                             [("", f"the object is malformed: a field has the wrong type or shape ({what})")],
                             res.group) from None

class Taken(Protocol):
    """What :meth:`Claims.take` claimed for one write."""

    async def keep(self) -> None:
        """The write landed: free what the old version held and the new one does not."""

    async def undo(self) -> None:
        """The write did not land: free what was claimed for it, take back what it was given."""


class Claims(Protocol):
    """Values the objects of one kind hold exclusively across the cluster, kept in the
    store beside them (kube-apiserver's allocators: kube32.apiserver.nodeports)."""

    async def take(self, new: Obj, old: Obj | None, dry_run: bool) -> Taken:
        """Claim what ``new`` holds and ``old`` did not (assigning what ``new`` leaves
        for the server to choose); an APIError when it cannot be had.  A dry run claims
        nothing."""
        ...

    async def release(self, gone: Obj) -> None:
        """``gone`` was removed: what it held is free."""



_W = TypeVar("_W", bound=Callable[..., Awaitable[Any]])


def _one_write_per_key(method: _W) -> _W:
    """A write method of the Registry (``self, res, ns, name, ...``) run in its key's turn
    (:class:`~.keylocks.KeyLocks`): writes of one object in this server queue, not conflict."""
    @functools.wraps(method)
    async def in_turn(self: "Registry", res: Resource, ns: str | None, name: str, *args: Any, **kwargs: Any) -> Any:
        async with self.turns.hold(res.key(ns, name)):
            return await method(self, res, ns, name, *args, **kwargs)
    return in_turn  # type: ignore[return-value]


class Registry:
    """Storage semantics shared by all kinds; one instance per API server."""

    def __init__(self, store: Store) -> None:
        self.store = store
        # Hooks the server wires in (the registry imports nothing above it).
        self.before_delete: dict[str, Callable[[Resource, Obj], Awaitable[None]]] = {}
        # ... and when a delete only marked an object (its finalizers keep it): the object marked.
        self.delete_marked: dict[str, Callable[[Resource, Obj], None]] = {}
        self.claims: dict[str, Claims] = {}   # plural -> its kind's claims
        # plural -> a check of a new object (and the old one, on an update) that needs the
        # cluster's view (a CRD's names against the others'); raises an APIError to refuse.
        self.admit: dict[str, Callable[[Resource, Obj, Obj | None], Awaitable[None]]] = {}
        self.turns = KeyLocks()   # one write of a key at a time here (keylocks.py says why)
        self._watch_objects: dict[tuple[str, int], Obj] = {}  # (key, revision) -> decoded, oldest first
        self._triggers_set: set[str] = set()   # plurals whose trigger function the store has
        # Lists of pods by spec.nodeName answer from here when it can (kube32.apiserver.nodeindex;
        # the server sets and starts it).
        self.pods_by_node: NodeIndex | None = None

    # --- reads --------------------------------------------------------------
    async def get(self, res: Resource, ns: str | None, name: str) -> Obj:
        kv = await self.store.get(res.key(ns, name))
        if kv is None:
            raise errors.not_found(res.plural, name, res.group)
        return decode(kv)

    async def get_encoded(self, res: Resource, ns: str | None, name: str) -> bytes:
        """:meth:`get`'s object as the API answers it in JSON, from the stored bytes
        (:func:`encoded`: neither decoded nor encoded again)."""
        kv = await self.store.get(res.key(ns, name))
        if kv is None:
            raise errors.not_found(res.plural, name, res.group)
        return encoded(kv)

    async def try_get(self, res: Resource, ns: str | None, name: str) -> Obj | None:
        kv = await self.store.get(res.key(ns, name))
        return decode(kv) if kv else None

    async def list(self, res: Resource, ns: str | None, labels: LabelSelector | None = None,
                   fields: FieldSelector | None = None) -> tuple[list[Obj], int]:
        kvs, rev = await self.store.list(res.prefix(ns))
        out = []
        for kv in kvs:
            obj = decode(kv)
            if self.matches(res, obj, labels, fields):
                out.append(obj)
        return out, rev

    @staticmethod
    def matches(res: Resource, obj: Obj, labels: LabelSelector | None,
                fields: FieldSelector | None) -> bool:
        if labels is not None and not labels.matches(objects.labels(obj)):
            return False
        if fields is not None and fields.terms and not fields.matches(res.strategy.fields(obj)):
            return False
        return True

    # --- create -------------------------------------------------------------
    async def create(self, res: Resource, ns: str | None, obj: Obj, *, dry_run: bool = False,
                     check_namespace: bool = True, manager: str | None = None, big: bool = False) -> Obj:
        """``manager``: who writes, recorded in managedFields (kube32.apiserver.patch.record_update);
        None for the server's own writes.  ``big``: ``obj`` came from a body of more than
        ``BIG_OBJECT`` bytes (its passes run on a worker thread)."""
        obj, ns, generated = await _pass(big, self._prepared_new, res, ns, obj)
        md = obj["metadata"]
        await self._validate_async(res, obj, None)
        if res.plural in self.admit:
            await self.admit[res.plural](res, obj, None)
        if manager:
            await _pass(big, record_update, None, obj, manager, res.rules)
        if res.namespaced and check_namespace:
            await self.check_namespace_open(ns or "")
        if dry_run:
            if await self.store.get(res.key(ns, md["name"])):
                raise errors.already_exists(res.plural, md["name"], res.group)
            async with self._claimed(res, obj, None, dry_run=True):
                return obj
        return await self._store_new(res, ns, obj, generated, big)

    def _prepared_new(self, res: Resource, ns: str | None, obj: Obj) -> tuple[Obj, str | None, bool]:
        """A copy of ``obj`` as it is created (metadata, defaults, validated), its namespace and
        whether its name was generated: one pass, with no await in it."""
        obj = _typed_copy(res, obj)
        self._check_kind(res, obj)
        md, ns, generated = self._new_metadata(res, ns, obj)
        with malformed(res, md["name"]):
            res.strategy.prepare_for_create(obj)
            if any(f in obj for f in res.strategy.spec_fields):
                md["generation"] = 1
            else:
                md.pop("generation", None)
            self._validate(res, obj, res.strategy.validate(obj))
        return obj, ns, generated

    def _new_metadata(self, res: Resource, ns: str | None, obj: Obj) -> tuple[Obj, str | None, bool]:
        """A new object's metadata: its namespace (the request's), its name (generated from
        generateName when it has none), a new uid and creation time, nothing the server
        owns; and the namespace and whether the name was generated."""
        md = obj.setdefault("metadata", {})
        if not isinstance(md, dict):
            raise errors.bad_request("metadata must be an object")
        if res.namespaced:
            _check_namespace(res, ns, md)
            body_ns = md.get("namespace")
            md["namespace"] = ns or body_ns or "default"
            ns = md["namespace"]
        else:
            md.pop("namespace", None)
        for f in ("name", "generateName", "namespace"):
            if md.get(f) is not None and not isinstance(md[f], str):
                raise errors.invalid(res.kind, "", [(f"metadata.{f}", "Invalid value: must be a string")])
        generated = bool(not md.get("name") and md.get("generateName"))
        if generated:
            md["name"] = self._generate_name(md["generateName"])
        if not md.get("name"):
            raise errors.invalid(res.kind, "", [("metadata.name", "Required value: name or generateName is required")])
        for f in ("resourceVersion", "deletionTimestamp", "deletionGracePeriodSeconds", "selfLink"):
            md.pop(f, None)
        md["uid"] = str(uuid.uuid4())
        md["creationTimestamp"] = objects.rfc3339()
        return md, ns, generated

    async def _store_new(self, res: Resource, ns: str | None, obj: Obj, generated: bool, big: bool) -> Obj:
        """Write a new object; a generated name that is taken is generated again (8 tries)."""
        md = obj["metadata"]
        for attempt in range(8):
            try:
                async with self._claimed(res, obj, None, dry_run=False):   # claimed for this name
                    data = await _pass(big, encode_bounded, res, obj)   # after the claims: they may fill it in
                    kv = await self.store.create(res.key(ns, md["name"]), data)
                return stored(obj, kv)
            except KeyExists:
                if not generated or attempt == 7:
                    raise errors.already_exists(res.plural, md["name"], res.group) from None
                md["name"] = self._generate_name(md["generateName"])
        raise AssertionError("unreachable")

    @staticmethod
    def _generate_name(base: str) -> str:
        alphabet = "bcdfghjklmnpqrstvwxz2456789"
        return base[:58] + "".join(secrets.choice(alphabet) for _ in range(5))

    def _check_kind(self, res: Resource, obj: Obj) -> None:
        if not isinstance(obj, dict):
            raise errors.bad_request(f"the body of the request must be a {res.kind} object")
        kind, api_version = obj.get("kind"), obj.get("apiVersion")
        for name, value in (("kind", kind), ("apiVersion", api_version)):
            if value is not None and not isinstance(value, str):
                raise errors.bad_request(f'{res.kind} in version "{res.version}" cannot be handled as a '
                                         f'{res.kind}: {name} must be a string, not {json.dumps(value)[:64]}')
        if kind and kind != res.kind:
            raise errors.bad_request(f'{res.kind} in version "{res.version}" cannot be handled as a '
                                     f'{res.kind}: the object provided is of kind "{kind}", not {res.kind}')
        if api_version and api_version != res.api_version:
            raise errors.bad_request(f'the API version in the data ({api_version}) does not match the '
                                     f'expected API version ({res.api_version})')
        obj["kind"], obj["apiVersion"] = res.kind, res.api_version

    def _check_apply_kind(self, res: Resource, body: Obj) -> None:
        """An apply patch names its type in full (kube-apiserver's versionCheckManager) and
        sends no managedFields (its fieldmanager's applyPatcher: what a manager owns is the
        server's record, never the applier's say)."""
        if meta.nested(body, "metadata", "managedFields") not in (None, []):
            raise errors.bad_request("metadata.managedFields must be nil")
        kind, api_version = body.get("kind"), body.get("apiVersion")
        if kind != res.kind or api_version != res.api_version:
            group, _, version = (api_version if isinstance(api_version, str) else "").rpartition("/")
            got = f"{group}/{version}, Kind={kind if isinstance(kind, str) else ''}"
            raise errors.bad_request(f"invalid object type: {got} (an apply patch must give apiVersion "
                                     f"{res.api_version} and kind {res.kind})")
        self._check_kind(res, body)

    @staticmethod
    def _check_applied_types(res: Resource, body: Obj) -> None:
        """A custom resource's applied configuration with a value of the wrong type is a 422
        naming it before anything else, a conflict included (structured-merge-diff types
        the configuration by the schema before it merges)."""
        if res.custom and res.schema:
            errs = schemavalidation.type_errors(body, res.schema)
            if errs:
                raise errors.invalid(res.kind, objects.name(body), errs, res.group)

    def _validate(self, res: Resource, obj: Obj, errs: builtins.list[tuple[str, str]]) -> None:
        md = obj["metadata"]
        name = md.get("name", "")
        errs = list(errs)
        rule = res.strategy.name_rule
        if rule == "label" and (len(name) > 63 or not meta.DNS1123_LABEL.match(name)):
            errs.insert(0, ("metadata.name", f'Invalid value: "{name}": {meta.LABEL_MSG}'))
        elif rule == "subdomain" and (len(name) > 253 or not meta.DNS1123_SUBDOMAIN.match(name)):
            errs.insert(0, ("metadata.name", f'Invalid value: "{name}": {meta.SUBDOMAIN_MSG}'))
        errs += meta.validate_labels(md.get("labels"), "metadata.labels")
        errs += meta.validate_annotations(md.get("annotations"), "metadata.annotations")
        fin = md.get("finalizers")
        if fin is not None and (not isinstance(fin, list) or not all(isinstance(f, str) for f in fin)):
            errs.append(("metadata.finalizers", "Invalid value: must be a list of strings"))
        owners = md.get("ownerReferences")
        if owners is not None:
            if not isinstance(owners, list):
                errs.append(("metadata.ownerReferences", "Invalid value: must be a list"))
            else:
                for i, o in enumerate(owners):
                    for f in ("apiVersion", "kind", "name", "uid"):
                        if not isinstance(o, dict) or not o.get(f):
                            errs.append((f"metadata.ownerReferences[{i}].{f}", "Required value"))
        if errs:
            raise errors.invalid(res.kind, name, errs, res.group)

    @staticmethod
    async def _validate_async(res: Resource, obj: Obj, old: Obj | None) -> None:
        errs = await res.strategy.validate_async(obj, old)
        if errs:
            raise errors.invalid(res.kind, objects.name(obj), errs, res.group)

    async def check_namespace_open(self, ns: str) -> None:
        nsres = by_plural("namespaces")
        kv = await self.store.get(nsres.key(None, ns))
        if kv is None:
            raise errors.not_found("namespaces", ns)
        if (json.loads(kv.value).get("metadata") or {}).get("deletionTimestamp"):
            raise errors.forbidden(f"unable to create new content in namespace {ns} because it is "
                                   "being terminated")

    # --- update -------------------------------------------------------------
    @_one_write_per_key
    async def update(self, res: Resource, ns: str | None, name: str, obj: Obj, *,
                     subresource: str | None = None, dry_run: bool = False, manager: str | None = None,
                     big: bool = False) -> Obj:
        """PUT: replace the object, or its status; 409 when the body's resourceVersion is stale.
        ``big``: ``obj`` came from a body of more than ``BIG_OBJECT`` bytes."""
        if not isinstance(obj, dict):
            raise errors.bad_request(f"the body of the request must be a {res.kind} object")
        body_md = objects.meta(obj)
        _check_namespace(res, ns, body_md)
        if body_md.get("name") and body_md["name"] != name:
            raise errors.bad_request(f'the name of the object ({body_md["name"]}) does not match the '
                                     f'name on the URL ({name})')
        wanted_rv = body_md.get("resourceVersion")
        for _ in range(MAX_RETRIES):
            kv = await self.store.get(res.key(ns, name))
            if kv is None:
                raise errors.not_found(res.plural, name, res.group)
            if wanted_rv and str(kv.mod_revision) != str(wanted_rv):
                raise errors.conflict(res.plural, name, res.group)
            big_write = big or len(kv.value) > BIG_OBJECT
            try:
                return await self._write(res, ns, kv, await _pass(big_write, _typed_copy, res, obj), subresource,
                                         dry_run, manager, big_write)
            except Conflict:
                if wanted_rv:
                    raise errors.conflict(res.plural, name, res.group) from None
        raise errors.conflict(res.plural, name, res.group)

    @_one_write_per_key
    async def mutate(self, res: Resource, ns: str | None, name: str,
                     fn: Callable[[Obj], Obj | None], *, subresource: str | None = None,
                     dry_run: bool = False, manager: str | None = None) -> Obj:
        """Read, apply ``fn`` to a copy, write; retried on conflict.  ``fn`` returning None
        means "no change"."""
        for _ in range(MAX_RETRIES):
            kv = await self.store.get(res.key(ns, name))
            if kv is None:
                raise errors.not_found(res.plural, name, res.group)
            if len(kv.value) > BIG_OBJECT:
                current = await offload.run(decode, kv)
                new = fn(await offload.run(copy_json, current))
            else:
                current = decode(kv)
                new = fn(copy_json(current))
            if new is None:
                return current
            try:
                # ``fn`` had a copy: ``current`` is the stored version, decoded once.
                return await self._write(res, ns, kv, new, subresource, dry_run, manager, old=current)
            except Conflict:
                continue
        raise errors.conflict(res.plural, name, res.group)

    async def _write(self, res: Resource, ns: str | None, kv: KeyValue, new: Obj,
                     subresource: str | None, dry_run: bool, manager: str | None = None,
                     big: bool = False, old: Obj | None = None) -> Obj:
        """:meth:`_write_kv`'s object."""
        return (await self._write_kv(res, ns, kv, new, subresource, dry_run, manager, big, old))[0]

    async def _write_kv(self, res: Resource, ns: str | None, kv: KeyValue, new: Obj,
                        subresource: str | None, dry_run: bool, manager: str | None = None,
                        big: bool = False, old: Obj | None = None) -> tuple[Obj, KeyValue | None]:
        """(the object written, the stored version it is the decoding of; None when
        nothing was stored: a no-op, a dry run, a removal).  Write ``new`` over the stored
        version ``kv``: its passes (decode, defaults and validation, managedFields, encode)
        on a worker thread when either is big.  ``old``:
        ``kv`` decoded already by the caller, a private copy nothing changed (not decoded
        again: a fleet's Lease and status patches decoded each stored version twice)."""
        big = big or len(kv.value) > BIG_OBJECT
        stored_old, new = await _pass(big, self._updated, res, kv, new, subresource, old)
        old = stored_old
        if subresource in (None, "status", "scale"):
            await self._validate_async(res, new, old)
        if subresource is None and res.plural in self.admit:
            await self.admit[res.plural](res, new, old)
        if not await _pass(big, self._recorded, res, old, new, subresource, manager):
            return old, None  # a no-op write keeps the resourceVersion, as in Kubernetes
        md, omd = new["metadata"], old["metadata"]
        if md.get("deletionTimestamp") and not md.get("finalizers"):
            if not dry_run:
                await self._remove(res, ns, kv, old)  # the last finalizer went: so does the object
            new["metadata"]["resourceVersion"] = omd["resourceVersion"]
            return new, None
        async with self._claimed(res, new, old, dry_run):
            if dry_run:
                new["metadata"]["resourceVersion"] = omd["resourceVersion"]
                return new, None
            data = await _pass(big, encode_bounded, res, new)
            out = await self.store.update(kv.key, data, kv.mod_revision)
        return stored(new, out), out

    def _updated(self, res: Resource, kv: KeyValue, new: Obj, subresource: str | None,
                 old: Obj | None = None) -> tuple[Obj, Obj]:
        """(the stored version, ``new`` as it would replace it): what the server owns kept,
        defaults, generation, validated.  One pass, with no await in it.  ``old``: ``kv``
        decoded (a private copy), else decoded here."""
        if old is None:
            old = decode(kv)
        self._check_kind(res, new)
        md = new.setdefault("metadata", {})
        if not isinstance(md, dict):
            raise errors.bad_request("metadata must be an object")
        omd = old["metadata"]
        for f in ("name", "namespace", "uid", "creationTimestamp", "deletionTimestamp",
                  "deletionGracePeriodSeconds", "generateName"):
            if f in omd:
                md[f] = omd[f]
            else:
                md.pop(f, None)
        with malformed(res, omd.get("name", "")):
            if subresource == "status":
                res.strategy.prepare_for_status_update(new, old)
            else:
                bound = new.get("status") if subresource == "binding" else None
                res.strategy.prepare_for_update(new, old)
                if bound is not None:
                    new["status"] = bound   # a binding sets PodScheduled in its write (kube32.apiserver.binding)
            md = new["metadata"]
            md.pop("resourceVersion", None)
            if res.strategy.spec_changed(new, old) and "generation" in omd:
                md["generation"] = int(omd.get("generation", 1)) + 1
            elif "generation" in omd:
                md["generation"] = omd["generation"]
            # Subresources (status, binding, finalize) change what plain updates may not; a
            # custom resource's /scale writes the object itself, checked as an update of it.
            whole = subresource is None or (subresource == "scale" and res.custom)
            errs = res.strategy.validate_update(new, old) if whole else []
            self._validate(res, new, errs)
        return old, new

    @staticmethod
    def _recorded(res: Resource, old: Obj, new: Obj, subresource: str | None, manager: str | None) -> bool:
        """Whether ``new`` changes ``old`` (False: a no-op write); when it does, ``manager``'s
        update is recorded in its managedFields.  One pass, with no await in it."""
        md, omd = new["metadata"], old["metadata"]
        if "managedFields" in omd and "managedFields" not in md:
            md["managedFields"] = omd["managedFields"]   # a body without them keeps them
        comparable = dict(old)
        comparable["metadata"] = {k: v for k, v in omd.items() if k != "resourceVersion"}
        if new == comparable:
            return False
        if manager:
            record_update(old, new, manager, res.rules, subresource=subresource)
        return True

    @asynccontextmanager
    async def _claimed(self, res: Resource, new: Obj, old: Obj | None, dry_run: bool) -> AsyncIterator[None]:
        """Around one write of ``new`` over ``old``: its kind's claims taken first, kept
        when the write lands, undone when it fails.  A write whose outcome is unknown (the
        store unavailable, the request cancelled) keeps its claims: a claim its object does
        not hold is a leftover the next one who wants it takes over."""
        claims = self.claims.get(res.plural)
        if claims is None:
            yield
            return
        taken = await claims.take(new, old, dry_run)
        try:
            yield
        except (Unavailable, asyncio.CancelledError):
            raise
        except BaseException:
            await taken.undo()
            raise
        try:
            await taken.keep()
        except StoreError as e:   # the write landed; what stays claimed is a leftover
            log.warning("cannot free what %s %s/%s no longer holds: %s", res.kind, objects.namespace(new),
                        objects.name(new), e)

    # --- patch --------------------------------------------------------------
    async def patch(self, res: Resource, ns: str | None, name: str, patch_type: str, body: Any, *,
                    subresource: str | None = None, manager: str = "", force: bool = False,
                    dry_run: bool = False, big: bool = False) -> tuple[Obj, bool]:
        """Returns (object, created); only apply patches create.  ``big``: the patch came in a
        body of more than ``BIG_OBJECT`` bytes (its passes run on a worker thread)."""
        obj, created, _ = await self._patch(res, ns, name, patch_type, body, subresource=subresource,
                                            manager=manager, force=force, dry_run=dry_run, big=big)
        return obj, created

    async def patch_encoded(self, res: Resource, ns: str | None, name: str, patch_type: str, body: Any, *,
                            subresource: str | None = None, manager: str = "", force: bool = False,
                            dry_run: bool = False, big: bool = False) -> tuple[Obj, bool, bytes | None]:
        """:meth:`patch`, and the object's JSON as the API answers it when it was stored by
        this patch (:func:`encoded` of the bytes written: not encoded once more), else None."""
        obj, created, kv = await self._patch(res, ns, name, patch_type, body, subresource=subresource,
                                             manager=manager, force=force, dry_run=dry_run, big=big)
        return obj, created, (encoded(kv) if kv is not None else None)

    @_one_write_per_key
    async def _patch(self, res: Resource, ns: str | None, name: str, patch_type: str, body: Any, *,
                     subresource: str | None = None, manager: str = "", force: bool = False,
                     dry_run: bool = False, big: bool = False) -> tuple[Obj, bool, KeyValue | None]:
        if patch_type not in PATCH_TYPES:
            raise errors.unsupported_media_type(patch_type)
        for _ in range(MAX_RETRIES):
            kv = await self.store.get(res.key(ns, name))
            if kv is None:
                if patch_type != PATCH_APPLY or subresource:
                    raise errors.not_found(res.plural, name, res.group)
                return await self._apply_create(res, ns, name, body, manager, force, dry_run, big), True, None
            big_write = big or len(kv.value) > BIG_OBJECT
            current = await _pass(big_write, decode, kv)
            new = await _pass(big_write, self.patched, res, current, patch_type, body, manager, force, subresource)
            if not isinstance(new, dict) or not isinstance(new.get("metadata", {}), dict):
                raise errors.bad_request(f"the patched {res.kind} is not an object with an object "
                                         "metadata: the patch replaces one with another type")
            _check_patched_name(res, ns, name, objects.meta(new))
            wanted_rv = objects.meta(new).get("resourceVersion")
            if wanted_rv and str(wanted_rv) != current["metadata"]["resourceVersion"]:
                raise errors.conflict(res.plural, name, res.group)
            try:
                # The patch functions work on a copy: ``current`` is still the stored version.
                written, stored_kv = await self._write_kv(res, ns, kv, new, subresource, dry_run,
                                                          manager if patch_type != PATCH_APPLY else None,
                                                          big_write, old=current)
                return written, False, stored_kv
            except Conflict:
                if wanted_rv:
                    raise errors.conflict(res.plural, name, res.group) from None
        raise errors.conflict(res.plural, name, res.group)

    def patched(self, res: Resource, current: Obj, patch_type: str, body: Any,
                 manager: str, force: bool, subresource: str | None = None) -> Obj:
        try:
            if patch_type == PATCH_JSON:
                if not isinstance(body, list):
                    raise PatchError("a JSON patch must be a list of operations")
                patched = json_patch(current, body)
                if res.strategy.typed:
                    drop_nulls(patched)   # an "add" of null is the field unset (the other types delete)
                return patched
            if not isinstance(body, dict):
                raise PatchError("the patch must be a JSON object")
            if patch_type == PATCH_MERGE:
                return json_merge_patch(current, body)
            if patch_type == PATCH_STRATEGIC:
                return strategic_merge_patch(current, body, res.kind)
            self._check_apply_kind(res, body)
            applicable = _applicable(res, body, subresource)
            self._check_applied_types(res, applicable)
            return _without_empty_maps(res, server_side_apply(current, applicable, manager or "unknown", force,
                                                              res.rules, subresource=subresource))
        except ApplyConflict as e:
            raise self._apply_conflict(e) from None
        except PatchError as e:
            raise patch_refusal(e) from None

    @staticmethod
    def _apply_conflict(e: ApplyConflict) -> errors.APIError:
        """The 409 of a conflict, as apimachinery's NewApplyConflict: its details only causes."""
        causes = [{"reason": "FieldManagerConflict", "message": f"conflict with {whom}", "field": field}
                  for field, _, whom in e.conflicts]
        return errors.APIError(409, "Conflict", str(e), details={"causes": causes})

    async def _apply_create(self, res: Resource, ns: str | None, name: str, body: Any,
                            manager: str, force: bool, dry_run: bool, big: bool) -> Obj:
        if not isinstance(body, dict):
            raise errors.bad_request("the applied configuration must be an object")
        self._check_apply_kind(res, body)
        md = objects.meta(body)
        if md.get("name") and md["name"] != name:
            raise errors.bad_request(f'the name of the object ({md["name"]}) does not match the name '
                                     f'on the URL ({name})')
        try:
            # A create by apply owns what its write keeps: not a status the strategy drops.
            obj = await _pass(big, server_side_apply, None, _applicable(res, body, None), manager or "unknown",
                              force, res.rules)
            _without_empty_maps(res, obj)
        except PatchError as e:
            raise errors.APIError(422, "Invalid", f"the applied configuration is invalid: {e}") from None
        obj.setdefault("metadata", {})["name"] = name
        return await self.create(res, ns, obj, dry_run=dry_run, big=big)

    # --- replace (kube32: pod moves) ------------------------------------------
    @_one_write_per_key
    async def replace(self, res: Resource, ns: str | None, name: str, obj: Obj, *,
                      expected_uid: str, dry_run: bool = False,
                      refusal: Callable[[Obj, Obj], str | None] | None = None,
                      carry: Callable[[Obj, Obj], None] | None = None) -> Obj:
        """Replace an object by a new incarnation in one write: same name, a new uid and
        creation time, status reset, written only if the current uid is ``expected_uid``
        and ``refusal(current, new)`` (after defaults) says nothing (409 with its words).
        ``carry(current, new)`` first copies into ``new`` what it takes from the object as
        stored at this write (not as the caller read it).

        A pod move uses it so that no moment exists with zero or two pods of that name:
        owners count one pod at every step, and ``kubectl drain`` sees the uid change.
        A write of the same incarnation in between (the kubelet's status) is no reason to
        refuse: the uid is what the caller named, so the replacement is tried again on the
        object as it is now, as every other write here is.
        """
        for _ in range(MAX_RETRIES):
            kv = await self.store.get(res.key(ns, name))
            if kv is None:
                raise errors.not_found(res.plural, name, res.group)
            new = self._replacement(res, ns, name, decode(kv), obj, expected_uid, refusal, carry)
            if dry_run:
                return new
            try:
                return decode(await self.store.update(kv.key, encode_bounded(res, new), kv.mod_revision))
            except Conflict:
                continue
        raise errors.conflict(res.plural, name, res.group)

    def _replacement(self, res: Resource, ns: str | None, name: str, old: Obj, obj: Obj, expected_uid: str,
                     refusal: Callable[[Obj, Obj], str | None] | None,
                     carry: Callable[[Obj, Obj], None] | None) -> Obj:
        if old["metadata"].get("uid") != expected_uid:
            raise errors.conflict(res.plural, name, res.group,
                                  f"Precondition failed: UID in precondition: {expected_uid}, "
                                  f"UID in object meta: {old['metadata'].get('uid')}")
        if old["metadata"].get("deletionTimestamp"):
            raise errors.conflict(res.plural, name, res.group, "the object is being deleted")
        new = _typed_copy(res, obj)
        self._check_kind(res, new)
        md = new.setdefault("metadata", {})
        if carry is not None:
            carry(old, new)
        md.update({"name": name, "uid": str(uuid.uuid4()), "creationTimestamp": objects.rfc3339()})
        if res.namespaced:
            md["namespace"] = ns
        for f in ("resourceVersion", "deletionTimestamp", "deletionGracePeriodSeconds", "generateName",
                  "managedFields"):
            md.pop(f, None)
        with malformed(res, name):
            res.strategy.prepare_for_create(new)
            md["generation"] = 1
            self._validate(res, new, res.strategy.validate(new))
        why = refusal(old, new) if refusal is not None else None
        if why:
            raise errors.conflict(res.plural, name, res.group, why)
        return new

    # --- delete -------------------------------------------------------------
    @_one_write_per_key
    async def delete(self, res: Resource, ns: str | None, name: str, *,
                     options: Obj | None = None, dry_run: bool = False) -> tuple[Obj, bool]:
        """Returns (object, gone).  ``gone`` is False when the object was only marked."""
        options = options or {}
        pre = options.get("preconditions") or {}
        propagation = options.get("propagationPolicy")
        if options.get("orphanDependents") is True:
            propagation = "Orphan"
        for _ in range(MAX_RETRIES):
            kv = await self.store.get(res.key(ns, name))
            if kv is None:
                raise errors.not_found(res.plural, name, res.group)
            obj = decode(kv)
            refusal = res.strategy.delete_refusal(obj)
            if refusal:
                raise errors.forbidden(f'{res.plural}{"." + res.group if res.group else ""} "{name}" is forbidden: '
                                       f"{refusal}")
            check_preconditions(res, obj, pre)
            marked = self._mark_for_deletion(res, obj, propagation, options.get("gracePeriodSeconds"))
            try:
                if dry_run:
                    return (marked or obj), marked is None
                if marked == obj:
                    # Already terminating, and this DELETE asks nothing new (no finalizer to
                    # add, no shorter grace period): as Kubernetes, the object unchanged and
                    # no write - a write would wake every watcher, who may delete again.
                    return obj, False
                if marked is not None:
                    out = decode(await self.store.update(kv.key, encode(marked), kv.mod_revision))
                    on_marked = self.delete_marked.get(res.plural)
                    if on_marked:
                        on_marked(res, out)
                    return out, False
                gone = await self._remove(res, ns, kv, obj)
                return gone, True
            except Conflict:
                continue
        raise errors.conflict(res.plural, name, res.group)

    def _mark_for_deletion(self, res: Resource, obj: Obj, propagation: str | None,
                           grace: Any) -> Obj | None:
        """The object to store instead of deleting it, or None to delete now."""
        md = obj["metadata"]
        finalizers = list(md.get("finalizers") or [])
        if not md.get("deletionTimestamp"):
            finalizers += [f for f in res.strategy.delete_finalizers if f not in finalizers]
        if propagation == "Foreground" and "foregroundDeletion" not in finalizers:
            finalizers.append("foregroundDeletion")
        if propagation == "Orphan" and "orphan" not in finalizers:
            finalizers.append("orphan")
        graceful = self._grace_seconds(res, obj, grace)
        if res.plural == "namespaces" and objects.spec(obj).get("finalizers"):
            # The namespace controller empties it, then removes spec.finalizers via /finalize.
            new = copy_json(obj)
            new["metadata"].setdefault("deletionTimestamp", objects.rfc3339())
            new.setdefault("status", {})["phase"] = NamespacePhase.TERMINATING
            return new
        if not finalizers and not graceful:
            return None
        if md.get("deletionTimestamp") and finalizers == (md.get("finalizers") or []) and not graceful:
            return obj if finalizers else None
        new = copy_json(obj)
        nmd = new["metadata"]
        if finalizers:
            nmd["finalizers"] = finalizers
        if not nmd.get("deletionTimestamp"):
            nmd["deletionTimestamp"] = objects.rfc3339()
            if graceful:
                nmd["deletionGracePeriodSeconds"] = graceful
        elif graceful and graceful < int(nmd.get("deletionGracePeriodSeconds") or graceful + 1):
            nmd["deletionGracePeriodSeconds"] = graceful
        return new

    @staticmethod
    def _grace_seconds(res: Resource, obj: Obj, grace: Any) -> int:
        """Pods bound to a node end gracefully: the kubelet stops them and deletes with grace 0."""
        if res.plural != "pods" or not objects.spec(obj).get("nodeName"):
            return 0
        if objects.phase(obj) in PodPhase.TERMINAL:
            return 0
        if grace is None:
            grace = objects.spec(obj).get("terminationGracePeriodSeconds", 30)
        try:
            return max(int(grace), 0)
        except (TypeError, ValueError):
            raise errors.bad_request("gracePeriodSeconds must be an integer") from None

    async def _remove(self, res: Resource, ns: str | None, kv: KeyValue, obj: Obj) -> Obj:
        """Delete ``obj`` (stored as ``kv``) from the store, its kind's before_delete hook
        first: whichever way it goes (a delete, or its last finalizer removed)."""
        hook = self.before_delete.get(res.plural)
        if hook:
            await hook(res, obj)
        try:
            out = await self.store.delete(kv.key, kv.mod_revision)
        except KeyNotFound:
            raise errors.not_found(res.plural, kv.key.rsplit("/", 1)[-1], res.group) from None
        gone = decode(out)
        claims = self.claims.get(res.plural)
        if claims is not None:
            try:
                await claims.release(gone)
            except StoreError as e:   # removed; what stays claimed is a leftover
                log.warning("cannot free what %s %s/%s held: %s", res.kind, objects.namespace(gone),
                            objects.name(gone), e)
        return gone

    # --- watch --------------------------------------------------------------
    def shared_decode(self, kv: KeyValue) -> Obj:
        """:meth:`_shared_decode` for readers in the API server (kube32.apiserver.datafacts)."""
        return self._shared_decode(kv)

    def _shared_decode(self, kv: KeyValue) -> Obj:
        """One decoded copy of a stored version for every watcher it reaches (each write
        fans out to the kubelets', the controllers' and users' watches) and every list that
        reads it.  Read-only: a watcher that changes an object copies it."""
        key = (kv.key, kv.mod_revision)
        obj = self._watch_objects.get(key)
        if obj is None:
            if len(self._watch_objects) >= WATCH_DECODED_KEPT:
                del self._watch_objects[next(iter(self._watch_objects))]
            obj = self._watch_objects[key] = decode(kv)
        return obj

    @staticmethod
    def _watch_prefix(res: Resource, ns: str | None, fields: FieldSelector | None) -> str:
        """The store prefix a watch or a list needs: one object's key (and the keys it
        begins, which the selector then drops) for ``metadata.name=<name>``, so a watch is
        not woken by every write to its kind and a list reads one name; else the kind's
        (namespace's) prefix."""
        name = fields.value_of("metadata.name") if fields is not None else None
        if name and (ns or not res.namespaced):
            return res.key(ns, name)
        return res.prefix(ns)

    def listing(self, res: Resource, ns: str | None, labels: LabelSelector | None,
                fields: FieldSelector | None, options: paging.ListOptions, decoded: bool = True) -> paging.Listing:
        """A list read a page at a time (:mod:`.paging`); open() it, then iterate.  Not
        ``decoded``: only objects a selector looks at are decoded (send :func:`encoded`)."""
        filtered = (labels is not None and not labels.empty) or (fields is not None and bool(fields.terms))
        keep = (lambda obj: self.matches(res, obj, labels, fields)) if filtered else None
        # Decoded once for every list and watch that reads the same version (200 watches
        # opened with a selector each read the namespace: one decode per object, not 200).
        node = fields.value_of(nodeindex.FIELD) if fields is not None and res.plural == "pods" else None
        if node is not None and self.pods_by_node is not None and nodeindex.answerable(options):
            # One node's pods (a kubelet's list and initial watch, the scheduler's pending
            # pods): from the index when it is fresh, not a scan of every pod.
            return nodeindex.NodeListing(self.pods_by_node, ns, node, self.store, res.prefix(ns), options,
                                         self._shared_decode, keep, decoded)
        # One name's keys only for a metadata.name selector (a kubelet's list of its Node,
        # `kubectl get pod X -w`): at 10,000 pods a read and decode of every pod for one.
        return paging.Listing(self.store, self._watch_prefix(res, ns, fields), options, self._shared_decode, keep,
                              decoded, token_prefix=res.prefix(ns))

    async def watch(self, res: Resource, ns: str | None, labels: LabelSelector | None,
                    fields: FieldSelector | None, resource_version: str | None
                    ) -> AsyncGenerator[tuple[str, Obj], None]:
        """(type, object) pairs: ADDED/MODIFIED/DELETED as seen through the selectors
        (:meth:`watch_items` without its progress marks)."""
        initial = resource_version in (None, "", "0")
        items = self.watch_items(res, ns, labels, fields, None if initial else resource_version, initial)
        try:
            async for item in items:
                if item.type in EVENT_TYPES and item.object is not None:
                    yield item.type, item.object
        finally:
            await items.aclose()

    async def watch_items(self, res: Resource, ns: str | None, labels: LabelSelector | None,
                          fields: FieldSelector | None, resource_version: str | None, initial: bool,
                          not_older_than: int = 0) -> AsyncGenerator[WatchItem, None]:
        """The watch's events, as :class:`WatchItem`: ADDED/MODIFIED/DELETED as seen through
        the selectors, and what bookmarks need: PROGRESS for a store event the selectors
        drop, INITIAL_END after the initial ADDED events (``initial``: the state at the
        start, read as a list is, page by page; the watch goes on from its revision).

        An object that starts or stops matching the selectors is ADDED or DELETED, as a
        Kubernetes watch cache does, so a kubelet watching ``spec.nodeName=X`` sees a pod
        that moved away as DELETED.  An object replaced under its name in one write (a
        move: ``replace``, a new uid) is DELETED (the old one, annotated
        ``kube32.io/replaced-by: <new uid>``, at the revision before that write's, so a
        watch resumed from it still gets the ADDED) then ADDED at that write's revision: no
        Kubernetes server changes a uid in place, and informers keyed on uid must see the
        old object end.  A watch whose selectors the replacement no longer matches (a
        node's, ``spec.nodeName``) gets the annotated DELETED alone, at the write's revision.
        """
        listing = None
        if initial:
            listing = await self.listing(res, ns, labels, fields,
                                         paging.ListOptions(not_older_than=not_older_than)).open()
            start = listing.revision
        else:
            start = paging.parse_revision(resource_version or "0")
        # Subscribe before sending the initial ADDED events: the subscription starts at
        # the call, so nothing written while they go out is lost.
        stream = self._store_watch(res, ns, fields, start)
        try:
            if listing is not None:
                async for item in listing:
                    assert item.object is not None
                    yield WatchItem("ADDED", item.object, start, initial=True, kv=item.kv)
                yield WatchItem(INITIAL_END, None, start)
            async for ev in stream:
                for seen in self._seen_as(res, ev, labels, fields):
                    yield seen
        except Compacted as e:
            raise errors.gone(f"too old resource version: {start} ({e.compacted_revision})") from None
        finally:
            await stream.aclose()

    def _store_watch(self, res: Resource, ns: str | None, fields: FieldSelector | None, start: int) -> Any:
        """The store's watch for a watch of ``res``: a triggered one (kube32.store.sqlite)
        when its field selector asks for one value of the kind's trigger field (a kubelet's
        ``spec.nodeName=<node>``, its ``status.targetNode=<node>``), so a write wakes the
        watches of the nodes it concerns, not every node's; else every write of the prefix."""
        prefix = self._watch_prefix(res, ns, fields)
        field = TRIGGER_FIELDS.get(res.plural)
        value = fields.value_of(field) if field is not None and fields is not None else None
        triggered = getattr(self.store, "watch_triggered", None)
        if value is None or triggered is None or field is None:
            # With PROGRESS marks where the store has them: a quiet kind's watch learns the
            # store's revision, for its bookmarks (kube32.store.sqlite).
            progress = getattr(self.store, "watch_progress", None)
            return progress(prefix, start) if progress is not None else self.store.watch(prefix, start)
        if res.plural not in self._triggers_set:
            self._triggers_set.add(res.plural)
            self.store.set_trigger(res.prefix(None), self._trigger_values(res, field))  # type: ignore[attr-defined]
        return triggered(prefix, start, value)

    @staticmethod
    def _trigger_values(res: Resource, field: str) -> Callable[[WatchEvent], builtins.list[str]]:
        """The values of ``field`` an event's object had before and has after it, or more:
        a watch selecting another value sees it as nothing (``_seen_as``: a progress mark).
        Read from the stored bytes without decoding them (the store calls this for every
        write and every replayed event): every ``"<last name of field>":"<value>"`` in the
        object's compact JSON (:func:`encode`; a string holds no bare quote, so each is a
        key and its value), and "" (the field unset) always: a superset, which is all a
        trigger needs."""
        mark = b'"' + field.rsplit(".", 1)[-1].encode() + b'":"'

        def scan(value: bytes, out: set[str]) -> None:
            at = value.find(mark)
            while at >= 0:
                start = at + len(mark)
                end = value.find(b'"', start)
                if end < 0:
                    return
                out.add(value[start:end].decode("utf-8", "replace"))
                at = value.find(mark, end)

        def values(ev: WatchEvent) -> builtins.list[str]:
            out = {""}
            scan(ev.kv.value, out)
            if ev.prev is not None:
                scan(ev.prev.value, out)
            return list(out)
        return values

    def _seen_as(self, res: Resource, ev: WatchEvent, labels: LabelSelector | None,
                 fields: FieldSelector | None) -> builtins.list[WatchItem]:
        """What one store event is to this watch (its selectors): one event, or a progress
        mark; two for an object replaced under its name (DELETED, then ADDED)."""
        if ev.type == STORE_PROGRESS:
            return [WatchItem(PROGRESS, None, ev.revision)]
        obj = self._shared_decode(ev.kv)
        prev = self._shared_decode(ev.prev) if ev.prev is not None else None
        was = prev is not None and self.matches(res, prev, labels, fields)
        if ev.type == "DELETE":
            if was or (prev is None and self.matches(res, obj, labels, fields)):
                return [WatchItem("DELETED", obj, ev.revision, kv=ev.kv)]
            return [WatchItem(PROGRESS, None, ev.revision)]
        now = self.matches(res, obj, labels, fields)
        replaced = prev is not None and objects.uid(prev) != objects.uid(obj)
        if now and was and replaced:
            # The DELETED one revision before the write: a client that resumes a broken
            # watch at the resourceVersion of the last event it got (client-go's reflector)
            # must still be sent the ADDED, which it would miss were both at one revision.
            assert prev is not None
            return [WatchItem("DELETED", _replaced(prev, obj, ev.revision - 1), ev.revision - 1,
                              derived=True, replaced=True),
                    WatchItem("ADDED", obj, ev.revision, kv=ev.kv)]
        if now:
            return [WatchItem("MODIFIED" if was else "ADDED", obj, ev.revision, kv=ev.kv)]
        if was:
            # As Kubernetes' watch cache: the previous content, at this event's
            # revision, so a kubelet sees the uid it ran go away (and, replaced under its
            # name elsewhere, by what).
            assert prev is not None
            if replaced:
                return [WatchItem("DELETED", _replaced(prev, obj, ev.revision), ev.revision, derived=True,
                                  replaced=True)]
            gone = {**prev, "metadata": {**prev["metadata"], "resourceVersion": obj["metadata"]["resourceVersion"]}}
            return [WatchItem("DELETED", gone, ev.revision, derived=True)]
        return [WatchItem(PROGRESS, None, ev.revision)]

def _typed_copy(res: Resource, obj: Any) -> Any:
    """A private copy of a body to write; a built-in kind's without its null members
    (Strategy.typed: kube-apiserver decodes them as fields unset)."""
    out = copy_json(obj)
    if res.strategy.typed:
        drop_nulls(out)
    return out


def _replaced(old: Obj, new: Obj, revision: int) -> Obj:
    """``old`` as a watch's DELETED event shows it when ``new`` replaced it under its name:
    at ``revision``, naming ``new``'s uid (Annotation.REPLACED_BY)."""
    md = dict(old["metadata"])
    md["resourceVersion"] = str(revision)
    md["annotations"] = {**(md.get("annotations") or {}), Annotation.REPLACED_BY: objects.uid(new)}
    return {**old, "metadata": md}


def _without_empty_maps(res: Resource, obj: Obj) -> Obj:
    """A built-in kind's object as its Go type stores it: no empty map (``omitempty``);
    an apply's result, whose applier owns the ``data: {}`` it applied."""
    typedfields.prune_unknown(res, obj, omit_empty=True)
    return obj


def _applicable(res: Resource, body: Obj, subresource: str | None) -> Obj:
    """What of an applied configuration its write may change, as Kubernetes' reset fields:
    an apply to /status its status alone; to the object, all but its status when the
    kind has a status subresource.  The rest would be reset by the strategy, and an
    applier owns only what it wrote."""
    identity = {"apiVersion", "kind"}
    if subresource == "status":
        md = objects.meta(body)
        kept = {k: v for k, v in body.items() if k in identity | {"status"}}
        kept["metadata"] = {k: md[k] for k in ("name", "namespace") if k in md}
        return kept
    if res.strategy.has_status and "status" in body:
        return {k: v for k, v in body.items() if k != "status"}
    return body


def check_preconditions(res: Resource, obj: Obj, preconditions: Any) -> None:
    """409 when DeleteOptions' ``preconditions`` (uid, resourceVersion) do not hold of
    ``obj``, in kube-apiserver's words; a delete and an eviction judge them alike."""
    pre = preconditions if isinstance(preconditions, dict) else {}
    md, name = obj["metadata"], objects.name(obj)
    if pre.get("uid") and pre["uid"] != md.get("uid"):
        raise errors.conflict(res.plural, name, res.group, f"Precondition failed: UID in precondition: "
                                                           f"{pre['uid']}, UID in object meta: {md.get('uid')}")
    if pre.get("resourceVersion") and str(pre["resourceVersion"]) != md.get("resourceVersion"):
        raise errors.conflict(res.plural, name, res.group,
                              f"Precondition failed: ResourceVersion in precondition: {pre['resourceVersion']}, "
                              f"ResourceVersion in object meta: {md.get('resourceVersion')}")
