"""Namespaces: names are DNS-1123 labels; phase Active until deletion, then Terminating."""
from __future__ import annotations

from typing import Any

from .. import meta
from ..strategy import AGE_COLUMN, NAME_COLUMN, Column, Strategy

# As Kubernetes' NamespaceLifecycle admission: these are never deleted (deleting "default"
# would delete every pod and Checkpoint in it).
IMMORTAL = ("default", "kube-system", "kube-public")


class NamespaceStrategy(Strategy):
    kind = "Namespace"
    name_rule = "label"
    columns = [NAME_COLUMN, Column("Status", description="The status of the namespace"), AGE_COLUMN]
    selectable_fields = {"metadata.name", "status.phase"}

    def default_status(self, obj: dict[str, Any]) -> dict[str, Any]:
        return {"phase": "Active"}

    def default(self, obj: dict[str, Any]) -> None:
        obj.setdefault("spec", {}).setdefault("finalizers", ["kubernetes"])
        obj["metadata"].setdefault("labels", {})["kubernetes.io/metadata.name"] = meta.name_of(obj)

    def delete_refusal(self, obj: dict[str, Any]) -> str | None:
        return "this namespace may not be deleted" if meta.name_of(obj) in IMMORTAL else None

    def extra_fields(self, obj: dict[str, Any]) -> dict[str, str]:
        return {"status.phase": (obj.get("status") or {}).get("phase", "")}

    def row(self, obj: dict[str, Any]) -> list[Any]:
        return [meta.name_of(obj), (obj.get("status") or {}).get("phase", "Active"), meta.age(obj)]
