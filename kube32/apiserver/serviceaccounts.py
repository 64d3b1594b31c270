"""ServiceAccount tokens: TokenRequest (``kubectl create token <sa>``) and the check that
keeps a token valid only while its ServiceAccount exists.

``POST /api/v1/namespaces/<ns>/serviceaccounts/<name>/token`` with a TokenRequest
(JSON, or the Kubernetes protobuf kubectl sends) answers the TokenRequest with
``status.token`` and ``status.expirationTimestamp``.  ``spec.expirationSeconds``
defaults to 3600 and may not be below 600, as Kubernetes.  The token is signed by
:class:`~kube32.apiserver.auth.ServiceAccountTokens`; :func:`still_valid` checks that
the ServiceAccount it names still exists with the same uid (a deleted and re-created
ServiceAccount does not inherit the old tokens).
"""
from __future__ import annotations

import datetime as dt
import time
from typing import Any

from aiohttp import web

from . import bodies, errors
from .auth import ServiceAccountRef, TokenAuthenticator, User
from .protobuf import fields as _proto_fields
from .registry import Registry
from .resources import by_plural
from .routing import Handler, Target, json_response

DEFAULT_SECONDS = 3600
MIN_SECONDS = 600
MAX_SECONDS = 1 << 32


async def still_valid(registry: Registry, user: User) -> bool:
    ref = user.extra.get("serviceaccount")
    if not isinstance(ref, ServiceAccountRef):
        return True
    sa = await registry.try_get(by_plural("serviceaccounts"), ref.namespace, ref.name)
    return sa is not None and sa["metadata"].get("uid") == ref.uid


def _decode_protobuf(raw: bytes) -> dict[str, Any]:
    try:
        request = _proto_fields(_proto_fields(raw[4:])[2][-1])
        spec = _proto_fields(request.get(2, [b""])[-1])
        out: dict[str, Any] = {}
        if 1 in spec:
            out["audiences"] = [a.decode() for a in spec[1]]
        if 4 in spec:
            out["expirationSeconds"] = int(spec[4][-1])
        return {"spec": out}
    except (ValueError, KeyError, IndexError, UnicodeDecodeError, TypeError) as e:
        raise errors.bad_request(f"the protobuf body could not be decoded: {e}") from None


def token_handler(registry: Registry, auth: TokenAuthenticator) -> Handler:
    """``POST serviceaccounts/<name>/token`` (a TokenRequest), for the API server's table."""
    async def token(request: web.Request, t: Target) -> web.Response:
        assert t.namespace is not None and t.name is not None
        tokens = auth.service_accounts
        if tokens is None:
            raise errors.service_unavailable("this API server has no key to sign ServiceAccount tokens")
        raw = await bodies.read_raw(request)
        if raw.startswith(b"k8s\x00"):
            body: Any = _decode_protobuf(raw)
        elif raw.strip():
            body = await bodies.decode_async(raw, bodies.media_type(request), "cannot create serviceaccounts/token")
        else:
            body = {}
        spec = body.get("spec") if isinstance(body, dict) else None
        spec = spec if isinstance(spec, dict) else {}
        seconds = spec.get("expirationSeconds", DEFAULT_SECONDS)
        if not isinstance(seconds, int) or seconds < MIN_SECONDS or seconds > MAX_SECONDS:
            raise errors.invalid("TokenRequest", t.name, [("spec.expirationSeconds",
                                 "Invalid value: may not specify a duration less than 10 minutes")],
                                 "authentication.k8s.io")
        sa = await registry.get(by_plural("serviceaccounts"), t.namespace, t.name)
        expires = int(time.time()) + seconds
        value = tokens.issue(t.namespace, t.name, sa["metadata"]["uid"], expires)
        when = dt.datetime.fromtimestamp(expires, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        audiences = [a for a in spec.get("audiences") or [] if isinstance(a, str)]
        return json_response({"kind": "TokenRequest", "apiVersion": "authentication.k8s.io/v1",
                              "metadata": {"name": t.name, "namespace": t.namespace},
                              "spec": {"audiences": audiences, "expirationSeconds": seconds,
                                       "boundObjectRef": None},
                              "status": {"token": value, "expirationTimestamp": when}}, 201)

    return token
