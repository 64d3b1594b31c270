"""Request bodies: size, time and depth limits, JSON/YAML/Kubernetes-protobuf decoding,
and strict field validation.

A body that cannot be decoded, names a field twice or (under
``fieldValidation=Strict``) names a field the kind does not have is refused
with a 400 that names the problem; nothing reaches the registry.  A protobuf body
(``k8s\x00`` + runtime.Unknown, see :mod:`.protobuf`) becomes the same JSON object the
JSON path would give; a protobuf kind without a schema is a 415 that names the kind.

Bounds (:mod:`.limits`), each refused with a status that says which:

* size: more than ``MAX_BODY`` bytes is a 413, said before the body is read whole;
* time: a body that has not arrived whole ``BODY_TIMEOUT`` seconds after its request
  began is a 408 (a stalled one is cut sooner: :mod:`kube32.serving`);
* depth: nesting deeper than ``MAX_DEPTH`` is a 400, found before anything recurses
  (JSON: :mod:`.jsonshape` measures the raw bytes; YAML: :mod:`.yamlbody` builds
  without recursion; protobuf: its schema's depth bound);
* values: more than ``MAX_VALUES`` is a 413, measured the same ways;
* expansion: YAML aliases and merge keys that would expand past ``MAX_DECODED`` bytes
  are a 413 (:mod:`.yamlbody`);
* values with no JSON form are a 400: NaN and Infinity, and numbers too large for a
  64-bit float (``1e999``, which Python would read as Infinity, and kube-apiserver's Go
  decoder refuses), in JSON, in JSON sent as YAML and in YAML (``.inf``).  The
  registry's encoder refuses them too (:func:`.registry.encode`), so no other path
  stores one.

Decoding a large body runs on a worker thread (two at most: :mod:`.offload`), so the event loop that
answers health checks and Lease renewals keeps running while it works; and requests
with large bodies are handled one at a time (:class:`HeavyBodies`, as kube-apiserver's
priority and fairness queues heavy writes apart from Leases and health checks), so
many of them at once cannot add up to a stall: the others wait their turn without
holding the loop.
"""
from __future__ import annotations

import asyncio
import json
import re
from typing import Any, Callable

import yaml
from aiohttp import web

from ..serving import BODY_TIMEOUT
from . import errors, jsonshape, offload, protobuf, typedfields, yamlbody
from .limits import MAX_BODY, MAX_DECODED, MAX_DEPTH, MAX_VALUES, out_of_range
from .resources import Resource

__all__ = ["MAX_BODY", "HeavyBodies", "read_raw", "read_body", "body_size", "decode", "decode_async", "media_type",
           "check_fields"]

INLINE_DECODE = 16 << 10  # bytes: a larger body is decoded on a worker thread (.offload)
HEAVY_BODY = 64 << 10     # bytes: a larger body makes its request wait its turn (HeavyBodies)
BODY_SIZE = "kube32.body-size"   # the request's key for the size of its body, once read


class HeavyBodies:
    """Requests whose decoded body is larger than ``HEAVY_BODY`` are handled ``at_once``
    at a time, from their decoding to their response; :func:`read_body` takes the turn
    and :meth:`middleware` gives it back when the request ends."""

    KEY = web.AppKey("kube32-heavy-bodies", object)

    def __init__(self, at_once: int = 1) -> None:
        self._turns = asyncio.Semaphore(at_once)

    async def wait_turn(self, request: web.Request) -> None:
        if request.get("kube32.heavy") is not self:
            await self._turns.acquire()
            request["kube32.heavy"] = self

    @web.middleware
    async def middleware(self, request: web.Request, handler: Any) -> web.StreamResponse:
        try:
            return await handler(request)
        finally:
            if request.get("kube32.heavy") is self:
                self._turns.release()


class _DuplicateKey(ValueError):
    pass


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise _DuplicateKey(k)
        out[k] = v
    return out


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON value (JSON has no NaN or infinity)")


class _NotFinite(ValueError):
    pass


def _number(parse: Callable[[str], int | float]) -> Callable[[str], int | float]:
    """A JSON number read by ``parse``, refused when it is out of a 64-bit float's range
    (:func:`.limits.out_of_range`: ``1e999`` would be Infinity, which JSON has not)."""
    def read(text: str) -> int | float:
        value = parse(text)
        if out_of_range(value):
            shown = text if len(text) <= 40 else f"{text[:20]}...({len(text)} characters)"
            raise _NotFinite(f"the number {shown} is out of the range of a 64-bit float "
                             "(JSON has no infinity)")
        return value
    return read


_READ_FLOAT, _READ_INT = _number(float), _number(int)
# Only a number with an exponent or of 309 digits and more can be out of a float's range;
# a body with neither (strings counted: a false match only costs the slower read) skips
# the per-number check.
_MAYBE_OUT_OF_RANGE = re.compile(rb"[0-9][eE]|[0-9]{309}")


class _NumberRefused(errors.APIError):
    """A body that is JSON but holds a number no JSON value can be: refused whatever the
    content type says (JSON sent as YAML is not read again as YAML for it)."""


# --- reading ---------------------------------------------------------------------------
async def read_raw(request: web.Request, limit: int = MAX_BODY) -> bytes:
    length = request.content_length
    if length is not None and length > limit:
        raise errors.too_large(f"the request body is {length} bytes, more than the limit of {limit} bytes")
    if length is not None and request.content.is_eof():
        # All of it came with the headers (a small body, as every PATCH of a Lease or a
        # status): taken at once, without a timer and a read loop.
        whole = request.content.read_nowait(-1)
        if len(whole) <= limit:   # not implied by Content-Length: aiohttp inflates a gzip body
            return whole
        raise errors.too_large(f"the request body is more than the limit of {limit} bytes")
    data = bytearray()
    try:
        async with asyncio.timeout(BODY_TIMEOUT):
            async for chunk in request.content.iter_chunked(65536):
                data += chunk
                if len(data) > limit:
                    raise errors.too_large(f"the request body is more than the limit of {limit} bytes")
    except TimeoutError:
        raise errors.APIError(408, "Timeout", f"the request body did not arrive whole within "
                              f"{BODY_TIMEOUT:g}s ({len(data)} bytes came)") from None
    return bytes(data)


def media_type(request: web.Request) -> str:
    return (request.headers.get("Content-Type") or "application/json").split(";")[0].strip().lower()


async def read_body(request: web.Request, what: str, ctype: str | None = None) -> Any:
    """The request's body, read (bounded) and decoded as ``ctype`` (default: its Content-Type)."""
    raw = await read_raw(request)
    request[BODY_SIZE] = len(raw)
    heavy = request.app.get(HeavyBodies.KEY)
    if len(raw) > HEAVY_BODY and isinstance(heavy, HeavyBodies):
        await heavy.wait_turn(request)
    return await decode_async(raw, ctype or media_type(request), what)


def body_size(request: web.Request) -> int:
    """The size in bytes of the body :func:`read_body` read (0 before): the registry does
    every pass over what a large body makes on a worker thread."""
    size = request.get(BODY_SIZE, 0)
    return size if isinstance(size, int) else 0


# --- decoding --------------------------------------------------------------------------
def decode_protobuf(raw: bytes, what: str) -> dict[str, Any]:
    """A Kubernetes protobuf body (kubectl's typed clients) as the JSON object it stands for."""
    try:
        return protobuf.decode_object(raw)
    except protobuf.UnknownKind as e:
        raise errors.APIError(415, "UnsupportedMediaType", f"{what}: {e}") from None
    except protobuf.ProtobufError as e:
        raise errors.bad_request(f"{what}: the protobuf body could not be decoded: {e}") from None


def _too_deep(what: str, depth: int) -> errors.APIError:
    return errors.bad_request(f"{what}: the body nests {depth} levels deep, more than the limit of "
                              f"{MAX_DEPTH} levels")


def _decode_json(raw: bytes, what: str) -> Any:
    measured = jsonshape.shape(raw)
    if measured.depth > MAX_DEPTH:
        raise _too_deep(what, measured.depth)
    if measured.values > MAX_VALUES:
        raise errors.too_large(f"{what}: the body holds about {measured.values} values, more than the limit "
                               f"of {MAX_VALUES}")
    try:
        if _MAYBE_OUT_OF_RANGE.search(raw) is None:   # the common case, at C speed
            return json.loads(raw, object_pairs_hook=_no_duplicates, parse_constant=_no_constant)
        return json.loads(raw, object_pairs_hook=_no_duplicates, parse_constant=_no_constant,
                          parse_float=_READ_FLOAT, parse_int=_READ_INT)
    except _DuplicateKey as e:
        raise errors.bad_request(f'{what}: strict decoding error: json: duplicate field "{e}"') from None
    except _NotFinite as e:
        raise _NumberRefused(400, "BadRequest", f"{what}: the body is not valid JSON: {e}") from None
    except (ValueError, UnicodeDecodeError) as e:   # JSONDecodeError, NaN, an int of 4300+ digits
        reason = str(e).split("; use sys.")[0]   # Python's advice is not the client's
        raise errors.bad_request(f"{what}: the body is not valid JSON: {reason}") from None


def _decode_yaml(raw: bytes, what: str) -> Any:
    if raw.lstrip()[:1] in (b"{", b"["):
        # JSON text (kubectl's server-side apply sends JSON as YAML): the fast path, with
        # the same bounds; anything JSON refuses is read as YAML after all.
        try:
            return _decode_json(raw, what)
        except _NumberRefused:
            raise
        except errors.APIError:
            pass
    try:
        return yamlbody.load(raw, MAX_DECODED, MAX_DEPTH, MAX_VALUES)
    except yamlbody.BodyError as e:
        if e.too_large:
            raise errors.too_large(f"{what}: {e}") from None
        raise errors.bad_request(f"{what}: {e}") from None
    except yaml.YAMLError as e:
        raise errors.bad_request(f"{what}: the body is not valid YAML: {e}") from None


def decode(raw: bytes, ctype: str, what: str) -> Any:
    """``raw`` as the JSON value it stands for (JSON, YAML or Kubernetes protobuf); a
    refusal is an APIError naming ``what`` and the reason."""
    if raw.startswith(protobuf.MAGIC) or "protobuf" in ctype:
        return decode_protobuf(raw, what)
    if not raw.strip():
        raise errors.bad_request(f"{what}: the request body is empty")
    if "yaml" in ctype:
        return _decode_yaml(raw, what)
    return _decode_json(raw, what)


async def decode_async(raw: bytes, ctype: str, what: str) -> Any:
    """:func:`decode`, on a worker thread when the body is large."""
    if len(raw) <= INLINE_DECODE:
        return decode(raw, ctype, what)
    return await offload.run(decode, raw, ctype, what)


def check_fields(res: Resource, obj: Any, validation: str, *, status_only: bool = False,
                 omit_empty: bool = True) -> list[str]:
    """Strict: 400 on unknown fields.  Warn: return warnings.  Ignore: nothing.  A built-in
    kind's unknown fields are dropped from ``obj`` whatever the validation, as its typed
    decoding drops them in kube-apiserver (:mod:`.typedfields`), and its empty maps too
    (``omit_empty``; not from an applied configuration, whose ``data: {}`` its applier owns)."""
    if not isinstance(obj, dict):
        return []
    try:
        typed = typedfields.prune_unknown(res, obj, omit_empty=omit_empty)
        if validation == "Ignore":
            return []
        unknown = res.strategy.unknown_fields(obj) if typed is None else typed
    except (TypeError, AttributeError, KeyError, ValueError, IndexError) as e:
        # A field of the wrong shape (a list where an object goes...): the client's error.
        raise errors.bad_request(f'{res.kind} in version "{res.version}" cannot be handled as a '
                                 f'{res.kind}: a field has the wrong type or shape ({e})') from None
    if not unknown:
        return []
    if validation == "Strict":
        text = ", ".join(f'unknown field "{u}"' for u in unknown)
        raise errors.bad_request(f'{res.kind} in version "{res.version}" cannot be handled as a '
                                 f'{res.kind}: strict decoding error: {text}')
    return [f'unknown field "{u}"' for u in unknown]
