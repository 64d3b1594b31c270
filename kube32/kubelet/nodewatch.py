"""The Nodes as the API server holds them, for kubelets that compare them with what they
would report (kube32.kubelet.kubelet's status loop).

A kubelet that writes its Node's status only when it changed (Kubernetes'
``nodeStatusReportFrequency``: the Lease is the heartbeat) must know what the server holds:
the node lifecycle controller marks a silent node's conditions Unknown, a user edits an
annotation, and the kubelet puts them back at once, not at its next full report.
Kubernetes' kubelet reads its Node from an informer on ``metadata.name=<node>``; so does
this one.

Design and invariants:

* One :class:`NodeWatch` is one informer of Nodes: a kubelet's own (``NodeWatch(name)``:
  ``fieldSelector=metadata.name=<name>``, which the node authorizer lets a node list and
  watch), or a fleet's, shared by its nodes (``NodeWatch()``: every Node, one watch and one
  connection for a thousand nodes instead of a thousand; a node may list and watch every
  Node, as in Kubernetes).  Reading is all it does: each node still writes its own Node
  with its own credentials.
* Followers (:meth:`follow`) are called by name, O(1) an event: a fleet's event for one
  node wakes that node's kubelet alone.  A follower must only note the change (set an
  event); it runs inside the informer's handler.
* :meth:`held` is the newer of the watch's copy and the copy a node's own write returned
  (:meth:`wrote`), by resourceVersion (one global revision in Kube32, so they compare as
  integers): a kubelet looking right after its write does not see the copy before it and
  write again.  It is None while the watch has not listed once (nothing is known: the
  kubelet writes as if it differed), and when the Node does not exist.
* A watch owns the client it is started with (a sibling of a node's: a pool of its own, so
  the watch never holds one of the node's connections) and closes it when done.
  :meth:`start` again with another client (a fleet whose watching node stopped) starts a
  new informer; until it has listed, the old one's copies answer.
"""
from __future__ import annotations

import asyncio
from typing import Any, Callable

from .. import objects
from ..client import NODES, Client, Informer

Obj = dict[str, Any]


def _revision(obj: Obj | None) -> int:
    try:
        return int(objects.meta(obj or {}).get("resourceVersion") or -1)
    except ValueError:
        return -1


class NodeWatch:
    """See the module docstring."""

    def __init__(self, name: str | None = None) -> None:
        self.name = name   # the one Node watched, or None: every Node
        self._followers: dict[str, Callable[[], None]] = {}
        self._written: dict[str, Obj] = {}
        self._informer: Informer | None = None
        self._previous: Informer | None = None   # answers until a restarted informer has listed
        self._tasks: set[asyncio.Task] = set()   # strong refs: the loop keeps only weak ones
        self.client: Client | None = None

    # --- lifecycle -------------------------------------------------------------------
    @property
    def running(self) -> bool:
        return self._informer is not None

    def start(self, client: Client) -> None:
        """Watch with ``client``'s credentials, which this watch owns from now on (it closes
        it when done).  Again (another client): the informer before answers until this one
        has listed, then stops, and its client is closed."""
        selector = f"metadata.name={self.name}" if self.name else None
        informer = Informer(client, NODES, field_selector=selector)
        informer.add_handler(self._on_event)
        before = self._informer
        self._informer, self.client = informer, client
        informer.start()
        if before is not None:
            self._retire(before)

    def _retire(self, informer: Informer) -> None:
        if self._previous is not None:   # never listed for anyone: stop it now
            self._spawn(self._stop_informer(self._previous))
        self._previous = informer
        live = self._informer
        assert live is not None

        async def when_listed() -> None:
            await live.synced.wait()
            await self._stop_informer(informer)
            if self._previous is informer:
                self._previous = None
        self._spawn(when_listed())

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro, name="node-watch-retire")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    @staticmethod
    async def _stop_informer(informer: Informer) -> None:
        await informer.stop()
        await informer.client.close()

    async def stop(self) -> None:
        """Stop watching and close the clients it was given."""
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for informer in (self._informer, self._previous):
            if informer is not None:
                await self._stop_informer(informer)
        self._informer = self._previous = None
        self.client = None

    # --- reading ---------------------------------------------------------------------
    def follow(self, name: str, on_change: Callable[[], None]) -> None:
        """Call ``on_change`` at each event of Node ``name`` (and once it is listed)."""
        self._followers[name] = on_change

    def forget(self, name: str) -> None:
        self._followers.pop(name, None)
        self._written.pop(name, None)

    def wrote(self, node: Obj) -> None:
        """The Node a write of its kubelet returned (see :meth:`held`)."""
        name = objects.name(node)
        if _revision(node) > _revision(self._watched(name)):
            self._written[name] = node

    def held(self, name: str) -> Obj | None:
        """What the server holds of Node ``name``, as far as known; None when it is not known
        (not listed yet) or there is no such Node."""
        watched = self._watched(name)
        if watched is None and not self.synced:
            return None
        written = self._written.get(name)
        if written is not None and _revision(written) > _revision(watched):
            return written
        return watched

    @property
    def synced(self) -> bool:
        live = self._informer
        return live is not None and (live.synced.is_set() or
                                     (self._previous is not None and self._previous.synced.is_set()))

    def _watched(self, name: str) -> Obj | None:
        live = self._informer
        if live is not None and live.synced.is_set():
            return live.get(name)
        if self._previous is not None and self._previous.synced.is_set():
            return self._previous.get(name)
        return None

    def _on_event(self, etype: str, node: Obj, _old: Obj | None) -> None:
        name = objects.name(node)
        written = self._written.get(name)
        if etype == "DELETED" or (written is not None and _revision(node) >= _revision(written)):
            self._written.pop(name, None)
        follower = self._followers.get(name)
        if follower is not None:
            follower()
