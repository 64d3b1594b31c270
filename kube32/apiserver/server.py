"""The Kube32 API server: Kubernetes' REST API over aiohttp.

Routing follows Kubernetes' URL layout
(``/api/v1[/namespaces/<ns>]/<plural>[/<name>[/<subresource>[/<path>]]]`` and the
same under ``/apis/<group>/<version>``); every kind goes through the generic
:class:`~kube32.apiserver.registry.Registry`.  Handlers raise
:class:`~kube32.apiserver.errors.APIError`; one middleware turns it into a
``Status``.  Any other exception is a 500 Status and is logged: the server
never goes down for a request.

Invariants:

* Every request but the public health/version paths carries a valid bearer
  token (401 otherwise) and passes the authorizer chain of :mod:`.authz`
  (system:masters, the node authorizer, RBAC) before its handler runs (403).
* Watches are streams of newline-delimited JSON events; with ``resourceVersion``
  unset or "0" they start with a synthetic ADDED per object (kubectl drops the
  first event of a named watch and relies on it).
* Lists are paged and streamed (:mod:`.paging`); watches run through a bounded feed per
  watcher, each event encoded once for all of them (:mod:`.watchstream`): neither holds
  the event loop for more than one pass over one object.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import ssl
from pathlib import Path
from typing import Any, AsyncIterator, Callable
from urllib.parse import quote

from aiohttp import web

from .. import holding, metrics, objects, serving
from ..store import Store, Unavailable, ValueTooLarge
from . import (apimetrics, authz, binding, bodies, checkpointstatus, crds, discovery, dryrun, errors, eventbus,
               gostrings, health, hold, images, impersonation, kubeletcredentials, meta, nodecredentials, nodeports,
               nodetokens, paging, podreplacement, rbac, serviceaccounts, tables, watchstream)
from .auth import PUBLIC_PATHS, TokenAuthenticator
from .checkpointdata import CheckpointDataAPI
from .nodeindex import NodeIndex, internal_ip
from .dataspace import SIM_CAPACITY, CheckpointDataSpace, Pace
from .eviction import EvictionHandler
from ..matching import label_selector
from .limits import MAX_DEPTH
from .peers import Peers
from .openapi import serving as openapi
from .kubeletcredentials import KubeletEndpoint
from .proxy import KubeletProxy, Unreached, check_suffix, kubelet_endpoint, kubelet_url, proxied_name, ready_pods
from .registry import BIG_OBJECT, PATCH_APPLY, PATCH_STRATEGIC, PATCH_TYPES, Registry, WatchItem, encoded, patch_refusal
from .resources import NOT_HERE, Resource, by_plural, lookup
from .routing import ANY, Subresources, Target, json_response, query_flag
from .selectors import parse_field_selector, parse_label_selector

log = logging.getLogger("kube32.apiserver")

DEFAULT_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")
WATCH_TIMEOUT = 1800.0
MAX_FIELD_MANAGER = 128
STREAM_PIECE = 64 << 10   # a streamed list is written in pieces of about this many bytes
LIST_SEATS = 8            # lists whose next piece is being made at once (stream_body)
PEER_CHECK_TIMEOUT = 20.0   # seconds a restart waits on the other API servers to learn what data it lost


async def stream_body(request: web.Request, pieces: AsyncIterator[bytes],
                      seats: asyncio.Semaphore | None = None) -> web.StreamResponse:
    """A JSON body written as its pieces come (a list: :func:`paging.encoded_list`).  The first
    piece is awaited before the answer begins, so a refusal (400, 410, 504) is still a
    Status; a failure after that cuts the connection (the client sees a broken body, never
    a short list that parses).

    ``seats``: each :data:`STREAM_PIECE` of the body is made holding one (and written to
    the client without), so however many lists run at once, at most that many are ready
    to run on the event loop: a request behind them (``/healthz``, a Lease renewal) waits
    for a few pieces' work, not one piece of every list (round 25d: 200 lists of one
    node's pods at once held /healthz 1.5-5 s).  A slow reader holds no seat."""
    seat: Any = seats if seats is not None else contextlib.nullcontext()
    async with seat:
        first = await anext(pieces)
    resp = web.StreamResponse(headers={"Content-Type": "application/json"})
    resp.enable_chunked_encoding()
    await resp.prepare(request)
    try:
        chunk, more = [first], True
        while more:
            async with seat:
                more = await _fill(chunk, pieces)
            if chunk:
                await resp.write(b"".join(chunk))   # joined once (a bytearray grown piece by piece copied twice)
            chunk = []
        await resp.write_eof()
    except (ConnectionResetError, RuntimeError):
        pass
    except Exception:  # noqa: BLE001 - the answer has begun: cut it, say why in the log
        log.exception("a list failed after its answer began; the connection is cut")
        if request.transport is not None:
            request.transport.abort()
    return resp


async def _fill(chunk: list[bytes], pieces: AsyncIterator[bytes]) -> bool:
    """Add ``pieces`` to ``chunk`` until it holds :data:`STREAM_PIECE` bytes (True: more
    may follow) or they end (False)."""
    size = sum(len(p) for p in chunk)
    async for piece in pieces:
        chunk.append(piece)
        size += len(piece)
        if size >= STREAM_PIECE:
            return True
    return False


class APIServer:
    """The aiohttp application and what its handlers share, built complete: the registry,
    authorization, the image store, the event bus, the kubelet proxy, the Checkpoint data
    space and every subresource (one table, :meth:`_subresources`).

    ``kubelet_tls``: makes the client context for HTTPS kubelets (the kubelet signer, the API
    server's client certificate; kube32.apiserver.kubeletcredentials); ``pki_dir``: the cluster CA's directory,
    which signs kubelet certificates (None: nodes get tokens only); ``data_space``: the
    memory for all Checkpoint data (default: the simulator's 16 MiB)."""

    def __init__(self, store: Store, auth: TokenAuthenticator, *,
                 kubelet_tls: Callable[[], ssl.SSLContext] | None = None, images_dir: Path | None = None,
                 pki_dir: Path | None = None,
                 data_space: CheckpointDataSpace | None = None, data_pace: Pace | None = None) -> None:
        self.store = store
        self.images = images.ImageStore(images_dir)
        self.events = eventbus.EventBus()
        self.registry = Registry(store)
        # Lists of pods by node from a watch-fed index (kube32.apiserver.nodeindex): where
        # the store's watch gives progress marks (SQLite); with etcd lists scan, as before.
        # Nodes by address, so a join on an address a running node has is refused.
        self.nodes_by_address: NodeIndex | None = None
        if NodeIndex.usable(store):
            self.registry.pods_by_node = NodeIndex(store, self.registry.shared_decode)
            self.nodes_by_address = NodeIndex(store, self.registry.shared_decode, plural="nodes",
                                              value_of=internal_ip)
        self.watch_encoder = watchstream.WatchEncoder()   # each watch event encoded once for all watchers
        self.list_seats = asyncio.Semaphore(LIST_SEATS)   # lists made at once (stream_body)
        self.bookmark_interval = watchstream.BOOKMARK_INTERVAL
        self.node_ports = nodeports.NodePortAllocator(store)   # cluster-wide, through the store
        self.registry.claims["services"] = self.node_ports
        self.auth = auth
        self.node_tokens = nodetokens.NodeTokens(self.registry)  # shared by API servers via the store
        self.authorizer = authz.Authorizer(self.registry)
        self.pki_dir = pki_dir
        self.kubelets = KubeletProxy(kubeletcredentials.KubeletCredentials(auth.service_accounts, kubelet_tls))
        self.holds = hold.Holds(self.registry)   # requests held through moves; .stats for /metrics
        self.evictions = EvictionHandler(self.registry, self.images.exports)
        self.data = CheckpointDataAPI(self.registry, self.events, self.authorizer, self.kubelets,
                                      data_space or CheckpointDataSpace(SIM_CAPACITY), data_pace or Pace())
        self.crds = crds.Catalog(self.registry)   # the custom resources served (CRDs)
        self.binding = binding.handler(self.registry)   # pods/<name>/binding and bindings
        self.subresources = self._subresources()
        self.health = health.Health(store)
        self._announce: asyncio.Task[None] | None = None   # this API server's Lease among its peers
        self._lost_check: asyncio.Task[None] | None = None   # what a restart lost, asked of the peers
        self.app = self._build_app()

    def _subresources(self) -> Subresources:
        """Who serves each subresource (which kind has which: kube32.apiserver.resources)."""
        table = Subresources()
        table.add(ANY, "", [ANY], self._object)
        table.add(ANY, "status", [ANY], self._object)
        table.add(ANY, "scale", [ANY], self.scale)
        table.add(ANY, "proxy", [ANY], self.proxy)
        table.add("pods", "binding", ["POST"], self.binding)
        table.add("pods", "eviction", ["POST"], self.eviction)
        table.add("pods", "log", ["GET"], self.pod_log)
        table.add("pods", "replacement", ["POST"], podreplacement.handler(self.registry))
        table.add("namespaces", "finalize", ["PUT"], self.finalize_namespace)
        table.add("serviceaccounts", "token", ["POST"], serviceaccounts.token_handler(self.registry, self.auth))
        table.add("checkpoints", "data", ["GET"], self.data.get)
        table.add("checkpoints", "data", ["PUT"], self.data.put)
        return table

    @property
    def peers(self) -> Peers | None:
        """The other API servers on the store (None: alone, or not joined yet)."""
        return self.data.peers

    async def start(self, *, shared_store: bool = False) -> None:
        """Before serving: the default namespaces and RBAC objects, every stored Service's
        nodePorts claimed (:meth:`.nodeports.NodePortAllocator.repair`); and, the Checkpoint
        data space starting empty, every Checkpoint that held data says it lost it, unless
        the store is shared with other API servers (etcd), whose data spaces may still hold
        it: that is decided when the server joins them (:meth:`join_peers`)."""
        await self.ensure_defaults()
        await self.node_ports.repair()
        await self.crds.start()
        await self.data.start()
        for index in (self.registry.pods_by_node, self.nodes_by_address):
            if index is not None:
                await index.start()
        if not shared_store:
            await self.report_data_lost()

    async def join_peers(self, url: str, token: str, ca_pem: bytes | None) -> None:
        """Once it serves at ``url`` on a shared store: announce this API server to the
        others (its Lease, renewed until :meth:`leave_peers`) and answer their checkpoint
        data GETs for data it holds (kube32.apiserver.peers).  The data the Checkpoints name
        may be held by another API server: it is lost only when none runs (this one starts
        empty); a restart among running peers loses what only this one held."""
        peers = Peers(self.registry, url, token, ca_pem)
        peers.holds = self.holds_data
        self.data.peers = peers
        self._announce = asyncio.create_task(peers.run(), name="peers")
        # Beside the start, not in its way: the check asks the other API servers, and one
        # that hangs (a stopped machine) must not keep this one's controllers from
        # campaigning for the Lease (a local CI run: cp-1 never led while its peers were
        # SIGSTOPped, its start waiting on them).
        self._lost_check = asyncio.create_task(self._check_lost_data(peers), name="peers-lost-data")

    async def _check_lost_data(self, peers: Peers) -> None:
        try:
            if not await asyncio.wait_for(peers.alive(), PEER_CHECK_TIMEOUT):
                await self.report_data_lost()
                return
            await asyncio.wait_for(peers.restarted(), PEER_CHECK_TIMEOUT)
        except Exception as e:  # noqa: BLE001 - a start goes on; a peer's Lease expiry looks again
            log.warning("cannot check which checkpoint data this restart lost: %s", e or type(e).__name__)

    async def leave_peers(self) -> None:
        """Withdraw this API server's Lease (the others stop sending it requests)."""
        for task in (self._lost_check, self._announce):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        self._lost_check = self._announce = None

    def holds_data(self, uid: str) -> bool:
        """Whether this API server's data space holds the data of the Checkpoint ``uid``."""
        return self.data.space.stored(uid) is not None

    async def report_data_lost(self) -> None:
        """Every Checkpoint that held data says it lost it (this data space starts empty)."""
        await checkpointstatus.lost_at_start(self.registry)

    # --- app ------------------------------------------------------------------
    def _build_app(self) -> web.Application:
        heavy = bodies.HeavyBodies()
        app = web.Application(middlewares=[serving.track_requests, heavy.middleware, apimetrics.middleware,
                                           self._errors_middleware, self._auth_middleware],
                              client_max_size=bodies.MAX_BODY)
        app[bodies.HeavyBodies.KEY] = heavy
        apimetrics.count_custom(app, self.crds.any_version)
        r = app.router
        # Discovery answers with and without a trailing slash, as kube-apiserver does
        # (kr8s asks for /version/ and /api/, pykube-ng for /apis/<group>/<version>/).
        for slash in ("", "/"):
            r.add_get("/version" + slash, self.version)
            r.add_get("/api" + slash, self.api_versions)
            r.add_get("/apis" + slash, self.api_groups)
            r.add_get("/openapi/v3" + slash, self.openapi_root)
            r.add_get("/openapi/v2" + slash, self.openapi_v2)
            r.add_route("*", "/api/v1" + slash, self.group_version_root)
        r.add_get("/metrics", self.metrics)
        self.health.add_routes(r)
        r.add_get("/openapi/v3/{path:.+}", self.openapi_doc)
        r.add_route("*", "/api/v1/{tail:.*}", self.resource)
        r.add_post("/apis/authentication.k8s.io/v1/tokenreviews", self.token_review)
        authz.add_routes(r, self.authorizer)
        nodecredentials.add_routes(r, self.registry, self.auth, self.node_tokens, self.pki_dir,
                                   self.nodes_by_address)
        images.add_routes(r, self.images)   # before the generic /apis/{group}/{version}/... routes
        eventbus.add_routes(r, self.events, self.registry.check_namespace_open)
        for slash in ("", "/"):
            r.add_get("/apis/{group}" + slash, self.api_group)
            r.add_route("*", "/apis/{group}/{version}" + slash, self.group_version_root)
        r.add_route("*", "/apis/{group}/{version}/{tail:.*}", self.resource)
        app.on_shutdown.append(self._shutdown)
        app.on_cleanup.append(self._cleanup)
        return app

    async def _shutdown(self, app: web.Application) -> None:
        """Stopping: /readyz says so; the long-lived streams that no store close ends, end
        now; held requests get their 503 with Retry-After before the grace ends and cuts them."""
        self.health.stopping = True
        self.events.close()
        self.holds.stop_holding()

    async def _cleanup(self, app: web.Application) -> None:
        await self.crds.close()
        await self.data.close()
        await self.holds.close()
        await self.kubelets.close()
        for index in (self.registry.pods_by_node, self.nodes_by_address):
            if index is not None:
                await index.close()

    async def ensure_defaults(self) -> None:
        ns = by_plural("namespaces")
        for name in DEFAULT_NAMESPACES:
            if await self.registry.try_get(ns, None, name) is None:
                await self.registry.create(ns, None, {"metadata": {"name": name}}, check_namespace=False)
        await rbac.ensure_defaults(self.registry)

    @web.middleware
    async def _errors_middleware(self, request: web.Request, handler: Any) -> web.StreamResponse:
        try:
            return await handler(request)
        except errors.APIError as e:
            return json_response(e.status(), e.code, e.headers)
        except web.HTTPException as e:
            if e.status >= 400:
                reason = {404: "NotFound", 405: "MethodNotAllowed",
                          413: "RequestEntityTooLarge"}.get(e.status, "BadRequest")
                msg = errors.NO_RESOURCE if e.status == 404 else e.reason
                return json_response(errors.APIError(e.status, reason, msg).status(), e.status)
            raise
        except (ValueTooLarge, Unavailable) as e:  # etcd: its size limit; no member, no quorum
            refusal = (errors.too_large(str(e)) if isinstance(e, ValueTooLarge)
                       else errors.service_unavailable(str(e), retry_after=1))
            return json_response(refusal.status(), refusal.code, refusal.headers)
        except (asyncio.CancelledError, ConnectionResetError):
            raise
        except RecursionError:
            # Every decoder and patch bounds nesting (limits.MAX_DEPTH); this is the net
            # under them: the client's too-deep input, never a 500.
            log.warning("a request nested too deep for a bound: %s %s", request.method, request.path)
            return json_response(errors.bad_request(f"the request nests too deeply to be handled "
                                                    f"(at most {MAX_DEPTH} levels)").status(), 400)
        except Exception as e:  # noqa: BLE001 - the server must outlive any request
            log.exception("internal error serving %s %s", request.method, request.path)
            return json_response(errors.internal(f"an internal error occurred: {type(e).__name__}: {e}").status(), 500)

    async def token_still_valid(self, user: Any) -> bool:
        """The store's part of a signed token's check: its ServiceAccount still exists, it
        is its node's current token, the Node a kubelet client token names still exists."""
        return (await serviceaccounts.still_valid(self.registry, user) and await self.node_tokens.still_valid(user)
                and await kubeletcredentials.still_valid(self.registry, user))

    @web.middleware
    async def _auth_middleware(self, request: web.Request, handler: Any) -> web.StreamResponse:
        if request.path in PUBLIC_PATHS:
            return await handler(request)
        user = self.auth.authenticate(request.headers.get("Authorization"))
        if user is None or not await self.token_still_valid(user):
            raise errors.unauthorized()
        if impersonation.asked(request.headers):
            user = await impersonation.impersonated(self.authorizer, user, request.headers)
        request["user"] = user
        attrs = authz.request_attributes(user, request.method, request.path, request.query)
        apimetrics.describe(request, attrs)
        allowed, reason = await self.authorizer.authorize(attrs)
        if not allowed:
            raise authz.forbidden(attrs, reason)
        try:
            return await handler(request)
        finally:
            if attrs.api_group == rbac.GROUP and attrs.verb not in rbac.READ:
                self.authorizer.rbac.invalidate()

    # --- discovery ----------------------------------------------------------
    async def version(self, request: web.Request) -> web.Response:
        return json_response(discovery.VERSION_INFO)

    async def metrics(self, request: web.Request) -> web.Response:
        """This process's figures in the Prometheus text format (kube32.metrics); needs
        ``get`` on the non-resource URL /metrics (cluster-admin, system:monitoring)."""
        apimetrics.data_space(self.data.space)
        return web.Response(body=metrics.REGISTRY.render().encode(), headers={"Content-Type": metrics.CONTENT_TYPE})

    async def api_versions(self, request: web.Request) -> web.Response:
        return json_response(discovery.api_versions(request.host))

    async def api_groups(self, request: web.Request) -> web.Response:
        return json_response(crds.group_list(self.crds, discovery.api_group_list()))

    async def api_group(self, request: web.Request) -> web.Response:
        doc = discovery.api_group(request.match_info["group"])
        if doc is None and (custom := crds.group_document(self.crds, request.match_info["group"])):
            doc = {"kind": "APIGroup", "apiVersion": "v1", **custom}
        if doc is None:
            raise errors.no_such_path()
        return json_response(doc)

    async def group_version_root(self, request: web.Request) -> web.Response:
        group = request.match_info.get("group")
        gv = f"{group}/{request.match_info['version']}" if group else "v1"
        doc = discovery.api_resource_list(gv) or crds.resource_list(self.crds, gv)
        if doc is None or request.method != "GET":
            raise errors.no_such_path()
        return json_response(doc)

    async def openapi_root(self, request: web.Request) -> web.Response:
        root = openapi.v3_root()
        return json_response({**root, "paths": {**root["paths"], **crds.openapi_paths(self.crds)}})

    async def openapi_doc(self, request: web.Request) -> web.Response:
        path = request.match_info["path"]
        body = openapi.v3_document_bytes(path)
        if body is None and path.startswith("apis/"):
            doc = crds.openapi_document(self.crds, path[len("apis/"):])
            body = json.dumps(doc, separators=(",", ":")).encode() if doc is not None else None
        if body is None:
            raise errors.no_such_path()
        return openapi.answer(request, body, "application/json")

    async def openapi_v2(self, request: web.Request) -> web.Response:
        return openapi.answer(request, *openapi.v2_for(request.headers.get("Accept", "")))

    async def token_review(self, request: web.Request) -> web.Response:
        """TokenReview: kubelets check who calls their endpoints (webhook authentication)."""
        body = await bodies.read_body(request, "cannot create tokenreviews")
        token = meta.nested(body, "spec", "token") or ""
        if not isinstance(token, str):
            raise errors.bad_request("cannot create tokenreviews: spec.token must be a string")
        user = self.auth.authenticate(f"Bearer {token}") if token else None
        if user is not None and not await self.token_still_valid(user):
            user = None
        status: dict[str, Any] = {"authenticated": user is not None}
        if user is not None:
            status["user"] = user.as_user_info()
        return json_response({"kind": "TokenReview", "apiVersion": "authentication.k8s.io/v1",
                              "metadata": {}, "spec": {}, "status": status}, 201)

    # --- resource routing ---------------------------------------------------
    def _target(self, request: web.Request) -> Target:
        group = request.match_info.get("group", "")
        version = request.match_info.get("version", "v1")
        segs = request.match_info["tail"].split("/") if request.match_info["tail"] else []
        nf = errors.no_such_path()
        if not segs or not segs[0]:
            raise nf
        ns = None
        if segs[0] == "namespaces" and len(segs) >= 3:
            res = lookup(group, version, segs[2]) or self.crds.lookup(group, version, segs[2])
            if res is not None and res.namespaced:
                ns, segs = segs[1], segs[2:]
        res = lookup(group, version, segs[0]) or self.crds.lookup(group, version, segs[0])
        if res is None:
            raise nf
        name = segs[1] if len(segs) > 1 else None
        sub = segs[2] if len(segs) > 2 else None
        rest = "/".join(segs[3:])
        if sub is not None and not res.has_sub(sub):
            why = NOT_HERE.get((res.plural, sub))
            raise errors.bad_request(f"{res.plural}/{sub} is not supported: {why}") if why else nf
        if rest and sub != "proxy":
            raise nf
        if sub == "proxy":
            check_suffix(rest)   # before any lookup: a refusal says nothing of what exists
        if name is not None and not name:
            raise nf
        return Target(res, ns, name, sub, rest)

    async def resource(self, request: web.Request) -> web.StreamResponse:
        t = self._target(request)
        m = request.method
        if t.sub is None:
            self._check_verb(t, m, request)
        if t.name is None:
            if m == "GET":
                watch = query_flag(request.query, "watch")
                return await (self.watch(request, t) if watch else self.list_objects(request, t))
            if m == "POST":
                return await (self.binding(request, t) if t.res.plural == "bindings" else self.create(request, t))
            if m == "DELETE":
                return await self.delete_collection(request, t)
            raise errors.method_not_allowed("the server does not allow this method on the requested resource")
        return await self.subresources.find(t.res.plural, t.sub or "", m)(request, t)

    @staticmethod
    def _check_verb(t: Target, method: str, request: web.Request) -> None:
        """405 for a verb the resource table does not give the kind (a kind Kube32 does not
        run is read-only), naming why."""
        if t.name is None:
            verb = {"GET": "watch" if query_flag(request.query, "watch") else "list", "POST": "create",
                    "DELETE": "deletecollection"}.get(method)
        else:
            verb = {"GET": "get", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}.get(method)
        if verb is None or verb in t.res.verbs:
            return
        raise errors.method_not_allowed(t.res.strategy.verb_refusal(t.res.plural))

    async def _object(self, request: web.Request, t: Target) -> web.StreamResponse:
        m = request.method
        assert t.name is not None
        if m == "GET":
            if not tables.wants_table(request.headers.get("Accept", "")):
                body = await self.registry.get_encoded(t.res, t.namespace, t.name)
                return web.Response(body=body, content_type="application/json")
            obj = await self.registry.get(t.res, t.namespace, t.name)
            return self._render_one(request, t.res, obj)
        if m == "PUT":
            return await self.update(request, t)
        if m == "PATCH":
            return await self.patch(request, t)
        if m == "DELETE" and t.sub is None:
            return await self.delete(request, t)
        raise errors.method_not_allowed("the server does not allow this method on the requested resource")

    # --- rendering ------------------------------------------------------------
    def _render_one(self, request: web.Request, res: Resource, obj: dict, status: int = 200,
                    warnings: list[str] | None = None, encoded_obj: bytes | None = None) -> web.Response:
        """The answer of one object; ``encoded_obj``: its JSON already (the bytes it was
        stored as, :func:`~.registry.encoded`), sent as it is."""
        headers = {"Warning": ", ".join(f'299 - "{_quoted(w)}"' for w in warnings)} if warnings else None
        if tables.wants_table(request.headers.get("Accept", "")):
            body = tables.table(res, [obj], obj["metadata"].get("resourceVersion", ""),
                                request.query.get("includeObject", "Metadata"))
            return json_response(body, status, headers)
        if encoded_obj is not None:
            return web.Response(body=encoded_obj, status=status, content_type="application/json", headers=headers)
        return json_response(obj, status, headers)

    # --- verbs ----------------------------------------------------------------
    def _selectors(self, request: web.Request, t: Target) -> tuple[Any, Any]:
        labels = parse_label_selector(request.query.get("labelSelector"))
        fields = parse_field_selector(request.query.get("fieldSelector"))
        fields.check_supported(t.res.kind, t.res.strategy.selectable_fields | {"metadata.name", "metadata.namespace"})
        return labels, fields

    async def list_objects(self, request: web.Request, t: Target) -> web.StreamResponse:
        """A list, paged (``limit``/``continue``) and streamed object by object (:mod:`.paging`)."""
        labels, fields = self._selectors(request, t)
        if "sendInitialEvents" in request.query:
            raise errors.bad_request("sendInitialEvents is forbidden for list")
        options = paging.list_options(request.query, t.res.prefix(t.namespace))
        as_table = tables.wants_table(request.headers.get("Accept", ""))
        listing = await self.registry.listing(t.res, t.namespace, labels, fields, options, decoded=as_table).open()
        if as_table:
            include = request.query.get("includeObject", "Metadata")
            head, field = tables.head(t.res), "rows"
            pieces = (paging.dumps(tables.row(t.res, item.object, include)) async for item in listing
                      if item.object is not None)
        else:
            head, field = {"kind": t.res.list_kind, "apiVersion": t.res.api_version}, "items"
            pieces = (encoded(item.kv) async for item in listing)
        body = paging.encoded_list(head, field, pieces, lambda: {"metadata": listing.metadata()})
        return await stream_body(request, body, self.list_seats)

    async def watch(self, request: web.Request, t: Target) -> web.StreamResponse:
        labels, fields = self._selectors(request, t)
        as_table = tables.wants_table(request.headers.get("Accept", ""))
        include = request.query.get("includeObject", "Metadata")
        try:
            timeout = float(request.query.get("timeoutSeconds") or WATCH_TIMEOUT)
        except ValueError:
            raise errors.bad_request("timeoutSeconds must be a number") from None
        o = paging.watch_options(request.query, query_flag)
        items = self.registry.watch_items(t.res, t.namespace, labels, fields, str(o.start), o.initial,
                                          o.not_older_than)

        def encode(item: WatchItem) -> bytes:
            assert item.object is not None
            if as_table:
                rv = item.object["metadata"].get("resourceVersion", "")
                return watchstream.line(item.type, tables.table(t.res, [item.object], rv, include))
            return self.watch_encoder.encode(t.res.plural, item)

        feed = watchstream.WatchFeed(items, encode, t.res.kind, t.res.api_version, bookmarks=o.bookmarks,
                                     timeout=timeout, start=o.start, initial_end_mark=o.initial_end_mark,
                                     interval=self.bookmark_interval)
        resp = web.StreamResponse(headers={"Content-Type": "application/json", "Cache-Control": "no-cache"})
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        lines = feed.lines()
        try:
            async for data in lines:
                await resp.write(data)
        except (ConnectionResetError, RuntimeError):
            return resp
        finally:
            await lines.aclose()
        try:
            await resp.write_eof()
        except (ConnectionResetError, RuntimeError):
            pass
        return resp

    async def _body(self, request: web.Request, t: Target, what: str) -> tuple[Any, list[str]]:
        obj = await bodies.read_body(request, what)
        warnings = bodies.check_fields(t.res, obj, request.query.get("fieldValidation", "Warn"))
        return obj, warnings

    async def create(self, request: web.Request, t: Target) -> web.Response:
        dry_run = dryrun.requested(request, kind="CreateOptions")
        obj, warnings = await self._body(request, t, f"cannot create {t.res.plural}")
        if t.res.namespaced and t.namespace is None:
            ns_in_body = objects.meta(obj).get("namespace") if isinstance(obj, dict) else None
            if not ns_in_body:
                raise errors.bad_request("the namespace of the object must be given")
        authz.admit(request["user"], t.res.plural, t.namespace, obj)
        if t.res.group == rbac.GROUP:
            await authz.check_escalation(self.authorizer, request["user"], t.res.plural, t.namespace, obj)
        out = await self.registry.create(t.res, t.namespace, obj, dry_run=dry_run, manager=field_manager(request),
                                         big=bodies.body_size(request) > BIG_OBJECT)
        return self._render_one(request, t.res, out, 201, warnings + self._spec_warnings(t, out))

    async def update(self, request: web.Request, t: Target) -> web.Response:
        assert t.name is not None
        dry_run = dryrun.requested(request, kind="UpdateOptions")
        obj, warnings = await self._body(request, t, f"cannot update {t.res.plural}")
        if t.res.group == rbac.GROUP:
            await authz.check_escalation(self.authorizer, request["user"], t.res.plural, t.namespace, obj)
        out = await self.registry.update(t.res, t.namespace, t.name, obj, subresource=t.sub, dry_run=dry_run,
                                         manager=field_manager(request), big=bodies.body_size(request) > BIG_OBJECT)
        return self._render_one(request, t.res, out, 200, warnings + self._spec_warnings(t, out))

    async def patch(self, request: web.Request, t: Target) -> web.Response:
        assert t.name is not None
        ptype = bodies.media_type(request)
        if ptype == PATCH_STRATEGIC and t.res.custom:
            raise crds.strategic_refusal(ptype)
        if ptype not in PATCH_TYPES:
            raise errors.unsupported_media_type(ptype)
        dry_run = dryrun.requested(request, kind="PatchOptions")
        body = await bodies.read_body(request, f"cannot patch {t.res.plural}",
                                      "application/yaml" if ptype == PATCH_APPLY else "application/json")
        warnings: list[str] = []
        if ptype == PATCH_APPLY:
            warnings = bodies.check_fields(t.res, body, request.query.get("fieldValidation", "Warn"),
                                           omit_empty=False)
            if request.query.get("fieldManager") in (None, ""):
                raise errors.invalid("PatchOptions", "", [("fieldManager", "Required value: is required for "
                                                                           "apply patch")], "meta.k8s.io")
        manager = field_manager(request)
        if t.res.group == rbac.GROUP:   # what the patch would make must not escalate
            current = await self.registry.try_get(t.res, t.namespace, t.name)
            patched = body if current is None else self.registry.patched(
                t.res, current, ptype, body, request.query.get("fieldManager", ""), True)
            await authz.check_escalation(self.authorizer, request["user"], t.res.plural, t.namespace, patched)
        out, created, answer = await self.registry.patch_encoded(
            t.res, t.namespace, t.name, ptype, body, subresource=t.sub,
            manager=manager, force=query_flag(request.query, "force"),
            dry_run=dry_run, big=bodies.body_size(request) > BIG_OBJECT)
        return self._render_one(request, t.res, out, 201 if created else 200,
                                warnings + self._spec_warnings(t, out), answer)

    @staticmethod
    def _spec_warnings(t: Target, out: dict[str, Any]) -> list[str]:
        """The kind's warnings about an object written whole (not through a subresource)."""
        return [] if t.sub else t.res.strategy.warnings(out)

    async def _delete_options(self, request: web.Request) -> tuple[dict[str, Any], bool]:
        """The request's DeleteOptions (JSON or protobuf body, as kubectl sends them; the
        query's gracePeriodSeconds and propagationPolicy over them) and whether it is a dry run."""
        options: dict[str, Any] = {}
        if request.body_exists:
            raw = await bodies.read_raw(request)
            if raw.strip():
                decoded = await bodies.decode_async(raw, bodies.media_type(request), "cannot decode the delete options")
                if not isinstance(decoded, dict):
                    raise errors.bad_request("the delete options must be an object")
                options = decoded
        for key in ("gracePeriodSeconds", "propagationPolicy"):
            if key in request.query:
                options[key] = request.query[key]
        return options, dryrun.requested(request, options, kind="DeleteOptions")

    async def delete(self, request: web.Request, t: Target) -> web.Response:
        assert t.name is not None
        options, dry_run = await self._delete_options(request)
        obj, _ = await self.registry.delete(t.res, t.namespace, t.name, options=options, dry_run=dry_run)
        return self._render_one(request, t.res, obj, 200)

    async def delete_collection(self, request: web.Request, t: Target) -> web.Response:
        options, dry_run = await self._delete_options(request)
        labels = parse_label_selector(request.query.get("labelSelector"))
        fields = parse_field_selector(request.query.get("fieldSelector"))
        items, rev = await self.registry.list(t.res, t.namespace, labels, fields)
        out = []
        for obj in items:
            try:
                gone, _ = await self.registry.delete(t.res, objects.namespace(obj) or None, objects.name(obj),
                                                     options=options, dry_run=dry_run)
                out.append(gone)
            except errors.APIError as e:
                if e.code != 404:
                    raise
        return json_response({"kind": t.res.list_kind, "apiVersion": t.res.api_version,
                              "metadata": {"resourceVersion": str(rev)}, "items": out})

    # --- subresources ---------------------------------------------------------
    async def scale(self, request: web.Request, t: Target) -> web.Response:
        assert t.name is not None
        if request.method == "GET":
            return json_response(_scale_of(t.res, await self.registry.get(t.res, t.namespace, t.name)))
        dry_run = dryrun.requested(request, kind="UpdateOptions" if request.method == "PUT" else "PatchOptions")
        if request.method == "PUT":
            body = await bodies.read_body(request, "cannot update scale")
            replicas = meta.nested(body, "spec", "replicas")
        elif request.method == "PATCH":
            ptype = bodies.media_type(request)
            patch = await bodies.read_body(request, "cannot patch scale", "application/json")
            current = _scale_of(t.res, await self.registry.get(t.res, t.namespace, t.name))
            from .patch import PatchError, json_merge_patch, json_patch  # the scale object has no merge keys
            try:
                patched = (json_patch(current, patch) if ptype == "application/json-patch+json"
                           else json_merge_patch(current, patch))
            except PatchError as e:
                raise patch_refusal(e) from None
            replicas = meta.nested(patched, "spec", "replicas")
        else:
            raise errors.method_not_allowed("the server does not allow this method on the requested resource")
        if not isinstance(replicas, int) or replicas < 0:
            raise errors.invalid("Scale", t.name, [("spec.replicas", f"Invalid value: {replicas}: "
                                                                      "must be greater than or equal to 0")],
                                 "autoscaling")

        def set_replicas(obj: dict) -> dict:
            if t.res.custom:
                crds.set_scale_replicas(t.res, obj, replicas)
            else:
                obj["spec"]["replicas"] = replicas
            return obj
        out = await self.registry.mutate(t.res, t.namespace, t.name, set_replicas, dry_run=dry_run,
                                         subresource="scale", manager=field_manager(request))
        return json_response(_scale_of(t.res, out))

    async def eviction(self, request: web.Request, t: Target) -> web.StreamResponse:
        assert t.name is not None
        body = await bodies.read_body(request, "cannot create evictions")
        if not isinstance(body, dict):
            raise errors.bad_request("an Eviction must be an object")
        return await self.evictions(request, t, body)

    async def finalize_namespace(self, request: web.Request, t: Target) -> web.Response:
        assert t.name is not None
        body = await bodies.read_body(request, "cannot finalize namespaces")
        wanted = meta.nested(body, "spec", "finalizers") or []
        if not isinstance(wanted, list) or not all(isinstance(f, str) for f in wanted):
            raise errors.bad_request("cannot finalize namespaces: spec.finalizers must be a list of strings")

        def finalize(ns: dict) -> dict:
            # An empty list, not a missing key: the namespace defaulting re-adds a missing one.
            ns.setdefault("spec", {})["finalizers"] = wanted
            return ns
        out = await self.registry.mutate(t.res, None, t.name, finalize, subresource="finalize")
        if out["metadata"].get("deletionTimestamp") and not objects.spec(out).get("finalizers"):
            out, _ = await self.registry.delete(t.res, None, t.name)
        return json_response(out)

    # --- forwarding to kubelets -------------------------------------------------
    async def node(self, name: str) -> dict:
        return await self.registry.get(by_plural("nodes"), None, name)

    async def _pod_base(self, ns: str, name: str) -> tuple[dict, KubeletEndpoint]:
        pod = await self.registry.get(by_plural("pods"), ns, name)
        node_name = pod["spec"].get("nodeName")
        if not node_name:
            raise errors.bad_request(f'pod "{name}" is not scheduled to a node yet')
        return pod, kubelet_endpoint(await self.node(node_name))

    async def proxy(self, request: web.Request, t: Target) -> web.StreamResponse:
        """The node, pod or service proxy: the caller's suffix (checked in :meth:`_target`)
        goes only under the object it was authorised for (:func:`~.proxy.kubelet_url`).
        A Service's requests, and a pod's when the client asks with ``Prefer: wait``,
        are held through a move (:mod:`.hold`)."""
        assert t.name is not None
        name = proxied_name(t.res.kind, t.name)
        query = request.rel_url.raw_query_string   # as sent: decoding it would change it
        if t.res.plural == "nodes":
            base = kubelet_endpoint(await self.node(name))
            return await self.kubelets.forward(request, kubelet_url(base, [], t.rest, query))
        assert t.namespace is not None
        wait = holding.prefer_wait(request.headers.getall(holding.PREFER, []))
        if t.res.plural == "services":
            svc = await self.registry.get(by_plural("services"), t.namespace, name)
            bound = holding.hold_seconds(svc["metadata"].get("annotations"))
            bound = bound if wait is None else min(bound, wait)
            selector = objects.spec(svc).get("selector") or {}
            if bound > 0 and selector:
                # No fixed selector: the hold follows the Service's (a change counts at once).
                target = hold.Target("Service", t.namespace, name, None, None, svc)
                return await self._held(request, t, target, bound, lambda: _no_endpoints(name))
            name = self._service_pod(name, await self._selected(t.namespace, selector))["metadata"]["name"]
        elif wait:
            pod = await self.registry.get(by_plural("pods"), t.namespace, name)
            if not pod["spec"].get("nodeName"):
                raise errors.bad_request(f'pod "{name}" is not scheduled to a node yet')
            target = hold.Target("Pod", t.namespace, name, None, parse_field_selector(f"metadata.name={name}"), pod)
            # A wait that runs out ends as an unheld request to a frozen pod does.
            return await self._held(request, t, target, wait, lambda: errors.service_unavailable(
                f'pod "{name}" is frozen or between nodes', retry_after=1))
        _, base = await self._pod_base(t.namespace, name)
        return await self.kubelets.forward(
            request, kubelet_url(base, ["pods", t.namespace, name, "http"], t.rest, query))

    async def _held(self, request: web.Request, t: Target, target: hold.Target, bound: float,
                    no_pod: Callable[[], errors.APIError]) -> web.StreamResponse:
        """A proxied request that may be held (:meth:`.hold.Holds.serve`); a body too large
        to keep goes once, as it comes, to the pod the proxy picks."""
        assert t.namespace is not None
        ns = t.namespace
        query = request.rel_url.raw_query_string
        holdable, body = await hold.holdable_body(request)

        async def send(pod: dict, extra: dict[str, str] | None = None) -> Any:
            try:
                base = kubelet_endpoint(await self.node(pod["spec"]["nodeName"]))
            except errors.APIError as e:   # its node is gone or has no kubelet: nothing was sent
                raise Unreached(e.message) from None
            url = kubelet_url(base, ["pods", ns, pod["metadata"]["name"], "http"], t.rest, query)
            return await self.kubelets.send(request, url, body, extra_headers=extra)

        async def relay(upstream: Any) -> web.StreamResponse:
            return await self.kubelets.relay(request, upstream)

        if holdable:
            return await self.holds.serve(target, bound, len(body or b""), send, relay, no_pod)
        if target.kind == "Pod":
            _, base = await self._pod_base(t.namespace, target.name)
            url = kubelet_url(base, ["pods", t.namespace, target.name, "http"], t.rest, query)
            upstream = self.kubelets.send(request, url, body)
        else:
            first, _ = self.holds.first_choice((await self.holds.pods(target))[0])
            if first is None:
                raise no_pod()
            upstream = send(first)
        return await relay(await self.holds.once(target, upstream))

    async def _selected(self, ns: str, selector: dict) -> list[dict] | None:
        if not selector:
            return None
        # A Service's selector is a plain map: its pods are those with every key equal.
        pods, _ = await self.registry.list(by_plural("pods"), ns, label_selector({"matchLabels": selector}))
        return pods

    def _service_pod(self, name: str, pods: list[dict] | None) -> dict:
        if pods is None:
            raise errors.service_unavailable(f'no endpoints available for service "{name}"')
        ready = ready_pods(pods)
        if not ready:
            raise _no_endpoints(name)
        return ready[self.kubelets.pick(len(ready))]

    async def pod_log(self, request: web.Request, t: Target) -> web.StreamResponse:
        assert t.namespace is not None and t.name is not None
        pod, base = await self._pod_base(t.namespace, t.name)
        containers = [c["name"] for c in pod["spec"].get("containers") or []]
        container = request.query.get("container") or (containers[0] if len(containers) == 1 else "")
        if container not in containers:
            raise errors.bad_request(f"container {container or '<none>'} is not valid for pod {t.name}"
                                     if container else
                                     f"a container name must be specified for pod {t.name}, "
                                     f"choose one of: {containers}")
        q = {k: v for k, v in request.query.items() if k in ("follow", "tailLines", "timestamps", "previous",
                                                            "sinceSeconds", "sinceTime",
                                                            "limitBytes")}
        qs = "&".join(f"{k}={quote(v, safe='')}" for k, v in q.items())
        url = kubelet_url(base, ["containerLogs", t.namespace, t.name, container], query=qs)
        return await self.kubelets.forward(request, url, method="GET", statuses=True)


def _no_endpoints(service: str) -> errors.APIError:
    # Often brief (a pod between nodes in a move, or starting): ask to retry, as a
    # frozen pod does.
    return errors.service_unavailable(f'no endpoints available for service "{service}"', retry_after=1)


def field_manager(request: web.Request) -> str:
    """Who writes, for managedFields: the ``fieldManager`` parameter, else what the
    User-Agent names before its first "/" (kube-apiserver's prefixFromUserAgent), at
    most 128 characters; a fieldManager longer or not printable is a 422 in
    ValidateFieldManager's words."""
    given = request.query.get("fieldManager")
    if given:
        causes = [("fieldManager", f"Too long: may not be more than {MAX_FIELD_MANAGER} bytes")] \
            if len(given.encode()) > MAX_FIELD_MANAGER else []
        causes += [("fieldManager", f"Invalid value: {gostrings.quote(given)}: invalid character U+{ord(c):04X} "
                                    f"(at position {len(given[:i].encode())})")
                   for i, c in enumerate(given) if not c.isprintable()]
        if causes:
            options = {"POST": "CreateOptions", "PUT": "UpdateOptions"}.get(request.method, "PatchOptions")
            raise errors.invalid(options, "", causes, "meta.k8s.io")
        return given
    agent = request.headers.get("User-Agent", "").split("/", 1)[0]
    return "".join(c for c in agent if c.isprintable())[:MAX_FIELD_MANAGER] or "unknown"


def _scale_of(res: Resource, obj: dict) -> dict:
    if res.custom:
        return crds.scale_of(res, obj)
    md = obj["metadata"]
    sel = (objects.spec(obj).get("selector") or {}).get("matchLabels") or {}
    return {"kind": "Scale", "apiVersion": "autoscaling/v1",
            "metadata": {"name": md["name"], "namespace": md.get("namespace"), "uid": md.get("uid"),
                         "resourceVersion": md.get("resourceVersion"),
                         "creationTimestamp": md.get("creationTimestamp")},
            "spec": {"replicas": objects.spec(obj).get("replicas", 0)},
            "status": {"replicas": objects.status(obj).get("replicas", 0),
                       "selector": ",".join(f"{k}={v}" for k, v in sel.items())}}




def _quoted(text: str) -> str:
    """``text`` inside an HTTP quoted-string (a Warning header's text, RFC 7234)."""
    return text.replace("\\", "\\\\").replace('"', '\\"')

