"""Nodes: cluster-scoped; the kubelet writes status (kept on create); kubectl's node columns."""
from __future__ import annotations

from typing import Any

from ... import objects
from ...terms import Annotation, Condition, KubeletScheme, Label
from .. import meta
from ..strategy import AGE_COLUMN, NAME_COLUMN, Column, Strategy, condition, get_path


def node_status_text(node: dict[str, Any]) -> str:
    # As kubectl's printNode: Ready when True, NotReady when False or Unknown, Unknown
    # only when the node never reported the condition.
    ready = condition(node, Condition.READY)
    if ready is None:
        text = "Unknown"
    elif ready.get("status") == "True":
        text = "Ready"
    else:
        text = "NotReady"
    if objects.spec(node).get("unschedulable"):
        text += ",SchedulingDisabled"
    return text


def node_roles(node: dict[str, Any]) -> str:
    prefix = Label.NODE_ROLE_PREFIX
    roles = sorted(k[len(prefix):] for k in objects.labels(node) if k.startswith(prefix))
    return ",".join(roles) or "<none>"


class NodeStrategy(Strategy):
    kind = "Node"
    keep_status_on_create = True
    selectable_fields = {"metadata.name", "spec.unschedulable"}
    columns = [NAME_COLUMN,
               Column("Status", description="The status of the node"),
               Column("Roles", description="The roles of the node"),
               AGE_COLUMN,
               Column("Version", description="Kubelet Version reported by the node."),
               Column("Internal-IP", priority=1, description="List of internal IPs for the node."),
               Column("External-IP", priority=1, description="List of external IPs for the node."),
               Column("OS-Image", priority=1, description="OS image reported by the node."),
               Column("Kernel-Version", priority=1, description="Kernel version reported by the node."),
               Column("Container-Runtime", priority=1, description="Container runtime and version."),
               # Not one of kubectl's: a Kube32 node's CPU matters (its engine runs on it).
               Column("Architecture", priority=1, description="The CPU architecture reported by the node.")]

    def validate(self, obj: dict[str, Any]) -> list[tuple[str, str]]:
        # The node's own word on how the API server reaches its kubelet (the API server
        # checks it again, with the address and port, each time it dials:
        # kube32.apiserver.proxy.kubelet_endpoint).
        scheme = objects.annotations(obj).get(Annotation.KUBELET_SCHEME)
        if scheme is not None and scheme not in KubeletScheme.ALL:
            return [(f"metadata.annotations[{Annotation.KUBELET_SCHEME}]",
                     f'Unsupported value: "{scheme}": supported values: "http", "https"')]
        return []

    def extra_fields(self, obj: dict[str, Any]) -> dict[str, str]:
        return {"spec.unschedulable": str(bool(objects.spec(obj).get("unschedulable"))).lower()}

    def row(self, obj: dict[str, Any]) -> list[Any]:
        addrs = get_path(obj, "status", "addresses", default=[]) or []

        def ip(kind: str) -> str:
            return ",".join(a.get("address", "") for a in addrs if a.get("type") == kind) or "<none>"
        info = get_path(obj, "status", "nodeInfo", default={}) or {}
        return [objects.name(obj), node_status_text(obj), node_roles(obj), meta.age(obj),
                info.get("kubeletVersion", ""), ip("InternalIP"), ip("ExternalIP"),
                info.get("osImage", "<unknown>"), info.get("kernelVersion", "<unknown>"),
                info.get("containerRuntimeVersion", "<unknown>"), info.get("architecture", "<unknown>")]
