"""Services, Endpoints and EndpointSlices: ClusterIP allocation is nominal in the sim."""
from __future__ import annotations

import hashlib
from typing import Any

from .. import meta
from ..strategy import AGE_COLUMN, NAME_COLUMN, Column, Strategy, get_path

NODE_PORT_TYPES = ("NodePort", "LoadBalancer")   # Service types every node answers on a port


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
    spec = svc.get("spec") or {}
    kind = spec.get("type", "ClusterIP")
    if kind == "ExternalName":
        return spec.get("externalName") or "<none>"
    ingress = ((svc.get("status") or {}).get("loadBalancer") or {}).get("ingress") or []
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
        if spec["type"] != "ExternalName" and spec.get("clusterIP") != "None" and not spec.get("clusterIP"):
            # A stable nominal address from the name: the sim routes by the API proxy.
            h = hashlib.sha256(f"{meta.namespace_of(obj)}/{meta.name_of(obj)}".encode()).digest()
            spec["clusterIP"] = f"10.96.{h[0]}.{max(h[1], 1)}"
            spec["clusterIPs"] = [spec["clusterIP"]]
        used: set[int] = set()
        for p in spec.get("ports") or []:
            if isinstance(p, dict):
                p.setdefault("protocol", "TCP")
                p.setdefault("targetPort", p.get("port"))
                if spec["type"] in NODE_PORT_TYPES and not p.get("nodePort"):
                    h = hashlib.sha256(f"{meta.namespace_of(obj)}/{meta.name_of(obj)}/{p.get('port')}".encode()).digest()
                    port = 30000 + int.from_bytes(h[:2], "big") % 2768
                    while port in used:
                        port += 1
                    p["nodePort"] = port
                used.add(p.get("nodePort") or 0)

    def default_status(self, obj: dict[str, Any]) -> dict[str, Any]:
        return {"loadBalancer": {}}

    def validate(self, obj: dict[str, Any]) -> list[tuple[str, str]]:
        errs = []
        spec = obj.get("spec") or {}
        for i, p in enumerate(spec.get("ports") or []):
            port = p.get("port") if isinstance(p, dict) else None
            if not isinstance(port, int) or not 1 <= port <= 65535:
                errs.append((f"spec.ports[{i}].port", f"Invalid value: {port}: must be between 1 and 65535, inclusive"))
        if spec.get("type") not in ("ClusterIP", "NodePort", "LoadBalancer", "ExternalName"):
            errs.append(("spec.type", f'Unsupported value: "{spec.get("type")}"'))
        if spec.get("type") == "ExternalName":  # a DNS name, no address of its own
            if not spec.get("externalName"):
                errs.append(("spec.externalName", "Required value"))
            if spec.get("clusterIP") or spec.get("clusterIPs"):
                errs.append(("spec.clusterIPs", "Forbidden: may not be set for ExternalName services"))
        return errs

    def extra_fields(self, obj: dict[str, Any]) -> dict[str, str]:
        spec = obj.get("spec") or {}
        return {"spec.clusterIP": spec.get("clusterIP", ""), "spec.type": spec.get("type", "")}

    def row(self, obj: dict[str, Any]) -> list[Any]:
        spec = obj.get("spec") or {}
        sel = ",".join(f"{k}={v}" for k, v in (spec.get("selector") or {}).items()) or "<none>"
        return [meta.name_of(obj), spec.get("type", "ClusterIP"), spec.get("clusterIP") or "<none>",
                _external_ip(obj), _ports_text(obj), meta.age(obj), sel]


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
        return [meta.name_of(obj), text or "<none>", meta.age(obj)]


class EndpointSliceStrategy(Strategy):
    kind = "EndpointSlice"
    has_status = False
    top_fields = {"addressType", "endpoints", "ports"}
    columns = [NAME_COLUMN, Column("AddressType"), Column("Ports"), Column("Endpoints"), AGE_COLUMN]

    def row(self, obj: dict[str, Any]) -> list[Any]:
        ports = ",".join(str(p.get("port")) for p in obj.get("ports") or []) or "<unset>"
        addrs = [a for e in obj.get("endpoints") or [] for a in e.get("addresses") or []]
        text = ",".join(addrs[:3]) + (f" + {len(addrs) - 3} more..." if len(addrs) > 3 else "")
        return [meta.name_of(obj), obj.get("addressType", "IPv4"), ports, text or "<unset>", meta.age(obj)]
