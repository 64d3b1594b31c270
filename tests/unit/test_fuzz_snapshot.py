"""Fuzzing the K32S reader and the Checkpoint data PUT (hypothesis, bounded run time).

The reader, on arbitrary bytes and on valid snapshots mutated byte-wise and section-wise
(lengths, types, counts, sections dropped, repeated or swapped), resealed with a fresh
trailer or not, through every driver (push with any chunking, a blocking file, an
asyncio stream, an aiohttp-style chunked body), with and without the size and a module:

* the answer is a snapshot or a `SnapshotError` naming a known cause, never another
  exception; every driver gives the same verdict for the same bytes and knowledge;
* a snapshot accepted has the trailer of its bytes, and its memory is the bytes of its
  memory section;
* memory and time stay bounded: the reader never asks for a memory target larger than
  the stream can hold, allocates about the input's size at most besides it, and ends.

The PUT, through a real API server in this process (tests.unit.test_fuzz_api_bodies's),
with mutated bodies: 200 exactly when the reader accepts the bytes, with the data and
facts stored as sent; else 422 whose message is the reader's cause, and everything as it
was (no data, or the data stored before, and the same status).

K32S_FUZZ_EXAMPLES raises the example count (the default keeps the suite fast).
"""
from __future__ import annotations

import asyncio
import hashlib
import io
import json
import os
import struct
import gc
import tracemalloc
from typing import Any, Callable, Iterator

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from kube32.snapshot import (
    CAUSES, HEADER_SIZE, MAGIC, SECTION_MEMORY, TRAILER_SIZE, VERSION, ModuleShape, Snapshot, SnapshotError,
    SnapshotReader, SnapshotWriter,
)
from tests.unit.test_fuzz_api_bodies import Server
from tests.unit.test_snapshot_properties import module_of, snapshots

EXAMPLES = int(os.environ.get("K32S_FUZZ_EXAMPLES", "80"))
SETTINGS = settings(max_examples=EXAMPLES, deadline=5000, suppress_health_check=[HealthCheck.too_slow])
PUT_SETTINGS = settings(max_examples=max(EXAMPLES // 2, 10), deadline=10000,
                        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
TARGET_CAP = 1 << 20  # a target the harness gives a stream of unknown size (as a pod's memory limit would)
STEP_SECONDS = 10.0   # an async read that takes longer than this has hung


# --- inputs -------------------------------------------------------------------------------

def reseal(data: bytes) -> bytes:
    """The bytes before the trailer, with a trailer that matches them."""
    body = data[:-TRAILER_SIZE] if len(data) >= TRAILER_SIZE else data
    return body + hashlib.sha256(body).digest()


def sections_of(data: bytes) -> list[tuple[int, int]]:
    """(offset, end) of each section (head and body) of a valid snapshot."""
    snap = SnapshotReader(total_size=len(data)).read_from(io.BytesIO(data))
    return [(s.offset, s.offset + 6 + s.length) for s in snap.sections]


@st.composite
def mutated(draw: st.DrawFn) -> tuple[bytes, bytes, Any]:
    """(original, mutated, state) of a valid snapshot changed byte-wise or section-wise."""
    state, memory = draw(snapshots())
    original = SnapshotWriter(state, memory).to_bytes()
    data = bytearray(original)
    parts = sections_of(original)
    kind = draw(st.sampled_from(["flip", "overwrite", "insert", "delete", "truncate", "append",
                                 "section-length", "section-type", "section-count", "drop-section",
                                 "repeat-section", "swap-sections", "header-field"]))
    if kind == "flip":
        at = draw(st.integers(0, len(data) - 1))
        data[at] ^= draw(st.integers(1, 255))
    elif kind == "overwrite":
        at = draw(st.integers(0, len(data) - 1))
        junk = draw(st.binary(min_size=1, max_size=16))
        data[at: at + len(junk)] = junk
    elif kind == "insert":
        at = draw(st.integers(0, len(data)))
        data[at:at] = draw(st.binary(min_size=1, max_size=16))
    elif kind == "delete":
        at = draw(st.integers(0, len(data) - 1))
        del data[at: at + draw(st.integers(1, 16))]
    elif kind == "truncate":
        del data[draw(st.integers(0, len(data) - 1)):]
    elif kind == "append":
        data += draw(st.binary(min_size=1, max_size=64))
    elif kind in ("section-length", "section-type") and parts:
        start, _ = parts[draw(st.integers(0, len(parts) - 1))]
        if kind == "section-length":
            struct.pack_into("<I", data, start + 2, draw(st.one_of(st.integers(0, 300), st.integers(0, 2**32 - 1))))
        else:
            struct.pack_into("<H", data, start, draw(st.integers(0, 2**16 - 1)))
    elif kind == "section-count":
        struct.pack_into("<I", data, 64, draw(st.one_of(st.integers(0, 10), st.integers(0, 2**32 - 1))))
    elif kind in ("drop-section", "repeat-section") and parts:
        start, end = parts[draw(st.integers(0, len(parts) - 1))]
        data[start:end] = b"" if kind == "drop-section" else data[start:end] * 2
    elif kind == "swap-sections" and len(parts) >= 2:
        (a0, a1), (b0, b1) = sorted(draw(st.lists(st.sampled_from(parts), min_size=2, max_size=2, unique=True)))
        data[a0:b1] = data[b0:b1] + data[a1:b0] + data[a0:a1]
    elif kind == "header-field":
        field = draw(st.sampled_from([(4, "<H"), (6, "<H"), (40, "<I"), (44, "<I"), (48, "<Q"), (56, "<Q")]))
        struct.pack_into(field[1], data, field[0], draw(st.integers(0, 2 ** (8 * struct.calcsize(field[1])) - 1)))
    if draw(st.booleans()):
        data = bytearray(reseal(bytes(data)))
    return original, bytes(data), state


@st.composite
def arbitrary(draw: st.DrawFn) -> bytes:
    """Bytes, often behind a plausible header (so the reader gets past the magic)."""
    tail = draw(st.binary(max_size=600))
    if draw(st.booleans()):
        return tail
    header = struct.pack("<4sHH32sIIQQI", MAGIC, VERSION, 0, draw(st.binary(min_size=32, max_size=32)),
                         draw(st.one_of(st.integers(0, 2000), st.integers(0, 2**32 - 1))),
                         draw(st.one_of(st.integers(0, 2), st.integers(0, 2**32 - 1))),
                         0, 0, draw(st.one_of(st.integers(0, 6), st.integers(0, 2**32 - 1))))
    data = header + tail
    return reseal(data) if draw(st.booleans()) else data


# --- drivers ------------------------------------------------------------------------------

class Chunks:
    """An aiohttp-style body: ``readchunk()`` hands over the pieces as they came."""

    def __init__(self, data: bytes, sizes: list[int]) -> None:
        self.pieces = list(split(data, sizes))

    async def readchunk(self) -> tuple[bytes, bool]:
        return (self.pieces.pop(0) if self.pieces else b""), False


def split(data: bytes, sizes: list[int]) -> Iterator[bytes]:
    """Pieces of the given sizes in turn (at least 1/300 of the data: a bounded number)."""
    pos, i, least = 0, 0, len(data) // 300
    while pos < len(data):
        n = max(sizes[i % len(sizes)], least)
        yield data[pos: pos + n]
        pos, i = pos + n, i + 1


def feed(reader: SnapshotReader, data: bytes, sizes: list[int]) -> Snapshot:
    for piece in split(data, sizes):
        reader.feed(piece)
    return reader.finish()


# One loop for every async read, made before any is traced: making a loop is no part of
# what a snapshot costs, and its first making in a process (after other tests) allocated
# megabytes inside the traced window.
LOOP = asyncio.Runner()


def in_loop(read: Callable[[], Any]) -> Snapshot:
    """An async read on the tests' loop, bounded in time."""
    async def run() -> Snapshot:
        return await asyncio.wait_for(read(), STEP_SECONDS)
    return LOOP.run(run())


def async_stream(data: bytes) -> asyncio.StreamReader:
    stream = asyncio.StreamReader()
    stream.feed_data(data)
    stream.feed_eof()
    return stream


DRIVERS: dict[str, Callable[[SnapshotReader, bytes, list[int]], Snapshot]] = {
    "feed": feed,
    "file": lambda r, data, sizes: r.read_from(io.BytesIO(data)),
    "stream": lambda r, data, sizes: in_loop(lambda: r.read_async(async_stream(data))),
    "chunks": lambda r, data, sizes: in_loop(lambda: r.read_async(Chunks(data, sizes))),
}


def verdict(driver: str, data: bytes, sizes: list[int], module: ModuleShape | None, sized: bool,
            with_target: bool) -> tuple[str, Any]:
    """("ok", (snapshot, memory)) or ("refused", cause), checking the bounds on the way."""
    total = len(data) if sized else None
    targets: list[bytearray] = []

    def memory_target(h: Any) -> memoryview:
        if sized:
            assert h.memory_bytes <= len(data), "a target larger than the stream can fill"
        # allocated in place: a temporary of the same size would count against the reader
        targets.append(bytearray(min(h.memory_bytes, TARGET_CAP)))
        return memoryview(targets[0])

    reader = SnapshotReader(module, memory_target if with_target else None, total_size=total)
    # No collection runs while tracing: a finalizer of an earlier test's garbage there (an
    # unclosed socket's ResourceWarning reads source lines through linecache) would count
    # its allocations against the reader.
    gc.disable()
    tracemalloc.start()
    try:
        snap = DRIVERS[driver](reader, data, sizes)
    except SnapshotError as err:
        assert err.cause in CAUSES and str(err), (err.cause, str(err))
        return "refused", err.cause
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        gc.enable()
        target = targets[0] if targets else bytearray()
        assert peak <= 4 * len(data) + len(target) + (512 << 10), \
            f"{driver}: {peak} bytes for {len(data)} bytes of input"
    return "ok", (snap, bytes(target))


@pytest.fixture(scope="module", autouse=True)
def warmed_drivers() -> Iterator[None]:
    """Each driver run once untraced: the first asyncio.run of a process allocates its
    loop's machinery (and imports), which is no part of what a snapshot costs."""
    LOOP.get_loop()
    for run in DRIVERS.values():
        try:
            run(SnapshotReader(None, None), b"K32S", [4])
        except SnapshotError:
            pass
    yield
    LOOP.close()


def check_accepted(data: bytes, result: tuple[Snapshot, bytes], with_target: bool) -> None:
    snap, memory = result
    assert data[-TRAILER_SIZE:] == hashlib.sha256(data[:-TRAILER_SIZE]).digest() == snap.sha256
    assert snap.total_size == len(data)
    if with_target:
        section = next((s for s in snap.sections if s.type == SECTION_MEMORY), None)
        held = data[section.offset + 6: section.offset + 6 + section.length] if section else b""
        assert memory[: len(held)] == held


def same_everywhere(data: bytes, sizes: list[int], module: ModuleShape | None, sized: bool,
                    with_target: bool) -> tuple[str, Any]:
    seen = {d: verdict(d, data, sizes, module, sized, with_target) for d in DRIVERS}
    kinds = {}
    for driver, (kind, result) in seen.items():
        if kind == "ok" and result[0].total_size < len(data):
            # A pull reader of unknown size stops at the trailer and leaves what follows
            # unread (the stream may go on); pushed, those bytes are refused.
            assert not sized and driver != "feed"
            check_accepted(data[: result[0].total_size], result, with_target)
            kind, result = "refused", "section"
        kinds[driver] = (kind, result if kind == "refused" else None)
    assert len(set(kinds.values())) == 1, kinds
    result = seen["feed"]
    if result[0] == "ok":
        check_accepted(data, result[1], with_target)
    return result


chunkings = st.lists(st.integers(1, 700), min_size=1, max_size=6)


# --- the reader ---------------------------------------------------------------------------

@SETTINGS
@given(arbitrary(), chunkings, st.booleans(), st.booleans())
def test_arbitrary_bytes_are_refused_cleanly_by_every_driver(data, sizes, sized, with_target) -> None:
    kind, _ = same_everywhere(data, sizes, None, sized, with_target)
    assert kind == "refused" or len(data) >= HEADER_SIZE + TRAILER_SIZE


@SETTINGS
@given(mutated(), chunkings, st.booleans(), st.booleans(), st.booleans())
def test_mutated_snapshots_get_a_clean_verdict_from_every_driver(case, sizes, sized, with_module,
                                                                 with_target) -> None:
    original, data, state = case
    same_everywhere(data, sizes, module_of(state) if with_module else None, sized, with_target)
    if data == original:
        assert verdict("feed", data, sizes, None, sized, with_target)[0] == "ok"


def test_a_header_announcing_4_gib_asks_for_no_memory_the_stream_cannot_hold() -> None:
    header = struct.pack("<4sHH32sIIQQI", MAGIC, VERSION, 0, bytes(32), 2**32 - 1, 65536, 0, 0, 1)
    data = reseal(header + bytes(200))
    for driver in DRIVERS:
        assert verdict(driver, data, [7], None, True, True)[0] == "refused"


# --- the data PUT -------------------------------------------------------------------------

CKS = "/apis/kube32.io/v1/namespaces/default/checkpoints"


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    s = Server(tmp_path_factory.mktemp("fuzzdata"))
    s.start()
    try:
        yield s
    finally:
        s.stop()


def oracle(data: bytes) -> SnapshotError | None:
    """The reader's verdict on the bytes, as the API server reads them (size known)."""
    try:
        SnapshotReader(total_size=len(data)).read_from(io.BytesIO(data))
    except SnapshotError as err:
        return err
    return None


def fresh_checkpoint(api: Server, name: str) -> dict[str, Any]:
    # No Checkpoint controller here to let a deleted Checkpoint go: its finalizer goes first.
    api.call("PATCH", f"{CKS}/{name}", b'{"metadata":{"finalizers":null}}', "application/merge-patch+json")
    api.call("DELETE", f"{CKS}/{name}")
    status, body = api.call("POST", CKS, json.dumps({
        "apiVersion": "kube32.io/v1", "kind": "Checkpoint", "metadata": {"name": name},
        "spec": {"podName": "fuzz"}}).encode())
    assert status == 201, body
    return json.loads(body)


@PUT_SETTINGS
@given(st.one_of(mutated().map(lambda case: case[1]), arbitrary()), st.booleans(), st.data())
def test_mutated_bodies_are_stored_exactly_when_valid_and_refused_with_their_cause(api: Server, body: bytes,
                                                                                  stored_before: bool,
                                                                                  data: st.DataObject) -> None:
    assume(body)
    fresh_checkpoint(api, "fz")
    before: bytes | None = None
    if stored_before:
        state, memory = data.draw(snapshots(), label="stored before")
        before = SnapshotWriter(state, memory).to_bytes()
        assert api.call("PUT", f"{CKS}/fz/data", before, "application/octet-stream")[0] == 200
    status_before = json.loads(api.call("GET", f"{CKS}/fz")[1])["status"]

    status, answer = api.call("PUT", f"{CKS}/fz/data", body, "application/octet-stream")
    refusal = oracle(body)
    if refusal is None:
        assert status == 200, answer
        facts = json.loads(answer)["status"]
        assert facts["sizeBytes"] == len(body) and facts["snapshotSha256"] == body[-32:].hex()
        assert api.call("GET", f"{CKS}/fz/data") == (200, body)
        return
    assert status == 422, (status, answer[:300])
    assert json.loads(answer)["message"] == f"the snapshot is not valid: {refusal}"
    got = api.call("GET", f"{CKS}/fz/data")
    assert got == (200, before) if before is not None else got[0] == 404, "a refused upload changes nothing"
    assert json.loads(api.call("GET", f"{CKS}/fz")[1])["status"] == status_before
