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
* ``kind`` and ``apiVersion`` of a body may be left out (the URL's are used, as
  Kubernetes defaults them on create and update); given, they must be the URL's
  strings.  An apply patch must give both, as kube-apiserver's field manager demands.
"""
from __future__ import annotations

import copy
import json
import secrets
import uuid
from contextlib import contextmanager
from typing import Any, AsyncIterator, Awaitable, Callable, Iterator

from ..store import Compacted, Conflict, KeyExists, KeyNotFound, KeyValue, Store
from . import errors, meta
from . import jsonshape
from .limits import MAX_OBJECT, MAX_VALUES
from .patch import (ApplyConflict, PatchError, PatchLimit, json_merge_patch, json_patch, server_side_apply,
                    strategic_merge_patch)
from .resources import Resource, by_plural
from .selectors import FieldSelector, LabelSelector

Obj = dict[str, Any]
MAX_RETRIES = 16
WATCH_DECODED_KEPT = 256  # recent versions decoded once for all watchers

PATCH_JSON = "application/json-patch+json"
PATCH_MERGE = "application/merge-patch+json"
PATCH_STRATEGIC = "application/strategic-merge-patch+json"
PATCH_APPLY = "application/apply-patch+yaml"
PATCH_TYPES = (PATCH_JSON, PATCH_MERGE, PATCH_STRATEGIC, PATCH_APPLY)


def decode(kv: KeyValue) -> Obj:
    obj = json.loads(kv.value)
    obj.setdefault("metadata", {})["resourceVersion"] = str(kv.mod_revision)
    return obj


def encode(obj: Obj) -> bytes:
    md = obj.get("metadata") or {}
    rv = md.pop("resourceVersion", None)
    try:
        return json.dumps(obj, separators=(",", ":"), sort_keys=False).encode()
    finally:
        if rv is not None:
            md["resourceVersion"] = rv


def encode_bounded(res: Resource, obj: Obj) -> bytes:
    """:func:`encode` for a create or an update: 413 past ``MAX_OBJECT`` bytes."""
    data = encode(obj)
    if len(data) > MAX_OBJECT:
        raise errors.too_large(f'{res.kind} "{meta.name_of(obj)}" would be {len(data)} bytes stored, more '
                               f"than the limit of {MAX_OBJECT} bytes for an object")
    values = jsonshape.shape(data).values
    if values > MAX_VALUES:
        raise errors.too_large(f'{res.kind} "{meta.name_of(obj)}" would hold about {values} values, more '
                               f"than the limit of {MAX_VALUES} for an object")
    return data


def patch_refusal(e: PatchError) -> errors.APIError:
    """The Status for a patch that cannot be applied (a conflict excepted)."""
    if isinstance(e, PatchLimit):
        return (errors.too_large if e.too_large else errors.bad_request)(f"the patch could not be applied: {e}")
    return errors.APIError(422, "Invalid", f"the patch could not be applied: {e}")



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

class Registry:
    """Storage semantics shared by all kinds; one instance per API server."""

    def __init__(self, store: Store) -> None:
        self.store = store
        # Hooks the server wires in (the registry imports nothing above it).
        self.before_delete: dict[str, Callable[[Resource, Obj], Awaitable[None]]] = {}
        self._watch_objects: dict[tuple[str, int], Obj] = {}  # (key, revision) -> decoded, oldest first

    # --- reads --------------------------------------------------------------
    async def get(self, res: Resource, ns: str | None, name: str) -> Obj:
        kv = await self.store.get(res.key(ns, name))
        if kv is None:
            raise errors.not_found(res.plural, name, res.group)
        return decode(kv)

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
        if labels is not None and not labels.matches(meta.labels_of(obj)):
            return False
        if fields is not None and fields.terms and not fields.matches(res.strategy.fields(obj)):
            return False
        return True

    # --- create -------------------------------------------------------------
    async def create(self, res: Resource, ns: str | None, obj: Obj, *, dry_run: bool = False,
                     check_namespace: bool = True) -> Obj:
        obj = copy.deepcopy(obj)
        self._check_kind(res, obj)
        md = obj.setdefault("metadata", {})
        if not isinstance(md, dict):
            raise errors.bad_request("metadata must be an object")
        if res.namespaced:
            body_ns = md.get("namespace")
            if body_ns and ns and body_ns != ns:
                raise errors.bad_request("the namespace of the provided object does not match "
                                         "the namespace sent on the request")
            md["namespace"] = ns or body_ns or "default"
            ns = md["namespace"]
        else:
            md.pop("namespace", None)
        for f in ("name", "generateName", "namespace"):
            if md.get(f) is not None and not isinstance(md[f], str):
                raise errors.invalid(res.kind, "", [(f"metadata.{f}", "Invalid value: must be a string")])
        generated = not md.get("name") and md.get("generateName")
        if generated:
            md["name"] = self._generate_name(md["generateName"])
        if not md.get("name"):
            raise errors.invalid(res.kind, "", [("metadata.name", "Required value: name or generateName is required")])
        for f in ("resourceVersion", "deletionTimestamp", "deletionGracePeriodSeconds", "selfLink"):
            md.pop(f, None)
        md["uid"] = str(uuid.uuid4())
        md["creationTimestamp"] = meta.rfc3339()
        with malformed(res, md["name"]):
            res.strategy.prepare_for_create(obj)
            if any(f in obj for f in res.strategy.spec_fields):
                md["generation"] = 1
            else:
                md.pop("generation", None)
            self._validate(res, obj, res.strategy.validate(obj))
        if res.namespaced and check_namespace:
            await self.check_namespace_open(ns)
        if dry_run:
            if await self.store.get(res.key(ns, md["name"])):
                raise errors.already_exists(res.plural, md["name"], res.group)
            return obj
        for attempt in range(8):
            try:
                kv = await self.store.create(res.key(ns, md["name"]), encode_bounded(res, obj))
                return decode(kv)
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
        """An apply patch names its type in full (kube-apiserver's versionCheckManager)."""
        kind, api_version = body.get("kind"), body.get("apiVersion")
        if kind != res.kind or api_version != res.api_version:
            group, _, version = (api_version if isinstance(api_version, str) else "").rpartition("/")
            got = f"{group}/{version}, Kind={kind if isinstance(kind, str) else ''}"
            raise errors.bad_request(f"invalid object type: {got} (an apply patch must give apiVersion "
                                     f"{res.api_version} and kind {res.kind})")
        self._check_kind(res, body)

    def _validate(self, res: Resource, obj: Obj, errs: list[tuple[str, str]]) -> None:
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

    async def check_namespace_open(self, ns: str) -> None:
        nsres = by_plural("namespaces")
        kv = await self.store.get(nsres.key(None, ns))
        if kv is None:
            raise errors.not_found("namespaces", ns)
        if (json.loads(kv.value).get("metadata") or {}).get("deletionTimestamp"):
            raise errors.forbidden(f"unable to create new content in namespace {ns} because it is "
                                   "being terminated")

    # --- update -------------------------------------------------------------
    async def update(self, res: Resource, ns: str | None, name: str, obj: Obj, *,
                     subresource: str | None = None, dry_run: bool = False) -> Obj:
        """PUT: replace the object, or its status; 409 when the body's resourceVersion is stale."""
        if not isinstance(obj, dict):
            raise errors.bad_request(f"the body of the request must be a {res.kind} object")
        body_md = obj.get("metadata") or {}
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
            try:
                return await self._write(res, ns, kv, copy.deepcopy(obj), subresource, dry_run)
            except Conflict:
                if wanted_rv:
                    raise errors.conflict(res.plural, name, res.group) from None
        raise errors.conflict(res.plural, name, res.group)

    async def mutate(self, res: Resource, ns: str | None, name: str,
                     fn: Callable[[Obj], Obj | None], *, subresource: str | None = None,
                     dry_run: bool = False) -> Obj:
        """Read, apply ``fn`` to a copy, write; retried on conflict.  ``fn`` returning None
        means "no change"."""
        for _ in range(MAX_RETRIES):
            kv = await self.store.get(res.key(ns, name))
            if kv is None:
                raise errors.not_found(res.plural, name, res.group)
            current = decode(kv)
            new = fn(copy.deepcopy(current))
            if new is None:
                return current
            try:
                return await self._write(res, ns, kv, new, subresource, dry_run)
            except Conflict:
                continue
        raise errors.conflict(res.plural, name, res.group)

    async def _write(self, res: Resource, ns: str | None, kv: KeyValue, new: Obj,
                     subresource: str | None, dry_run: bool) -> Obj:
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
                res.strategy.prepare_for_update(new, old)
            md = new["metadata"]
            md.pop("resourceVersion", None)
            if res.strategy.spec_changed(new, old) and "generation" in omd:
                md["generation"] = int(omd.get("generation", 1)) + 1
            elif "generation" in omd:
                md["generation"] = omd["generation"]
            # Subresources (status, binding, finalize) change what plain updates may not.
            errs = res.strategy.validate_update(new, old) if subresource is None else []
            self._validate(res, new, errs)
        comparable = dict(old)
        comparable["metadata"] = {k: v for k, v in omd.items() if k != "resourceVersion"}
        if new == comparable:
            return old  # a no-op write keeps the resourceVersion, as in Kubernetes
        if dry_run:
            new["metadata"]["resourceVersion"] = omd["resourceVersion"]
            return new
        if md.get("deletionTimestamp") and not md.get("finalizers"):
            await self._remove(res, ns, kv)
            new["metadata"]["resourceVersion"] = omd["resourceVersion"]
            return new
        out = await self.store.update(kv.key, encode_bounded(res, new), kv.mod_revision)
        return decode(out)

    # --- patch --------------------------------------------------------------
    async def patch(self, res: Resource, ns: str | None, name: str, patch_type: str, body: Any, *,
                    subresource: str | None = None, manager: str = "", force: bool = False,
                    dry_run: bool = False) -> tuple[Obj, bool]:
        """Returns (object, created); only apply patches create."""
        if patch_type not in PATCH_TYPES:
            raise errors.unsupported_media_type(patch_type)
        for _ in range(MAX_RETRIES):
            kv = await self.store.get(res.key(ns, name))
            if kv is None:
                if patch_type != PATCH_APPLY or subresource:
                    raise errors.not_found(res.plural, name, res.group)
                return await self._apply_create(res, ns, name, body, manager, force, dry_run), True
            current = decode(kv)
            new = self._patched(res, current, patch_type, body, manager, force)
            if not isinstance(new, dict) or not isinstance(new.get("metadata", {}), dict):
                raise errors.bad_request(f"the patched {res.kind} is not an object with an object "
                                         "metadata: the patch replaces one with another type")
            wanted_rv = (new.get("metadata") or {}).get("resourceVersion")
            if wanted_rv and str(wanted_rv) != current["metadata"]["resourceVersion"]:
                raise errors.conflict(res.plural, name, res.group)
            try:
                return await self._write(res, ns, kv, new, subresource, dry_run), False
            except Conflict:
                if wanted_rv:
                    raise errors.conflict(res.plural, name, res.group) from None
        raise errors.conflict(res.plural, name, res.group)

    def _patched(self, res: Resource, current: Obj, patch_type: str, body: Any,
                 manager: str, force: bool) -> Obj:
        try:
            if patch_type == PATCH_JSON:
                if not isinstance(body, list):
                    raise PatchError("a JSON patch must be a list of operations")
                return json_patch(current, body)
            if not isinstance(body, dict):
                raise PatchError("the patch must be a JSON object")
            if patch_type == PATCH_MERGE:
                return json_merge_patch(current, body)
            if patch_type == PATCH_STRATEGIC:
                return strategic_merge_patch(current, body, res.kind)
            self._check_apply_kind(res, body)
            return server_side_apply(current, body, manager or "unknown", force, res.kind)
        except ApplyConflict as e:
            raise self._apply_conflict(res, meta.name_of(current), e) from None
        except PatchError as e:
            raise patch_refusal(e) from None

    @staticmethod
    def _apply_conflict(res: Resource, name: str, e: ApplyConflict) -> errors.APIError:
        causes = [{"reason": "FieldManagerConflict", "message": f'conflict with "{mgr}"', "field": field}
                  for field, mgr in e.conflicts]
        text = "; ".join(f'conflict with "{mgr}": {field}' for field, mgr in e.conflicts)
        err = errors.APIError(409, "Conflict", f"Apply failed with {len(causes)} conflict"
                              f"{'s' if len(causes) != 1 else ''}: {text}",
                              details={"name": name, "group": res.group, "kind": res.plural,
                                       "causes": causes})
        return err

    async def _apply_create(self, res: Resource, ns: str | None, name: str, body: Any,
                            manager: str, force: bool, dry_run: bool) -> Obj:
        if not isinstance(body, dict):
            raise errors.bad_request("the applied configuration must be an object")
        self._check_apply_kind(res, body)
        md = body.get("metadata") or {}
        if md.get("name") and md["name"] != name:
            raise errors.bad_request(f'the name of the object ({md["name"]}) does not match the name '
                                     f'on the URL ({name})')
        try:
            obj = server_side_apply(None, body, manager or "unknown", force, res.kind)
        except PatchError as e:
            raise errors.APIError(422, "Invalid", f"the applied configuration is invalid: {e}") from None
        obj.setdefault("metadata", {})["name"] = name
        return await self.create(res, ns, obj, dry_run=dry_run)

    # --- replace (kube32: pod moves) ------------------------------------------
    async def replace(self, res: Resource, ns: str | None, name: str, obj: Obj, *,
                      expected_uid: str, dry_run: bool = False) -> Obj:
        """Replace an object by a new incarnation in one write: same name, a new uid and
        creation time, status reset, written only if the current uid is ``expected_uid``.

        A pod move uses it so that no moment exists with zero or two pods of that name:
        owners count one pod at every step, and ``kubectl drain`` sees the uid change.
        """
        kv = await self.store.get(res.key(ns, name))
        if kv is None:
            raise errors.not_found(res.plural, name, res.group)
        old = decode(kv)
        if old["metadata"].get("uid") != expected_uid:
            raise errors.conflict(res.plural, name, res.group,
                                  f"Precondition failed: UID in precondition: {expected_uid}, "
                                  f"UID in object meta: {old['metadata'].get('uid')}")
        if old["metadata"].get("deletionTimestamp"):
            raise errors.conflict(res.plural, name, res.group, "the object is being deleted")
        new = copy.deepcopy(obj)
        self._check_kind(res, new)
        md = new.setdefault("metadata", {})
        md.update({"name": name, "uid": str(uuid.uuid4()), "creationTimestamp": meta.rfc3339()})
        if res.namespaced:
            md["namespace"] = ns
        for f in ("resourceVersion", "deletionTimestamp", "deletionGracePeriodSeconds", "generateName",
                  "managedFields"):
            md.pop(f, None)
        with malformed(res, name):
            res.strategy.prepare_for_create(new)
            md["generation"] = 1
            self._validate(res, new, res.strategy.validate(new))
        if dry_run:
            return new
        try:
            out = await self.store.update(kv.key, encode_bounded(res, new), kv.mod_revision)
        except Conflict:
            raise errors.conflict(res.plural, name, res.group) from None
        return decode(out)

    # --- delete -------------------------------------------------------------
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
            md = obj["metadata"]
            refusal = res.strategy.delete_refusal(obj)
            if refusal:
                raise errors.forbidden(f'{res.plural}{"." + res.group if res.group else ""} "{name}" is forbidden: '
                                       f"{refusal}")
            if pre.get("uid") and pre["uid"] != md.get("uid"):
                raise errors.conflict(res.plural, name, res.group,
                                      f"Precondition failed: UID in precondition: {pre['uid']}, "
                                      f"UID in object meta: {md.get('uid')}")
            if pre.get("resourceVersion") and str(pre["resourceVersion"]) != md["resourceVersion"]:
                raise errors.conflict(res.plural, name, res.group,
                                      f"Precondition failed: ResourceVersion in precondition: "
                                      f"{pre['resourceVersion']}, ResourceVersion in object meta: "
                                      f"{md['resourceVersion']}")
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
                    out = await self.store.update(kv.key, encode(marked), kv.mod_revision)
                    return decode(out), False
                hook = self.before_delete.get(res.plural)
                if hook:
                    await hook(res, obj)
                gone = await self._remove(res, ns, kv)
                return gone, True
            except Conflict:
                continue
        raise errors.conflict(res.plural, name, res.group)

    def _mark_for_deletion(self, res: Resource, obj: Obj, propagation: str | None,
                           grace: Any) -> Obj | None:
        """The object to store instead of deleting it, or None to delete now."""
        md = obj["metadata"]
        finalizers = list(md.get("finalizers") or [])
        if propagation == "Foreground" and "foregroundDeletion" not in finalizers:
            finalizers.append("foregroundDeletion")
        if propagation == "Orphan" and "orphan" not in finalizers:
            finalizers.append("orphan")
        graceful = self._grace_seconds(res, obj, grace)
        if res.plural == "namespaces" and (obj.get("spec") or {}).get("finalizers"):
            # The namespace controller empties it, then removes spec.finalizers via /finalize.
            new = copy.deepcopy(obj)
            new["metadata"].setdefault("deletionTimestamp", meta.rfc3339())
            new.setdefault("status", {})["phase"] = "Terminating"
            return new
        if not finalizers and not graceful:
            return None
        if md.get("deletionTimestamp") and finalizers == (md.get("finalizers") or []) and not graceful:
            return obj if finalizers else None
        new = copy.deepcopy(obj)
        nmd = new["metadata"]
        if finalizers:
            nmd["finalizers"] = finalizers
        if not nmd.get("deletionTimestamp"):
            nmd["deletionTimestamp"] = meta.rfc3339()
            if graceful:
                nmd["deletionGracePeriodSeconds"] = graceful
        elif graceful and graceful < int(nmd.get("deletionGracePeriodSeconds") or graceful + 1):
            nmd["deletionGracePeriodSeconds"] = graceful
        return new

    @staticmethod
    def _grace_seconds(res: Resource, obj: Obj, grace: Any) -> int:
        """Pods bound to a node end gracefully: the kubelet stops them and deletes with grace 0."""
        if res.plural != "pods" or not (obj.get("spec") or {}).get("nodeName"):
            return 0
        if (obj.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            return 0
        if grace is None:
            grace = (obj.get("spec") or {}).get("terminationGracePeriodSeconds", 30)
        try:
            return max(int(grace), 0)
        except (TypeError, ValueError):
            raise errors.bad_request("gracePeriodSeconds must be an integer") from None

    async def _remove(self, res: Resource, ns: str | None, kv: KeyValue) -> Obj:
        try:
            out = await self.store.delete(kv.key, kv.mod_revision)
        except KeyNotFound:
            raise errors.not_found(res.plural, kv.key.rsplit("/", 1)[-1], res.group) from None
        return decode(out)

    # --- watch --------------------------------------------------------------
    def _shared_decode(self, kv: KeyValue) -> Obj:
        """One decoded copy of a stored version for every watcher it reaches (each write
        fans out to the kubelets', the controllers' and users' watches).  Read-only: a
        watcher that changes an object copies it."""
        key = (kv.key, kv.mod_revision)
        obj = self._watch_objects.get(key)
        if obj is None:
            if len(self._watch_objects) >= WATCH_DECODED_KEPT:
                del self._watch_objects[next(iter(self._watch_objects))]
            obj = self._watch_objects[key] = decode(kv)
        return obj

    @staticmethod
    def _watch_prefix(res: Resource, ns: str | None, fields: FieldSelector | None) -> str:
        """The store prefix a watch needs: one object's key (and the keys it begins,
        which the selector then drops) for a watch on ``metadata.name=<name>``, so it is
        not woken by every write to its kind; else the kind's (namespace's) prefix."""
        name = fields.value_of("metadata.name") if fields is not None else None
        if name and (ns or not res.namespaced):
            return res.key(ns, name)
        return res.prefix(ns)

    async def watch(self, res: Resource, ns: str | None, labels: LabelSelector | None,
                    fields: FieldSelector | None, resource_version: str | None
                    ) -> AsyncIterator[tuple[str, Obj]]:
        """(type, object) pairs: ADDED/MODIFIED/DELETED as seen through the selectors.

        An object that starts or stops matching the selectors is ADDED or DELETED, as a
        Kubernetes watch cache does, so a kubelet watching ``spec.nodeName=X`` sees a pod
        that moved away as DELETED.
        """
        if resource_version in (None, "", "0"):
            items, start = await self.list(res, ns, labels, fields)
        else:
            items = []
            try:
                start = int(resource_version)
            except ValueError:
                raise errors.bad_request(f"invalid resource version: {resource_version!r}") from None
        # Subscribe before sending the synthetic ADDED events: the subscription starts at
        # the call, so nothing written while they go out is lost.
        stream = self.store.watch(self._watch_prefix(res, ns, fields), start)
        try:
            for obj in items:
                yield "ADDED", obj
            async for ev in stream:
                obj = self._shared_decode(ev.kv)
                prev = self._shared_decode(ev.prev) if ev.prev is not None else None
                was = prev is not None and self.matches(res, prev, labels, fields)
                if ev.type == "DELETE":
                    if was or (prev is None and self.matches(res, obj, labels, fields)):
                        yield "DELETED", obj
                    continue
                now = self.matches(res, obj, labels, fields)
                if now and was:
                    yield "MODIFIED", obj
                elif now:
                    yield "ADDED", obj
                elif was:
                    # As Kubernetes' watch cache: the previous content, at this event's
                    # revision, so a kubelet sees the uid it ran go away.
                    assert prev is not None
                    yield "DELETED", {**prev, "metadata": {**prev["metadata"],
                                                           "resourceVersion": obj["metadata"]["resourceVersion"]}}
        except Compacted as e:
            raise errors.gone(f"too old resource version: {start} ({e.compacted_revision})") from None
        finally:
            await stream.aclose()
