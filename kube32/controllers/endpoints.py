"""Endpoints and EndpointSlices for Services with a selector (one controller, two outputs).

``sync(namespace/name of a Service)`` lists, from the pod cache, the pods in the
Service's namespace that match its selector, have a ``status.podIP`` and are
not finished, and writes:

* ``Endpoints/<svc>``: Ready pods (condition Ready=True, not terminating) in
  ``addresses``, the others that are not terminating in
  ``notReadyAddresses``; pods grouped into subsets by their resolved ports (a
  named ``targetPort`` is looked up in each pod's container ports; a pod
  without it is left out of that port);
* ``EndpointSlice/<svc>-<hash>`` (label ``kubernetes.io/service-name``,
  managed-by ``endpointslice-controller.k8s.io``, addressType IPv4, owned by
  the Service): every such pod, terminating ones included, with conditions
  ``ready`` (Ready and not terminating), ``serving`` (Ready) and
  ``terminating``; one slice per port set, at most 100 endpoints each; the
  name hashes the port set and chunk index, so re-syncs rewrite the same
  slices and slices no longer needed are deleted.

Addresses are never de-duplicated by IP: in the simulator every pod of a node
has the node's IP; ``targetRef`` (kind Pod, name, namespace, uid) tells them
apart.  A Service without a selector is left alone (its Endpoints are the
user's).  Writes happen only when the content differs from the cache.
"""
from __future__ import annotations

import hashlib
import json
import logging
from typing import Any

from .. import objects
from ..client import ENDPOINTS, ENDPOINTSLICES, PODS, SERVICES, ApiError
from ..matching import service_selects
from ..terms import Label
from . import podutil as pu
from .base import Controller, split_key

log = logging.getLogger("kube32.controllers.endpoints")
Obj = dict[str, Any]

SERVICE_NAME_LABEL = Label.SERVICE_NAME
MANAGED_BY_LABEL = Label.ENDPOINTSLICE_MANAGED_BY
MANAGED_BY = "endpointslice-controller.k8s.io"
MAX_ENDPOINTS_PER_SLICE = 100


def resolve_port(svc_port: Obj, pod: Obj) -> int | None:
    """The pod port a Service port targets (k8s FindPort): a number, or a named container port."""
    target = svc_port.get("targetPort", svc_port.get("port"))
    if isinstance(target, int):
        return target
    if isinstance(target, str) and target.isdigit():
        return int(target)
    proto = svc_port.get("protocol", "TCP")
    for c in objects.spec(pod).get("containers") or []:
        for p in c.get("ports") or []:
            if p.get("name") == target and p.get("protocol", "TCP") == proto:
                return p.get("containerPort")
    return None


def _target_ref(pod: Obj) -> Obj:
    m = objects.meta(pod)
    return {"kind": "Pod", "name": m.get("name", ""), "namespace": m.get("namespace", "default"),
            "uid": m.get("uid", "")}


def _address(pod: Obj) -> Obj:
    a: Obj = {"ip": objects.status(pod).get("podIP"), "targetRef": _target_ref(pod)}
    node = objects.spec(pod).get("nodeName")
    if node:
        a["nodeName"] = node
    return a


def _addr_order(a: Obj) -> tuple:
    return (a.get("ip") or "", a["targetRef"]["name"])


def service_pods(svc: Obj, pods: list[Obj]) -> list[Obj]:
    ns = objects.meta(svc).get("namespace", "default")
    selector = objects.spec(svc).get("selector")
    return sorted((p for p in pods if objects.meta(p).get("namespace") == ns
                   and service_selects(selector, objects.meta(p).get("labels"))
                   and objects.status(p).get("podIP") and not pu.is_terminal(p)),
                  key=lambda p: objects.meta(p).get("name", ""))


def _port_set(svc: Obj, pod: Obj) -> tuple[tuple[str, int, str], ...]:
    out = []
    for sp in objects.spec(svc).get("ports") or []:
        port = resolve_port(sp, pod)
        if port is not None:
            out.append((sp.get("name") or "", int(port), sp.get("protocol", "TCP")))
    return tuple(out)


def desired_subsets(svc: Obj, pods: list[Obj]) -> list[Obj]:
    groups: dict[tuple, tuple[list[Obj], list[Obj]]] = {}
    for pod in pods:
        if pu.is_terminating(pod):
            continue  # Endpoints list no terminating pods (publishNotReadyAddresses aside)
        ready, not_ready = groups.setdefault(_port_set(svc, pod), ([], []))
        publish = bool(objects.spec(svc).get("publishNotReadyAddresses"))
        (ready if pu.is_ready(pod) or publish else not_ready).append(_address(pod))
    subsets = []
    for ports, (ready, not_ready) in sorted(groups.items()):
        s: Obj = {}
        if ready:
            s["addresses"] = sorted(ready, key=_addr_order)
        if not_ready:
            s["notReadyAddresses"] = sorted(not_ready, key=_addr_order)
        if ports:
            s["ports"] = [{**({"name": n} if n else {}), "port": p, "protocol": pr} for n, p, pr in ports]
        subsets.append(s)
    return subsets


def slice_name(svc: Obj, ports: tuple, index: int) -> str:
    digest = hashlib.sha256(json.dumps([list(ports), index]).encode()).digest()
    return f"{objects.meta(svc)['name'][:56]}-{pu.safe_encode(digest, 5)}"


def desired_slices(svc: Obj, pods: list[Obj]) -> dict[str, Obj]:
    """name -> EndpointSlice body; an empty placeholder when no pod is selected (as k8s)."""
    smd = objects.meta(svc)
    groups: dict[tuple, list[Obj]] = {}
    for pod in pods:
        groups.setdefault(_port_set(svc, pod), []).append(pod)
    if not groups:
        groups[()] = []
    labels = {**(smd.get("labels") or {}), SERVICE_NAME_LABEL: smd["name"], MANAGED_BY_LABEL: MANAGED_BY}
    owner = {"apiVersion": "v1", "kind": "Service", "name": smd["name"], "uid": smd.get("uid", ""),
             "controller": True, "blockOwnerDeletion": True}
    out: dict[str, Obj] = {}
    for ports, members in sorted(groups.items()):
        chunks = [members[i:i + MAX_ENDPOINTS_PER_SLICE]
                  for i in range(0, len(members), MAX_ENDPOINTS_PER_SLICE)] or [[]]
        for index, chunk in enumerate(chunks):
            name = slice_name(svc, ports, index)
            out[name] = {
                "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                "metadata": {"name": name, "namespace": smd.get("namespace", "default"),
                             "labels": labels, "ownerReferences": [owner]},
                "addressType": "IPv4",
                "endpoints": [_slice_endpoint(p) for p in chunk],
                "ports": [{"name": n, "port": p, "protocol": pr} for n, p, pr in ports],
            }
    return out


def _slice_endpoint(pod: Obj) -> Obj:
    ready = pu.is_ready(pod)
    terminating = pu.is_terminating(pod)
    ep: Obj = {"addresses": [objects.status(pod).get("podIP")],
               "conditions": {"ready": ready and not terminating, "serving": ready, "terminating": terminating},
               "targetRef": _target_ref(pod)}
    node = objects.spec(pod).get("nodeName")
    if node:
        ep["nodeName"] = node
    return ep


class EndpointsController(Controller):
    """Endpoints and EndpointSlices; keys are Service ``namespace/name``."""

    name = "endpoint-controller"
    workers = 2

    def setup(self) -> None:
        self.svc_informer = self.ctx.informers.get(SERVICES)
        self.pod_informer = self.ctx.informers.get(PODS)
        self.ep_informer = self.ctx.informers.get(ENDPOINTS)
        self.slice_informer = self.ctx.informers.get(ENDPOINTSLICES)
        self.svc_informer.add_handler(lambda t, o, old: self.queue.add(pu.pod_key(o)))
        self.pod_informer.add_handler(self._on_pod)
        self.ep_informer.add_handler(self._on_endpoints)
        self.slice_informer.add_handler(self._on_slice)

    def _on_pod(self, etype: str, pod: Obj, old: Obj | None) -> None:
        ns = objects.meta(pod).get("namespace")
        label_sets = [objects.meta(pod).get("labels")] + ([objects.meta(old).get("labels")] if old else [])
        for svc in self.svc_informer.list():
            if objects.meta(svc).get("namespace") == ns and any(
                    service_selects(objects.spec(svc).get("selector"), ls) for ls in label_sets):
                self.queue.add(pu.pod_key(svc))

    def _on_endpoints(self, etype: str, ep: Obj, old: Obj | None) -> None:
        if etype == "DELETED":  # someone removed what we keep: put it back
            self.queue.add(pu.pod_key(ep))

    def _on_slice(self, etype: str, sl: Obj, old: Obj | None) -> None:
        labels = objects.labels(sl)
        if labels.get(MANAGED_BY_LABEL) == MANAGED_BY and labels.get(SERVICE_NAME_LABEL):
            self.queue.add(f"{objects.meta(sl).get('namespace', 'default')}/{labels[SERVICE_NAME_LABEL]}")

    async def resync(self) -> None:
        for svc in self.svc_informer.list():
            self.queue.add(pu.pod_key(svc))

    # --- sync ---------------------------------------------------------------------------------
    async def sync(self, key: Any) -> None:
        ns, name = split_key(key)
        ns = ns or "default"
        svc = self.svc_informer.get(key)
        if svc is None or objects.meta(svc).get("deletionTimestamp"):
            await self._delete_all(ns, name)
            return
        if not objects.spec(svc).get("selector"):
            return  # no selector: Endpoints are managed by the user
        pods = service_pods(svc, self.pod_informer.list())
        await self._sync_endpoints(svc, pods)
        await self._sync_slices(svc, pods)

    async def _sync_endpoints(self, svc: Obj, pods: list[Obj]) -> None:
        smd = objects.meta(svc)
        subsets = desired_subsets(svc, pods)
        labels = dict(smd.get("labels") or {})
        current = self.ep_informer.get(pu.pod_key(svc))
        if current is None:
            body = {"apiVersion": "v1", "kind": "Endpoints",
                    "metadata": {"name": smd["name"], "namespace": smd.get("namespace", "default"),
                                 "labels": labels},
                    "subsets": subsets}
            try:
                await self.client.create(ENDPOINTS, body, smd.get("namespace"))
                return
            except ApiError as e:
                if e.code != 409:
                    raise
                current = await self.client.try_get(ENDPOINTS, smd["name"], smd.get("namespace"))
                if current is None:
                    raise
        if (current.get("subsets") or []) == subsets and \
                objects.labels(current) == labels:
            return
        new = {**current, "subsets": subsets}
        new["metadata"] = {**objects.meta(current), "labels": labels}
        await self.client.update(ENDPOINTS, new)

    async def _sync_slices(self, svc: Obj, pods: list[Obj]) -> None:
        smd = objects.meta(svc)
        ns = smd.get("namespace", "default")
        want = desired_slices(svc, pods)
        have = {objects.meta(s)["name"]: s for s in self.slice_informer.list()
                if objects.meta(s).get("namespace") == ns
                and objects.labels(s).get(SERVICE_NAME_LABEL) == smd["name"]
                and objects.labels(s).get(MANAGED_BY_LABEL) == MANAGED_BY}
        for name, body in want.items():
            cur = have.get(name)
            if cur is None:
                try:
                    await self.client.create(ENDPOINTSLICES, body, ns)
                    continue
                except ApiError as e:
                    if e.code != 409:
                        raise
                    cur = await self.client.try_get(ENDPOINTSLICES, name, ns)
                    if cur is None:
                        raise
            if all(cur.get(f) == body[f] for f in ("addressType", "endpoints", "ports")) and \
                    objects.meta(cur).get("labels") == body["metadata"]["labels"] and \
                    objects.meta(cur).get("ownerReferences") == body["metadata"]["ownerReferences"]:
                continue
            new = {**body, "metadata": {**objects.meta(cur), **body["metadata"]}}
            await self.client.update(ENDPOINTSLICES, new)
        for name, cur in have.items():
            if name not in want:
                await self._delete(ENDPOINTSLICES, name, ns, objects.meta(cur).get("uid"))

    async def _delete_all(self, ns: str, name: str) -> None:
        if self.ep_informer.get(f"{ns}/{name}") is not None:
            await self._delete(ENDPOINTS, name, ns, None)
        for s in self.slice_informer.list():
            labels = objects.labels(s)
            if objects.meta(s).get("namespace") == ns and labels.get(SERVICE_NAME_LABEL) == name \
                    and labels.get(MANAGED_BY_LABEL) == MANAGED_BY:
                await self._delete(ENDPOINTSLICES, objects.meta(s)["name"], ns, objects.meta(s).get("uid"))

    async def _delete(self, kind: Any, name: str, ns: str, uid: str | None) -> None:
        try:
            await self.client.delete(kind, name, ns, uid=uid)
        except ApiError as e:
            if e.code not in (404, 409):
                raise

