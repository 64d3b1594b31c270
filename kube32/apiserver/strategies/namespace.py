"""Namespaces: names are DNS-1123 labels; phase Active until deletion, then Terminating."""
from __future__ import annotations

from typing import Any

from ... import objects
from ...terms import Label, NamespacePhase
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
        return {"phase": NamespacePhase.ACTIVE}

    def default(self, obj: dict[str, Any]) -> None:
        obj.setdefault("spec", {}).setdefault("finalizers", ["kubernetes"])
        obj["metadata"].setdefault("labels", {})[Label.NAMESPACE_NAME] = objects.name(obj)

    def delete_refusal(self, obj: dict[str, Any]) -> str | None:
        return "this namespace may not be deleted" if objects.name(obj) in IMMORTAL else None

    def extra_fields(self, obj: dict[str, Any]) -> dict[str, str]:
        return {"status.phase": objects.status(obj).get("phase", "")}

    def row(self, obj: dict[str, Any]) -> list[Any]:
        return [objects.name(obj), objects.status(obj).get("phase", NamespacePhase.ACTIVE), meta.age(obj)]
