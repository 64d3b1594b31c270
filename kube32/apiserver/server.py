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
"""
from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass
from typing import Any, Awaitable, Callable
from urllib.parse import quote

from aiohttp import web

from .. import serving
from ..store import Store
from . import (authz, bodies, discovery, dryrun, errors, eventbus, images, impersonation, meta, nodecredentials,
               rbac, serviceaccounts, tables)
from .auth import PUBLIC_PATHS, TokenAuthenticator
from .eviction import EvictionHandler
from .limits import MAX_DEPTH
from .proxy import KubeletProxy, check_suffix, kubelet_base, kubelet_url, proxied_name, ready_pods
from .registry import PATCH_APPLY, PATCH_TYPES, Registry, patch_refusal
from .resources import Resource, by_plural, lookup
from .selectors import parse_field_selector, parse_label_selector

log = logging.getLogger("kube32.apiserver")

DEFAULT_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")
WATCH_TIMEOUT = 1800.0


@dataclass(frozen=True)
class Target:
    res: Resource
    namespace: str | None
    name: str | None
    sub: str | None
    rest: str  # the path after a proxy subresource


def json_response(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(body=json.dumps(body, separators=(",", ":")).encode(), status=status,
                        content_type="application/json", headers=headers)


class APIServer:
    """The aiohttp application and what its handlers share."""

    def __init__(self, store: Store, auth: TokenAuthenticator, *, kubelet_token: str,
                 kubelet_ssl: Any = None, images_dir: Any = None) -> None:
        self.store = store
        self.images = images.ImageStore(images_dir)
        self.events = eventbus.EventBus()
        self.registry = Registry(store)
        self.auth = auth
        self.authorizer = authz.Authorizer(self.registry)
        self.pki_dir: Any = None   # the cluster CA's directory: signs kubelet certificates
        self.kubelets = KubeletProxy(kubelet_token, kubelet_ssl)
        # Subresource handlers that later parts plug in: (plural, sub, method) -> handler.
        self.sub_handlers: dict[tuple[str, str, str], Callable[[web.Request, Target], Awaitable[web.StreamResponse]]] = {}
        self.eviction_handler: Callable[[web.Request, Target, dict], Awaitable[web.StreamResponse]] | None = \
            EvictionHandler(self.registry, self.images.exports)
        self.app = self._build_app()
        serviceaccounts.install(self)

    # --- app ------------------------------------------------------------------
    def _build_app(self) -> web.Application:
        heavy = bodies.HeavyBodies()
        app = web.Application(middlewares=[serving.track_requests, heavy.middleware, self._errors_middleware,
                                           self._auth_middleware],
                              client_max_size=bodies.MAX_BODY)
        app[bodies.HeavyBodies.KEY] = heavy
        r = app.router
        r.add_get("/version", self.version)
        for p in ("/healthz", "/readyz", "/livez"):
            r.add_get(p, self.healthz)
        r.add_get("/api", self.api_versions)
        r.add_get("/apis", self.api_groups)
        r.add_get("/openapi/v3", self.openapi_root)
        r.add_get("/openapi/v3/{path:.+}", self.openapi_doc)
        r.add_route("*", "/api/v1", self.group_version_root)
        r.add_route("*", "/api/v1/{tail:.*}", self.resource)
        r.add_post("/apis/authentication.k8s.io/v1/tokenreviews", self.token_review)
        authz.add_routes(r, self.authorizer)
        nodecredentials.add_routes(r, self)
        images.add_routes(r, self.images)   # before the generic /apis/{group}/{version}/... routes
        eventbus.add_routes(r, self.events, self.registry.check_namespace_open)
        r.add_get("/apis/{group}", self.api_group)
        r.add_route("*", "/apis/{group}/{version}", self.group_version_root)
        r.add_route("*", "/apis/{group}/{version}/{tail:.*}", self.resource)
        app.on_cleanup.append(self._cleanup)
        return app

    async def _cleanup(self, app: web.Application) -> None:
        await self.kubelets.close()

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
                reason = {404: "NotFound", 405: "MethodNotAllowed", 413: "RequestEntityTooLarge"}.get(e.status, "BadRequest")
                msg = errors.NO_RESOURCE if e.status == 404 else e.reason
                return json_response(errors.APIError(e.status, reason, msg).status(), e.status)
            raise
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

    @web.middleware
    async def _auth_middleware(self, request: web.Request, handler: Any) -> web.StreamResponse:
        if request.path in PUBLIC_PATHS:
            return await handler(request)
        user = self.auth.authenticate(request.headers.get("Authorization"))
        if user is None or not await serviceaccounts.still_valid(self, user):
            raise errors.unauthorized()
        if impersonation.asked(request.headers):
            user = await impersonation.impersonated(self.authorizer, user, request.headers)
        request["user"] = user
        attrs = authz.request_attributes(user, request.method, request.path, request.query)
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

    async def healthz(self, request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def api_versions(self, request: web.Request) -> web.Response:
        return json_response(discovery.api_versions(request.host))

    async def api_groups(self, request: web.Request) -> web.Response:
        return json_response(discovery.api_group_list())

    async def api_group(self, request: web.Request) -> web.Response:
        doc = discovery.api_group(request.match_info["group"])
        if doc is None:
            raise errors.no_such_path()
        return json_response(doc)

    async def group_version_root(self, request: web.Request) -> web.Response:
        group = request.match_info.get("group")
        gv = f"{group}/{request.match_info['version']}" if group else "v1"
        doc = discovery.api_resource_list(gv)
        if doc is None or request.method != "GET":
            raise errors.no_such_path()
        return json_response(doc)

    async def openapi_root(self, request: web.Request) -> web.Response:
        return json_response(discovery.openapi_root())

    async def openapi_doc(self, request: web.Request) -> web.Response:
        doc = discovery.openapi_gv_document(request.match_info["path"])
        if doc is None:
            raise errors.no_such_path()
        return json_response(doc)

    async def token_review(self, request: web.Request) -> web.Response:
        """TokenReview: kubelets check who calls their endpoints (webhook authentication)."""
        body = await bodies.read_body(request, "cannot create tokenreviews")
        token = meta.nested(body, "spec", "token") or ""
        if not isinstance(token, str):
            raise errors.bad_request("cannot create tokenreviews: spec.token must be a string")
        user = self.auth.authenticate(f"Bearer {token}") if token else None
        if user is not None and not await serviceaccounts.still_valid(self, user):
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
            res = lookup(group, version, segs[2])
            if res is not None and res.namespaced:
                ns, segs = segs[1], segs[2:]
        res = lookup(group, version, segs[0])
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
        if t.name is None:
            if m == "GET":
                return await (self.watch(request, t) if _truthy(request.query.get("watch")) else self.list(request, t))
            if m == "POST":
                return await self.create(request, t)
            if m == "DELETE":
                return await self.delete_collection(request, t)
            raise errors.method_not_allowed("the server does not allow this method on the requested resource")
        handler = self.sub_handlers.get((t.res.plural, t.sub or "", m))
        if handler is not None:
            return await handler(request, t)
        if t.sub in (None, "status"):
            return await self._object(request, t)
        if t.sub == "scale":
            return await self.scale(request, t)
        if t.sub == "binding" and m == "POST":
            return await self.binding(request, t)
        if t.sub == "eviction" and m == "POST":
            return await self.eviction(request, t)
        if t.sub == "proxy":
            return await self.proxy(request, t)
        if t.sub == "log" and m == "GET":
            return await self.pod_log(request, t)
        if t.sub == "finalize" and m == "PUT":
            return await self.finalize_namespace(request, t)
        raise errors.method_not_allowed("the server does not allow this method on the requested resource")

    async def _object(self, request: web.Request, t: Target) -> web.StreamResponse:
        m = request.method
        assert t.name is not None
        if m == "GET":
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
                    warnings: list[str] | None = None) -> web.Response:
        headers = {"Warning": ", ".join(f'299 - "{_quoted(w)}"' for w in warnings)} if warnings else None
        if tables.wants_table(request.headers.get("Accept", "")):
            body = tables.table(res, [obj], obj["metadata"].get("resourceVersion", ""),
                                request.query.get("includeObject", "Metadata"))
            return json_response(body, status, headers)
        return json_response(obj, status, headers)

    # --- verbs ----------------------------------------------------------------
    async def list(self, request: web.Request, t: Target) -> web.Response:
        labels = parse_label_selector(request.query.get("labelSelector"))
        fields = parse_field_selector(request.query.get("fieldSelector"))
        fields.check_supported(t.res.kind, t.res.strategy.selectable_fields | {"metadata.name", "metadata.namespace"})
        items, rev = await self.registry.list(t.res, t.namespace, labels, fields)
        if tables.wants_table(request.headers.get("Accept", "")):
            return json_response(tables.table(t.res, items, str(rev), request.query.get("includeObject", "Metadata")))
        return json_response({"kind": t.res.list_kind, "apiVersion": t.res.api_version,
                              "metadata": {"resourceVersion": str(rev)}, "items": items})

    async def watch(self, request: web.Request, t: Target) -> web.StreamResponse:
        labels = parse_label_selector(request.query.get("labelSelector"))
        fields = parse_field_selector(request.query.get("fieldSelector"))
        fields.check_supported(t.res.kind, t.res.strategy.selectable_fields | {"metadata.name", "metadata.namespace"})
        as_table = tables.wants_table(request.headers.get("Accept", ""))
        include = request.query.get("includeObject", "Metadata")
        try:
            timeout = float(request.query.get("timeoutSeconds") or WATCH_TIMEOUT)
        except ValueError:
            raise errors.bad_request("timeoutSeconds must be a number") from None
        events = self.registry.watch(t.res, t.namespace, labels, fields, request.query.get("resourceVersion"))
        resp = web.StreamResponse(headers={"Content-Type": "application/json", "Cache-Control": "no-cache"})
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        try:
            async with asyncio.timeout(timeout):
                async for etype, obj in events:
                    if as_table:
                        obj = tables.table(t.res, [obj], obj["metadata"].get("resourceVersion", ""), include)
                    await resp.write(json.dumps({"type": etype, "object": obj}, separators=(",", ":")).encode() + b"\n")
        except TimeoutError:
            pass
        except errors.APIError as e:
            await resp.write(json.dumps({"type": "ERROR", "object": e.status()}).encode() + b"\n")
        except (ConnectionResetError, RuntimeError):
            return resp
        finally:
            await events.aclose()
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
            ns_in_body = (obj.get("metadata") or {}).get("namespace") if isinstance(obj, dict) else None
            if not ns_in_body:
                raise errors.bad_request("the namespace of the object must be given")
        authz.admit(request["user"], t.res.plural, t.namespace, obj)
        if t.res.group == rbac.GROUP:
            await authz.check_escalation(self.authorizer, request["user"], t.res.plural, t.namespace, obj)
        out = await self.registry.create(t.res, t.namespace, obj, dry_run=dry_run)
        return self._render_one(request, t.res, out, 201, warnings + self._spec_warnings(t, out))

    async def update(self, request: web.Request, t: Target) -> web.Response:
        assert t.name is not None
        dry_run = dryrun.requested(request, kind="UpdateOptions")
        obj, warnings = await self._body(request, t, f"cannot update {t.res.plural}")
        if t.res.group == rbac.GROUP:
            await authz.check_escalation(self.authorizer, request["user"], t.res.plural, t.namespace, obj)
        out = await self.registry.update(t.res, t.namespace, t.name, obj, subresource=t.sub, dry_run=dry_run)
        return self._render_one(request, t.res, out, 200, warnings + self._spec_warnings(t, out))

    async def patch(self, request: web.Request, t: Target) -> web.Response:
        assert t.name is not None
        ptype = bodies.media_type(request)
        if ptype not in PATCH_TYPES:
            raise errors.unsupported_media_type(ptype)
        dry_run = dryrun.requested(request, kind="PatchOptions")
        body = await bodies.read_body(request, f"cannot patch {t.res.plural}",
                                      "application/yaml" if ptype == PATCH_APPLY else "application/json")
        warnings: list[str] = []
        if ptype == PATCH_APPLY:
            warnings = bodies.check_fields(t.res, body, request.query.get("fieldValidation", "Warn"))
            if request.query.get("fieldManager") in (None, ""):
                raise errors.bad_request("PATCH of type apply requires the fieldManager parameter")
        if t.res.group == rbac.GROUP:   # what the patch would make must not escalate
            current = await self.registry.try_get(t.res, t.namespace, t.name)
            patched = body if current is None else self.registry._patched(
                t.res, current, ptype, body, request.query.get("fieldManager", ""), True)
            await authz.check_escalation(self.authorizer, request["user"], t.res.plural, t.namespace, patched)
        out, created = await self.registry.patch(
            t.res, t.namespace, t.name, ptype, body, subresource=t.sub,
            manager=request.query.get("fieldManager", ""), force=_truthy(request.query.get("force")),
            dry_run=dry_run)
        return self._render_one(request, t.res, out, 201 if created else 200,
                                warnings + self._spec_warnings(t, out))

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
                gone, _ = await self.registry.delete(t.res, meta.namespace_of(obj) or None, meta.name_of(obj),
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
            return json_response(_scale_of(await self.registry.get(t.res, t.namespace, t.name)))
        dry_run = dryrun.requested(request, kind="UpdateOptions" if request.method == "PUT" else "PatchOptions")
        if request.method == "PUT":
            body = await bodies.read_body(request, "cannot update scale")
            replicas = meta.nested(body, "spec", "replicas")
        elif request.method == "PATCH":
            ptype = bodies.media_type(request)
            patch = await bodies.read_body(request, "cannot patch scale", "application/json")
            current = _scale_of(await self.registry.get(t.res, t.namespace, t.name))
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
            raise errors.invalid("Scale", t.name, [("spec.replicas", f"Invalid value: {replicas}: must be greater than or equal to 0")], "autoscaling")

        def set_replicas(obj: dict) -> dict:
            obj["spec"]["replicas"] = replicas
            return obj
        out = await self.registry.mutate(t.res, t.namespace, t.name, set_replicas, dry_run=dry_run)
        return json_response(_scale_of(out))

    async def binding(self, request: web.Request, t: Target) -> web.Response:
        assert t.name is not None and t.res.plural == "pods"
        dry_run = dryrun.requested(request)
        body = await bodies.read_body(request, "cannot create bindings")
        node = meta.nested(body, "target", "name")
        if not node or not isinstance(node, str):
            raise errors.invalid("Binding", t.name, [("target.name", "Required value")])

        def bind(pod: dict) -> dict:
            current = pod["spec"].get("nodeName")
            if current:
                raise errors.conflict("pods", t.name, why=f"pod {t.name} is already assigned to node \"{current}\"")
            if pod["metadata"].get("deletionTimestamp"):
                raise errors.conflict("pods", t.name, why=f"pod {t.name} is being deleted, cannot be assigned to a host")
            pod["spec"]["nodeName"] = node
            return pod
        await self.registry.mutate(t.res, t.namespace, t.name, bind, subresource="binding", dry_run=dry_run)
        return json_response({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}, 201)

    async def eviction(self, request: web.Request, t: Target) -> web.StreamResponse:
        assert t.name is not None
        body = await bodies.read_body(request, "cannot create evictions")
        if not isinstance(body, dict):
            raise errors.bad_request("an Eviction must be an object")
        if self.eviction_handler is not None:
            return await self.eviction_handler(request, t, body)
        options = body.get("deleteOptions") or {}
        if not isinstance(options, dict):
            raise errors.bad_request("deleteOptions must be an object")
        await self.registry.delete(t.res, t.namespace, t.name, options=options,
                                   dry_run=dryrun.requested(request, options))
        return json_response({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}, 201)

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
        if out["metadata"].get("deletionTimestamp") and not (out.get("spec") or {}).get("finalizers"):
            out, _ = await self.registry.delete(t.res, None, t.name)
        return json_response(out)

    # --- forwarding to kubelets -------------------------------------------------
    async def _node(self, name: str) -> dict:
        return await self.registry.get(by_plural("nodes"), None, name)

    async def _pod_base(self, ns: str, name: str) -> tuple[dict, str]:
        pod = await self.registry.get(by_plural("pods"), ns, name)
        node_name = pod["spec"].get("nodeName")
        if not node_name:
            raise errors.bad_request(f'pod "{name}" is not scheduled to a node yet')
        return pod, kubelet_base(await self._node(node_name))

    async def proxy(self, request: web.Request, t: Target) -> web.StreamResponse:
        """The node, pod or service proxy: the caller's suffix (checked in :meth:`_target`)
        goes only under the object it was authorised for (:func:`~.proxy.kubelet_url`)."""
        assert t.name is not None
        name = proxied_name(t.res.kind, t.name)
        query = request.rel_url.raw_query_string   # as sent: decoding it would change it
        if t.res.plural == "nodes":
            base = kubelet_base(await self._node(name))
            return await self.kubelets.forward(request, kubelet_url(base, [], t.rest, query))
        assert t.namespace is not None
        if t.res.plural == "services":
            pod = await self._service_pod(t.namespace, name)
            name = pod["metadata"]["name"]
        _, base = await self._pod_base(t.namespace, name)
        return await self.kubelets.forward(
            request, kubelet_url(base, ["pods", t.namespace, name, "http"], t.rest, query))

    async def _service_pod(self, ns: str, name: str) -> dict:
        svc = await self.registry.get(by_plural("services"), ns, name)
        selector = (svc.get("spec") or {}).get("selector") or {}
        if not selector:
            raise errors.service_unavailable(f'no endpoints available for service "{name}"')
        labels = parse_label_selector(",".join(f"{k}={v}" for k, v in selector.items()))
        pods, _ = await self.registry.list(by_plural("pods"), ns, labels)
        ready = ready_pods(pods)
        if not ready:
            # Often brief (a pod between nodes in a move, or starting): ask to retry, as a
            # frozen pod does.
            raise errors.service_unavailable(f'no endpoints available for service "{name}"', retry_after=1)
        return ready[self.kubelets.pick(len(ready))]

    async def pod_log(self, request: web.Request, t: Target) -> web.StreamResponse:
        assert t.namespace is not None and t.name is not None
        pod, base = await self._pod_base(t.namespace, t.name)
        containers = [c["name"] for c in pod["spec"].get("containers") or []]
        container = request.query.get("container") or (containers[0] if len(containers) == 1 else "")
        if container not in containers:
            raise errors.bad_request(f"container {container or '<none>'} is not valid for pod {t.name}"
                                     if container else
                                     f"a container name must be specified for pod {t.name}, choose one of: {containers}")
        q = {k: v for k, v in request.query.items() if k in ("follow", "tailLines", "timestamps", "previous", "sinceSeconds", "sinceTime",
                                                            "limitBytes")}
        qs = "&".join(f"{k}={quote(v, safe='')}" for k, v in q.items())
        url = kubelet_url(base, ["containerLogs", t.namespace, t.name, container], query=qs)
        return await self.kubelets.forward(request, url, method="GET", statuses=True)


def _scale_of(obj: dict) -> dict:
    md = obj["metadata"]
    sel = ((obj.get("spec") or {}).get("selector") or {}).get("matchLabels") or {}
    return {"kind": "Scale", "apiVersion": "autoscaling/v1",
            "metadata": {"name": md["name"], "namespace": md.get("namespace"), "uid": md.get("uid"),
                         "resourceVersion": md.get("resourceVersion"),
                         "creationTimestamp": md.get("creationTimestamp")},
            "spec": {"replicas": (obj.get("spec") or {}).get("replicas", 0)},
            "status": {"replicas": (obj.get("status") or {}).get("replicas", 0),
                       "selector": ",".join(f"{k}={v}" for k, v in sel.items())}}


# Kubernetes subresources a Kube32 pod has no use for, refused with the reason rather than
# a bare 404 (kubectl exec, attach, cp, port-forward and debug reach these).
_NO_PROCESS = ("a Kube32 pod is a WebAssembly module, with no processes, shell or terminal to "
               "run commands in; read its output with kubectl logs")
NOT_HERE = {
    ("pods", "exec"): _NO_PROCESS,
    ("pods", "attach"): _NO_PROCESS,
    ("pods", "ephemeralcontainers"): _NO_PROCESS,
    ("pods", "portforward"): "a Kube32 pod has no network ports to forward; reach its HTTP handler "
                             "through the API server: kubectl get --raw "
                             "/api/v1/namespaces/<namespace>/pods/<name>/proxy/<path>, or kubectl proxy",
}


def _quoted(text: str) -> str:
    """``text`` inside an HTTP quoted-string (a Warning header's text, RFC 7234)."""
    return text.replace("\\", "\\\\").replace('"', '\\"')


def _truthy(value: str | None) -> bool:
    return (value or "").lower() in ("1", "true", "yes")

