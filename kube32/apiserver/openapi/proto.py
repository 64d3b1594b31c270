"""The OpenAPI v2 document as protobuf: gnostic's ``openapi.v2.Document``.

kubectl (and client-go's openapi v2 client) asks ``/openapi/v2`` for
``application/com.github.proto-openapi.spec.v2@v1.0+protobuf`` and parses the answer
with gnostic's OpenAPIv2.proto; a JSON answer there is "proto: cannot parse invalid
wire-format data".  This module writes the messages of that file the document uses,
with their field numbers: Document, Info, Paths/PathItem/Operation (query parameters,
responses) and Definitions/Schema.  Values a message keeps as ``Any`` (defaults, enums,
vendor extensions) go as its ``yaml`` string, JSON being YAML, as gnostic writes them.

Invariant: encoding is total over the documents :mod:`.documents` builds; a schema key
this module does not know is left out, never guessed.
"""
from __future__ import annotations

import json
import struct
from typing import Any

from ... import leb128

_WIRE_VARINT, _WIRE_FIXED64, _WIRE_BYTES = 0, 1, 2


def _varint(n: int) -> bytes:
    return leb128.encode(n & leb128.MASK64)


def _key(field: int, wire: int) -> bytes:
    return _varint(field << 3 | wire)


def _bytes(field: int, data: bytes) -> bytes:
    return _key(field, _WIRE_BYTES) + _varint(len(data)) + data


def _str(field: int, text: str | None) -> bytes:
    return _bytes(field, text.encode()) if text else b""


def _bool(field: int, value: Any) -> bytes:
    return _key(field, _WIRE_VARINT) + b"\x01" if value else b""


def _int(field: int, value: Any) -> bytes:
    return _key(field, _WIRE_VARINT) + _varint(int(value)) if isinstance(value, int) and value else b""


def _double(field: int, value: Any) -> bytes:
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return b""
    return _key(field, _WIRE_FIXED64) + struct.pack("<d", float(value))


def _any(field: int, value: Any) -> bytes:
    """gnostic's Any: {2: yaml}."""
    return _bytes(field, _str(2, json.dumps(value, sort_keys=True)))


def _named_any(field: int, name: str, value: Any) -> bytes:
    """NamedAny: {1: name, 2: Any}."""
    return _bytes(field, _str(1, name) + _any(2, value))


def _extensions(field: int, node: dict[str, Any]) -> bytes:
    return b"".join(_named_any(field, k, v) for k, v in node.items() if k.startswith("x-"))


# Schema's scalar fields: key -> (field number, writer).
_SCHEMA_SCALARS = {"$ref": (1, _str), "format": (2, _str), "title": (3, _str), "description": (4, _str),
                   "multipleOf": (6, _double), "maximum": (7, _double), "exclusiveMaximum": (8, _bool),
                   "minimum": (9, _double), "exclusiveMinimum": (10, _bool), "maxLength": (11, _int),
                   "minLength": (12, _int), "pattern": (13, _str), "maxItems": (14, _int), "minItems": (15, _int),
                   "uniqueItems": (16, _bool), "maxProperties": (17, _int), "minProperties": (18, _int),
                   "discriminator": (26, _str), "readOnly": (27, _bool)}


def schema(node: dict[str, Any]) -> bytes:
    """A Schema message."""
    out = bytearray()
    for key, value in node.items():
        if key in _SCHEMA_SCALARS:
            number, write = _SCHEMA_SCALARS[key]
            out += write(number, value)
        elif key == "default":
            out += _any(5, value)
        elif key == "required":
            out += b"".join(_str(19, r) for r in value)
        elif key == "enum":
            out += b"".join(_any(20, v) for v in value)
        elif key == "additionalProperties":   # AdditionalPropertiesItem: {1: Schema} or {2: bool}
            inner = _bytes(1, schema(value)) if isinstance(value, dict) else _key(2, _WIRE_VARINT) + _varint(
                1 if value else 0)
            out += _bytes(21, inner)
        elif key == "type":   # TypeItem: {1: repeated string}
            out += _bytes(22, b"".join(_str(1, t) for t in ([value] if isinstance(value, str) else value)))
        elif key == "items":   # ItemsItem: {1: repeated Schema}
            items = value if isinstance(value, list) else [value]
            out += _bytes(23, b"".join(_bytes(1, schema(i)) for i in items))
        elif key == "allOf":
            out += b"".join(_bytes(24, schema(s)) for s in value)
        elif key == "properties":   # Properties: {1: repeated NamedSchema{1: name, 2: Schema}}
            out += _bytes(25, b"".join(_bytes(1, _str(1, k) + _bytes(2, schema(v))) for k, v in value.items()))
    out += _extensions(31, node)
    return bytes(out)


def _parameter(p: dict[str, Any]) -> bytes:
    """ParametersItem{1: Parameter{2: NonBodyParameter{3: QueryParameterSubSchema, or
    4: PathParameterSubSchema}}} (their fields for type and uniqueItems differ)."""
    common = _bool(1, p.get("required")) + _str(2, p.get("in")) + _str(3, p.get("description")) \
        + _str(4, p.get("name"))
    if p.get("in") == "path":
        return _bytes(1, _bytes(2, _bytes(4, common + _str(5, p.get("type")) + _bool(19, p.get("uniqueItems")))))
    return _bytes(1, _bytes(2, _bytes(3, common + _str(6, p.get("type")) + _bool(20, p.get("uniqueItems")))))


def _responses(responses: dict[str, Any]) -> bytes:
    """Responses{1: NamedResponseValue{1: code, 2: ResponseValue{1: Response{1: text, 2: SchemaItem{1: Schema}}}}}."""
    out = bytearray()
    for code, r in responses.items():
        body = _str(1, r.get("description"))
        if "schema" in r:
            body += _bytes(2, _bytes(1, schema(r["schema"])))
        out += _bytes(1, _str(1, code) + _bytes(2, _bytes(1, body)))
    return bytes(out)


def _operation(op: dict[str, Any]) -> bytes:
    return (_str(5, op.get("operationId")) + b"".join(_bytes(8, _parameter(p)) for p in op.get("parameters", []))
            + _bytes(9, _responses(op.get("responses", {}))) + _extensions(13, op))


_METHODS = {"get": 2, "put": 3, "post": 4, "delete": 5, "options": 6, "head": 7, "patch": 8}


def _path_item(item: dict[str, Any]) -> bytes:
    """PathItem{2..8: the methods' Operations, 9: the path's parameters}."""
    return (b"".join(_bytes(_METHODS[m], _operation(op)) for m, op in item.items() if m in _METHODS)
            + b"".join(_bytes(9, _parameter(p)) for p in item.get("parameters", [])))


def document(doc: dict[str, Any]) -> bytes:
    """A Document message: {1: swagger, 2: Info, 8: Paths, 9: Definitions}."""
    info = doc.get("info", {})
    paths = b"".join(_bytes(2, _str(1, path) + _bytes(2, _path_item(item)))
                     for path, item in doc.get("paths", {}).items())
    definitions = b"".join(_bytes(1, _str(1, name) + _bytes(2, schema(s)))
                           for name, s in doc.get("definitions", {}).items())
    return (_str(1, doc.get("swagger")) + _bytes(2, _str(1, info.get("title")) + _str(2, info.get("version")))
            + _bytes(8, paths) + _bytes(9, definitions))
