"""The per-kind behaviour of the generic registry (as Kubernetes' ``strategy.go``).

A :class:`Strategy` says what is special about a kind: defaults and status
handling on create and update, validation, the fields a field selector may
name, and the columns of its server-side Table.  The registry does everything
else the same way for every kind.  Invariants a strategy keeps:

* ``prepare_for_create`` and ``prepare_for_update`` keep ``status`` out of
  object writes when the kind has a status subresource; status changes only
  through ``/status`` (``prepare_for_status_update`` keeps everything else).
* ``validate`` returns (field, message) pairs; an empty list means valid.
  ``validate_async`` is for checks that must run off the event loop (CEL rules).
"""
from __future__ import annotations

from .jsoncopy import copy_json
from dataclasses import dataclass
from typing import Any, ClassVar

from .. import objects
from . import meta


@dataclass(frozen=True)
class Column:
    name: str
    type: str = "string"
    format: str = ""
    priority: int = 0
    description: str = ""

    def definition(self) -> dict[str, Any]:
        return {"name": self.name, "type": self.type, "format": self.format,
                "description": self.description, "priority": self.priority}


NAME_COLUMN = Column("Name", format="name", description="Name must be unique within a namespace.")
AGE_COLUMN = Column("Age", description="CreationTimestamp is a timestamp representing the server "
                    "time when this object was created.")

# Top-level fields every kind accepts, for strict field validation.
COMMON_TOP = {"apiVersion", "kind", "metadata"}
METADATA_FIELDS = {"name", "generateName", "namespace", "uid", "resourceVersion", "generation",
                   "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds",
                   "labels", "annotations", "ownerReferences", "finalizers", "managedFields",
                   "selfLink"}


class Strategy:
    kind: ClassVar[str] = ""
    has_status: ClassVar[bool] = True
    keep_status_on_create: ClassVar[bool] = False
    name_rule: ClassVar[str] = "subdomain"  # or "label" or "any"
    top_fields: ClassVar[set[str]] = {"spec", "status"}
    columns: ClassVar[list[Column]] = [NAME_COLUMN, AGE_COLUMN]
    selectable_fields: ClassVar[set[str]] = set()
    spec_fields: ClassVar[tuple[str, ...]] = ("spec",)
    # A built-in kind's body is decoded into typed fields in kube-apiserver, where a null
    # member is the field unset (then defaulted): the registry drops nulls before the
    # strategy sees the object.  A custom resource keeps what its schema allows.
    typed: ClassVar[bool] = True

    # --- writes -----------------------------------------------------------
    def prepare_for_create(self, obj: dict[str, Any]) -> None:
        if self.has_status and not self.keep_status_on_create:
            obj.pop("status", None)
            default = self.default_status(obj)
            if default is not None:
                obj["status"] = default
        self.default(obj)

    def default_status(self, obj: dict[str, Any]) -> dict[str, Any] | None:
        return None

    def default(self, obj: dict[str, Any]) -> None:
        """Fill defaults of the spec, as Kubernetes' defaulting functions."""

    def prepare_for_update(self, new: dict[str, Any], old: dict[str, Any]) -> None:
        if self.has_status:
            if "status" in old:
                new["status"] = copy_json(old["status"])
            else:
                new.pop("status", None)
        self.default(new)

    def prepare_for_status_update(self, new: dict[str, Any], old: dict[str, Any]) -> None:
        """A status write changes the status alone; its managedFields are kept (a
        server-side apply to /status records its manager in them)."""
        status = new.get("status")
        managed = (new.get("metadata") or {}).get("managedFields")
        keep = copy_json(old)
        new.clear()
        new.update(keep)
        if managed is not None:
            new.setdefault("metadata", {})["managedFields"] = managed
        if status is not None:
            new["status"] = status
        else:
            new.pop("status", None)

    def spec_changed(self, new: dict[str, Any], old: dict[str, Any]) -> bool:
        return any(new.get(f) != old.get(f) for f in self.spec_fields)

    # --- validation ---------------------------------------------------------
    def validate(self, obj: dict[str, Any]) -> list[tuple[str, str]]:
        return []

    def validate_update(self, new: dict[str, Any], old: dict[str, Any]) -> list[tuple[str, str]]:
        return self.validate(new)

    async def validate_async(self, new: dict[str, Any], old: dict[str, Any] | None) -> list[tuple[str, str]]:
        """Checks too slow for the event loop (a CRD's CEL rules), after ``validate`` passed, on
        every write (``old``: None on a create), status and scale writes too."""
        return []

    # Finalizers a deletion of the kind always starts with (added then if an update removed
    # them: a CRD's cleanup of its objects, as apiextensions' Delete adds it).
    delete_finalizers: tuple[str, ...] = ()

    def delete_refusal(self, obj: dict[str, Any]) -> str | None:
        """Why ``obj`` may never be deleted (403, before anything is written), or None."""
        return None

    def verb_refusal(self, plural: str) -> str:
        """The words of a 405 for a verb the resource table does not give the kind."""
        return "the server does not allow this method on the requested resource"

    def warnings(self, obj: dict[str, Any]) -> list[str]:
        """What a client should hear about an object it writes (kubectl prints "Warning: ...")."""
        return []

    def unknown_fields(self, obj: dict[str, Any]) -> list[str]:
        """Paths of fields the kind does not have (for fieldValidation=Strict)."""
        allowed = COMMON_TOP | self.top_fields
        bad = [k for k in obj if k not in allowed]
        md = obj.get("metadata")
        if isinstance(md, dict):
            bad += [f"metadata.{k}" for k in md if k not in METADATA_FIELDS]
        return bad + self.unknown_nested(obj)

    def unknown_nested(self, obj: dict[str, Any]) -> list[str]:
        return []

    # --- reads --------------------------------------------------------------
    def fields(self, obj: dict[str, Any]) -> dict[str, str]:
        """Values of the fields a field selector may name."""
        md = objects.meta(obj)
        out = {"metadata.name": md.get("name", ""), "metadata.namespace": md.get("namespace", "")}
        out.update(self.extra_fields(obj))
        return out

    def extra_fields(self, obj: dict[str, Any]) -> dict[str, str]:
        return {}

    def row(self, obj: dict[str, Any]) -> list[Any]:
        return [objects.name(obj), meta.age(obj)]


def get_path(obj: Any, *path: str | int, default: Any = None) -> Any:
    cur = obj
    for p in path:
        if isinstance(p, int):
            if not isinstance(cur, list) or p >= len(cur):
                return default
            cur = cur[p]
        else:
            if not isinstance(cur, dict) or p not in cur:
                return default
            cur = cur[p]
    return cur


def condition(obj: dict[str, Any], ctype: str) -> dict[str, Any] | None:
    for c in get_path(obj, "status", "conditions", default=[]) or []:
        if isinstance(c, dict) and c.get("type") == ctype:
            return c
    return None
