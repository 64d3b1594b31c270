"""kube32.leb128, the one LEB128 / protobuf varint writer: the encodings of the WebAssembly
specification's and protobuf's documentation, read back by the readers of both formats."""
from __future__ import annotations

import pytest

from kube32 import leb128, wasmformat
from kube32.apiserver.openapi import proto
from kube32.apiserver.protobuf import iter_fields


@pytest.mark.parametrize("n, encoded", [
    (0, b"\x00"), (1, b"\x01"), (127, b"\x7f"), (128, b"\x80\x01"), (150, b"\x96\x01"),   # protobuf's example
    (300, b"\xac\x02"), (624485, b"\xe5\x8e\x26"),                                        # Wikipedia's LEB128 example
    ((1 << 64) - 1, b"\xff" * 9 + b"\x01"),
])
def test_the_documented_encodings(n: int, encoded: bytes) -> None:
    assert leb128.encode(n) == encoded
    assert wasmformat.Reader(encoded).uleb() == n


def test_a_negative_number_has_no_unsigned_encoding() -> None:
    with pytest.raises(ValueError, match="cannot encode -1"):
        leb128.encode(-1)


def test_protobuf_writes_a_negative_int64_as_ten_bytes_that_read_back() -> None:
    assert proto._varint(-1) == b"\xff" * 9 + b"\x01"
    assert iter_fields(proto._key(5, 0) + proto._varint(-1)) == [(5, 0, (1 << 64) - 1)]
