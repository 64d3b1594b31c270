"""Small typed accessors for API objects as plain dicts, and their timestamps.

Objects travel as the JSON the API serves (``dict``), everywhere: the registry, the
informers' caches, the kubelet.  A field that is missing, null or not an object reads as
empty here - ``spec(pod)`` is ``{}`` for a pod without a spec - so a reader never needs
the ``(x.get("spec") or {})`` chain and never fails on a body of the wrong shape.  The
accessors read; what they return is the object's own dict (writes to it land in the
object) except where the field is missing, when it is a fresh empty one.

Timestamps are RFC 3339 in UTC, to the second (``metadata.creationTimestamp``, condition
times) or the microsecond (``MicroTime``: Leases, Events).

Imports nothing else of Kube32.  (No ``from __future__ import annotations``: the
accessor :func:`annotations` would shadow it.)
"""
import datetime as _dt
from typing import Any

Obj = dict[str, Any]


def _dict(obj: Any, key: str) -> Obj:
    value = obj.get(key) if isinstance(obj, dict) else None
    return value if isinstance(value, dict) else {}


def meta(obj: Obj | None) -> Obj:
    return _dict(obj, "metadata")


def spec(obj: Obj | None) -> Obj:
    return _dict(obj, "spec")


def status(obj: Obj | None) -> Obj:
    return _dict(obj, "status")


def labels(obj: Obj | None) -> dict[str, str]:
    return _dict(meta(obj), "labels")


def annotations(obj: Obj | None) -> dict[str, str]:
    return _dict(meta(obj), "annotations")


def name(obj: Obj) -> str:
    return meta(obj).get("name") or ""


def namespace(obj: Obj) -> str:
    """The object's namespace, "" for a cluster-scoped one."""
    return meta(obj).get("namespace") or ""


def uid(obj: Obj) -> str:
    return meta(obj).get("uid") or ""


def phase(obj: Obj) -> str | None:
    """``status.phase``."""
    return status(obj).get("phase")


def node_name(pod: Obj) -> str | None:
    """``spec.nodeName``: the node a pod is bound to, None while it is not."""
    return spec(pod).get("nodeName") or None


def condition(obj: Obj, ctype: str) -> Obj | None:
    """The status condition of type ``ctype``, if any."""
    for c in status(obj).get("conditions") or []:
        if isinstance(c, dict) and c.get("type") == ctype:
            return c
    return None


def condition_status(obj: Obj, ctype: str) -> str | None:
    """``"True"``, ``"False"``, ``"Unknown"`` or None (no such condition)."""
    c = condition(obj, ctype)
    return None if c is None else c.get("status")


def is_true(obj: Obj, ctype: str) -> bool:
    return condition_status(obj, ctype) == "True"


def pointer(*tokens: str) -> str:
    """The JSON pointer (RFC 6901) of a field, for a JSON patch: ``pointer("metadata",
    "annotations", "a/b")`` is ``/metadata/annotations/a~1b``."""
    return "".join("/" + t.replace("~", "~0").replace("/", "~1") for t in tokens)


def controller_ref(obj: Obj) -> Obj | None:
    """The owner reference marked ``controller``, if any."""
    for ref in meta(obj).get("ownerReferences") or []:
        if isinstance(ref, dict) and ref.get("controller"):
            return ref
    return None


# --- timestamps -------------------------------------------------------------------
def now() -> _dt.datetime:
    return _dt.datetime.now(_dt.timezone.utc)


def rfc3339(t: _dt.datetime | None = None) -> str:
    return (t or now()).strftime("%Y-%m-%dT%H:%M:%SZ")


def micro_time(t: _dt.datetime | None = None) -> str:
    return (t or now()).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_time(text: str | None) -> _dt.datetime | None:
    """An RFC 3339 timestamp, None when missing or not one."""
    if not text or not isinstance(text, str):
        return None
    try:
        return _dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
