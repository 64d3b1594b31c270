"""A move's restore, begun before its replacement arrives.

The Checkpoint controller names a move's target in ``status.targetNode`` when the move
turns ``Saving``, before it takes the snapshot.  The kubelet watches the Checkpoints that
name its node (``fieldSelector status.targetNode=<node>``: all the node authorizer lets
a node watch of them) and, for each Move still ``Saving``, starts the restore at once:
it reads the pod being moved (the node authorizer lets the target read it, and the
ConfigMaps and Secrets it names, while the move is under way), pulls and loads its
image, sends ``GET .../data?waitSeconds=`` (the API server forwards the snapshot's bytes
as it receives them), builds its config as this node would run it, makes the instance
and streams the data straight into it while the controller stores the snapshot and
replaces the pod.  When the replacement arrives, its worker asks for its restore's plan
(:meth:`Prefetcher.plan`, a :class:`~.restore.RestorePlan` holding the :class:`~.restore.Prepared`
restore) and only finishes it (globals, tables, clock, channels, ``k32_restored``) - if
its image and config are the ones prepared; otherwise the prepared instance is dropped
and the plan fetches the data as without a prefetch.  A restart
can begin nothing before its pod exists; a move knows its target early, and this is
what lets a move keep up with one.

Invariants:

* No second copy: the data goes from the socket into the prepared instance's linear
  memory, as in any restore.  Prepared instances count against the node's free heap.
* At most :data:`MAX_PREPARING` restores are begun at once (each holds an instance and
  a connection of the node's client: a drain's many Saving moves must not starve the
  node); the others begin as earlier ones are taken or dropped.
* One try per Checkpoint uid; a try that fails (an error, a refusal, a 404) is dropped
  and not made again: the worker then restores by itself and meets the same cause.
* A prepared restore nobody took is dropped once its Checkpoint no longer names this
  node, has finished or is gone, or after :data:`UNCLAIMED_SECONDS`.
"""
from __future__ import annotations

import asyncio
import copy
import logging
import time
from dataclasses import dataclass
from typing import Any

from .. import objects, timing
from ..client import CHECKPOINTS, PODS, Informer
from ..client.informer import key_of
from ..wasm import Pod
from ..terms import CheckpointAction, CheckpointPhase
from .nodeapi import NodeServices
from .restore import DataRequest, Prepared, RestorePlan, read_into

log = logging.getLogger("kube32.kubelet.prefetch")

MAX_PREPARING = 4
WAIT_SECONDS = timing.PREFETCH_DATA_WAIT_SECONDS       # the API server's wait for the data (timing says why)
UNCLAIMED_SECONDS = timing.PREFETCH_UNCLAIMED_SECONDS  # longer than a move's rollback timeout
SWEEP_SECONDS = 5.0

Obj = dict[str, Any]


@dataclass(frozen=True)
class _Entry:
    uid: str  # the Checkpoint's
    task: "asyncio.Task[Prepared | None]"
    at: float


def _came_to_nothing(task: asyncio.Task) -> bool:
    return task.done() and (task.cancelled() or task.exception() is not None or task.result() is None)


def _move_toward(ck: Obj, node: str) -> bool:
    st = objects.status(ck)
    return objects.spec(ck).get("action") == CheckpointAction.MOVE and st.get("targetNode") == node \
        and st.get("phase") in CheckpointPhase.IN_FLIGHT


class Prefetcher:
    """The node's :class:`~.restore.RestoreSource`: a plan with the restore prepared for it,
    when there is one."""

    def __init__(self, node: NodeServices, informer: Informer | None = None) -> None:
        """``informer``: the Checkpoints naming this node (default: the node's own watch of
        them; a unit test gives its own)."""
        self.node = node
        self.node_name = node.options.node_name
        self.informer = informer or Informer(node.client, CHECKPOINTS,
                                             field_selector=f"status.targetNode={self.node_name}")
        self.informer.add_handler(lambda *_: self._reconcile())
        self._entries: dict[str, _Entry] = {}  # "ns/name" -> the restore begun for it
        self._tried: set[str] = set()          # Checkpoint uids begun once already
        self._instances: set[Pod] = set()      # prepared, not yet claimed: counted in the free heap
        self._background: set[asyncio.Task] = set()

    def start(self) -> list[asyncio.Task]:
        return [self.informer.start(), asyncio.create_task(self._sweep(), name="kubelet-prefetch")]

    async def stop(self) -> None:
        await self.informer.stop()
        for entry in self._entries.values():
            self._drop(entry)
        self._entries.clear()
        await asyncio.gather(*self._background, return_exceptions=True)

    def instances(self) -> list[Pod]:
        """The instances prepared and not yet claimed (the node counts them in its heap)."""
        return list(self._instances)

    async def plan(self, namespace: str, checkpoint: str) -> RestorePlan:
        """The restore from this Checkpoint: with the restore begun for it, now the plan's
        (waited for), or a plan that fetches the data itself."""
        entry = self._take(namespace, checkpoint)
        # A worker stopped meanwhile cancels the preparation too: it forgets its instance.
        prepared = await entry.task if entry is not None else None
        return RestorePlan(self.node, namespace, checkpoint, prepared, self)

    def _take(self, namespace: str, name: str) -> _Entry | None:
        key = f"{namespace}/{name}"
        entry = self._entries.pop(key, None)
        ck = self.informer.get(key)
        if entry is not None and (ck is None or ck["metadata"].get("uid") != entry.uid):
            self._drop(entry)  # a Checkpoint of the same name, not the one prepared
            entry = None
        self._reconcile()  # room for the next one
        return entry

    def claim(self, prepared: Prepared) -> Pod:
        """The prepared instance, now the caller's worker's (no longer counted here)."""
        self._instances.discard(prepared.instance)
        return prepared.instance

    def discard(self, prepared: Prepared) -> None:
        """A prepared restore nobody will finish: its instance stops."""
        self._forget(prepared.instance)

    async def _sweep(self) -> None:
        while True:
            await asyncio.sleep(SWEEP_SECONDS)
            self._reconcile()

    def _reconcile(self) -> None:
        moves = {key_of(ck): ck for ck in self.informer.list() if _move_toward(ck, self.node_name)}
        now = time.monotonic()
        for key, entry in list(self._entries.items()):
            ck = moves.get(key)
            if ck is None or ck["metadata"].get("uid") != entry.uid or now - entry.at > UNCLAIMED_SECONDS \
                    or _came_to_nothing(entry.task):
                del self._entries[key]
                self._drop(entry)
        self._tried &= {ck["metadata"].get("uid") for ck in moves.values()}
        saving = sorted((ck for ck in moves.values() if ck["status"]["phase"] == CheckpointPhase.SAVING),
                        key=lambda ck: ck["metadata"].get("creationTimestamp") or "")
        for ck in saving:
            if len(self._entries) >= MAX_PREPARING:
                break
            key, uid = key_of(ck), ck["metadata"].get("uid", "")
            if key in self._entries or uid in self._tried:
                continue
            self._tried.add(uid)
            self._entries[key] = _Entry(uid, asyncio.create_task(self._prepare(ck), name=f"prefetch {key}"), now)

    def _drop(self, entry: _Entry) -> None:
        entry.task.cancel()

        async def settle() -> None:
            await asyncio.wait([entry.task])
            prepared = None if _came_to_nothing(entry.task) else entry.task.result()
            if prepared is not None:
                self.discard(prepared)
        self._spawn(settle())

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _prepare(self, ck: Obj) -> Prepared | None:
        """Everything of the restore but its finish, as the pod will run here; None when
        anything fails (the worker then restores by itself)."""
        ns, name = ck["metadata"]["namespace"], ck["metadata"]["name"]
        st = objects.status(ck)
        request: DataRequest | None = None
        instance: Pod | None = None
        try:
            pod = await self.node.client.get(PODS, ck["spec"]["podName"], ns)
            if pod["metadata"].get("uid") != st.get("podUID"):
                return None
            here = copy.deepcopy(pod)
            here["spec"]["nodeName"] = self.node_name
            container = (here["spec"].get("containers") or [{}])[0]
            image, ann = container.get("image", ""), here["metadata"].get("annotations") or {}
            module = await self.node.load_module(image, ann)
            # The data's request once the module is loaded (the API server holds it until
            # the snapshot comes): one request at a time on the node's connections, and no
            # answer waiting in buffers behind a slow pull - the restore's peak memory.
            request = DataRequest(self.node.client, ns, name, wait_seconds=WAIT_SECONDS)
            config = await self.node.config_for(here)
            instance = self.node.new_instance(module, config)
            self._instances.add(instance)
            snapshot = await read_into(instance, request, self.node.options.faults)
            return Prepared(image, module, config, instance, snapshot)
        except asyncio.CancelledError:
            self._forget(instance)
            raise
        except Exception as e:  # noqa: BLE001 - any failure: the worker restores by itself
            log.debug("no prefetch for %s/%s: %s", ns, name, e)
            self._forget(instance)
            return None
        finally:
            if request is not None:
                await request.close()

    def _forget(self, instance: Pod | None) -> None:
        """Stop an instance prepared here and not claimed (a claimed one is its worker's)."""
        if instance is not None and instance in self._instances:
            self._instances.discard(instance)
            self._spawn(asyncio.to_thread(instance.stop))
