"""The fleet's control stream (round 25c): one answer a line, a line over the limit
included; a worker's address checked before its join."""
from __future__ import annotations

import asyncio

from kube32.sim.fleet import TOO_LONG, read_command
from kube32.sim.worker import address_problem


def _lines(data: bytes, limit: int = 64) -> list[bytes | None]:
    async def main() -> list[bytes | None]:
        reader = asyncio.StreamReader(limit=limit)
        reader.feed_data(data)
        reader.feed_eof()
        out: list[bytes | None] = []
        while (line := await read_command(reader)) is not None:
            out.append(line)
        return out
    return asyncio.run(main())


def test_a_line_over_the_limit_is_one_answer_and_the_next_line_is_read() -> None:
    assert _lines(b"list\n" + b"x" * 100_000 + b"\nkill fleet-1\n") == [b"list\n", TOO_LONG, b"kill fleet-1\n"]
    assert _lines(b"y" * 100 + b"\nlist\n") == [TOO_LONG, b"list\n"]     # separator within the buffer
    assert _lines(b"z" * 1000) == [TOO_LONG]                              # no newline before the end
    assert _lines(b"list") == [b"list"] and _lines(b"") == []


def test_a_nodes_address_must_be_an_ipv4_address_this_machine_listens_on() -> None:
    assert address_problem("127.0.0.2") is None
    for bad in ("999.1.1.1", "::1", "localhost", ""):
        assert "is not an IPv4 address" in (address_problem(bad) or ""), bad
    assert "cannot listen on 10.255.255.1" in (address_problem("10.255.255.1") or "")
