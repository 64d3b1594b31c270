"""The pods of each node, kept from the store's watch: a list of pods by ``spec.nodeName``
answered from it, as kube-apiserver answers it from its watch cache's index.

A kubelet lists its node's pods (``fieldSelector=spec.nodeName=<node>``) at every start
and every relist, the scheduler its pending ones (``spec.nodeName=``); a list read and
filtered every pod of the store, so at 10,000 pods one node's list took 1.7 s and every
kubelet's relist cost O(all pods) (issue 25).  :class:`NodeIndex` lists the pods once,
then follows one store watch of the pods prefix (``watch_progress``: its PROGRESS marks
carry the store's revision past writes of other kinds), and keeps for each node the
stored versions (:class:`~kube32.store.KeyValue`, the bytes a list sends) of its pods.
One decode per pod write (the registry's shared decode, which the pod's watchers share),
and a list by node costs O(that node's pods); the initial list of a watch by node (a
kubelet's, Registry.watch_items) reads it too.  It holds a reference to every pod's
stored bytes (the store's own objects: about the pods' JSON, 15 MB at 10,000 pods).

A list is answered from the index as a consistent read from cache (Kubernetes' KEP-2340):

1. R = the store's current revision (every write acknowledged before the list began is
   at or below R);
2. wait, bounded (:data:`WAIT_SECONDS`), until the index has read the store's watch up
   to a revision >= R: the index asks its stream for a PROGRESS mark at the store's
   current revision (``WatchStream.request_progress``, etcd's WatchProgressRequest),
   which the store queues behind every event it pushed the watch;
3. answer, in the same turn of the event loop as the check (nothing applied in between),
   the node's pods as of the index's revision I >= R, in key order, with
   ``metadata.resourceVersion`` = I.

Why this is what a scan answers at I: the store pushes a watch every event under its
prefix in revision order, and a PROGRESS mark at M only after every event <= M
(kube32.store.sqlite), so once the index applied the events and marks it was pushed up
to I it holds exactly the pods of the store's state at I; a pod is under the node its
stored version's ``spec.nodeName`` names (the same :meth:`Strategy.fields` a selector
matches against), so the pods a selector ``spec.nodeName=V, ...`` can match at I are
among those under V, and the other terms and label selectors filter them as the scan
does.  I >= R makes it read-your-writes and linearizable for this API server: the answer
is at least as new as every write acknowledged before the list began (as the scan,
which reads the current state).

Invariants:

* ``_pods[node][key]`` is the stored version of every pod at :attr:`NodeIndex.revision`
  whose ``spec.nodeName`` is ``node`` (``""``: not bound), and ``_node[key]`` its node:
  each pod is under exactly one node; a node with no pods has no entry (memory O(pods)).
  A pod moved or replaced under its name (another uid, another node: Registry.replace)
  is one PUT: it leaves its old node's entry and joins the new one's in that one step.
* :attr:`NodeIndex.revision` only grows: the revision of the last event or PROGRESS
  mark applied (the list's, after a relist).
* A list is answered from the index only when it asks for the current state (no
  ``resourceVersion``, ``"0"``, or ``NotOlderThan`` N no newer than the store), is not
  a ``continue``, holds in one page (a ``limit``, kubectl's 500, above the node's pods
  in the namespace: the scan then ends without a token too, its selector matching fewer
  than the limit) and selects one ``spec.nodeName`` by equality.
  Everything else, and an index not synced (before :meth:`start`, relisting after a
  failed watch: :data:`RESTART_PAUSE`), a store whose watch cannot give progress marks
  (etcd here: its watch does not yield them, and its current revision is this client's,
  not a quorum read), or an index that did not catch up within :data:`WAIT_SECONDS`,
  is the scan it was (kube32.apiserver.paging): never older than a list would be, and
  never a wait longer than :data:`WAIT_SECONDS`.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Any, AsyncIterator, Callable

from .. import metrics, objects
from ..store import PROGRESS, KeyValue, Store, WatchEvent, WatchStream
from . import paging
from .resources import by_plural

log = logging.getLogger("kube32.apiserver.nodeindex")
Obj = dict[str, Any]

FIELD = "spec.nodeName"
WAIT_SECONDS = 1.0      # a list waits at most this long for the index to reach the store's revision
ASK_EVERY = 0.25        # seconds between two progress requests while it waits (one may be lost to an overflow)
RESTART_PAUSE = 1.0     # seconds before a failed watch starts again from a list
LISTS = metrics.REGISTRY.counter(
    "kube32_pod_lists_by_node_total", "Lists of pods by spec.nodeName, by what answered them (index or scan).",
    ("answered",))


def answerable(options: paging.ListOptions) -> bool:
    """Whether a list with these options may be answered from the index (module docstring)."""
    return not (options.after or options.revision or options.continued)


class NodeIndex:
    """Every pod's stored version by its ``spec.nodeName``, from a list and the store's watch."""

    def __init__(self, store: Store, decode: Callable[[KeyValue], Obj], wait: float = WAIT_SECONDS, *,
                 plural: str = "pods", value_of: Callable[[Obj], str] | None = None) -> None:
        self.store = store
        self.res = by_plural(plural)
        self._decode = decode   # the registry's shared decode: one per stored version for all its readers
        # What an object is filed under: a pod's spec.nodeName (the default), a Node's
        # address (:func:`internal_ip`, for joins), or anything one stored version decides.
        self._value_of = value_of or (lambda obj: self.res.strategy.fields(obj).get(FIELD, ""))
        self.wait = wait
        self._pods: dict[str, dict[str, KeyValue]] = {}   # node -> store key -> stored version
        self._node: dict[str, str] = {}                    # store key -> node
        self.revision = 0
        self.synced = False
        self._stream: WatchStream | None = None
        self._task: asyncio.Task[None] | None = None
        self._waiters: list[tuple[int, asyncio.Future[None]]] = []
        self.served = 0      # lists answered from the index (tests and the bench read these)
        self.fell_back = 0   # lists by node the scan answered (not synced, or not caught up)

    @staticmethod
    def usable(store: Store) -> bool:
        """Whether the store's watch gives the progress marks a consistent read waits for."""
        return callable(getattr(store, "watch_progress", None))

    async def start(self) -> None:
        rev = await self._relist()
        self._task = asyncio.create_task(self._follow(rev), name="pods-by-node")

    async def close(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        self._unsynced()

    # --- the answer ----------------------------------------------------------------------
    async def pods(self, ns: str | None, node: str, not_older_than: int = 0,
                   limit: int = 0) -> tuple[list[KeyValue], int] | None:
        """(the stored versions of ``node``'s pods in ``ns`` (None: every namespace) in key
        order, the revision they are the state at), at least as new as the store's current
        revision; None when the index cannot say so within :attr:`wait`, or they are
        ``limit`` or more (more than one page: the scan's pages and continue token)."""
        target = self.store.current_revision
        if not self.synced or not_older_than > target:
            self._fell_back()
            return None    # (a revision the store has not reached: the scan answers the 504)
        if self.revision < target and not await self._caught_up(target):
            self._fell_back()
            return None
        # No await from here: the pods as of self.revision, whatever is applied after.
        prefix = self.res.prefix(ns)
        kvs = [kv for key, kv in self._pods.get(node, {}).items() if key.startswith(prefix)]
        if limit and len(kvs) >= limit:
            self._fell_back()
            return None
        kvs.sort(key=lambda kv: kv.key)
        self.served += 1
        if self.res.plural == "pods":
            LISTS.inc("index")
        return kvs, self.revision

    def _fell_back(self) -> None:
        self.fell_back += 1
        if self.res.plural == "pods":   # the metric counts lists of pods by node
            LISTS.inc("scan")

    async def names(self, value: str) -> list[str] | None:
        """The names of the objects filed under ``value`` (every namespace), as fresh as
        :meth:`pods`; None when the index cannot say."""
        answer = await self.pods(None, value)
        return None if answer is None else [str(objects.meta(self._decode(kv)).get("name")) for kv in answer[0]]

    async def _caught_up(self, target: int) -> bool:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.wait
        while self.synced and self.revision < target:
            left = deadline - loop.time()
            stream = self._stream
            if left <= 0 or stream is None or not stream.request_progress():
                return False
            done: asyncio.Future[None] = loop.create_future()
            self._waiters.append((target, done))
            try:
                await asyncio.wait_for(asyncio.shield(done), min(left, ASK_EVERY))
            except asyncio.TimeoutError:
                pass
            finally:
                if not done.done():
                    done.cancel()
        return self.synced and self.revision >= target

    def _wake(self) -> None:
        still = []
        for target, done in self._waiters:
            if done.done():
                continue
            if not self.synced or target <= self.revision:
                done.set_result(None)
            else:
                still.append((target, done))
        self._waiters = still

    # --- following the store ---------------------------------------------------------------
    async def _relist(self) -> int:
        self._unsynced()
        kvs, rev = await self.store.list(self.res.prefix(None))
        self._pods.clear()
        self._node.clear()
        for kv in kvs:
            self._put(kv)
        self.revision = rev
        self.synced = True
        return rev

    def _unsynced(self) -> None:
        self.synced = False
        self._stream = None
        self._wake()   # waiters see it and scan

    async def _follow(self, rev: int) -> None:
        prefix = self.res.prefix(None)
        while True:
            try:
                stream = self.store.watch_progress(prefix, rev)  # type: ignore[attr-defined]
                self._stream = stream
                try:
                    async for ev in stream:
                        self._apply(ev)
                        rev = self.revision
                finally:
                    self._stream = None
                    await stream.aclose()
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - compaction or a store fault: list again
                log.warning("the pods-by-node index's watch failed (%s); listing again", e or type(e).__name__)
            self._unsynced()   # lists by node scan meanwhile
            await asyncio.sleep(RESTART_PAUSE)
            try:
                rev = await self._relist()
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - tried again after the next pause
                log.warning("cannot list pods for the pods-by-node index: %s", e or type(e).__name__)

    def _apply(self, ev: WatchEvent) -> None:
        if ev.type == "DELETE":
            self._drop(ev.kv.key)
        elif ev.type != PROGRESS:
            self._put(ev.kv)
        if ev.revision > self.revision:
            self.revision = ev.revision
        if self._waiters:
            self._wake()

    def _put(self, kv: KeyValue) -> None:
        node = self._value_of(self._decode(kv))
        old = self._node.get(kv.key)
        if old is not None and old != node:
            self._drop(kv.key)
        self._node[kv.key] = node
        self._pods.setdefault(node, {})[kv.key] = kv

    def _drop(self, key: str) -> None:
        node = self._node.pop(key, None)
        if node is None:
            return
        pods = self._pods.get(node)
        if pods is not None:
            pods.pop(key, None)
            if not pods:
                del self._pods[node]

    def check(self) -> None:
        """Assert the invariants between the two maps (the tests call it)."""
        assert sum(len(p) for p in self._pods.values()) == len(self._node)
        for node, pods in self._pods.items():
            assert pods
            for key in pods:
                assert self._node[key] == node


def internal_ip(node: Obj) -> str:
    """A Node's InternalIP ("" when it has none): what a second node joining on the same
    address would collide with (its NodePorts, its kubelet endpoint's certificate)."""
    for address in objects.status(node).get("addresses") or []:
        if isinstance(address, dict) and address.get("type") == "InternalIP":
            return str(address.get("address") or "")
    return ""


class NodeListing(paging.Listing):
    """A list of pods by node: answered from :class:`NodeIndex` when it can (module
    docstring), else the scan of :class:`~.paging.Listing` it is."""

    def __init__(self, index: NodeIndex, ns: str | None, node: str, store: Store, prefix: str,
                 options: paging.ListOptions, decode: Callable[[KeyValue], Obj],
                 keep: Callable[[Obj], bool] | None, decoded: bool = True) -> None:
        super().__init__(store, prefix, options, decode, keep, decoded)
        self.index, self.ns, self.node = index, ns, node
        self.indexed: list[KeyValue] | None = None   # the answer, when the index gave it

    async def open(self) -> NodeListing:
        answer = await self.index.pods(self.ns, self.node, self.options.not_older_than, self.options.limit)
        if answer is None:
            await super().open()
            return self
        self.indexed, self.revision = answer
        return self

    async def __aiter__(self) -> AsyncIterator[paging.Item]:
        if self.indexed is None:
            async for item in super().__aiter__():
                yield item
            return
        since_turn = 0
        for kv in self.indexed:
            obj = self.decode(kv) if self.decoded or self.keep is not None else None
            since_turn += len(kv.value)
            if since_turn >= paging.TURN_BYTES:   # the loop serves others between
                since_turn = 0
                await asyncio.sleep(0)
            if self.keep is not None and obj is not None and not self.keep(obj):
                continue
            yield paging.Item(kv, obj)
