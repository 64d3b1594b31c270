"""Restoring a pod from a Checkpoint: one :class:`RestorePlan` per restore, prepared or fetched.

A pod with ``kube32.io/restore-from: <checkpoint>`` starts from that Checkpoint's snapshot
instead of ``k32_init``: ``GET .../checkpoints/<name>/data`` is streamed into a fresh
instance (the reader checks image, memory limit, globals, tables and trailer as the bytes
arrive), then the runtime restores clock and channels and calls ``k32_restored``
(:func:`finish`).  Any failure is a :class:`RestoreError` whose message begins "cannot
restore the snapshot: ".

A restore is one :class:`RestorePlan`, made when the pod's worker begins a start, in one of
two ways:

* prepared: the move's prefetch (kube32.kubelet.prefetch) did all of it but the finish
  before the pod existed - module, config, instance, and the data streamed in
  (:class:`Prepared`).  The plan uses it when the pod's image and config are the ones
  prepared; otherwise it drops it and fetches.
* fetched: the plan sends the data request itself, once the pod's module is loaded
  (:meth:`RestorePlan.fetch_early`), so that its round trip through the API server
  overlaps the config and the instantiation - not before: a slow pull would leave the
  answer waiting in buffers.

Either way the worker runs the same steps - :meth:`~RestorePlan.module_for`,
:meth:`~RestorePlan.fetch_early`, :meth:`~RestorePlan.instance`, :meth:`~RestorePlan.restore`,
:meth:`~RestorePlan.close` - and the plan decides what each does.

Invariants:

* A prepared restore is the plan's until :meth:`RestorePlan.instance` claims its instance;
  :meth:`RestorePlan.close` (always called, idempotent) gives back what is left: an unread
  data answer is released, an unclaimed prepared instance is discarded (it stops).
* One data request per restore at most: a plan never sends a second one.
"""
from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any, Protocol

import aiohttp

from .. import testing
from ..client import CHECKPOINTS, Client
from ..snapshot import Snapshot, SnapshotError
from ..terms import Annotation
from ..urlpath import PathRefused
from ..wasm import Module, Pod, PodConfig, PodError
from .nodeapi import NodeServices

log = logging.getLogger("kube32.kubelet.restore")



class RestoreError(Exception):
    """A restore that failed; the container ends terminated with reason RestoreError."""

    def __init__(self, cause: str) -> None:
        super().__init__(f"cannot restore the snapshot: {cause}")


class DataRequest:
    """A restore's ``GET .../checkpoints/<name>/data``: sent by the move's prefetch (with
    ``wait_seconds``, before the data is stored; kube32.kubelet.prefetch), or else once
    the pod's module is loaded, so that its round trip through the API server overlaps
    the pod's config and the instantiation.  ``close`` releases an answer nobody read
    (idempotent)."""

    def __init__(self, client: Client, namespace: str, checkpoint_name: str, wait_seconds: int = 0) -> None:
        self.checkpoint_name = checkpoint_name
        params = {"waitSeconds": str(wait_seconds)} if wait_seconds else None
        self.response: asyncio.Future[aiohttp.ClientResponse]
        try:
            # The name comes from the pod's kube32.io/restore-from: one segment of the
            # pod's own namespace's checkpoints, whatever it holds, or no request at all.
            path = CHECKPOINTS.path(namespace, checkpoint_name, "data")
        except PathRefused as e:
            self.response = asyncio.get_running_loop().create_future()
            self.response.set_exception(RestoreError(f"{Annotation.RESTORE_FROM} {checkpoint_name!r} does not "
                                                     f"name a Checkpoint of namespace {namespace}: {e}"))
            return
        self.response = asyncio.ensure_future(client.request(
            "GET", path, params=params, timeout=aiohttp.ClientTimeout(total=None, sock_read=60 + wait_seconds)))

    async def close(self) -> None:
        if not self.response.done():
            self.response.cancel()
        await asyncio.wait([self.response])
        if not self.response.cancelled() and self.response.exception() is None:
            self.response.result().release()


async def read_into(instance: Pod, request: DataRequest, faults: tuple[str, ...] = ()) -> Snapshot:
    """Make ``instance`` (on a thread, while the data's answer comes) and stream the data
    into it: everything of a restore but :func:`finish`."""
    prepared = asyncio.ensure_future(asyncio.to_thread(instance.prepare_restore))
    try:
        return await _read(request, prepared, faults)
    finally:
        await asyncio.wait([prepared])  # never hand back an instance still being made
        if not prepared.cancelled():
            prepared.exception()  # seen: reported above, or superseded by the request's failure


async def finish(instance: Pod, snap: Snapshot) -> None:
    """Globals, tables, clock and channels; ``k32_restored``; the held events."""
    try:
        await asyncio.to_thread(instance.finish_restore, snap)
    except (PodError, SnapshotError) as e:
        raise RestoreError(str(e)) from None


async def _read(request: DataRequest, prepared: "asyncio.Future[Any]", faults: tuple[str, ...]) -> Snapshot:
    checkpoint_name = request.checkpoint_name
    try:
        async with await request.response as r:
            try:
                reader = await prepared
            except PodError as e:
                raise RestoreError(str(e)) from None
            if r.status == 404:
                raise RestoreError(f"checkpoint {checkpoint_name} has no data (lost with a control plane "
                                   "restart, or dropped to make room)")
            if r.status != 200:
                raise RestoreError(f"the checkpoint's data could not be read: {r.status} {(await r.text())[:200]}")
            stream = await testing.restore_stream(faults, r.content)
            return await reader.read_async(stream)
    except SnapshotError as e:
        raise RestoreError(str(e)) from None
    except (aiohttp.ClientError, asyncio.TimeoutError) as e:
        raise RestoreError(f"the checkpoint's data could not be read: {e}") from None


@dataclass(frozen=True)
class Prepared:
    """A restore done but for its finish (by the move's prefetch)."""
    image: str
    module: Module
    config: PodConfig  # as the node's config_for gives it, before the free-heap cap
    instance: Pod
    snapshot: Snapshot


class Preparations(Protocol):
    """Who made a :class:`Prepared` restore and counts its instance (the prefetch)."""

    def claim(self, prepared: Prepared) -> Pod:
        """The prepared instance, now the caller's (no longer counted by its maker)."""

    def discard(self, prepared: Prepared) -> None:
        """A prepared restore nobody will finish: its instance stops."""


class RestoreSource(Protocol):
    """Where a pod's worker gets the plan of its restore (the prefetch)."""

    async def plan(self, namespace: str, checkpoint: str) -> "RestorePlan":
        """The restore from ``checkpoint``: the one prepared for it, if any, else a fetch."""


class RestorePlan:
    """One pod's restore from Checkpoint ``checkpoint``: ``prepared`` (by ``maker``), or
    fetched by the plan itself.  The worker's steps, in order: :meth:`module_for`,
    :meth:`fetch_early`, :meth:`instance`, :meth:`restore`; :meth:`close` at the end,
    whatever happened."""

    def __init__(self, node: NodeServices, namespace: str, checkpoint: str,
                 prepared: Prepared | None = None, maker: Preparations | None = None) -> None:
        if prepared is not None and maker is None:
            raise ValueError("a prepared restore needs the maker that counts its instance")
        self.node = node
        self.namespace = namespace
        self.checkpoint = checkpoint
        self._prepared = prepared
        self._maker = maker
        self._snapshot: Snapshot | None = None  # the prepared snapshot, once its instance is claimed
        self._request: DataRequest | None = None

    def module_for(self, image: str) -> Module | None:
        """The module prepared for ``image``; None: load it."""
        p = self._prepared
        return p.module if p is not None and p.image == image else None

    def fetch_early(self) -> None:
        """Unless prepared, send the data request now (once the module is loaded)."""
        if self._prepared is None and self._snapshot is None and self._request is None:
            self._request = DataRequest(self.node.client, self.namespace, self.checkpoint)

    def instance(self, image: str, module: Module, config: PodConfig) -> Pod:
        """The instance to restore into: the prepared one when it was prepared for this
        ``image`` and ``config`` (it is then the caller's), else a new one of ``module``
        (the prepared restore is dropped, and the data fetched).  PodError as
        :meth:`NodeServices.new_instance`."""
        p = self._prepared
        if p is not None and p.image == image and p.config == config:
            assert self._maker is not None
            self._prepared, self._snapshot = None, p.snapshot
            return self._maker.claim(p)
        self._drop_prepared()
        self.fetch_early()
        return self.node.new_instance(module, config)

    async def restore(self, instance: Pod) -> None:
        """Bring ``instance`` (from :meth:`instance`) to the snapshot's state: stream the
        data into it unless the prefetch did, then :func:`finish` (RestoreError)."""
        snapshot = self._snapshot
        if snapshot is not None:
            log.info("restoring %s/%s from checkpoint %s: begun before the replacement arrived",
                     self.namespace, instance.config.name, self.checkpoint)
        else:
            self.fetch_early()
            request, self._request = self._request, None
            assert request is not None
            try:
                snapshot = await read_into(instance, request, self.node.options.faults)
            finally:
                await request.close()
        await finish(instance, snapshot)

    async def close(self) -> None:
        """Give back what the plan still holds (idempotent)."""
        self._drop_prepared()
        if self._request is not None:
            request, self._request = self._request, None
            await request.close()

    def _drop_prepared(self) -> None:
        if self._prepared is not None:
            prepared, self._prepared = self._prepared, None
            assert self._maker is not None
            self._maker.discard(prepared)
