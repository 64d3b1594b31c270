"""The kubelet's endpoint: what the API server forwards to this node.

TLS with the node's certificate from the kubelet-serving signer, for its address and
its node's name (see :mod:`.join`; plain HTTP only with ``--kubelet-insecure-http``).
Every request but ``/healthz`` comes from the API server, with a credential no other
node could have passed on (kube32.apiserver.kubeletcredentials): its client
certificate (signed by the API server CA, ``CN=system:kube-apiserver-kubelet-client``),
or a bearer token that the API server's TokenReview says is
``system:kube-apiserver-kubelet-client`` *bound to this node* (``user.extra``
``authentication.kubernetes.io/node-name``; positive answers cached for
:data:`AUTH_CACHE_SECONDS`).  401 without a valid credential, 403 for anyone else,
a token bound to another node included.  Paths live in
:data:`ROUTES` (the checkpoint and thaw endpoints of the migration work plug in there):

* ``/pods/<ns>/<pod>/http/<path>``: one request into the pod's ``k32_handle``;
  a frozen pod answers 503 with ``Retry-After: 1``.  Every refusal of a request the
  pod never began (frozen, moved away, not running) carries
  :data:`~kube32.holding.NOT_STARTED`, and no answer of a pod does (the header is
  dropped from it): the proxies hold and re-send only what is so marked.
* ``/containerLogs/<ns>/<pod>/<container>``, with ``follow``, ``tailLines``, ``timestamps``, ``previous``,
  ``sinceSeconds``, ``sinceTime`` and ``limitBytes``.
* ``/checkpoint/<ns>/<pod>/<container>``, ``/thaw/...`` and ``/images/pull``: see :mod:`.migration`.
* ``/devices/keyboard?key=K[&namespace=NS]``: a key press on a node with a
  keyboard, published on the topic ``keyboard``.
* ``/healthz``.

Confinement, whatever the API server sends (a pod proxy caller is authorised for one
pod, and the kubelet checks again what the API server checked): every
request's raw path is checked before routing (:mod:`kube32.urlpath`): a dot
segment in any encoding, a backslash or a control character is a 400, never
resolved; and a segment that names the namespace, pod or container may not hold
an encoded ``/``.  So a request reaches only the route, and the pod, its path names.
"""
from __future__ import annotations

import asyncio
import datetime as dt
import ssl
import time
from concurrent.futures import Future
from typing import Any, Awaitable, Callable, NamedTuple

from aiohttp import web

from .. import holding, objects, serving, urlpath
from ..client import ApiError, Client
from ..terms import NODE_NAME_EXTRA, ContainerReason
from ..wasm import HttpRequest, PodError, PodFrozen
from . import migration
from .agent import NodeAgent
from .logs import format_line, rfc3339_nano
from .ordering import OrderGate
from .pods import PodWorker

AUTH_CACHE_SECONDS = 60.0
MAX_BODY = 16 << 20          # a request body for a pod; larger ones are refused with 413
# Who may call: the API server, by its client certificate (CN) or by a token bound to
# this node (TokenReview's extra NODE_NAME_EXTRA).  kube32.apiserver.auth's KUBELET_CLIENT.
API_SERVER_CLIENT = "system:kube-apiserver-kubelet-client"
PUBLIC = frozenset({"/healthz"})
Handler = Callable[[NodeAgent, web.Request], Awaitable[web.StreamResponse]]
DROP_HEADERS = frozenset({"host", "authorization", "connection", "keep-alive", "transfer-encoding",
                          "content-length", "x-forwarded-for", "x-forwarded-uri", "accept-encoding",
                          holding.ORDER.lower()})
ORDER_GATE = web.AppKey("order_gate", OrderGate)


# Of a pod's answer: framing the server sets, and the kubelet's own mark (no pod forges it).
POD_DROPPED_HEADERS = frozenset({"content-length", "transfer-encoding", "connection", holding.NOT_STARTED.lower()})


def _text(status: int, text: str, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(status=status, text=text.rstrip("\n") + "\n", headers=headers)


def _not_started(text: str, why: str) -> web.Response:
    """503 for a request the pod never began: ask again, and the proxies may hold it."""
    return _text(503, text, {"Retry-After": "1", holding.NOT_STARTED: why})


class Reviewed(NamedTuple):
    """Who a token is (TokenReview): the user, and the node it is bound to ("" for none)."""
    user: str
    node: str


class TokenCheck:
    """TokenReview with a cache of positive answers (negative ones are asked again)."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self._cache: dict[str, tuple[float, Reviewed]] = {}

    async def review(self, token: str) -> Reviewed | None:
        hit = self._cache.get(token)
        if hit is not None and hit[0] > time.monotonic():
            return hit[1]
        review = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": token}}
        out = await self.client.post_json("/apis/authentication.k8s.io/v1/tokenreviews", review)
        status = objects.status(out)
        if not status.get("authenticated"):
            return None
        user = status.get("user") or {}
        nodes = (user.get("extra") or {}).get(NODE_NAME_EXTRA) or []
        reviewed = Reviewed(str(user.get("username", "")), str(nodes[0]) if len(nodes) == 1 else "")
        if len(self._cache) > 1024:
            self._cache.clear()
        self._cache[token] = (time.monotonic() + AUTH_CACHE_SECONDS, reviewed)
        return reviewed


def _client_cn(request: web.Request) -> str | None:
    """The common name of a client certificate the cluster CA signed (TLS verified it)."""
    transport = request.transport
    cert = transport.get_extra_info("peercert") if transport is not None else None
    for rdn in (cert or {}).get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                return str(value)
    return None


async def _limited(request: web.Request, handler) -> web.StreamResponse:
    if request.content_length is not None and request.content_length > MAX_BODY:
        return _text(413, f"the request body is {request.content_length} bytes, more than the "
                          f"kubelet's limit of {MAX_BODY} bytes")
    return await handler(request)


def server_ssl(context: ssl.SSLContext, ca_pem: bytes) -> ssl.SSLContext:
    """Ask for (not require) a client certificate signed by the cluster CA."""
    context.load_verify_locations(cadata=ca_pem.decode())
    context.verify_mode = ssl.CERT_OPTIONAL
    return context


TAIL = "path"   # the one route variable that is a path (a pod's own), not a name


@web.middleware
async def confine(request: web.Request, handler):
    """A 400 for a path that could name something other than what it seems to."""
    why = urlpath.refusal(request.raw_path.split("?", 1)[0].split("/"))
    if why is None:
        why = next((f'the {key} "{value}" holds a "/"' for key, value in request.match_info.items()
                    if key != TAIL and "/" in value), None)
    if why is not None:
        return _text(400, why)
    return await handler(request)


def build_app(kubelet: NodeAgent) -> web.Application:
    check = TokenCheck(kubelet.client)
    me = kubelet.options.node_name

    @web.middleware
    async def auth(request: web.Request, handler):
        if request.path in PUBLIC:
            return await handler(request)
        cn = _client_cn(request)
        if cn == API_SERVER_CLIENT:
            return await _limited(request, handler)
        if cn is not None:
            return _text(403, f'Forbidden: "{cn}" may not use the kubelet API')
        header = request.headers.get("Authorization", "")
        if not header.lower().startswith("bearer ") or not header[7:].strip():
            return _text(401, "Unauthorized: a bearer token is required")
        try:
            reviewed = await check.review(header[7:].strip())
        except ApiError as e:
            # Refused before any handler ran: nothing began, so it is marked as a frozen pod's is.
            return _not_started(f"cannot check the token with the API server: {e.message}", holding.UNCHECKED)
        if reviewed is None:
            return _text(401, "Unauthorized: the token is not valid")
        if reviewed.user != API_SERVER_CLIENT:
            return _text(403, f'Forbidden: user "{reviewed.user}" may not use the kubelet API')
        if reviewed.node != me:
            # The token the API server gave another node: that node could replay it here.
            bound = f'node "{reviewed.node}"' if reviewed.node else "no node"
            return _text(403, f'Forbidden: this token is bound to {bound}, not to node "{me}"')
        return await _limited(request, handler)

    app = web.Application(middlewares=[serving.track_requests, confine, auth], client_max_size=MAX_BODY)
    app[ORDER_GATE] = OrderGate()
    for method, path, handler in ROUTES:
        app.router.add_route(method, path, _bind(kubelet, handler))
    return app


def _bind(kubelet: NodeAgent, handler: Handler):
    async def h(request: web.Request) -> web.StreamResponse:
        return await handler(kubelet, request)
    return h


async def healthz(kl: NodeAgent, request: web.Request) -> web.Response:
    return _text(200, "ok")


async def _into_pod(kl: NodeAgent, request: web.Request, ns: str, name: str) -> "Future[Any] | web.Response":
    """Queue the request into its pod: the call's future, or the refusal."""
    worker = kl.worker_by_name(ns, name)
    if worker is None and kl.moved_away_lately(ns, name):
        return _not_started(f'pod "{ns}/{name}" moved away from node "{kl.options.node_name}"', holding.MOVED_AWAY)
    if worker is None:
        return _text(404, f'pod "{ns}/{name}" is not running on node "{kl.options.node_name}"')
    inst = worker.instance
    if inst is None:
        return _not_started(f'pod "{ns}/{name}" is not running: {_state_text(worker.state)}', holding.NOT_RUNNING)
    headers = tuple((k, v) for k, v in request.headers.items() if k.lower() not in DROP_HEADERS)
    req = HttpRequest(request.method, "/" + request.match_info[TAIL], request.rel_url.raw_query_string, headers,
                      await request.read())
    try:
        return inst.handle(req)
    except PodFrozen:
        return _not_started(f'pod "{ns}/{name}" is frozen', holding.FROZEN)
    except PodError as e:   # not running: the request was not queued
        return _not_started(f'pod "{ns}/{name}" cannot serve: {e}', holding.NOT_RUNNING)


async def pod_http(kl: NodeAgent, request: web.Request) -> web.Response:
    ns, name = request.match_info["ns"], request.match_info["pod"]
    # A held request the API server numbered goes into the pod after the one before it.
    async with request.app[ORDER_GATE].turn(ns, name, request.headers.get(holding.ORDER)):
        fut = await _into_pod(kl, request, ns, name)
    if isinstance(fut, web.Response):
        return fut
    try:
        resp = await asyncio.wait_for(asyncio.wrap_future(fut), kl.options.call_timeout_ms / 1000 + 5)
    except PodFrozen:   # queued, then the freeze came first: the call never began
        return _not_started(f'pod "{ns}/{name}" is frozen', holding.FROZEN)
    except PodError as e:
        return _text(502, f'pod "{ns}/{name}" failed the request: {e}')
    except TimeoutError:
        return _text(504, f'pod "{ns}/{name}" did not answer in time')
    if kl.free_heap() != kl.reported_free_heap:
        kl.node_changed()  # a call that grew memory: report the free heap (and any pressure) now
    out = web.Response(status=resp.status, body=resp.body)
    for k, v in resp.headers:
        if k.lower() not in POD_DROPPED_HEADERS:
            out.headers.add(k, v)
    return out


def _state_text(state: dict) -> str:
    for kind, detail in state.items():
        return f"{kind} {detail.get('reason', '')}: {detail.get('message', '')}".strip(": ")
    return "not started"


async def container_logs(kl: NodeAgent, request: web.Request) -> web.StreamResponse:
    ns, name, container = request.match_info["ns"], request.match_info["pod"], request.match_info["container"]
    worker = kl.worker_by_name(ns, name)
    if worker is None:
        return _text(404, f'pod "{ns}/{name}" is not on node "{kl.options.node_name}"')
    if container != worker.container:
        return _text(400, f"container {container} is not valid for pod {name}")
    options = log_options(request.query)
    if isinstance(options, str):
        return _text(400, options)
    tail, since, limit, timestamps, follow, previous = options
    run = log_run(worker, previous)
    if isinstance(run, str):
        return _text(400, run)
    if run != worker.restart_count or "terminated" in worker.state:
        follow = False  # that container has ended: its log is complete
    if not follow:
        body = b"".join(format_line(e, timestamps) for e in worker.logs.lines(tail, run, since))
        return web.Response(body=body[:limit], content_type="text/plain")
    resp = web.StreamResponse(headers={"Content-Type": "text/plain", "Cache-Control": "no-cache"})
    resp.enable_chunked_encoding()
    await resp.prepare(request)
    left = limit
    try:
        async for entry in worker.logs.follow(tail, run, since):
            line = format_line(entry, timestamps)
            if left is not None:
                line, left = line[:left], left - len(line[:left])
            await resp.write(line)
            if left == 0:
                break
        await resp.write_eof()
    except (ConnectionResetError, RuntimeError):
        pass
    return resp


def log_run(worker: PodWorker, previous: bool) -> int | str:
    """Which run of the container a log request means, as the kubelet chooses the
    container (its validateContainerLogStatus): the running or finished one, else the
    last one that ended (a container in back-off); with ``previous``, the last one that
    ended.  Lines are tagged with the restart count they were logged under, and a run
    that ended is followed by one more restart count, so that one is count - 1."""
    state, last = worker.state or {}, worker.last_state or {}
    if previous:
        if "terminated" not in last:
            return f'previous terminated container "{worker.container}" in pod "{worker.name}" not found'
        return worker.restart_count - 1
    if "running" in state or "terminated" in state:
        return worker.restart_count
    if "terminated" in last:
        return worker.restart_count - 1
    reason = (state.get("waiting") or {}).get("reason", ContainerReason.CONTAINER_CREATING)
    why = {ContainerReason.ERR_IMAGE_PULL: "image can't be pulled",
           ContainerReason.IMAGE_PULL_BACK_OFF: "trying and failing to pull image"}.get(reason, reason)
    return f'container "{worker.container}" in pod "{worker.name}" is waiting to start: {why}'


class LogQuery(NamedTuple):
    tail: int | None          # tailLines
    since: str | None         # sinceSeconds or sinceTime, as an rfc3339_nano cut
    limit: int | None         # limitBytes
    timestamps: bool
    follow: bool
    previous: bool


def log_options(q: Any) -> LogQuery | str:
    """A log request's query as kubectl sends it, or the message of a 400."""
    flags = {k: q.get(k, "").lower() in ("1", "true") for k in ("timestamps", "follow", "previous")}
    numbers: dict[str, int | None] = {}
    for key, least in (("tailLines", 0), ("sinceSeconds", 1), ("limitBytes", 1)):
        raw = q.get(key)
        if raw is None or raw == "":
            numbers[key] = None
            continue
        try:
            numbers[key] = int(raw)
        except ValueError:
            return f'{key} must be a number, not "{raw}"'
        if numbers[key] < least:  # type: ignore[operator]
            return f"{key}: Invalid value: {raw}: must be greater than {'or equal to ' if least == 0 else ''}0"
    since = None
    if q.get("sinceTime") and numbers["sinceSeconds"] is not None:
        return "at most one of sinceTime or sinceSeconds may be specified"
    if numbers["sinceSeconds"] is not None:
        since = rfc3339_nano(dt.datetime.now(dt.timezone.utc) - dt.timedelta(seconds=numbers["sinceSeconds"]))
    elif q.get("sinceTime"):
        try:
            when = dt.datetime.fromisoformat(q["sinceTime"].replace("Z", "+00:00"))
        except ValueError:
            return f'sinceTime must be an RFC 3339 time, not "{q["sinceTime"]}"'
        if when.tzinfo is None:
            when = when.replace(tzinfo=dt.timezone.utc)
        since = rfc3339_nano(when.astimezone(dt.timezone.utc))
    return LogQuery(numbers["tailLines"], since, numbers["limitBytes"], flags["timestamps"], flags["follow"],
                    flags["previous"])


async def keyboard(kl: NodeAgent, request: web.Request) -> web.Response:
    if "keyboard" not in kl.options.devices:
        return _text(404, f'node "{kl.options.node_name}" has no keyboard (start it with --devices keyboard)')
    key = request.query.get("key", "")
    if not key:
        return _text(400, "give the key pressed as ?key=K")
    ns = request.query.get("namespace", "default")
    await kl.publish_async(ns, "keyboard", key.encode(), f"node/{kl.options.node_name}")
    return _text(200, f"published key {key!r} on topic keyboard in namespace {ns}")


# (method, path, handler): the kubelet API.
ROUTES: list[tuple[str, str, Handler]] = [
    ("POST", "/checkpoint/{ns}/{pod}/{container}", migration.checkpoint),
    ("POST", "/thaw/{ns}/{pod}/{container}", migration.thaw),
    ("POST", "/images/pull", migration.pull_image),
    ("GET", "/healthz", healthz),
    ("*", "/pods/{ns}/{pod}/http/{path:.*}", pod_http),
    ("GET", "/containerLogs/{ns}/{pod}/{container}", container_logs),
    ("GET", "/devices/keyboard", keyboard),
    ("POST", "/devices/keyboard", keyboard),
]
