"""``GET checkpoints/<name>/data?waitSeconds=``: while the Checkpoint is Saving, the answer
waits for the data on its way (a move's target asks before the snapshot is stored), on a
real API server in this process."""
from __future__ import annotations

import asyncio
import functools
import time
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from kube32.apiserver.auth import ADMIN, load_or_create_tokens
from kube32.apiserver.checkpointdata import SIM_CAPACITY, CheckpointDataSpace, Pace
from kube32.apiserver.resources import by_plural
from kube32.apiserver.server import APIServer
from kube32.snapshot import GlobalState, PodState, SnapshotWriter, VALTYPE_I32
from kube32.store import SQLiteStore

CKS = "/apis/kube32.io/v1/namespaces/default/checkpoints"


def cks(ns: str) -> str:
    return f"/apis/kube32.io/v1/namespaces/{ns}/checkpoints"
CUT = -1


def in_loop(fn):
    @functools.wraps(fn)
    def run(*args, **kwargs):
        return asyncio.run(fn(*args, **kwargs))
    return run


def snapshot(memory: bytes) -> bytes:
    state = PodState(image_sha256=bytes(32), memory_bytes=len(memory), memory_pages=max(1, -(-len(memory) // 65536)),
                     pod_time_ms=7,
                     unix_time_ms=0, globals=(GlobalState(0, VALTYPE_I32, 1),))
    return SnapshotWriter(state, memory).to_bytes()


class Server:
    """An API server on a free loopback port, with the Checkpoint data subresource
    (``async with Server(tmp_path) as s``)."""

    def __init__(self, data_dir: Path, capacity: int = SIM_CAPACITY, pace: Pace | None = None) -> None:
        self.data_dir = data_dir
        self.capacity, self.pace = capacity, pace

    async def __aenter__(self) -> "Server":
        await self.start(self.data_dir)
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.stop()

    async def start(self, data_dir: Path) -> None:
        self.store = await SQLiteStore.open(data_dir / "state.db")
        auth = load_or_create_tokens(data_dir)
        self.space = CheckpointDataSpace(self.capacity)
        self.api = APIServer(self.store, auth, data_space=self.space,
                             data_pace=self.pace)
        await self.api.ensure_defaults()
        self.runner = web.AppRunner(self.api.app, access_log=None)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"  # type: ignore[union-attr]
        self.session = aiohttp.ClientSession(headers={"Authorization": f"Bearer {auth.token_for(ADMIN)}"})

    async def stop(self) -> None:
        await self.session.close()
        await self.store.close()
        await self.runner.cleanup()

    async def checkpoint(self, name: str, phase: str, ns: str = "default", pod: str = "p",
                         labels: dict[str, str] | None = None, **status: Any) -> None:
        res = by_plural("checkpoints")
        if await self.api.registry.try_get(by_plural("namespaces"), None, ns) is None:
            await self.api.registry.create(by_plural("namespaces"), None,
                                           {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
        await self.api.registry.create(res, ns, {"apiVersion": "kube32.io/v1", "kind": "Checkpoint",
                                                 "metadata": {"name": name, "labels": labels or {}},
                                                 "spec": {"podName": pod}})
        await self.set_phase(name, phase, ns, **status)

    async def set_phase(self, name: str, phase: str, ns: str = "default", **status: Any) -> None:
        def set_phase(obj: dict[str, Any]) -> dict[str, Any]:
            obj["status"] = {**(obj.get("status") or {}), "phase": phase, **status}
            return obj
        await self.api.registry.mutate(by_plural("checkpoints"), ns, name, set_phase, subresource="status")

    async def get(self, name: str, wait: str | None = None, ns: str = "default") -> tuple[int, bytes]:
        """(status, body); (CUT, b"") when the connection was cut mid-body."""
        params = {"waitSeconds": wait} if wait is not None else None
        try:
            async with self.session.get(f"{self.url}{cks(ns)}/{name}/data", params=params) as r:
                return r.status, await r.read()
        except (aiohttp.ClientPayloadError, aiohttp.ServerDisconnectedError):
            return CUT, b""

    async def waiting_get(self, name: str) -> "asyncio.Future[tuple[int, bytes]]":
        """A GET waiting up to 30 s, given a moment to reach the server."""
        waiting = asyncio.ensure_future(self.get(name, "30"))
        await asyncio.sleep(0.2)
        assert not waiting.done(), "answered before any data came"
        return waiting

    async def put(self, name: str, body: bytes, ns: str = "default") -> int:
        return (await self.put_answer(name, body, ns))[0]

    async def put_answer(self, name: str, body: Any, ns: str = "default",
                         size: int | None = None) -> tuple[int, dict[str, Any]]:
        """(status, JSON answer) of a data PUT; ``body`` may be an async generator of
        ``size`` bytes."""
        headers = {"Content-Type": "application/octet-stream"}
        if size is not None:
            headers["Content-Length"] = str(size)
        async with self.session.put(f"{self.url}{cks(ns)}/{name}/data", data=body, headers=headers) as r:
            return r.status, await r.json()


@in_loop
async def test_a_get_waits_for_the_data_of_a_saving_checkpoint(tmp_path: Path) -> None:
    async with Server(tmp_path) as s:
        await s.checkpoint("ck", "Saving")
        waiting = await s.waiting_get("ck")
        body = snapshot(b"\x05" * 4096)
        assert await s.put("ck", body) == 200
        assert await asyncio.wait_for(waiting, 5) == (200, body)


@in_loop
async def test_a_waiting_get_ends_404_when_no_data_comes(tmp_path: Path) -> None:
    async with Server(tmp_path) as s:
        # Not Saving: no wait at all.
        await s.checkpoint("pending", "Pending")
        started = time.monotonic()
        assert (await s.get("pending", "30"))[0] == 404 and time.monotonic() - started < 5
        # Saving, and the upload is refused (damaged trailer): the waiting GET answers at
        # once - a 404, or, when it had begun forwarding the bytes, a cut connection; never
        # the whole snapshot (the trailer is held back until the data is checked).
        await s.checkpoint("refused", "Saving")
        waiting = await s.waiting_get("refused")
        damaged = bytearray(snapshot(b"\x01" * (1 << 20)))  # large enough to be forwarded as it comes
        damaged[-1] ^= 0xFF
        assert await s.put("refused", bytes(damaged)) == 422
        status, body = await asyncio.wait_for(waiting, 5)
        assert status == CUT or (status == 404 and b'checkpoint \\"refused\\" has no data' in body), (status, body)
        # Saving, and the Checkpoint is deleted: 404 at once.
        await s.checkpoint("deleted", "Saving")
        waiting = await s.waiting_get("deleted")
        await s.api.registry.delete(by_plural("checkpoints"), "default", "deleted")
        assert (await asyncio.wait_for(waiting, 5))[0] == 404
        # Saving and nothing comes: 404 once the wait is over.
        await s.checkpoint("silent", "Saving")
        started = time.monotonic()
        assert (await s.get("silent", "1"))[0] == 404 and time.monotonic() - started >= 1


@in_loop
async def test_wait_seconds_must_be_0_to_60(tmp_path: Path) -> None:
    async with Server(tmp_path) as s:
        await s.checkpoint("ck", "Saving")
        for bad in ("abc", "-1", "61", "1.5"):
            status, body = await s.get("ck", bad)
            assert status == 400 and b"waitSeconds must be a whole number of seconds from 0 to 60" in body, body


@in_loop
async def test_a_waiting_get_forwards_the_data_while_it_arrives(tmp_path: Path) -> None:
    """Cut-through: the target's restore reads the bytes as the control plane receives them."""
    async with Server(tmp_path) as s:
        await s.checkpoint("ck", "Saving")
        body = snapshot(bytes(range(256)) * 4096)  # 1 MiB of memory
        half = asyncio.Event()

        async def slow_body():
            yield body[: len(body) // 2]
            await half.wait()   # the second half only once the reader got the first
            yield body[len(body) // 2:]

        answer = asyncio.ensure_future(s.session.get(f"{s.url}{CKS}/ck/data", params={"waitSeconds": "30"}))
        await asyncio.sleep(0.2)
        upload = asyncio.ensure_future(s.session.put(
            f"{s.url}{CKS}/ck/data", data=slow_body(),
            headers={"Content-Type": "application/octet-stream", "Content-Length": str(len(body))}))
        async with await asyncio.wait_for(answer, 10) as r:
            assert r.status == 200 and r.content_length == len(body)
            first = await asyncio.wait_for(r.content.readexactly(256 << 10), 10)
            assert first == body[: 256 << 10] and not upload.done(), "forwarded only after the whole upload"
            half.set()
            rest = await asyncio.wait_for(r.content.read(), 10)
        assert first + rest == body
        async with await upload as put:
            assert put.status == 200
        assert await s.get("ck") == (200, body)
