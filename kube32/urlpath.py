"""Proxied paths that stay inside the object they name: one check for every hop.

A proxy appends a caller's path to a URL that names one object: the API server's
``pods/<pod>/proxy/<path>`` and ``services/<svc>/proxy/<path>`` become the kubelet's
``/pods/<ns>/<pod>/http/<path>``, ``nodes/<node>/proxy/<path>`` the kubelet's
``/<path>``, a node's NodePort ``/<path>`` the API server's
``services/<svc>:<port>/proxy/<path>``.  The next server (or the HTTP client on
the way, which resolves dot segments) must never read that path as naming
another object, so every layer uses this module and nothing else:

* A path is a list of segments.  A segment that is a dot segment (``.`` or ``..``)
  under any reading is refused, never resolved: as sent, after percent-decoding
  any number of times (``%2e``, ``%2E``, ``%252e``), with a backslash read as a
  slash (as some servers do), with ``;params`` cut off (``..;/``), and after
  Unicode NFKC (fullwidth dots).  A backslash or a control character in any
  encoding is refused too, and so is a segment still changing after
  :data:`MAX_DECODINGS` decodings (the decoder is bounded).
* What goes on is built segment by segment, each percent-encoded (``/`` and ``%``
  included), into a URL the client sends as is (:func:`encoded_url`), so the next
  server decodes exactly the segments that were checked.
* The API's own clients build their paths the same way (:func:`api_path`): every
  name one segment, checked and encoded, sent as is.

Everything else in a segment (``%2F`` for a slash inside one, ``%25``, ``;``, ``:``,
spaces) passes through unchanged: a pod's own paths are its business.
"""
from __future__ import annotations

import unicodedata
from typing import Iterable, Iterator
from urllib.parse import quote, unquote

import yarl

from .terms import GROUP, VERSION

MAX_DECODINGS = 8
# RFC 3986 pchar minus "%": what a segment may hold unencoded.  "/" is not in it.
_SEGMENT_SAFE = "!$&'()*+,;=:@-._~"
_QUERY_SAFE = _SEGMENT_SAFE + "/?%"   # a query as received keeps its escapes
_DOTS = frozenset({".", ".."})


class PathRefused(ValueError):
    """A path that could name something outside its object; the message says why."""


def _decodings(segment: str) -> Iterator[str]:
    """``segment`` and each percent-decoding of it until it stops changing."""
    for _ in range(MAX_DECODINGS):
        yield segment
        decoded = unquote(segment, errors="replace")
        if decoded == segment:
            return
        segment = decoded
    raise PathRefused(f'the path segment is percent-encoded more than {MAX_DECODINGS} times')


def _why(segment: str) -> str | None:
    """Why one segment (as received, or decoded once) is refused, or None."""
    for form in _decodings(segment):
        if "\\" in form:
            return f'the path segment "{segment}" holds a backslash'
        if any(ord(c) < 0x20 or ord(c) == 0x7f for c in form):
            return f'the path segment "{segment}" holds a control character'
        for piece in form.split("/"):
            for reading in (piece, piece.split(";", 1)[0]):
                if reading in _DOTS or unicodedata.normalize("NFKC", reading) in _DOTS:
                    return f'the path segment "{segment}" is a dot segment ("{reading}")'
    return None


def _segment_refusal(segment: str) -> str | None:
    try:
        return _why(segment)
    except PathRefused as e:
        return f'{e}: "{segment}"'


def refusal(segments: Iterable[str]) -> str | None:
    """Why these path segments could leave the object they are under, or None."""
    for segment in segments:
        why = _segment_refusal(segment)
        if why:
            return f"{why}: a proxied path may not leave the object it names"
    return None


def api_path(*segments: str) -> str:
    """``/`` + ``segments``, each exactly one segment of the path: percent-encoded, and
    refused (:class:`PathRefused`, saying why) when empty, holding a ``/`` (which the
    server would split on, encoded or not) or a dot segment under any reading.

    The one way every client of the API builds a path from names (kube32.client.Kind,
    and the paths outside the kinds: node proxies, topics, images), sent as is
    (:func:`encoded_url`): a name taken from an object or an annotation can never
    address anything but itself."""
    for segment in segments:
        why = ("the path segment is empty" if not segment else
               f'the name "{segment}" holds a "/"' if "/" in segment else _segment_refusal(segment))
        if why:
            raise PathRefused(f"{why}: an API path names each object by one segment")
    return "/" + "/".join(quote_segment(s) for s in segments)


def group_path(*segments: str) -> str:
    """:func:`api_path` under Kube32's own group and version (``/apis/kube32.io/v1/...``)."""
    return api_path("apis", GROUP, VERSION, *segments)


def quote_segment(segment: str) -> str:
    return quote(segment, safe=_SEGMENT_SAFE)


def confined(segments: list[str]) -> str:
    """The segments checked and percent-encoded, joined by ``/``; PathRefused says why not."""
    why = refusal(segments)
    if why:
        raise PathRefused(why)
    return "/".join(quote_segment(s) for s in segments)


def encoded_url(base: str, path: str, query: str = "") -> yarl.URL:
    """``base`` + an already encoded ``path`` (and ``query`` as received), sent as is: an
    HTTP client given a plain string would resolve dot segments and re-quote it.  Of
    the query only what may not stand in one is encoded (a ``#`` would cut it short)."""
    query = quote(query, safe=_QUERY_SAFE)
    return yarl.URL(f"{base}{path}" + (f"?{query}" if query else ""), encoded=True)
