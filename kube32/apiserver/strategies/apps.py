"""Deployments, ReplicaSets and DaemonSets: selectors, defaults, columns, scale."""
from __future__ import annotations

from typing import Any

from ... import objects
from .. import meta
from ..strategy import AGE_COLUMN, NAME_COLUMN, Column, Strategy, get_path
from .workload import selector_errors, selector_text
from .pod import default_pod_spec, pod_spec_warnings, unknown_pod_spec_fields, validate_pod_spec


class _WorkloadStrategy(Strategy):
    has_replicas = True

    def default(self, obj: dict[str, Any]) -> None:
        spec = obj.setdefault("spec", {})
        if self.has_replicas:
            spec.setdefault("replicas", 1)
        spec.setdefault("revisionHistoryLimit", 10)
        tmpl_spec = get_path(spec, "template", "spec")
        if isinstance(tmpl_spec, dict):
            default_pod_spec(tmpl_spec)

    def unknown_nested(self, obj: dict[str, Any]) -> list[str]:
        return unknown_pod_spec_fields(get_path(obj, "spec", "template", "spec"), "spec.template.spec")

    def validate(self, obj: dict[str, Any]) -> list[tuple[str, str]]:
        spec = obj.get("spec")
        if not isinstance(spec, dict):
            return [("spec", "Required value")]
        errs = selector_errors(spec, "spec")
        if self.has_replicas:
            r = spec.get("replicas", 1)
            if not isinstance(r, int) or r < 0:
                errs.append(("spec.replicas", f"Invalid value: {r}: must be greater than or equal to 0"))
        errs += validate_pod_spec(get_path(spec, "template", "spec"), "spec.template.spec")
        return errs

    def warnings(self, obj: dict[str, Any]) -> list[str]:
        return pod_spec_warnings(get_path(obj.get("spec"), "template", "spec"), "spec.template.spec")

    def validate_update(self, new: dict[str, Any], old: dict[str, Any]) -> list[tuple[str, str]]:
        errs = self.validate(new)
        if get_path(new, "spec", "selector") != get_path(old, "spec", "selector"):
            errs.append(("spec.selector", "Invalid value: field is immutable"))
        return errs


def _images(obj: dict[str, Any]) -> tuple[str, str]:
    cs = get_path(obj, "spec", "template", "spec", "containers", default=[]) or []
    return ",".join(c.get("name", "") for c in cs), ",".join(c.get("image", "") for c in cs)


def _selector_text(obj: dict[str, Any]) -> str:
    return selector_text(get_path(obj, "spec", "selector"))


class DeploymentStrategy(_WorkloadStrategy):
    kind = "Deployment"
    columns = [NAME_COLUMN, Column("Ready"), Column("Up-to-date", type="integer"),
               Column("Available", type="integer"), AGE_COLUMN, Column("Containers", priority=1),
               Column("Images", priority=1), Column("Selector", priority=1)]

    def default(self, obj: dict[str, Any]) -> None:
        super().default(obj)
        strategy = obj["spec"].setdefault("strategy", {"type": "RollingUpdate"})
        if strategy.get("type", "RollingUpdate") == "RollingUpdate":
            strategy.setdefault("type", "RollingUpdate")
            ru = strategy.setdefault("rollingUpdate", {})
            ru.setdefault("maxSurge", "25%")
            ru.setdefault("maxUnavailable", "25%")
        obj["spec"].setdefault("progressDeadlineSeconds", 600)

    def row(self, obj: dict[str, Any]) -> list[Any]:
        st = objects.status(obj)
        names, images = _images(obj)
        return [objects.name(obj), f"{st.get('readyReplicas', 0)}/{get_path(obj, 'spec', 'replicas', default=1)}",
                st.get("updatedReplicas", 0), st.get("availableReplicas", 0), meta.age(obj),
                names, images, _selector_text(obj)]


class ReplicaSetStrategy(_WorkloadStrategy):
    kind = "ReplicaSet"
    columns = [NAME_COLUMN, Column("Desired", type="integer"), Column("Current", type="integer"),
               Column("Ready", type="integer"), AGE_COLUMN, Column("Containers", priority=1),
               Column("Images", priority=1), Column("Selector", priority=1)]

    def row(self, obj: dict[str, Any]) -> list[Any]:
        st = objects.status(obj)
        names, images = _images(obj)
        return [objects.name(obj), get_path(obj, "spec", "replicas", default=1), st.get("replicas", 0),
                st.get("readyReplicas", 0), meta.age(obj), names, images, _selector_text(obj)]


class DaemonSetStrategy(_WorkloadStrategy):
    kind = "DaemonSet"
    has_replicas = False
    columns = [NAME_COLUMN, Column("Desired", type="integer"), Column("Current", type="integer"),
               Column("Ready", type="integer"), Column("Up-to-date", type="integer"),
               Column("Available", type="integer"), Column("Node Selector"), AGE_COLUMN,
               Column("Containers", priority=1), Column("Images", priority=1), Column("Selector", priority=1)]

    def default(self, obj: dict[str, Any]) -> None:
        super().default(obj)
        obj["spec"].setdefault("updateStrategy", {"type": "RollingUpdate",
                                                  "rollingUpdate": {"maxUnavailable": 1, "maxSurge": 0}})

    def row(self, obj: dict[str, Any]) -> list[Any]:
        st = objects.status(obj)
        ns = get_path(obj, "spec", "template", "spec", "nodeSelector", default={}) or {}
        names, images = _images(obj)
        return [objects.name(obj), st.get("desiredNumberScheduled", 0), st.get("currentNumberScheduled", 0),
                st.get("numberReady", 0), st.get("updatedNumberScheduled", 0), st.get("numberAvailable", 0),
                ",".join(f"{k}={v}" for k, v in ns.items()) or "<none>", meta.age(obj), names, images,
                _selector_text(obj)]


class PodDisruptionBudgetStrategy(Strategy):
    kind = "PodDisruptionBudget"
    columns = [NAME_COLUMN, Column("Min Available"), Column("Max Unavailable"),
               Column("Allowed Disruptions", type="integer"), AGE_COLUMN]

    def row(self, obj: dict[str, Any]) -> list[Any]:
        spec, st = objects.spec(obj), objects.status(obj)
        return [objects.name(obj), str(spec.get("minAvailable", "N/A")), str(spec.get("maxUnavailable", "N/A")),
                st.get("disruptionsAllowed", 0), meta.age(obj)]


class ControllerRevisionStrategy(Strategy):
    """A ControllerRevision: one recorded state of a DaemonSet's template (``data``, the patch
    that brings it back) and its ``revision`` number; ``data`` is immutable, as Kubernetes'."""
    kind = "ControllerRevision"
    has_status = False
    top_fields = {"data", "revision"}
    spec_fields = ("data",)
    columns = [NAME_COLUMN, Column("Controller"), Column("Revision", type="integer"), AGE_COLUMN]

    def validate(self, obj: dict[str, Any]) -> list[tuple[str, str]]:
        rev = obj.get("revision")
        if isinstance(rev, bool) or not isinstance(rev, int) or rev < 0:
            return [("revision", f"Invalid value: {rev}: must be greater than or equal to 0")]
        if obj.get("data") is not None and not isinstance(obj.get("data"), dict):
            return [("data", "Invalid value: must be an object")]
        return []

    def validate_update(self, new: dict[str, Any], old: dict[str, Any]) -> list[tuple[str, str]]:
        errs = self.validate(new)
        if new.get("data") != old.get("data"):
            errs.append(("data", "Invalid value: field is immutable"))
        return errs

    def row(self, obj: dict[str, Any]) -> list[Any]:
        ref = objects.controller_ref(obj)
        owner = "<none>"
        if ref is not None:
            api = str(ref.get("apiVersion", ""))
            group = f".{api.partition('/')[0]}" if "/" in api else ""
            owner = f"{str(ref.get('kind', '')).lower()}{group}/{ref.get('name', '')}"
        return [objects.name(obj), owner, obj.get("revision", 0), meta.age(obj)]
