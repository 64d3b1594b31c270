"""The snapshot's side threads: a hash that lags behind the stream and pages
faulted in ahead of it.  They may change when work is done, never what is
decided: every case here is also judged by the one-thread path in
test_snapshot.py, and must read the same."""

from __future__ import annotations

import asyncio
import hashlib
import socket
import threading
import time

import pytest

from kube32.snapshot import PodState, SnapshotError, SnapshotReader, SnapshotWriter
from kube32.snapshot import parallel
from kube32.snapshot.parallel import HashBehind, prefault

IMAGE = bytes(range(32))
MiB = 1 << 20


def memory(size: int) -> bytearray:
    pattern = bytes(range(251))
    return bytearray((pattern * (size // len(pattern) + 1))[:size])


def snapshot(size: int) -> tuple[bytes, bytearray]:
    mem = memory(size)
    return SnapshotWriter(PodState(IMAGE, size, size // 65536, 7, 0), mem).to_bytes(), mem


def test_hash_behind_equals_hashlib_whatever_the_pieces():
    pieces = [b"a" * 10, memory(3 * MiB), b"b", bytearray(b"c" * (300 << 10)), memory(5)]
    h = HashBehind()
    for piece in pieces:
        h.update(piece, stable=isinstance(piece, bytes))
    assert h.digest() == hashlib.sha256(b"".join(pieces)).digest()
    h.close()


def test_small_inputs_behind_a_large_one_go_with_the_next_hand_over():
    """A reader's 32-byte tail before each MiB of memory must not wake the worker on its own."""
    h = HashBehind()
    jobs = []
    h.update(memory(MiB), stable=True)  # starts the worker
    submit = h._executor.submit
    h._executor.submit = lambda *a: jobs.append(1) or submit(*a)  # type: ignore[union-attr]
    tail = bytearray(b"t" * 32)
    pieces: list[bytes] = []
    for i in range(4):
        h.update(tail)
        pieces.append(bytes(tail))
        tail[:] = bytes([i]) * 32  # reused at once: the pending copy must not see it
        piece = memory(MiB + i)
        h.update(piece, stable=True)
        pieces.append(bytes(piece))
    h.update(b"end")
    assert len(jobs) == 4  # one hand-over per large input, the small ones with it
    assert h.digest() == hashlib.sha256(bytes(memory(MiB)) + b"".join(pieces) + b"end").digest()
    h.close()


def test_small_inputs_go_on_their_own_once_they_add_up():
    h = HashBehind()
    h.update(memory(MiB), stable=True)
    small = [bytes([i % 256]) * 1000 for i in range(600)]  # 600,000 bytes: above PARALLEL_MIN twice
    for piece in small:
        h.update(piece)
    assert len(h._pending) < parallel.PARALLEL_MIN
    assert h.digest() == hashlib.sha256(bytes(memory(MiB)) + b"".join(small)).digest()
    h.close()


def test_hash_behind_copies_what_the_caller_may_reuse():
    scratch = bytearray(b"x" * MiB)
    h = HashBehind()
    h.update(scratch)           # not stable: hashed from a copy
    scratch[:] = b"y" * MiB     # the caller reuses its buffer at once
    assert h.digest() == hashlib.sha256(b"x" * MiB).digest()
    h.close()


def test_prefault_changes_no_byte():
    buf = memory(16 * MiB)
    before = hashlib.sha256(buf).digest()
    stop = prefault(memoryview(buf))
    time.sleep(0.2)
    assert hashlib.sha256(buf).digest() == before
    if stop is not None:
        stop.set()
    assert prefault(memoryview(bytes(8 * MiB))) is None  # read-only: left alone
    assert prefault(memoryview(bytearray(4096))) is None  # small: not worth a thread


def test_large_snapshot_over_a_socket_with_both_sides_threaded():
    size = 12 * MiB  # above PARALLEL_MIN and PREFAULT_MIN
    mem = memory(size)
    writer = SnapshotWriter(PodState(IMAGE, size, size // 65536, 7, 0), mem)
    a, b = socket.socketpair()
    dst = bytearray(size)
    sent: dict = {}
    thread = threading.Thread(target=lambda: sent.setdefault("trailer", writer.write_to(a)))
    thread.start()
    with a, b:
        snap = SnapshotReader(None, lambda h: memoryview(dst), total_size=writer.total_size).read_from(b)
        thread.join(10)
    assert snap.sha256 == sent["trailer"] == writer.sha256 and dst == mem


@pytest.mark.parametrize("where", ["memory", "trailer"])
def test_large_snapshot_damage_is_found_by_the_lagging_hash(where):
    data, _ = snapshot(8 * MiB)
    bad = bytearray(data)
    bad[len(bad) // 2 if where == "memory" else -1] ^= 0x01
    for read in (_read_blocking, _read_async, _read_fed):
        with pytest.raises(SnapshotError) as info:
            read(bytes(bad))
        assert info.value.cause == "trailer", read
        assert info.value.memory_written or read is _read_fed


def test_large_snapshot_cut_in_its_memory_is_truncated():
    data, _ = snapshot(8 * MiB)
    fed_with_its_content_length = lambda cut: _read_fed(cut, declared=len(data))  # noqa: E731
    for read in (_read_blocking, _read_async, fed_with_its_content_length):
        with pytest.raises(SnapshotError) as info:
            read(data[: 5 * MiB + 3])
        assert info.value.cause == "truncated", read


def test_large_snapshot_reads_the_same_every_way():
    data, mem = snapshot(8 * MiB)
    for read in (_read_blocking, _read_async, _read_fed):
        snap, dst = read(data)
        assert snap.sha256 == data[-32:] and (dst is None or dst[: len(mem)] == mem), read


def test_threads_are_not_left_behind():
    data, _ = snapshot(8 * MiB)
    for _ in range(5):
        _read_blocking(data)
        with pytest.raises(SnapshotError):
            _read_blocking(data[:-1] + bytes([data[-1] ^ 1]))
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and _side_threads():
        time.sleep(0.05)
    assert not _side_threads()


def _side_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith(("k32s-hash", "k32s-prefault"))]


def _read_blocking(data: bytes):
    a, b = socket.socketpair()
    dst = bytearray(8 * MiB)
    thread = threading.Thread(target=_send, args=(a, data))
    thread.start()
    try:
        with b:
            return SnapshotReader(None, lambda h: memoryview(dst)[: h.memory_bytes]).read_from(b), dst
    finally:
        thread.join(10)
        a.close()


def _send(sock: socket.socket, data: bytes) -> None:
    try:
        sock.sendall(data)
        sock.shutdown(socket.SHUT_WR)
    except OSError:
        pass  # the reader refused early and closed


def _read_async(data: bytes):
    async def go():
        stream = asyncio.StreamReader(limit=1 << 30)
        for offset in range(0, len(data), 100_000):
            stream.feed_data(data[offset: offset + 100_000])
        stream.feed_eof()
        dst = bytearray(8 * MiB)
        snap = await SnapshotReader(None, lambda h: memoryview(dst)[: h.memory_bytes]).read_async(stream)
        return snap, dst

    return asyncio.run(go())


def _read_fed(data: bytes, declared: int | None = None):
    buf = bytearray(data)  # the API server's way: the upload's own buffer, fed in steps
    reader = SnapshotReader(total_size=declared or len(buf))
    view = memoryview(buf)
    for offset in range(0, len(view), MiB):
        reader.feed(view[offset: offset + MiB], stable=True)
    return reader.finish(), None


def test_small_inputs_stay_on_the_calling_thread(monkeypatch):
    started = []
    monkeypatch.setattr(parallel, "ThreadPoolExecutor", lambda *a, **k: started.append(1))
    h = HashBehind()
    h.update(b"x" * (parallel.PARALLEL_MIN - 1))
    assert h.digest() == hashlib.sha256(b"x" * (parallel.PARALLEL_MIN - 1)).digest() and not started


def test_a_wasm_memory_destination_is_prefaulted_and_filled():
    """The restore's real destination: a wasmtime linear memory seen through a ctypes
    array (the kubelet's view), large enough for the prefault thread."""
    import ctypes

    import wasmtime

    size = 6 * MiB
    data, mem = snapshot(size)
    store = wasmtime.Store()
    memory = wasmtime.Memory(store, wasmtime.MemoryType(wasmtime.Limits(size // 65536, None)))
    address = ctypes.addressof(memory.data_ptr(store).contents)
    view = memoryview((ctypes.c_ubyte * memory.data_len(store)).from_address(address)).cast("B")
    assert parallel._address(view) == address
    a, b = socket.socketpair()
    thread = threading.Thread(target=_send, args=(a, data))
    thread.start()
    with b:
        snap = SnapshotReader(None, lambda h: view[: h.memory_bytes]).read_from(b)
    thread.join(10)
    a.close()
    assert snap.sha256 == data[-32:] and view[:size] == mem
