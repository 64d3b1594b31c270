"""What the API server's handlers share: a request's target, JSON answers, and the one
table of subresources.

The API server (:mod:`.server`) parses a resource URL into a :class:`Target` and looks
its subresource up in its :class:`Subresources` table; every handler, the server's own
and those of the parts it builds (Checkpoint data, pod replacements, ServiceAccount
tokens), has one signature, :data:`Handler`, and is entered in that table.  This module
lies below all of them, so no handler imports the server.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Iterable, Mapping

from aiohttp import web

from . import errors

if TYPE_CHECKING:
    from .resources import Resource

ANY = "*"   # a Subresources entry for every plural, or every method


@dataclass(frozen=True)
class Target:
    res: "Resource"
    namespace: str | None
    name: str | None
    sub: str | None
    rest: str  # the path after a proxy subresource


Handler = Callable[[web.Request, Target], Awaitable[web.StreamResponse]]


def json_response(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(body=json.dumps(body, separators=(",", ":")).encode(), status=status,
                        content_type="application/json", headers=headers)


def created() -> web.Response:
    """The ``Status`` Success 201 of a create that answers no object (a binding, an eviction)."""
    return json_response({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                          "code": 201}, 201)


def query_flag(query: Mapping[str, str], name: str) -> bool:
    """A boolean query parameter (``watch``, ``force``) as kube-apiserver reads it: absent,
    ``0`` or ``false`` (any case) is false; anything else, the empty value included, is
    true.  The one reading: the authorizer derives the verb from it (``?watch=yes`` is a
    watch) and the handlers act on it, so a request is never authorised as one thing and
    served as another."""
    value = query.get(name)
    return value is not None and value != "0" and value.lower() != "false"


class Subresources:
    """``(plural, subresource, method) -> handler``, ``ANY`` matching every plural or method.

    Which plural has which subresource is the resource table's (:mod:`.resources`); this
    table says who serves it.  A subresource served, but not with the request's method, is
    405; one nobody serves is 405 too (the resource table already answered 404 for one the
    kind does not have)."""

    def __init__(self) -> None:
        self._table: dict[tuple[str, str, str], Handler] = {}

    def add(self, plural: str, sub: str, methods: Iterable[str], handler: Handler) -> None:
        for method in methods:
            key = (plural, sub, method)
            if key in self._table:
                raise ValueError(f"{plural}/{sub} {method} is served twice")
            self._table[key] = handler

    def find(self, plural: str, sub: str, method: str) -> Handler:
        for key in ((plural, sub, method), (plural, sub, ANY), (ANY, sub, method), (ANY, sub, ANY)):
            handler = self._table.get(key)
            if handler is not None:
                return handler
        raise errors.method_not_allowed("the server does not allow this method on the requested resource")
