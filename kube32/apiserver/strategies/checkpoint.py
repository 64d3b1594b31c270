"""kube32.io/v1 Checkpoints: spec validation, status only through /status, the spec's columns.

Every Checkpoint is created with the finalizer ``kube32.io/checkpoint-protection``
(:data:`kube32.terms.Finalizer.CHECKPOINT_PROTECTION`), as Kubernetes' admission gives a
PersistentVolumeClaim ``kubernetes.io/pvc-protection``: a delete only marks it, and the
Checkpoint controller lets it go once no move of it is under way and no pod's
``kube32.io/restore-from`` names it, so a pod restoring from it never finds it gone.  Its
data goes with the object (kube32.apiserver.checkpointdata).
"""
from __future__ import annotations

from typing import Any

from ... import movability, objects
from ...terms import CheckpointAction, CheckpointPhase, Finalizer
from .. import meta
from ..strategy import AGE_COLUMN, NAME_COLUMN, Column, Strategy, get_path

PHASES = CheckpointPhase.ALL
SPEC_FIELDS = {"podName", "containerName", "action", "target"}
TARGET_FIELDS = {"nodeName", "nodeSelector"}


def size_text(n: Any) -> str:
    """Sizes as Kubernetes quantities print them: 12Ki, 3Mi, 512."""
    if not isinstance(n, int):
        return ""
    for unit, factor in (("Gi", 1 << 30), ("Mi", 1 << 20), ("Ki", 1 << 10)):
        if n >= factor:
            value = n / factor
            return f"{value:.0f}{unit}" if value >= 10 or value == int(value) else f"{value:.1f}{unit}"
    return str(n)


class CheckpointStrategy(Strategy):
    kind = "Checkpoint"
    columns = [NAME_COLUMN, Column("Pod"), Column("Action"), Column("Phase"), Column("Node"),
               Column("Size"), AGE_COLUMN, Column("Target", priority=1), Column("New Pod", priority=1),
               Column("Message", priority=1)]
    selectable_fields = {"metadata.name", "metadata.namespace", "spec.podName", "status.phase", "status.targetNode"}

    def default_status(self, obj: dict[str, Any]) -> dict[str, Any]:
        return {"phase": CheckpointPhase.PENDING}

    def prepare_for_create(self, obj: dict[str, Any]) -> None:
        super().prepare_for_create(obj)
        md = obj.setdefault("metadata", {})
        finalizers = md.get("finalizers")
        if isinstance(finalizers, list) and Finalizer.CHECKPOINT_PROTECTION not in finalizers:
            md["finalizers"] = [*finalizers, Finalizer.CHECKPOINT_PROTECTION]
        elif finalizers is None:
            md["finalizers"] = [Finalizer.CHECKPOINT_PROTECTION]

    def default(self, obj: dict[str, Any]) -> None:
        spec = obj.get("spec")
        if isinstance(spec, dict):
            spec.setdefault("action", CheckpointAction.SAVE)

    def unknown_nested(self, obj: dict[str, Any]) -> list[str]:
        spec = obj.get("spec")
        if not isinstance(spec, dict):
            return []
        bad = [f"spec.{k}" for k in spec if k not in SPEC_FIELDS]
        if isinstance(spec.get("target"), dict):
            bad += [f"spec.target.{k}" for k in spec["target"] if k not in TARGET_FIELDS]
        return bad

    def validate(self, obj: dict[str, Any]) -> list[tuple[str, str]]:
        spec = obj.get("spec")
        if not isinstance(spec, dict):
            return [("spec", "Required value")]
        errs = []
        pod = spec.get("podName")
        if not pod:
            errs.append(("spec.podName", "Required value"))
        elif not isinstance(pod, str) or not meta.DNS1123_SUBDOMAIN.match(pod):
            errs.append(("spec.podName", f'Invalid value: "{pod}": {meta.SUBDOMAIN_MSG}'))
        action = spec.get("action", CheckpointAction.SAVE)
        if action not in CheckpointAction.ALL:
            errs.append(("spec.action", f'Unsupported value: "{action}": supported values: "Save", "Move"'))
        target = spec.get("target")
        if target is not None:
            if not isinstance(target, dict):
                errs.append(("spec.target", "Invalid value: must be an object"))
            else:
                if action != CheckpointAction.MOVE:
                    errs.append(("spec.target", "Forbidden: a target applies only to action Move"))
                if target.get("nodeName") and target.get("nodeSelector"):
                    errs.append(("spec.target", "Invalid value: give nodeName or nodeSelector, not both"))
                sel = target.get("nodeSelector")
                if sel is not None and (not isinstance(sel, dict)
                                        or not all(isinstance(v, str) for v in sel.values())):
                    errs.append(("spec.target.nodeSelector", "Invalid value: must be a map of strings"))
        return errs

    def validate_update(self, new: dict[str, Any], old: dict[str, Any]) -> list[tuple[str, str]]:
        errs = self.validate(new)
        if new.get("spec") != old.get("spec"):
            errs.append(("spec", "Invalid value: field is immutable"))
        return errs

    def extra_fields(self, obj: dict[str, Any]) -> dict[str, str]:
        return {"spec.podName": get_path(obj, "spec", "podName", default="") or "",
                "status.phase": get_path(obj, "status", "phase", default="") or "",
                "status.targetNode": get_path(obj, "status", "targetNode", default="") or ""}

    def row(self, obj: dict[str, Any]) -> list[Any]:
        spec, st = objects.spec(obj), objects.status(obj)
        lost = movability.data_gone(obj)  # its data is gone: SIZE says none, MESSAGE why
        size = "<none>" if lost is not None else size_text(st.get("sizeBytes"))
        message = "; ".join(m for m in (st.get("message"), (lost or {}).get("message")) if m)
        return [objects.name(obj), spec.get("podName", ""), spec.get("action", CheckpointAction.SAVE),
                st.get("phase", CheckpointPhase.PENDING), st.get("nodeName") or "", size,
                meta.age(obj), st.get("targetNode") or "", st.get("newPodName") or "", message]
