"""``/healthz``, ``/livez`` and ``/readyz``: named checks, answered as kube-apiserver does.

Each path runs its checks: ``ping`` and ``log`` (the server answers at all), ``etcd``
(the store answers a read within :data:`STORE_TIMEOUT`, whatever the backend: kube-apiserver's
name for its store check, kept so tools that look for it find it) and, for ``/readyz``,
``shutdown`` (fails once the server has begun to stop).  The answer is ``ok``; with
``?verbose`` one ``[+]<check> ok`` line per check and ``<path> check passed``.  A failed
check makes it a 500 that is always verbose, ``[-]<check> failed: reason withheld`` (the
paths are public: the reason goes to the log) and ``<path> check failed``.
``?exclude=<check>`` skips one (``[+]<check> excluded: ok``).  ``/<path>/<check>``
runs one check: ``ok``, or a 500 ``internal server error: <reason>``.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Awaitable, Callable

from aiohttp import web

from ..store import Store

log = logging.getLogger("kube32.apiserver.health")

STORE_TIMEOUT = 2.0   # s: a store read slower than this fails the etcd check
HEALTH_KEY = "/registry/health"   # read, never written: any answer (None too) is healthy

Check = Callable[[], Awaitable[None]]   # raises with the reason when unhealthy


class Health:
    """The checks of one API server and the handlers of its health paths."""

    PATHS = ("healthz", "livez", "readyz")

    def __init__(self, store: Store) -> None:
        self.store = store
        self.stopping = False

    async def _ok(self) -> None:
        return None

    async def _store(self) -> None:
        """The store answers a read and says it is healthy (etcd: a quorum of members)."""
        try:
            await asyncio.wait_for(self.store.get(HEALTH_KEY), STORE_TIMEOUT)
            problem = await asyncio.wait_for(self.store.health(), STORE_TIMEOUT)
        except TimeoutError:
            raise RuntimeError(f"the store did not answer within {STORE_TIMEOUT:g}s") from None
        if problem:
            raise RuntimeError(problem)

    async def _shutdown(self) -> None:
        if self.stopping:
            raise RuntimeError("the API server is shutting down")

    def checks(self, path: str) -> dict[str, Check]:
        out: dict[str, Check] = {"ping": self._ok, "log": self._ok, "etcd": self._store}
        if path == "readyz":
            out["shutdown"] = self._shutdown
        return out

    async def failure(self, check: Check) -> str | None:
        """Why ``check`` fails (None: it passes)."""
        try:
            await check()
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 - any failure of a check is its answer
            return str(e) or type(e).__name__
        return None

    async def report(self, path: str, verbose: bool, exclude: list[str]) -> tuple[int, str]:
        """(status, text) of ``/<path>``."""
        lines, failed, left = [], [], set(exclude)
        for name, check in self.checks(path).items():
            if name in left:
                left.discard(name)
                lines.append(f"[+]{name} excluded: ok")
                continue
            why = await self.failure(check)
            if why is None:
                lines.append(f"[+]{name} ok")
            else:
                log.warning("/%s: the %s check failed: %s", path, name, why)
                lines.append(f"[-]{name} failed: reason withheld")
                failed.append(name)
        if left:
            lines.append("warn: some health checks cannot be excluded: no matches for "
                         + ",".join(f'"{n}"' for n in sorted(left)))
        if failed:
            return 500, "\n".join(lines) + f"\n{path} check failed\n"
        return 200, ("\n".join(lines) + f"\n{path} check passed\n") if verbose else "ok"

    async def root(self, request: web.Request) -> web.Response:
        path = request.path.strip("/").split("/")[0]
        status, text = await self.report(path, "verbose" in request.query, request.query.getall("exclude", []))
        return _text(status, text)

    async def one(self, request: web.Request) -> web.Response:
        path = request.path.strip("/").split("/")[0]
        check = self.checks(path).get(request.match_info["check"])
        if check is None:
            return _text(404, "404 page not found\n")
        why = await self.failure(check)
        return _text(200, "ok") if why is None else _text(500, f"internal server error: {why}\n")

    def add_routes(self, router: web.UrlDispatcher) -> None:
        for path in self.PATHS:
            router.add_get(f"/{path}", self.root)
            router.add_get(f"/{path}/{{check}}", self.one)


def _text(status: int, text: str) -> web.Response:
    return web.Response(status=status, text=text, content_type="text/plain",
                        headers={"X-Content-Type-Options": "nosniff"})
