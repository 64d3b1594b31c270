"""What the workload kinds (Deployments, ReplicaSets, StatefulSets, DaemonSets, Jobs)
share in validation and printing: their selector must select their template's labels, and
kubectl's SELECTOR column.  Selectors match through kube32.matching alone."""
from __future__ import annotations

from typing import Any

from ...matching import SelectorError, parse_label_selector
from ..strategy import get_path


def selector_errors(spec: dict[str, Any], prefix: str) -> list[tuple[str, str]]:
    """``spec.selector`` is set, converts, and selects ``spec.template``'s labels, as
    kube-apiserver's ValidatePodTemplateSpecForReplicaSet / Job validation words it."""
    sel = spec.get("selector")
    if not isinstance(sel, dict) or not (sel.get("matchLabels") or sel.get("matchExpressions")):
        return [(f"{prefix}.selector", "Required value")]
    labels = get_path(spec, "template", "metadata", "labels", default={}) or {}
    try:
        if not parse_label_selector(sel).matches(labels):
            return [(f"{prefix}.template.metadata.labels",
                     f"Invalid value: {labels}: `selector` does not match template `labels`")]
    except SelectorError:
        return [(f"{prefix}.selector", "Invalid value: malformed selector")]
    return []


def selector_text(sel: Any) -> str:
    """The SELECTOR column (``-o wide``): its matchLabels as ``k=v,...``."""
    ml = (sel or {}).get("matchLabels") or {} if isinstance(sel, dict) else {}
    return ",".join(f"{k}={v}" for k, v in ml.items()) or "<none>"
