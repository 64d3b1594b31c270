"""Answering the OpenAPI paths: content negotiation, compression and validators.

``/openapi/v2`` answers JSON (``application/json``, ``*/*`` or no Accept) or gnostic's
protobuf (``application/com.github.proto-openapi.spec.v2@v1.0+protobuf``, what kubectl
asks; answered as ``...spec.v2.v1.0+protobuf``, as kube-openapi names it), in the first
of the Accept's types, by quality, that it has; anything else is a 406 naming both.
Every document goes gzipped to a client that accepts it and has an ``ETag`` (its
SHA-256), as kube-apiserver's do; bodies are built once.
"""
from __future__ import annotations

import gzip
import hashlib
import json
from functools import lru_cache

from aiohttp import web

from .. import errors
from . import proto
from .documents import v2_document, v3_document_bytes, v3_root

__all__ = ["PROTOBUF", "answer", "v2_for", "v3_document_bytes", "v3_root"]

PROTOBUF = "application/com.github.proto-openapi.spec.v2@v1.0+protobuf"
# The type the answer names: kube-openapi's, without the "@" Go's mime parser refuses.
PROTOBUF_ANSWER = "application/com.github.proto-openapi.spec.v2.v1.0+protobuf"
_PROTOBUF_TYPES = (PROTOBUF, PROTOBUF_ANSWER)
_JSON_TYPES = ("application/json", "*/*", "application/*")


@lru_cache(maxsize=None)
def _v2_json() -> bytes:
    return json.dumps(v2_document(), separators=(",", ":")).encode()


@lru_cache(maxsize=None)
def _v2_protobuf() -> bytes:
    return proto.document(v2_document())


@lru_cache(maxsize=64)
def _gzipped(body: bytes) -> bytes:
    return gzip.compress(body, 6, mtime=0)


def _accepted(accept: str) -> list[str]:
    """The Accept header's media types, best first (quality, then order)."""
    ranked = []
    for i, part in enumerate(accept.split(",")):
        fields = [f.strip() for f in part.split(";")]
        q = 1.0
        for f in fields[1:]:
            if f.startswith("q="):
                try:
                    q = float(f[2:])
                except ValueError:
                    q = 0.0
        if fields[0] and q > 0:
            ranked.append((-q, i, fields[0].lower()))
    return [t for _, _, t in sorted(ranked)]


def v2_for(accept: str) -> tuple[bytes, str]:
    """The v2 document in the form the Accept header asks: (body, content type)."""
    for media in _accepted(accept) or ["application/json"]:
        if media in _PROTOBUF_TYPES:
            return _v2_protobuf(), PROTOBUF_ANSWER
        if media in _JSON_TYPES:
            return _v2_json(), "application/json"
    raise errors.APIError(406, "NotAcceptable",
                          f"the server cannot answer /openapi/v2 as {accept!r}: it serves application/json "
                          f"and {PROTOBUF}")


def answer(request: web.Request, body: bytes, content_type: str) -> web.Response:
    etag = '"' + hashlib.sha256(body).hexdigest().upper() + '"'
    headers = {"ETag": etag, "Vary": "Accept, Accept-Encoding"}
    if request.headers.get("If-None-Match") == etag:
        return web.Response(status=304, headers=headers)
    if "gzip" in request.headers.get("Accept-Encoding", ""):
        headers["Content-Encoding"] = "gzip"
        body = _gzipped(body)
    return web.Response(body=body, content_type=content_type, headers=headers)
