"""Kinds with few rules beyond their columns: ConfigMaps and Secrets (string, or base64,
values; at most 1 MiB of data each, as Kubernetes - a control plane on a board has far
less), Leases, Events."""
from __future__ import annotations

import base64
import binascii
from typing import Any

from ... import objects
from .. import meta
from ..strategy import AGE_COLUMN, NAME_COLUMN, Column, Strategy, get_path


MAX_DATA_BYTES = 1 << 20  # a ConfigMap's or Secret's data, as Kubernetes (core.MaxSecretSize)
TOO_LONG = f"Too long: must have at most {MAX_DATA_BYTES} bytes"


def _decoded(value: Any) -> bytes | None:
    """A base64 value's bytes, or None when it is not base64."""
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, TypeError, ValueError):
        return None


class ConfigMapStrategy(Strategy):
    kind = "ConfigMap"
    has_status = False
    top_fields = {"data", "binaryData", "immutable"}
    columns = [NAME_COLUMN, Column("Data", type="integer"), AGE_COLUMN]

    def validate(self, obj: dict[str, Any]) -> list[tuple[str, str]]:
        errs = []
        for field in ("data", "binaryData"):
            val = obj.get(field)
            if val is not None and not isinstance(val, dict):
                errs.append((field, "Invalid value: must be a map of strings"))
            for k, v in (val or {}).items() if isinstance(val, dict) else ():
                if not isinstance(v, str):
                    errs.append((f"{field}[{k}]", "Invalid value: must be a string"))
        if not errs:
            total = sum(len(k) + len(v.encode()) for k, v in (obj.get("data") or {}).items()) + \
                sum(len(k) + len(_decoded(v) or b"") for k, v in (obj.get("binaryData") or {}).items())
            if total > MAX_DATA_BYTES:
                errs.append(("", TOO_LONG))
        return errs

    def row(self, obj: dict[str, Any]) -> list[Any]:
        n = len(obj.get("data") or {}) + len(obj.get("binaryData") or {})
        return [objects.name(obj), n, meta.age(obj)]


class SecretStrategy(Strategy):
    kind = "Secret"
    has_status = False
    top_fields = {"data", "stringData", "type", "immutable"}
    columns = [NAME_COLUMN, Column("Type"), Column("Data", type="integer"), AGE_COLUMN]
    selectable_fields = {"metadata.name", "metadata.namespace", "type"}

    def default(self, obj: dict[str, Any]) -> None:
        string_data = obj.pop("stringData", None)
        if isinstance(string_data, dict):
            data = obj.setdefault("data", {})
            for k, v in string_data.items():
                data[k] = base64.b64encode(str(v).encode()).decode()
        obj.setdefault("type", "Opaque")

    def validate(self, obj: dict[str, Any]) -> list[tuple[str, str]]:
        errs = []
        total = 0
        for k, v in (obj.get("data") or {}).items():
            value = _decoded(v)  # each value decoded once: checked and counted
            if value is None:
                errs.append((f"data[{k}]", "Invalid value: must be base64-encoded"))
            else:
                total += len(value)
        if total > MAX_DATA_BYTES:
            errs.append(("data", TOO_LONG))
        return errs

    def extra_fields(self, obj: dict[str, Any]) -> dict[str, str]:
        return {"type": obj.get("type", "")}

    def row(self, obj: dict[str, Any]) -> list[Any]:
        return [objects.name(obj), obj.get("type", "Opaque"), len(obj.get("data") or {}), meta.age(obj)]


class LeaseStrategy(Strategy):
    kind = "Lease"
    has_status = False
    columns = [NAME_COLUMN, Column("Holder"), AGE_COLUMN]

    def row(self, obj: dict[str, Any]) -> list[Any]:
        return [objects.name(obj), get_path(obj, "spec", "holderIdentity", default="") or "", meta.age(obj)]


class EventStrategy(Strategy):
    kind = "Event"
    has_status = False
    name_rule = "subdomain"
    top_fields = {"involvedObject", "reason", "message", "source", "firstTimestamp", "lastTimestamp",
                  "count", "type", "eventTime", "series", "action", "related", "reportingComponent",
                  "reportingInstance"}
    columns = [Column("Last Seen"), Column("Type"), Column("Reason"), Column("Object"),
               Column("Subobject", priority=1), Column("Source", priority=1), Column("Message"),
               Column("First Seen", priority=1), Column("Count", priority=1), Column("Name", priority=1)]
    selectable_fields = {"metadata.name", "metadata.namespace", "involvedObject.kind",
                         "involvedObject.namespace", "involvedObject.name", "involvedObject.uid",
                         "involvedObject.apiVersion", "involvedObject.resourceVersion",
                         "involvedObject.fieldPath", "reason", "reportingComponent", "source", "type"}

    def extra_fields(self, obj: dict[str, Any]) -> dict[str, str]:
        io = obj.get("involvedObject") or {}
        out = {f"involvedObject.{k}": str(io.get(k, "")) for k in
               ("kind", "namespace", "name", "uid", "apiVersion", "resourceVersion", "fieldPath")}
        out.update({"reason": obj.get("reason", ""), "type": obj.get("type", ""),
                    "reportingComponent": obj.get("reportingComponent", ""),
                    "source": (obj.get("source") or {}).get("component", "")})
        return out

    def row(self, obj: dict[str, Any]) -> list[Any]:
        io = obj.get("involvedObject") or {}
        last = obj.get("lastTimestamp") or obj.get("eventTime") or objects.meta(obj).get("creationTimestamp")
        first = obj.get("firstTimestamp") or obj.get("eventTime")
        src = obj.get("source") or {}
        return [meta.age(obj, last), obj.get("type", ""), obj.get("reason", ""),
                f"{(io.get('kind') or '').lower()}/{io.get('name', '')}", io.get("fieldPath", ""),
                ", ".join(v for v in (src.get("component"), src.get("host")) if v),
                obj.get("message", ""), meta.age(obj, first), obj.get("count", 1), objects.name(obj)]


class NotRunStrategy(Strategy):
    """A common Kubernetes kind that Kube32 does not run (StatefulSets, volumes, Ingresses,
    metric autoscalers): served for reading only, always empty, so that clients which
    sweep every common kind (``kubectl apply --prune``'s default list, ``kubectl get
    all``, Helm's lookups) work; a write is refused (405) with ``why``."""
    has_status = False

    def __init__(self, kind: str, why: str) -> None:
        self.kind = kind   # type: ignore[misc]
        self.why = why

    def verb_refusal(self, plural: str) -> str:
        return f"Kube32 does not run {plural}: {self.why}"
