"""Property tests of K32S v1 (hypothesis, modest example counts).

- Any snapshot round-trips, whatever the chunking, and writes back identically.
- Any single-byte change is refused with the cause its position calls for.
- Any truncation is refused as truncated.
- Arbitrary bytes are refused, never accepted, never a crash.
"""

from __future__ import annotations

import io
import os

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kube32.snapshot import (
    MAX_CHANNEL_HANDLE, NULL_FUNC, VALTYPE_NAMES, ChannelState, GlobalState, HeldEvent, ModuleShape, PodState,
    SnapshotError, SnapshotReader, SnapshotWriter, TableState,
)

# K32S_EXAMPLES=2000 for a deeper run by hand; the default keeps the suite fast.
SETTINGS = settings(max_examples=int(os.environ.get("K32S_EXAMPLES", "60")), deadline=None, suppress_health_check=[HealthCheck.too_slow])

u32s = st.integers(0, 0xFFFFFFFF)
u64s = st.integers(0, 0xFFFFFFFFFFFFFFFF)


@st.composite
def snapshots(draw) -> tuple[PodState, bytes]:
    pages = draw(st.integers(0, 2))
    memory_bytes = draw(st.one_of(st.integers(0, min(pages * 65536, 300)), st.just(pages * 65536)))
    seed = draw(st.binary(min_size=1, max_size=16))
    memory = (seed * (memory_bytes // len(seed) + 1))[:memory_bytes]
    global_indices = draw(st.lists(u32s, unique=True, max_size=4))
    globals_ = tuple(GlobalState(i, draw(st.sampled_from(sorted(VALTYPE_NAMES))), draw(u64s)) for i in global_indices)
    table_indices = draw(st.lists(st.integers(0, 3), unique=True, max_size=3))
    tables = tuple(
        TableState(i, tuple(draw(st.lists(st.one_of(st.integers(0, 50), st.just(NULL_FUNC)), max_size=5))))
        for i in table_indices
    )
    channels = tuple(   # channels a pod can have: handles 1..2^31-1, names of 1-255 bytes
        ChannelState(h, draw(st.text(min_size=1, max_size=8)))
        for h in draw(st.lists(st.integers(1, MAX_CHANNEL_HANDLE), unique=True, max_size=3))
    )
    events = tuple(
        HeldEvent(draw(st.text(max_size=8)), draw(st.binary(max_size=20))) for _ in range(draw(st.integers(0, 3)))
    )
    state = PodState(
        draw(st.binary(min_size=32, max_size=32)), memory_bytes, pages, draw(u64s), draw(u64s),
        globals_, tables, channels, events,
    )
    return state, memory


def module_of(state: PodState) -> ModuleShape:
    return ModuleShape(
        state.image_sha256,
        state.memory_bytes,
        {g.index: g.valtype for g in state.globals},
        {t.index: (len(t.entries), None) for t in state.tables},
    )


def feed_in_chunks(reader: SnapshotReader, data: bytes, chunk: int):
    chunk = max(chunk, len(data) // 300)  # small chunks, but a bounded number of them
    for i in range(0, len(data), chunk):
        reader.feed(data[i:i + chunk])
    return reader.finish()


@SETTINGS
@given(snapshots(), st.integers(1, 5000))
def test_any_snapshot_round_trips(snap, chunk):
    state, memory = snap
    data = SnapshotWriter(state, memory).to_bytes()
    target = bytearray(state.memory_bytes)
    reader = SnapshotReader(module_of(state), lambda h: memoryview(target), total_size=len(data))
    result = feed_in_chunks(reader, data, chunk)
    assert result.state == state and bytes(target) == memory
    assert SnapshotWriter(result.state, target).to_bytes() == data
    pulled = SnapshotReader().read_from(io.BytesIO(data))
    assert pulled.state == state and pulled.sha256 == data[-32:]


def expected_cause(original: bytes, changed: bytes, position: int, with_module: bool) -> str:
    if position < 4:
        return "magic"
    if position < 8:
        return "version"
    if with_module and position < 40:
        return "image"
    if with_module and position < 44:
        old = int.from_bytes(original[40:44], "little")
        new = int.from_bytes(changed[40:44], "little")
        pages = int.from_bytes(original[44:48], "little")
        if old < new <= pages * 65536:
            return "memory-limit"
    # Everything else is damage the trailer reveals, however the structure broke.
    return "trailer"


@SETTINGS
@given(snapshots(), st.data(), st.integers(1, 255), st.booleans(), st.integers(1, 4096))
def test_any_single_byte_change_is_refused_with_its_cause(snap, data, flip, with_module, chunk):
    state, memory = snap
    original = SnapshotWriter(state, memory).to_bytes()
    small_part = len(original) - 32 - state.memory_bytes
    position = data.draw(
        st.one_of(st.integers(0, small_part - 1), st.integers(0, len(original) - 1)), label="position"
    )
    changed = bytearray(original)
    changed[position] ^= flip
    changed = bytes(changed)
    if with_module:
        target = bytearray(state.memory_bytes)
        reader = SnapshotReader(module_of(state), lambda h: memoryview(target), total_size=len(changed))
    else:
        reader = SnapshotReader(total_size=len(changed))
    try:
        feed_in_chunks(reader, changed, chunk)
    except SnapshotError as err:
        assert err.cause == expected_cause(original, changed, position, with_module), (position, str(err))
    else:
        raise AssertionError(f"a change at byte {position} was accepted")

    # Without the total size the cause may be less precise, but it is always a refusal.
    try:
        SnapshotReader().read_from(io.BytesIO(changed))
    except SnapshotError as err:
        assert err.cause in ("magic", "version", "trailer", "truncated", "section", "memory-length",
                             "duplicate-memory"), str(err)
    else:
        raise AssertionError(f"a change at byte {position} was accepted without a size")


@SETTINGS
@given(snapshots(), st.data(), st.integers(1, 4096), st.booleans())
def test_any_truncation_is_refused_as_truncated(snap, data, chunk, size_known):
    state, memory = snap
    whole = SnapshotWriter(state, memory).to_bytes()
    keep = data.draw(st.integers(0, len(whole) - 1), label="keep")
    target = bytearray(state.memory_bytes)
    reader = SnapshotReader(None, lambda h: memoryview(target), total_size=len(whole) if size_known else None)
    try:
        feed_in_chunks(reader, whole[:keep], chunk)
    except SnapshotError as err:
        assert err.cause == "truncated", str(err)
    else:
        raise AssertionError(f"a snapshot cut at {keep} of {len(whole)} bytes was accepted")


@SETTINGS
@given(st.binary(max_size=400), st.booleans())
def test_arbitrary_bytes_are_refused_never_crash(tail, plausible):
    data = (b"K32S\x01\x00\x00\x00" if plausible else b"") + tail
    try:
        SnapshotReader(None, lambda h: memoryview(bytearray(min(h.memory_bytes, 1 << 16))), total_size=None).read_from(
            io.BytesIO(data)
        )
    except SnapshotError as err:
        assert err.cause and str(err)
    else:
        raise AssertionError("random bytes were accepted")
