"""The API server's figures in /metrics (kube32.metrics): requests by verb, resource and
code with their latency (kube-apiserver's apiserver_request_total and
apiserver_request_duration_seconds), snapshots stored and the checkpoint data space.

The middleware counts every request once, after the errors middleware made its answer,
with the verb and resource the authorizer saw (``describe``): the resource label is a
kind the server serves (a built-in one, or a custom resource its CRDs serve: the
application's :func:`count_custom`) or empty, the subresource one that kind has (the
resource table's, which the routing reads too) or empty, never a client's string, so
label sets stay few.  A watch is counted but not timed (it lasts as long as the client
wants), as kube-apiserver times only its start.  A request cancelled before it was
answered (its client went away) is not counted: it had no code.
"""
from __future__ import annotations

import asyncio
import time
from typing import Any, Awaitable, Callable

from aiohttp import web

from .. import metrics
from .rbac import Attributes
from .resources import NOT_HERE, RESOURCES, Resource

REQUESTS = metrics.REGISTRY.counter(
    "apiserver_request_total", "Requests answered, by verb, group, resource, subresource and HTTP code.",
    ("verb", "group", "resource", "subresource", "code"))
LATENCY = metrics.REGISTRY.histogram(
    "apiserver_request_duration_seconds", "Time to answer a request (watches excepted), by verb and resource.",
    ("verb", "group", "resource", "subresource"))
SNAPSHOT_BYTES = metrics.REGISTRY.histogram(
    "kube32_checkpoint_snapshot_bytes", "Size of each snapshot stored in the checkpoint data space.", (),
    buckets=tuple(4096 * 4**i for i in range(9)))
DATA_SPACE = metrics.REGISTRY.gauge(
    "kube32_checkpoint_data_space_bytes", "The checkpoint data space: bytes in use and its capacity.", ("state",))

_ATTRS = "kube32.metrics.attrs"
_CUSTOM: web.AppKey[Callable[[str, str], Resource | None]] = web.AppKey("kube32.metrics.custom")
_KUBE_VERBS = {"list": "LIST", "watch": "WATCH", "get": "GET", "deletecollection": "DELETE"}


def describe(request: web.Request, attrs: Attributes) -> None:
    """What the authorizer saw of ``request``: its verb and resource, for the counts."""
    request[_ATTRS] = attrs


def count_custom(app: web.Application, served: Callable[[str, str], Resource | None]) -> None:
    """Requests to custom resources are labelled with their group and resource:
    ``served(group, plural)`` is the served Resource, or None."""
    app[_CUSTOM] = served


def _labels(request: web.Request) -> tuple[str, str, str, str]:
    attrs: Attributes | None = request.get(_ATTRS)
    method = request.method
    if method == "PATCH" and request.headers.get("Content-Type", "").startswith("application/apply-patch"):
        verb = "APPLY"
    elif attrs is not None and attrs.resource_request:
        verb = _KUBE_VERBS.get(attrs.verb, method)
    else:
        verb = method
    if attrs is None or not attrs.resource_request:
        return verb, "", "", ""
    res = _SERVED.get((attrs.api_group, attrs.resource))
    if res is None and _CUSTOM in request.app:
        res = request.app[_CUSTOM](attrs.api_group, attrs.resource)
    if res is None:
        return verb, "", "", ""
    return verb, attrs.api_group, attrs.resource, _subresource(res, attrs.subresource)


def _subresource(res: Resource, sub: str) -> str:
    """``sub`` when the resource table the routing reads gives ``res`` that subresource, or
    refuses it by name (:data:`.resources.NOT_HERE`); else empty: no client's string."""
    return sub if sub and (res.has_sub(sub) or (res.plural, sub) in NOT_HERE) else ""


_SERVED = {(r.group, r.plural): r for r in RESOURCES}


@web.middleware
async def middleware(request: web.Request,
                     handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> web.StreamResponse:
    started = time.monotonic()
    code = 500
    try:
        response = await handler(request)
        code = response.status
        return response
    except web.HTTPException as e:
        code = e.status
        raise
    except asyncio.CancelledError:
        code = 0
        raise
    finally:
        if code:
            _count(request, code, started)


def _count(request: web.Request, code: int, started: float) -> None:
    verb, group, resource, sub = _labels(request)
    REQUESTS.inc(verb, group, resource, sub, str(code))
    if verb != "WATCH":
        LATENCY.observe(time.monotonic() - started, verb, group, resource, sub)


def snapshot_stored(size: int) -> None:
    SNAPSHOT_BYTES.observe(size)


def data_space(space: Any) -> None:
    """The data space's figures now (read at a scrape)."""
    DATA_SPACE.set(space.used, "used")
    DATA_SPACE.set(space.capacity, "capacity")
