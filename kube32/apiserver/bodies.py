"""Request bodies: size limits, JSON/YAML/Kubernetes-protobuf decoding, and strict field validation.

A body that cannot be decoded, names a field twice or (under
``fieldValidation=Strict``) names a field the kind does not have is refused
with a 400 that names the problem; nothing reaches the registry.  A protobuf body
(``k8s\x00`` + runtime.Unknown, see :mod:`.protobuf`) becomes the same JSON object the
JSON path would give; a protobuf kind without a schema is a 415 that names the kind.
"""
from __future__ import annotations

import json
from typing import Any

import yaml
from aiohttp import web

from . import errors, protobuf
from .resources import Resource

MAX_BODY = 3 * 1024 * 1024  # as kube-apiserver's default for objects


class _DuplicateKey(ValueError):
    pass


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise _DuplicateKey(k)
        out[k] = v
    return out


async def read_raw(request: web.Request, limit: int = MAX_BODY) -> bytes:
    length = request.content_length
    if length is not None and length > limit:
        raise errors.too_large(f"the request body is {length} bytes, more than the limit of {limit} bytes")
    data = bytearray()
    async for chunk in request.content.iter_chunked(65536):
        data += chunk
        if len(data) > limit:
            raise errors.too_large(f"the request body is more than the limit of {limit} bytes")
    return bytes(data)


def media_type(request: web.Request) -> str:
    return (request.headers.get("Content-Type") or "application/json").split(";")[0].strip().lower()


def decode_protobuf(raw: bytes, what: str) -> dict[str, Any]:
    """A Kubernetes protobuf body (kubectl's typed clients) as the JSON object it stands for."""
    try:
        return protobuf.decode_object(raw)
    except protobuf.UnknownKind as e:
        raise errors.APIError(415, "UnsupportedMediaType", f"{what}: {e}") from None
    except protobuf.ProtobufError as e:
        raise errors.bad_request(f"{what}: the protobuf body could not be decoded: {e}") from None


def decode(raw: bytes, ctype: str, what: str) -> Any:
    if raw.startswith(protobuf.MAGIC) or "protobuf" in ctype:
        return decode_protobuf(raw, what)
    if not raw.strip():
        raise errors.bad_request(f"{what}: the request body is empty")
    if "yaml" in ctype:
        try:
            return yaml.safe_load(raw)
        except yaml.YAMLError as e:
            raise errors.bad_request(f"{what}: the body is not valid YAML: {e}") from None
    try:
        return json.loads(raw, object_pairs_hook=_no_duplicates)
    except _DuplicateKey as e:
        raise errors.bad_request(f'{what}: strict decoding error: json: duplicate field "{e}"') from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise errors.bad_request(f"{what}: the body is not valid JSON: {e}") from None


def check_fields(res: Resource, obj: Any, validation: str, *, status_only: bool = False) -> list[str]:
    """Strict: 400 on unknown fields.  Warn: return warnings.  Ignore: nothing."""
    if not isinstance(obj, dict) or validation == "Ignore":
        return []
    try:
        unknown = res.strategy.unknown_fields(obj)
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
