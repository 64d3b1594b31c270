"""Unsigned LEB128, the variable-length integer of both WebAssembly's binary format and
protobuf's wire format (a protobuf "varint" is the same encoding): seven bits a byte,
least significant first, the high bit set on every byte but the last.

The one writer of these numbers (kube32.wasm.binary adds exports to a module,
kube32.apiserver.openapi.proto writes the OpenAPI document as protobuf).  The readers stay
with their formats (kube32.wasmformat, kube32.apiserver.protobuf): each bounds a number
by its format's rules and answers with its format's error.

Imports nothing: any layer may use it.
"""
from __future__ import annotations

MASK64 = (1 << 64) - 1   # protobuf writes a negative int64 as its 64-bit two's complement


def encode(n: int) -> bytes:
    """``n`` (``>= 0``) as unsigned LEB128; ValueError for a negative number, which has no
    unsigned encoding (a caller that means two's complement masks it first: ``n & MASK64``)."""
    if n < 0:
        raise ValueError(f"unsigned LEB128 cannot encode {n}")
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)
