"""nodePorts allocated cluster-wide, as kube-apiserver's service node port allocator does.

A Service of type NodePort or LoadBalancer answers on every node's address at each of
its ``nodePort``s (kube32.kubelet.nodeports): a port is one Service's in the whole
cluster, or a Service of one namespace could take another namespace's traffic.  So
every nodePort is claimed in the store, beside the objects, under
``/registry/ranges/servicenodeports/<port>`` (kube-apiserver's key), with the Service
that holds it (namespace, name, uid) and when it was claimed.  The store's create is
the one atomic step: of two writes that want one port at once, one gets it.

* A create or an update of a Service claims each nodePort it holds that the stored
  version did not, before the Service is written (:meth:`NodePortAllocator.take`).  A
  port already claimed is a 422 ``spec.ports[i].nodePort: Invalid value: N: provided
  port is already allocated``; one outside :data:`NODE_PORT_RANGE` (kube-apiserver's
  default ``--service-node-port-range``, 30000-32767) a 422 ``provided port is not in
  the valid range. The range of valid ports is 30000-32767``.  A port left unset is
  given a free one of the range, starting from one the Service's name suggests.
* After the write the ports the old version held and the new one does not are freed;
  if the write failed, the claims made for it are undone and the ports it was given
  are taken back off it.  A delete frees every port of the Service it removed.
  The registry drives this (:class:`~.registry.Claims`); a dry run checks and assigns
  without claiming.
* Nothing can be claimed twice, but a claim can outlive its reason (an API server that
  stopped between the claim and the write, a store that failed): a claim whose Service
  does not hold its port (gone, another uid, the port no longer in it) and that is older
  than :data:`~kube32.timing.NODE_PORT_CLAIM_GRACE_SECONDS` is taken over by whoever
  asks for the port.  At start (:meth:`NodePortAllocator.repair`) every stored
  Service's ports are claimed for it, so a store written before claims existed is
  covered too.
"""
from __future__ import annotations

import secrets
import json
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from .. import objects
from ..store import Conflict, KeyExists, KeyNotFound, KeyValue, Store, StoreError
from ..timing import NODE_PORT_CLAIM_GRACE_SECONDS
from . import errors
from .resources import by_plural
from .strategies.service import NODE_PORT_TYPES, node_ports

log = logging.getLogger("kube32.apiserver.nodeports")

Obj = dict[str, Any]
NODE_PORT_RANGE = range(30000, 32768)
KEY_PREFIX = "/registry/ranges/servicenodeports/"


def _range_text(ports: range) -> str:
    return f"{ports.start}-{ports.stop - 1}"


def _key(port: int) -> str:
    return f"{KEY_PREFIX}{port}"


def _owner(svc: Obj) -> Obj:
    md = objects.meta(svc)
    return {"namespace": md.get("namespace", ""), "name": md.get("name", ""), "uid": md.get("uid", "")}


def _claim_of(kv: KeyValue) -> Obj:
    try:
        value = json.loads(kv.value)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


@dataclass
class Taken:
    """What :meth:`NodePortAllocator.take` did for one write, to keep or undo."""

    allocator: NodePortAllocator
    claimed: list[KeyValue] = field(default_factory=list)   # claims made for this write
    given: list[Obj] = field(default_factory=list)          # ports whose nodePort was assigned
    freed_after: set[int] = field(default_factory=set)      # the old version's ports the new lacks
    old_uid: str = ""

    async def keep(self) -> None:
        """The write landed: the ports the old version held and the new one does not go."""
        for port in sorted(self.freed_after):
            await self.allocator.free(port, self.old_uid)

    async def undo(self) -> None:
        """The write did not land: the claims made for it go, the assigned ports too."""
        for kv in self.claimed:
            try:
                await self.allocator.store.delete(kv.key, kv.mod_revision)
            except (Conflict, KeyNotFound):
                pass
            except StoreError as e:   # left for the next one who asks for the port
                log.warning("cannot undo the claim %s: %s", kv.key, e)
        for p in self.given:
            p.pop("nodePort", None)
        self.claimed.clear()
        self.given.clear()


class NodePortAllocator:
    def __init__(self, store: Store, ports: range = NODE_PORT_RANGE) -> None:
        self.store = store
        self.ports = ports

    # --- the registry's side --------------------------------------------------------
    async def take(self, new: Obj, old: Obj | None, dry_run: bool) -> Taken:
        """Claim (or, for a dry run, check) the nodePorts ``new`` holds that ``old`` did
        not, giving a port to each port that needs one; 422 when one cannot be had."""
        held = node_ports(old) if old is not None else set()
        taken = Taken(self, old_uid=objects.uid(old) if old is not None else "")
        if objects.spec(new).get("type") in NODE_PORT_TYPES:
            try:
                await self._take_given(new, held, taken, dry_run)
                await self._give(new, taken, dry_run)
            except BaseException:
                await taken.undo()
                raise
        taken.freed_after = held - node_ports(new)
        return taken

    async def release(self, gone: Obj) -> None:
        """``gone`` was removed from the store: its ports are free."""
        for port in sorted(node_ports(gone)):
            await self.free(port, objects.uid(gone))

    async def free(self, port: int, uid: str) -> None:
        """Drop the claim of ``port`` if the Service of ``uid`` holds it."""
        try:
            kv = await self.store.get(_key(port))
            if kv is not None and _claim_of(kv).get("uid") == uid:
                await self.store.delete(kv.key, kv.mod_revision)
        except (Conflict, KeyNotFound):
            pass
        except StoreError as e:   # a leftover, reclaimed when someone asks for the port
            log.warning("cannot free nodePort %d: %s", port, e)

    # --- claiming -----------------------------------------------------------------
    async def _take_given(self, svc: Obj, held: set[int], taken: Taken, dry_run: bool) -> None:
        seen: set[int] = set()
        for i, p in enumerate(objects.spec(svc).get("ports") or []):
            port = p.get("nodePort")
            if not port or port in held or port in seen:
                continue
            seen.add(port)
            if port not in self.ports:
                raise self._invalid(svc, i, port, "provided port is not in the valid range. The range of valid "
                                                  f"ports is {_range_text(self.ports)}")
            if not await self._claim(port, svc, taken, dry_run):
                raise self._invalid(svc, i, port, "provided port is already allocated")

    async def _give(self, svc: Obj, taken: Taken, dry_run: bool) -> None:
        """A free port of the range for each port of ``svc`` that has none."""
        spec = objects.spec(svc)
        if spec.get("type") == "LoadBalancer" and spec.get("allocateLoadBalancerNodePorts") is False:
            return
        wanting = [(i, p) for i, p in enumerate(spec.get("ports") or []) if not p.get("nodePort")]
        if not wanting:
            return
        kvs, _ = await self.store.list(KEY_PREFIX)
        used = {int(kv.key[len(KEY_PREFIX):]) for kv in kvs if kv.key[len(KEY_PREFIX):].isdigit()}
        used |= node_ports(svc)
        for i, p in wanting:
            port = await self._free_port(svc, used, taken, dry_run)
            if port is None:
                raise self._invalid(svc, i, 0, f"failed to allocate a nodePort: the range "
                                               f"{_range_text(self.ports)} is full")
            p["nodePort"] = port
            taken.given.append(p)
            used.add(port)

    async def _free_port(self, svc: Obj, used: set[int], taken: Taken, dry_run: bool) -> int | None:
        """The first port that can be claimed from a random one on, as kube-apiserver picks:
        the unclaimed ones first; then, the range being full, the leftovers among the claimed.
        Random, not from the Service's name: two clusters on one machine (two test runs at
        once) then rarely pick one port on one address."""
        first = secrets.randbelow(len(self.ports))
        order = [self.ports[(first + k) % len(self.ports)] for k in range(len(self.ports))]
        own = node_ports(svc)
        for port in [p for p in order if p not in used] + [p for p in order if p in used]:
            if port in own:
                continue
            if await self._claim(port, svc, taken, dry_run):
                return port
        return None

    async def _claim(self, port: int, svc: Obj, taken: Taken, dry_run: bool) -> bool:
        """Claim ``port`` for ``svc`` (True), taking over a leftover claim; False when
        another Service holds it.  A dry run only looks."""
        key = _key(port)
        for _ in range(3):
            if dry_run:
                kv = await self.store.get(key)
                return kv is None or not await self._held(port, kv)
            try:
                value = json.dumps({**_owner(svc), "claimed": time.time()}).encode()
                taken.claimed.append(await self.store.create(key, value))
                return True
            except KeyExists as e:
                current = e.current or await self.store.get(key)
            if current is not None:
                if await self._held(port, current):
                    return False
                try:
                    await self.store.delete(key, current.mod_revision)
                    log.info("nodePort %d: the claim of %s/%s was a leftover, taken over", port,
                             _claim_of(current).get("namespace"), _claim_of(current).get("name"))
                except (Conflict, KeyNotFound):
                    pass
        return False

    async def _held(self, port: int, kv: KeyValue) -> bool:
        """Whether the claim ``kv`` of ``port`` stands: young (its write may be in flight),
        or its Service (that uid) holds the port."""
        claim = _claim_of(kv)
        claimed = claim.get("claimed")
        if isinstance(claimed, (int, float)) and time.time() - claimed < NODE_PORT_CLAIM_GRACE_SECONDS:
            return True
        stored = await self.store.get(by_plural("services").key(str(claim.get("namespace")), str(claim.get("name"))))
        if stored is None:
            return False
        svc = json.loads(stored.value)
        return objects.uid(svc) == claim.get("uid") and port in node_ports(svc)

    @staticmethod
    def _invalid(svc: Obj, index: int, port: int, why: str) -> errors.APIError:
        return errors.invalid("Service", objects.name(svc),
                              [(f"spec.ports[{index}].nodePort", f"Invalid value: {port}: {why}")])

    # --- at start -----------------------------------------------------------------
    async def repair(self) -> None:
        """Every stored Service's nodePorts claimed for it (a store from before claims, or
        a claim lost); two Services on one port (only such a store can hold them) are
        logged, the port staying with its claim."""
        kvs, _ = await self.store.list(by_plural("services").prefix())
        for kv in kvs:
            svc = json.loads(kv.value)
            for port in sorted(node_ports(svc)):
                try:
                    await self.store.create(_key(port), json.dumps({**_owner(svc), "claimed": 0}).encode())
                except KeyExists as e:
                    holder = _claim_of(e.current) if e.current is not None else {}
                    if holder.get("uid") != objects.uid(svc):
                        log.warning("nodePort %d is held by Service %s/%s and claimed by %s/%s: only the "
                                    "claim's Service keeps it", port, objects.namespace(svc), objects.name(svc),
                                    holder.get("namespace"), holder.get("name"))
