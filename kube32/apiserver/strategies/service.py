"""Services, Endpoints and EndpointSlices: ClusterIP allocation is nominal in the sim."""
from __future__ import annotations

import hashlib
import json
from typing import Any

from ... import holding, objects
from ...terms import Annotation
from .. import meta
from ..strategy import AGE_COLUMN, NAME_COLUMN, Column, Strategy, get_path

NODE_PORT_TYPES = ("NodePort", "LoadBalancer")   # Service types every node answers on a port


def node_ports(svc: dict[str, Any] | None) -> set[int]:
    """The nodePorts a Service holds: those of its ports, if its type has them."""
    spec = objects.spec(svc)
    if spec.get("type") not in NODE_PORT_TYPES:
        return set()
    return {p["nodePort"] for p in spec.get("ports") or []
            if isinstance(p, dict) and isinstance(p.get("nodePort"), int) and not isinstance(p["nodePort"], bool)
            and p["nodePort"] > 0}


def _ports_text(svc: dict[str, Any]) -> str:
    out = []
    for p in get_path(svc, "spec", "ports", default=[]) or []:
        text = str(p.get("port"))
        if p.get("nodePort"):
            text += f":{p['nodePort']}"
        out.append(f"{text}/{p.get('protocol', 'TCP')}")
    return ",".join(out) or "<none>"


def _external_ip(svc: dict[str, Any]) -> str:
    """kubectl's EXTERNAL-IP: an ExternalName's name; else the load balancer's ingress and
    the external IPs, or <pending> for a LoadBalancer that has none yet."""
    spec = objects.spec(svc)
    kind = spec.get("type", "ClusterIP")
    if kind == "ExternalName":
        return spec.get("externalName") or "<none>"
    ingress = (objects.status(svc).get("loadBalancer") or {}).get("ingress") or []
    shown = [i.get("ip") or i.get("hostname") or "" for i in ingress] + list(spec.get("externalIPs") or [])
    return ",".join(shown) or ("<pending>" if kind == "LoadBalancer" else "<none>")


class ServiceStrategy(Strategy):
    kind = "Service"
    name_rule = "label"
    columns = [NAME_COLUMN, Column("Type"), Column("Cluster-IP"), Column("External-IP"),
               Column("Port(s)"), AGE_COLUMN, Column("Selector", priority=1)]
    selectable_fields = {"metadata.name", "metadata.namespace", "spec.clusterIP", "spec.type"}

    def default(self, obj: dict[str, Any]) -> None:
        spec = obj.setdefault("spec", {})
        spec.setdefault("type", "ClusterIP")
        spec.setdefault("sessionAffinity", "None")
        if spec["type"] != "ExternalName":
            _default_addresses(obj, spec)
        # nodePorts are the allocator's (kube32.apiserver.nodeports): cluster-wide, in the store.
        for p in spec.get("ports") or []:
            if isinstance(p, dict):
                p.setdefault("protocol", "TCP")
                p.setdefault("targetPort", p.get("port"))

    def prepare_for_update(self, new: dict[str, Any], old: dict[str, Any]) -> None:
        super().prepare_for_update(new, old)
        _keep_allocated(new, old)
        _drop_type_dependent(new, old)

    def default_status(self, obj: dict[str, Any]) -> dict[str, Any]:
        return {"loadBalancer": {}}

    def validate(self, obj: dict[str, Any]) -> list[tuple[str, str]]:
        errs = []
        spec = objects.spec(obj)
        for i, p in enumerate(spec.get("ports") or []):
            port = p.get("port") if isinstance(p, dict) else None
            if not isinstance(port, int) or not 1 <= port <= 65535:
                errs.append((f"spec.ports[{i}].port", f"Invalid value: {port}: must be between 1 and 65535, inclusive"))
        errs += _node_port_errors(spec)
        if spec.get("type") not in ("ClusterIP", "NodePort", "LoadBalancer", "ExternalName"):
            errs.append(("spec.type", f'Unsupported value: "{spec.get("type")}"'))
        if spec.get("type") == "ExternalName":  # a DNS name, no address of its own
            if not spec.get("externalName"):
                errs.append(("spec.externalName", "Required value"))
            if spec.get("clusterIP") or spec.get("clusterIPs"):
                errs.append(("spec.clusterIPs", "Forbidden: may not be set for ExternalName services"))
        hold = objects.annotations(obj).get(Annotation.HOLD_REQUESTS)
        if hold is not None:
            try:
                holding.parse_hold(str(hold))
            except ValueError as e:
                errs.append((f"metadata.annotations[{Annotation.HOLD_REQUESTS}]", f"Invalid value: {e}"))
        return errs

    def extra_fields(self, obj: dict[str, Any]) -> dict[str, str]:
        spec = objects.spec(obj)
        return {"spec.clusterIP": spec.get("clusterIP", ""), "spec.type": spec.get("type", "")}

    def row(self, obj: dict[str, Any]) -> list[Any]:
        spec = objects.spec(obj)
        sel = ",".join(f"{k}={v}" for k, v in (spec.get("selector") or {}).items()) or "<none>"
        return [objects.name(obj), spec.get("type", "ClusterIP"), spec.get("clusterIP") or "<none>",
                _external_ip(obj), _ports_text(obj), meta.age(obj), sel]


def _default_cluster_ip(obj: dict[str, Any], spec: dict[str, Any]) -> None:
    if spec.get("clusterIP") != "None" and not spec.get("clusterIP"):
        h = hashlib.sha256(f"{objects.namespace(obj)}/{objects.name(obj)}".encode()).digest()
        spec["clusterIP"] = f"10.96.{h[0]}.{max(h[1], 1)}"
        spec["clusterIPs"] = [spec["clusterIP"]]
    if spec.get("clusterIP") and not spec.get("clusterIPs"):
        spec["clusterIPs"] = [spec["clusterIP"]]


def _default_addresses(obj: dict[str, Any], spec: dict[str, Any]) -> None:
    """What kube-apiserver sets on a Service with an address (not ExternalName): its
    cluster IP (a stable nominal one from the name: the sim routes by the API proxy) in
    ``clusterIP`` and ``clusterIPs``, one IPv4 family (``SingleStack``), the traffic
    policies ``Cluster``, and for a LoadBalancer ``allocateLoadBalancerNodePorts``."""
    _default_cluster_ip(obj, spec)
    spec.setdefault("ipFamilies", ["IPv4"])
    spec.setdefault("ipFamilyPolicy", "SingleStack")
    spec.setdefault("internalTrafficPolicy", "Cluster")
    if spec.get("type") in NODE_PORT_TYPES:
        spec.setdefault("externalTrafficPolicy", "Cluster")
    if spec.get("type") == "LoadBalancer":
        spec.setdefault("allocateLoadBalancerNodePorts", True)


def _node_port_errors(spec: dict[str, Any]) -> list[tuple[str, str]]:
    """nodePorts as kube-apiserver validates them: whole numbers of a port, only for the
    types that have them, none twice for one protocol.  Whether one is free and in the
    range is the allocator's to say (kube32.apiserver.nodeports)."""
    errs = []
    seen: set[tuple[int, str]] = set()
    for i, p in enumerate(spec.get("ports") or []):
        node_port = p.get("nodePort") if isinstance(p, dict) else None
        if node_port in (None, 0):
            continue
        where = f"spec.ports[{i}].nodePort"
        if isinstance(node_port, bool) or not isinstance(node_port, int) or not 1 <= node_port <= 65535:
            errs.append((where, f"Invalid value: {json.dumps(node_port)}: must be between 1 and 65535, inclusive"))
        elif spec.get("type") not in NODE_PORT_TYPES:
            errs.append((where, f"Forbidden: may not be used when `type` is '{spec.get('type')}'"))
        elif (node_port, str(p.get("protocol", "TCP"))) in seen:
            errs.append((where, f"Duplicate value: {node_port}"))
        else:
            seen.add((node_port, str(p.get("protocol", "TCP"))))
    return errs


def _keep_allocated(new: dict[str, Any], old: dict[str, Any]) -> None:
    """An update that leaves a port's nodePort out keeps the one it had (matched by port
    name, and not if another port of the update now has it), as kube-apiserver's
    patchAllocatedValues: ``kubectl apply`` of a manifest without nodePorts moves none."""
    if not (node_ports(old) and objects.spec(new).get("type") in NODE_PORT_TYPES):
        return
    ports = [p for p in objects.spec(new).get("ports") or [] if isinstance(p, dict)]
    before = {p.get("name"): p.get("nodePort") for p in objects.spec(old).get("ports") or [] if isinstance(p, dict)}
    used = node_ports(old) & node_ports(new)
    for p in ports:
        if not p.get("nodePort") and before.get(p.get("name")) and before[p.get("name")] not in used:
            p["nodePort"] = before[p.get("name")]


def _drop_type_dependent(new: dict[str, Any], old: dict[str, Any]) -> None:
    """A change to a type without nodePorts drops the ones the update carried over
    unchanged, as kube-apiserver's dropTypeDependentFields (else they would be refused),
    and the external traffic policy (and a LoadBalancer's allocation flag) it carried over."""
    spec, before = objects.spec(new), objects.spec(old)
    for field, types in (("externalTrafficPolicy", NODE_PORT_TYPES), ("allocateLoadBalancerNodePorts",
                                                                     ("LoadBalancer",))):
        if spec.get("type") not in types and field in spec and spec.get(field) == before.get(field):
            spec.pop(field)
    if objects.spec(new).get("type") in NODE_PORT_TYPES or not node_ports(old):
        return
    ports = [p for p in objects.spec(new).get("ports") or [] if isinstance(p, dict)]
    olds = [p for p in objects.spec(old).get("ports") or [] if isinstance(p, dict)]
    unchanged = len(ports) == len(olds) and all(p.get("nodePort") in (None, 0, o.get("nodePort"))
                                                 for p, o in zip(ports, olds, strict=True))
    if unchanged:
        for p in ports:
            p.pop("nodePort", None)


class EndpointsStrategy(Strategy):
    kind = "Endpoints"
    has_status = False
    top_fields = {"subsets"}
    columns = [NAME_COLUMN, Column("Endpoints"), AGE_COLUMN]

    def row(self, obj: dict[str, Any]) -> list[Any]:
        eps = []
        for s in obj.get("subsets") or []:
            for a in s.get("addresses") or []:
                for p in s.get("ports") or [{}]:
                    eps.append(f"{a.get('ip')}:{p.get('port')}" if p.get("port") else a.get("ip", ""))
        text = ",".join(eps[:3]) + (f" + {len(eps) - 3} more..." if len(eps) > 3 else "")
        return [objects.name(obj), text or "<none>", meta.age(obj)]


class EndpointSliceStrategy(Strategy):
    kind = "EndpointSlice"
    has_status = False
    top_fields = {"addressType", "endpoints", "ports"}
    columns = [NAME_COLUMN, Column("AddressType"), Column("Ports"), Column("Endpoints"), AGE_COLUMN]

    def row(self, obj: dict[str, Any]) -> list[Any]:
        ports = ",".join(str(p.get("port")) for p in obj.get("ports") or []) or "<unset>"
        addrs = [a for e in obj.get("endpoints") or [] for a in e.get("addresses") or []]
        text = ",".join(addrs[:3]) + (f" + {len(addrs) - 3} more..." if len(addrs) > 3 else "")
        return [objects.name(obj), obj.get("addressType", "IPv4"), ports, text or "<unset>", meta.age(obj)]
