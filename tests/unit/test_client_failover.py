"""The REST client with a hung API server (attack 26, findings 2 and 9), and the leader's
fencing (finding 4).

A hung server is a listening socket nobody accepts from: the kernel completes the TCP
handshake and takes the request, and nothing ever answers, which is what a SIGSTOPped
API server (or a machine that paused) looks like.  The healthy one is a small aiohttp
server.  The client must move to it within seconds (probe after `PROBE_AFTER`, `PROBE_TIMEOUT`; shortened
here), not after a 30 s read timeout; a leader's controllers' client refuses writes once the
elector's renew deadline passed.
"""
from __future__ import annotations

import asyncio
import json
import socket
import time
from typing import Any
from unittest import mock

import pytest
from aiohttp import web

from kube32.client import CONFIGMAPS, ApiError, Client
from kube32.client import rest
from kube32.controllers.leaderelection import LeaderElectionTimings, LeaderElector


def run(test: Any) -> None:
    asyncio.run(test())


async def healthy_server(events: asyncio.Queue) -> tuple[web.AppRunner, str]:
    async def healthz(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def configmaps(request: web.Request) -> web.StreamResponse:
        if request.query.get("watch"):
            resp = web.StreamResponse()
            await resp.prepare(request)
            obj = await events.get()
            await resp.write(json.dumps({"type": "ADDED", "object": obj}).encode() + b"\n")
            return resp
        return web.json_response({"items": [], "metadata": {"resourceVersion": "7"}})

    app = web.Application()
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/api/v1/namespaces/default/configmaps", configmaps)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, f"http://127.0.0.1:{port}"


def hung_server() -> tuple[socket.socket, str]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)  # never accepted: connections complete, requests are never read
    return sock, f"http://127.0.0.1:{sock.getsockname()[1]}"


@mock.patch.object(rest, "PROBE_TIMEOUT", 0.5)
@mock.patch.object(rest, "PROBE_AFTER", 1.0)
def test_a_get_and_a_watch_leave_a_hung_server_within_seconds() -> None:
    async def check() -> None:
        events: asyncio.Queue = asyncio.Queue()
        runner, good = await healthy_server(events)
        sock, hung = hung_server()
        client = Client(hung, "t", servers=[hung, good])
        try:
            t0 = time.monotonic()
            items, rv = await client.list(CONFIGMAPS, "default")
            took = time.monotonic() - t0
            assert rv == "7" and client.server == good
            assert took < rest.PROBE_AFTER + rest.PROBE_TIMEOUT + 2, f"the GET left the hung server after {took:.1f}s"

            # A watch on a server that hangs later ends (its caller lists again elsewhere).
            client.server = hung
            t0 = time.monotonic()
            with pytest.raises(ApiError) as broken:
                async for _ in client.watch(CONFIGMAPS, "default"):
                    pass
            assert broken.value.code == 0 and "not even /healthz" in broken.value.message
            assert time.monotonic() - t0 < rest.PROBE_AFTER + rest.PROBE_TIMEOUT + 2
            assert client.server == good

            # An idle watch on a healthy server stays (its /healthz answers).
            async def first() -> tuple[str, Any]:
                async for ev in client.watch(CONFIGMAPS, "default"):
                    return ev
                raise AssertionError("the watch ended")
            watching = asyncio.ensure_future(first())
            await asyncio.sleep(rest.PROBE_AFTER * 2 + 1)
            assert not watching.done()
            await events.put({"metadata": {"name": "late", "resourceVersion": "8"}})
            etype, obj = await asyncio.wait_for(watching, 5)
            assert etype == "ADDED" and obj["metadata"]["name"] == "late"
        finally:
            await client.close()
            await runner.cleanup()
            sock.close()

    run(check)


class FakeLeases:
    """The API of one Lease, in memory: get, create, update with resourceVersion CAS."""

    def __init__(self) -> None:
        self.lease: dict[str, Any] | None = None
        self.rv = 0

    async def get(self, kind: Any, name: str, namespace: str | None = None) -> dict[str, Any]:
        if self.lease is None:
            raise ApiError(404, "NotFound", "no lease")
        return json.loads(json.dumps(self.lease))

    async def create(self, kind: Any, obj: dict[str, Any], namespace: str | None = None) -> dict[str, Any]:
        self.rv += 1
        self.lease = {**obj, "metadata": {**obj["metadata"], "resourceVersion": str(self.rv)}}
        return self.lease

    async def update(self, kind: Any, obj: dict[str, Any], subresource: str | None = None) -> dict[str, Any]:
        assert self.lease is not None
        if obj["metadata"]["resourceVersion"] != self.lease["metadata"]["resourceVersion"]:
            raise ApiError(409, "Conflict", "modified")
        return await self.create(kind, obj)


def test_a_leader_whose_renew_deadline_passed_writes_nothing() -> None:
    """The fence a leader's controllers' client checks before every write: open while the
    term is renewed; shut once renew_deadline passed since the last renewal began (a hung
    process waking), whatever runs first; open again after a renewal."""
    async def check() -> None:
        leases = FakeLeases()
        elector = LeaderElector(leases, "cp-1", LeaderElectionTimings(4, 3, 1))  # type: ignore[arg-type]
        started = asyncio.Event()

        async def lead() -> None:
            started.set()
            await asyncio.Event().wait()
        campaign = asyncio.create_task(elector.run(lead))
        await asyncio.wait_for(started.wait(), 5)
        assert elector.fence() is None
        client = Client("http://127.0.0.1:9", "t", servers=["http://127.0.0.1:9", "http://127.0.0.1:10"])
        client.guard = elector.fence
        woke = time.monotonic() + 3.5  # as after a SIGSTOP longer than the renew deadline
        with mock.patch("kube32.controllers.leaderelection.time.monotonic", return_value=woke):
            why = elector.fence()
            assert why and "renew deadline 3s" in why
            with pytest.raises(ApiError) as fenced:
                await client.create(CONFIGMAPS, {"metadata": {"name": "x", "namespace": "default"}})
            assert fenced.value.reason == "Fenced"
        campaign.cancel()
        await asyncio.gather(campaign, return_exceptions=True)
        assert elector.fence() is not None, "not leading: fenced"
        assert leases.lease and leases.lease["spec"]["holderIdentity"] == ""  # released
        await client.close()

    run(check)



def test_a_leader_that_finds_another_holder_stops_at_once() -> None:
    """The Lease taken from a leader (another control plane, or anyone who wrote it): its
    next look finds the other holder and it stops leading then, fence shut, not at the
    renew deadline (attack round 26b: two controller managers acted side by side ~8 s)."""
    async def check() -> None:
        leases = FakeLeases()
        elector = LeaderElector(leases, "cp-1", LeaderElectionTimings(15, 10, 0.2))  # type: ignore[arg-type]
        started, stopped = asyncio.Event(), asyncio.Event()

        async def lead() -> None:
            started.set()
            try:
                await asyncio.Event().wait()
            finally:
                stopped.set()
        campaign = asyncio.create_task(elector.run(lead))
        await asyncio.wait_for(started.wait(), 5)
        assert leases.lease is not None
        taken = json.loads(json.dumps(leases.lease))
        taken["spec"]["holderIdentity"] = "cp-2"
        await leases.update(None, taken)
        t0 = time.monotonic()
        await asyncio.wait_for(stopped.wait(), 3)
        assert time.monotonic() - t0 < 1.5 and elector.fence() is not None
        campaign.cancel()
        await asyncio.gather(campaign, return_exceptions=True)

    run(check)
