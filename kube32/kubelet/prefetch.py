"""A move's data, asked for before its replacement arrives.

The Checkpoint controller names a move's target in ``status.targetNode`` when the move
turns ``Saving``, before it takes the snapshot.  The kubelet watches the Checkpoints that
name its node (``fieldSelector status.targetNode=<node>``: all the node authorizer lets
a node watch of them) and, for each Move still ``Saving``, sends the restore's
``GET .../data?waitSeconds=`` at once.  The API server answers it the moment the
snapshot is stored, so the bytes are under way while the controller replaces the pod
and the pod watch brings the replacement here; the replacement's worker takes the
request (:meth:`Prefetcher.take`) instead of sending its own.  A restart has nothing to
fetch; this round trip, taken off a move's path, is what lets a move keep up with one.

Invariants:

* The body is read only by the restore, straight into the new instance: until then flow
  control holds the bytes in the sockets (aiohttp reads at most its buffer ahead), so a
  prefetch costs no second copy of the linear memory.
* At most :data:`MAX_WAITING` requests are out at once (each holds a connection of the
  node's client: a drain's many Saving moves must not starve its status writes); the
  others are asked for as earlier ones are taken or closed.
* One request per Checkpoint uid.  One that failed (an error, 404) is dropped and not
  sent again: the worker then sends its own, as without a prefetch.
* A request nobody took is closed once its Checkpoint no longer names this node, has
  finished or is gone, or after :data:`UNCLAIMED_SECONDS`.
"""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..client import CHECKPOINTS, Informer
from ..client.informer import key_of
from .migration import DataRequest

if TYPE_CHECKING:
    from .kubelet import Kubelet

MAX_WAITING = 4
WAIT_SECONDS = 50         # the API server's wait for the data (its limit is 60)
UNCLAIMED_SECONDS = 70.0  # longer than a move's rollback timeout (60 s)
SWEEP_SECONDS = 5.0

Obj = dict[str, Any]


@dataclass(frozen=True)
class _Asked:
    uid: str
    request: DataRequest
    at: float


def _move_toward(ck: Obj, node: str) -> bool:
    st = ck.get("status") or {}
    return (ck.get("spec") or {}).get("action") == "Move" and st.get("targetNode") == node \
        and st.get("phase") in ("Saving", "Moving")


class Prefetcher:
    def __init__(self, kl: "Kubelet") -> None:
        self.kl = kl
        self.node = kl.options.node_name
        self.informer = Informer(kl.client, CHECKPOINTS, field_selector=f"status.targetNode={self.node}")
        self.informer.add_handler(lambda *_: self._reconcile())
        self._asked: dict[str, _Asked] = {}   # "ns/name" -> the request out for it
        self._tried: set[str] = set()         # Checkpoint uids asked for once already
        self._closing: set[asyncio.Task] = set()

    def start(self) -> list[asyncio.Task]:
        return [self.informer.start(), asyncio.create_task(self._sweep(), name="kubelet-prefetch")]

    async def stop(self) -> None:
        await self.informer.stop()
        for asked in self._asked.values():
            self._close(asked.request)
        self._asked.clear()
        await asyncio.gather(*self._closing, return_exceptions=True)

    def take(self, namespace: str, name: str) -> DataRequest | None:
        """The request out for this Checkpoint's data, now the caller's (None: send your own)."""
        asked = self._asked.pop(f"{namespace}/{name}", None)
        self._reconcile()  # room for the next one
        if asked is None:
            return None
        if asked.request.failed():
            self._close(asked.request)
            return None
        return asked.request

    async def _sweep(self) -> None:
        while True:
            await asyncio.sleep(SWEEP_SECONDS)
            self._reconcile()

    def _reconcile(self) -> None:
        moves = {key_of(ck): ck for ck in self.informer.list() if _move_toward(ck, self.node)}
        now = time.monotonic()
        for key, asked in list(self._asked.items()):
            ck = moves.get(key)
            if ck is None or ck["metadata"].get("uid") != asked.uid or asked.request.failed() \
                    or now - asked.at > UNCLAIMED_SECONDS:
                del self._asked[key]
                self._close(asked.request)
        self._tried &= {ck["metadata"].get("uid") for ck in moves.values()}
        saving = sorted((ck for ck in moves.values() if ck["status"]["phase"] == "Saving"),
                        key=lambda ck: ck["metadata"].get("creationTimestamp") or "")
        for ck in saving:
            if len(self._asked) >= MAX_WAITING:
                break
            key, uid = key_of(ck), ck["metadata"].get("uid", "")
            if key in self._asked or uid in self._tried:
                continue
            self._tried.add(uid)
            self._asked[key] = _Asked(uid, DataRequest(self.kl, ck["metadata"]["namespace"], ck["metadata"]["name"],
                                                       wait_seconds=WAIT_SECONDS), now)

    def _close(self, request: DataRequest) -> None:
        task = asyncio.create_task(request.close())
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)
