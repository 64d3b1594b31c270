"""K32S v1: golden vectors, every refusal, and streaming over real transports.

Golden vectors are spelled out field by field here, independently of the
codec, so a change to the layout breaks them.  The transports are real:
loopback sockets, files, aiohttp over loopback HTTP, and wasmtime linear
memory as source and destination.
"""

from __future__ import annotations

import asyncio
import ctypes
import hashlib
import io
import socket
import struct
import threading

import aiohttp
import pytest
import wasmtime
from aiohttp import web

from kube32.snapshot import (
    HEADER_SIZE, NULL_FUNC, SECTION_MEMORY, TRAILER_SIZE, VALTYPE_F32, VALTYPE_F64, VALTYPE_FUNCREF,
    VALTYPE_I32, VALTYPE_I64, ChannelState, GlobalState, HeldEvent, ModuleShape, PodState, SnapshotError,
    SnapshotReader, SnapshotWriter, TableState,
)

IMAGE = bytes(range(32))
OTHER_IMAGE = bytes(32)


def u16(n: int) -> bytes:
    return struct.pack("<H", n)


def u32(n: int) -> bytes:
    return struct.pack("<I", n)


def u64(n: int) -> bytes:
    return struct.pack("<Q", n)


def with_trailer(prefix: bytes) -> bytes:
    return prefix + hashlib.sha256(prefix).digest()


# ---------------------------------------------------------------- golden vectors

# 1. The smallest snapshot: a module without memory, one empty MEMORY section.
GOLDEN_EMPTY = with_trailer(
    b"K32S" + u16(1) + u16(0) + IMAGE
    + u32(0)              # memory bytes
    + u32(0)              # memory pages
    + u64(1234)           # pod time ms
    + u64(0)              # Unix time unset
    + u32(1)              # one section
    + u16(1) + u32(0)     # MEMORY, 0 bytes
)
STATE_EMPTY = PodState(IMAGE, 0, 0, 1234, 0)

# 2. A pod whose limit is below one page (5 bytes of 1 page), with every section kind.
GOLDEN_FULL = with_trailer(
    b"K32S" + u16(1) + u16(0) + IMAGE
    + u32(5) + u32(1) + u64(987_654_321) + u64(1_700_000_000_000) + u32(5)
    # GLOBALS: __stack_pointer = 65536, an f64 NaN with payload, a funcref to function 2
    + u16(2) + u32(39)
    + u32(0) + bytes([0x7F]) + u64(65536)
    + u32(1) + bytes([0x7C]) + u64(0x7FF8000000000001)
    + u32(4) + bytes([0x70]) + u64(2)
    # TABLE 0: two entries, function 1 and null
    + u16(3) + u32(16) + u32(0) + u32(2) + u32(1) + u32(0xFFFFFFFF)
    # CHANNELS: handle 7 "log"
    + u16(4) + u32(9) + u32(7) + u16(3) + b"log"
    # EVENTS: "sensor/temp" with payload 01 02
    + u16(5) + u32(19) + u16(11) + b"sensor/temp" + u32(2) + b"\x01\x02"
    # MEMORY
    + u16(1) + u32(5) + b"hello"
)
STATE_FULL = PodState(
    IMAGE, 5, 1, 987_654_321, 1_700_000_000_000,
    globals=(GlobalState(0, VALTYPE_I32, 65536), GlobalState(1, VALTYPE_F64, 0x7FF8000000000001),
             GlobalState(4, VALTYPE_FUNCREF, 2)),
    tables=(TableState(0, (1, NULL_FUNC)),),
    channels=(ChannelState(7, "log"),),
    events=(HeldEvent("sensor/temp", b"\x01\x02"),),
)
MODULE_FULL = ModuleShape(IMAGE, 65536, {0: VALTYPE_I32, 1: VALTYPE_F64, 4: VALTYPE_FUNCREF}, {0: (1, None)})

# 3. Two tables, an empty one and one of three, and 2 full pages of memory.
MEM3 = bytes(range(256)) * 512
GOLDEN_TABLES = with_trailer(
    b"K32S" + u16(1) + u16(0) + IMAGE
    + u32(131072) + u32(2) + u64(0) + u64(0) + u32(3)
    + u16(3) + u32(8) + u32(0) + u32(0)
    + u16(3) + u32(20) + u32(1) + u32(3) + u32(5) + u32(6) + u32(7)
    + u16(1) + u32(131072) + MEM3
)
STATE_TABLES = PodState(IMAGE, 131072, 2, 0, 0, tables=(TableState(0, ()), TableState(1, (5, 6, 7))))

GOLDEN = [
    ("empty", GOLDEN_EMPTY, STATE_EMPTY, b""),
    ("full", GOLDEN_FULL, STATE_FULL, b"hello"),
    ("tables", GOLDEN_TABLES, STATE_TABLES, MEM3),
]


def read_bytes(data: bytes, module: ModuleShape | None = None, size: int | None = None, **kw):
    """Feeds `data` and returns (snapshot, memory written)."""
    target = bytearray(size if size is not None else 65536 * 4)
    reader = SnapshotReader(module, lambda h: memoryview(target), **kw)
    reader.feed(data)
    snap = reader.finish()
    return snap, bytes(target[: snap.header.memory_bytes])


def refusal(data: bytes, module: ModuleShape | None = None, chunk: int | None = None, **kw) -> SnapshotError:
    target = bytearray(65536 * 4)
    reader = SnapshotReader(module, lambda h: memoryview(target), **kw)
    with pytest.raises(SnapshotError) as info:
        step = chunk or max(len(data), 1)
        for i in range(0, len(data), step):
            reader.feed(data[i:i + step])
        reader.finish()
    return info.value


@pytest.mark.parametrize("name,data,state,memory", GOLDEN, ids=[g[0] for g in GOLDEN])
def test_golden_vectors_read_and_write_back_identically(name, data, state, memory):
    snap, mem = read_bytes(data)
    assert snap.state == state
    assert mem == memory
    assert snap.sha256 == data[-32:]
    assert snap.header.section_count == len(snap.sections)
    assert snap.total_size == len(data)
    writer = SnapshotWriter(snap.state, mem)
    assert writer.total_size == len(data)
    assert writer.to_bytes() == data
    assert writer.sha256 == data[-32:]


def test_golden_full_checks_against_its_module():
    snap, _ = read_bytes(GOLDEN_FULL, MODULE_FULL)
    assert snap.state.globals[1].bits == 0x7FF8000000000001  # NaN payload kept bit for bit


def test_unknown_section_is_skipped():
    prefix = GOLDEN_FULL[:-32]
    header = bytearray(prefix[:HEADER_SIZE])
    header[64:68] = u32(6)
    data = with_trailer(bytes(header) + u16(77) + u32(4) + b"abcd" + prefix[HEADER_SIZE:])
    snap, mem = read_bytes(data, MODULE_FULL)
    assert snap.state == STATE_FULL and mem == b"hello"
    assert snap.sections[0].type == 77 and snap.sections[0].length == 4


def test_memory_section_may_come_first():
    # Another writer may order sections differently; the reader does not mind.
    body = GOLDEN_FULL[HEADER_SIZE:-32]
    mem_section = u16(1) + u32(5) + b"hello"
    data = with_trailer(GOLDEN_FULL[:HEADER_SIZE] + mem_section + body[: -len(mem_section)])
    snap, mem = read_bytes(data, MODULE_FULL)
    assert snap.state == STATE_FULL and mem == b"hello"


def test_memory_target_none_hashes_and_skips():
    reader = SnapshotReader(total_size=len(GOLDEN_TABLES))
    reader.feed(GOLDEN_TABLES)
    assert reader.finish().state == STATE_TABLES


def test_memory_bytes_fewer_than_pages_but_never_more():
    SnapshotWriter(PodState(IMAGE, 1000, 1, 0, 0), bytes(65536))
    with pytest.raises(ValueError):
        SnapshotWriter(PodState(IMAGE, 65537, 1, 0, 0), bytes(65537))
    header = bytearray(GOLDEN_FULL[:HEADER_SIZE])
    header[44:48] = u32(0)  # 5 bytes in 0 pages
    err = refusal(with_trailer(bytes(header) + GOLDEN_FULL[HEADER_SIZE:-32]))
    assert err.cause == "memory-length"


# ---------------------------------------------------------------- refusals, one per cause


def patched(data: bytes, offset: int, new: bytes, retrail: bool = True) -> bytes:
    body = data[:-32] if retrail else data
    body = body[:offset] + new + body[offset + len(new):]
    return with_trailer(body) if retrail else body


def test_bad_magic():
    err = refusal(patched(GOLDEN_FULL, 0, b"K32X"))
    assert err.cause == "magic" and "not a K32S snapshot" in str(err)


def test_unknown_version_and_flags():
    err = refusal(patched(GOLDEN_FULL, 4, u16(2)))
    assert err.cause == "version" and "version 2" in str(err) and "reads version 1" in str(err)
    err = refusal(patched(GOLDEN_FULL, 6, u16(1)))
    assert err.cause == "version" and "flags" in str(err)


def test_other_image():
    module = ModuleShape(OTHER_IMAGE, None, MODULE_FULL.globals, MODULE_FULL.tables)
    err = refusal(GOLDEN_FULL, module)
    assert err.cause == "image"
    assert str(err) == (
        f"the snapshot was taken from image sha256:{IMAGE.hex()}, not from this pod's image sha256:{OTHER_IMAGE.hex()}"
    )
    assert not err.memory_written


def test_memory_limit_below_snapshot():
    module = ModuleShape(IMAGE, 4, MODULE_FULL.globals, MODULE_FULL.tables)
    err = refusal(GOLDEN_FULL, module)
    assert err.cause == "memory-limit"
    assert str(err) == "the pod's memory limit of 4 bytes is below the snapshot's 5 bytes of memory"


def test_memory_target_too_small():
    reader = SnapshotReader(None, lambda h: memoryview(bytearray(3)))
    with pytest.raises(SnapshotError) as info:
        reader.feed(GOLDEN_FULL)
    assert info.value.cause == "memory-limit"


@pytest.mark.parametrize(
    "globals_,message",
    [
        ({0: VALTYPE_I32, 1: VALTYPE_F64}, "global 4 is funcref in the snapshot but the module has no mutable global 4"),
        ({0: VALTYPE_I64, 1: VALTYPE_F64, 4: VALTYPE_FUNCREF}, "global 0 is i32 in the snapshot but i64 in the module"),
        ({0: VALTYPE_I32, 1: VALTYPE_F64, 4: VALTYPE_FUNCREF, 9: VALTYPE_F32},
         "the module's mutable global 9 (f32) is missing from the snapshot"),
    ],
)
def test_global_mismatch(globals_, message):
    err = refusal(GOLDEN_FULL, ModuleShape(IMAGE, None, globals_, {0: (1, None)}))
    assert err.cause == "global" and str(err) == message
    assert err.memory_written  # module checks come after the trailer; the caller must discard


@pytest.mark.parametrize(
    "tables,fragment",
    [
        ({}, "the module has no table 0"),
        ({0: (3, None)}, "needs at least 3"),
        ({0: (0, 1)}, "holds at most 1"),
        ({0: (0, None), 1: (0, None)}, "the module's table 1 is missing"),
    ],
)
def test_table_mismatch(tables, fragment):
    err = refusal(GOLDEN_FULL, ModuleShape(IMAGE, None, MODULE_FULL.globals, tables))
    assert err.cause == "table" and fragment in str(err)


def test_trailer_mismatch():
    damaged = GOLDEN_FULL[:-35] + bytes([GOLDEN_FULL[-35] ^ 1]) + GOLDEN_FULL[-34:]  # a memory byte
    err = refusal(damaged, MODULE_FULL)
    assert err.cause == "trailer"
    assert str(err) == "the snapshot's trailer does not match its contents (damaged in transfer or storage)"
    assert err.memory_written


@pytest.mark.parametrize("keep", [0, 3, HEADER_SIZE, HEADER_SIZE + 10, len(GOLDEN_FULL) - 1])
def test_truncated(keep):
    err = refusal(GOLDEN_FULL[:keep], chunk=7)
    assert err.cause == "truncated" and str(err) == "the snapshot ends before its trailer (truncated)"
    err = refusal(GOLDEN_FULL[:keep], total_size=len(GOLDEN_FULL))
    assert err.cause == "truncated"


def test_section_overrun_with_and_without_known_size():
    # The EVENTS section claims 100 bytes more than it has, and the trailer is right.
    offset = HEADER_SIZE + 45 + 22 + 15 + 2
    assert GOLDEN_FULL[offset - 2:offset] == u16(5)
    data = patched(GOLDEN_FULL, offset, u32(119))
    err = refusal(data, total_size=len(data))
    assert err.cause == "section" and "only" in str(err) and "before the trailer" in str(err)
    err = refusal(data)
    assert err.cause == "section"


def test_memory_length_differs_from_header():
    offset = len(GOLDEN_FULL) - 32 - 5 - 4
    data = patched(GOLDEN_FULL, offset, u32(4))[:-32]
    data = with_trailer(data[:-1])  # memory section of 4 bytes
    err = refusal(data)
    assert err.cause == "memory-length"
    assert str(err) == "the memory section holds 4 bytes, but the snapshot's header gives 5"
    assert not err.memory_written


def test_duplicate_memory():
    prefix = bytearray(GOLDEN_FULL[:-32])
    prefix[64:68] = u32(6)
    data = with_trailer(bytes(prefix) + u16(1) + u32(5) + b"again")
    err = refusal(data, total_size=len(data))
    assert err.cause == "duplicate-memory"
    assert err.memory_written


def test_missing_memory_section():
    header = bytearray(GOLDEN_TABLES[:HEADER_SIZE])
    header[64:68] = u32(2)
    data = with_trailer(bytes(header) + GOLDEN_TABLES[HEADER_SIZE:HEADER_SIZE + 14 + 26])
    assert refusal(data).cause == "memory-length"


def test_bytes_after_the_trailer():
    err = refusal(GOLDEN_FULL + b"x")
    assert err.cause == "section" and "follow the snapshot's trailer" in str(err)
    err = refusal(GOLDEN_EMPTY + b"xyz", total_size=len(GOLDEN_EMPTY) + 3)
    assert err.cause == "section"


def test_malformed_small_section_with_a_good_trailer_is_section_else_trailer():
    offset = HEADER_SIZE + 6 + 4  # valtype of global 0
    good_trailer = patched(GOLDEN_FULL, offset, b"\x55")
    assert refusal(good_trailer).cause == "section"
    bad_trailer = patched(GOLDEN_FULL, offset, b"\x55", retrail=False)
    assert refusal(bad_trailer).cause == "trailer"


def test_refusal_is_sticky():
    reader = SnapshotReader()
    with pytest.raises(SnapshotError):
        reader.feed(b"NOPE" + bytes(100))
    with pytest.raises(SnapshotError) as again:
        reader.finish()
    assert again.value.cause == "magic"


# ---------------------------------------------------------------- real transports


def wasm_memory(pages: int):
    """A real wasmtime linear memory and a memoryview over it (no copy)."""
    store = wasmtime.Store()
    memory = wasmtime.Memory(store, wasmtime.MemoryType(wasmtime.Limits(pages, None)))
    n = memory.data_len(store)
    array = (ctypes.c_ubyte * n).from_address(ctypes.addressof(memory.data_ptr(store).contents))
    view = memoryview(array).cast("B")
    return store, memory, view


def big_state(pages: int) -> PodState:
    return PodState(
        IMAGE, pages * 65536, pages, 42, 1_700_000_000_123,
        globals=(GlobalState(0, VALTYPE_I32, 70000), GlobalState(1, VALTYPE_I64, 2**63 + 5),
                 GlobalState(2, VALTYPE_F32, 0x7FC00001)),
        tables=(TableState(0, (3, NULL_FUNC, 4)),),
        channels=(ChannelState(1, "uart"), ChannelState(2, "ℓog")),
        events=(HeldEvent("a", b""), HeldEvent("b/c", b"\x00" * 300)),
    )


MODULE_BIG = ModuleShape(IMAGE, None, {0: VALTYPE_I32, 1: VALTYPE_I64, 2: VALTYPE_F32}, {0: (1, 10)})


def test_wasm_memory_to_wasm_memory_over_a_loopback_socket():
    pages = 40  # 2.5 MiB: several memory chunks
    _src_store, _src_mem, src = wasm_memory(pages)
    pattern = bytes(range(251)) * 4
    for offset in range(0, len(src), 1 << 16):
        src[offset: offset + len(pattern)] = pattern
    src[-7:] = b"the end"
    writer = SnapshotWriter(big_state(pages), src)

    dst_holder = {}

    def target(header):
        dst_holder["wasm"] = wasm_memory(header.memory_pages)
        return dst_holder["wasm"][2]

    server = socket.create_server(("127.0.0.1", 0))
    result: dict = {}

    def receive():
        conn, _ = server.accept()
        with conn:
            result["snap"] = SnapshotReader(MODULE_BIG, target, total_size=writer.total_size).read_from(conn)

    thread = threading.Thread(target=receive)
    thread.start()
    with socket.create_connection(server.getsockname()) as out:
        trailer = writer.write_to(out)
    thread.join(10)
    server.close()
    snap = result["snap"]
    assert snap.sha256 == trailer
    assert snap.state == big_state(pages)
    assert dst_holder["wasm"][2] == src


def test_reader_stops_at_the_trailer_on_a_socket_left_open():
    a, b = socket.socketpair()
    with a, b:
        writer = SnapshotWriter(STATE_FULL, b"hello")
        writer.write_to(a)
        a.sendall(b"NEXT")  # e.g. the next request on a kept-alive connection
        snap = SnapshotReader(MODULE_FULL, lambda h: memoryview(bytearray(8))).read_from(b)
        assert snap.state == STATE_FULL
        assert b.recv(4) == b"NEXT"


def test_blocking_socket_refusal_when_peer_closes_early():
    a, b = socket.socketpair()
    with b:
        with a:
            a.sendall(GOLDEN_TABLES[:1000])
        with pytest.raises(SnapshotError) as info:
            SnapshotReader(None, lambda h: memoryview(bytearray(h.memory_bytes))).read_from(b)
    assert info.value.cause == "truncated" and info.value.memory_written


def test_file_round_trip(tmp_path):
    path = tmp_path / "pod.k32s"
    memory = bytearray(MEM3)
    with open(path, "wb") as f:
        SnapshotWriter(STATE_TABLES, memory).write_to(f)
    assert path.read_bytes() == GOLDEN_TABLES
    target = bytearray(131072)
    with open(path, "rb") as f:
        snap = SnapshotReader(None, lambda h: memoryview(target), total_size=path.stat().st_size).read_from(f)
    assert snap.state == STATE_TABLES and target == MEM3
    with open(path, "rb", buffering=0) as f:  # raw file: partial reads
        assert SnapshotReader().read_from(f).sha256 == GOLDEN_TABLES[-32:]
    assert SnapshotReader().read_from(io.BytesIO(GOLDEN_TABLES)).state == STATE_TABLES


def test_aiohttp_download_and_upload():
    memory = bytes(range(256)) * 256 * 12  # 12 pages
    state = big_state(12)

    async def scenario():
        uploaded: dict = {}

        async def get(request):
            writer = SnapshotWriter(state, memory)
            resp = web.StreamResponse(headers={"Content-Type": "application/octet-stream"})
            resp.content_length = writer.total_size
            await resp.prepare(request)
            await writer.write_async(resp.write)
            await resp.write_eof()
            return resp

        async def put(request):
            target = bytearray(request.content_length)
            reader = SnapshotReader(None, None, total_size=request.content_length)
            try:
                snap = await reader.read_async(request.content)
            except SnapshotError as err:
                return web.json_response({"cause": err.cause, "message": str(err)}, status=422)
            uploaded["snap"] = snap
            del target
            return web.json_response({"sha256": snap.sha256.hex()})

        app = web.Application()
        app.router.add_get("/data", get)
        app.router.add_put("/data", put)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]
        try:
            async with aiohttp.ClientSession() as session:
                async with session.get(f"http://127.0.0.1:{port}/data") as resp:
                    body_len = resp.content_length
                    dst = bytearray(len(memory))
                    snap = await SnapshotReader(MODULE_BIG, lambda h: memoryview(dst), total_size=body_len).read_async(
                        resp.content
                    )
                assert snap.state == state and dst == memory
                good = SnapshotWriter(state, memory).to_bytes()
                async with session.put(f"http://127.0.0.1:{port}/data", data=good) as resp:
                    assert resp.status == 200 and (await resp.json())["sha256"] == good[-32:].hex()
                bad = good[:-1] + bytes([good[-1] ^ 0xFF])
                async with session.put(f"http://127.0.0.1:{port}/data", data=bad) as resp:
                    assert resp.status == 422 and (await resp.json())["cause"] == "trailer"
                # A cut file uploaded whole cannot be told from damage: its trailer is wrong.
                async with session.put(f"http://127.0.0.1:{port}/data", data=good[:-100]) as resp:
                    assert (await resp.json())["cause"] == "trailer"
        finally:
            await runner.cleanup()
        assert uploaded["snap"].state == state

    asyncio.run(scenario())


def test_asyncio_stream_truncated_without_known_size():
    async def scenario():
        stream = asyncio.StreamReader()
        stream.feed_data(GOLDEN_FULL[:50])
        stream.feed_eof()
        with pytest.raises(SnapshotError) as info:
            await SnapshotReader().read_async(stream)
        return info.value

    assert asyncio.run(scenario()).cause == "truncated"


def test_writer_checks_its_input():
    with pytest.raises(ValueError):
        SnapshotWriter(PodState(b"short", 0, 0, 0, 0), b"")
    with pytest.raises(ValueError):
        SnapshotWriter(PodState(IMAGE, 10, 1, 0, 0), b"123")
    with pytest.raises(ValueError):
        SnapshotWriter(PodState(IMAGE, 0, 0, 0, 0, globals=(GlobalState(0, 0x42, 0),)), b"")


def test_pieces_do_not_copy_memory():
    memory = bytearray(3 << 20)
    pieces = list(SnapshotWriter(PodState(IMAGE, len(memory), 48, 0, 0), memory).pieces())
    memory_pieces = [p for p in pieces if len(p) == 1 << 20]
    assert len(memory_pieces) == 3
    memory[0] = 0x99  # the pieces are views of the caller's buffer
    assert memory_pieces[0][0] == 0x99
    assert len(pieces[-1]) == TRAILER_SIZE and SECTION_MEMORY == 1


def test_a_stream_that_breaks_reads_as_truncated():
    class Breaking:
        def __init__(self, data: bytes) -> None:
            self.data = data

        def _next(self, n: int) -> bytes:
            if not self.data:
                raise ConnectionResetError("connection reset by peer")
            out, self.data = self.data[:n], self.data[n:]
            return out

        def read(self, n: int) -> bytes:
            return self._next(n)

    class AsyncBreaking(Breaking):
        async def read(self, n: int) -> bytes:  # type: ignore[override]
            return self._next(n)

    target = bytearray(131072)
    with pytest.raises(SnapshotError) as info:
        SnapshotReader(None, lambda h: memoryview(target)).read_from(Breaking(GOLDEN_TABLES[:500]))
    assert info.value.cause == "truncated" and info.value.memory_written
    assert "connection reset" in str(info.value)

    async def scenario():
        return await SnapshotReader().read_async(AsyncBreaking(GOLDEN_TABLES[:500]))

    with pytest.raises(SnapshotError) as info:
        asyncio.run(scenario())
    assert info.value.cause == "truncated"
