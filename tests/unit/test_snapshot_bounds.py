"""K32S v1's bounds: a snapshot holds no more than one pod can have (issue 19, round b).

A snapshot is its uploader's data (``edit`` may PUT checkpoints/data) and the node builds
something per entry of its small sections: 2,000,000 CHANNELS entries on one handle grew
a node by 2 GB per restore, for good.  Each section's bound is refused by every driver
(push with and without a size, pull), with a message naming it; a snapshot at the bound
still reads; a restore registers on the node only the channels it keeps, and gives them
back when it fails.  The bounds are the ones the pod ABI, the pod's queue and the module
reader use (pinned here), so nothing a pod can hold is refused.
"""
from __future__ import annotations

import dataclasses
import io
import struct
import tracemalloc
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kube32 import snapshot as k32s
from kube32 import wasmformat as wf
from kube32.snapshot import (
    MAX_CHANNELS, MAX_EVENT_BYTES, MAX_EVENTS, MAX_GLOBALS, MAX_TABLES, VALTYPE_I32, ChannelState,
    HeldEvent, ModuleShape, PodState, SnapshotError, SnapshotReader, SnapshotWriter, TableState,
)
from kube32.wasm import ChannelRegistry, Pod, PodConfig, PodError, Runtime, abi, pod as wasm_pod

from tests.unit.test_snapshot import with_trailer

IMAGE = bytes(range(32))
ROOT = Path(__file__).resolve().parents[2]


def crafted(*sections: tuple[int, bytes], memory: bytes = b"") -> bytes:
    """A snapshot with these small sections, written by hand (the writer never makes them)."""
    pages = (len(memory) + 65535) // 65536
    body = b"".join(struct.pack("<HI", t, len(b)) + b for t, b in sections)
    body += struct.pack("<HI", 1, len(memory)) + memory
    head = struct.pack("<4sHH32sIIQQI", b"K32S", 1, 0, IMAGE, len(memory), pages, 0, 0, len(sections) + 1)
    return with_trailer(head + body)


def channels(entries: list[tuple[int, bytes]]) -> tuple[int, bytes]:
    return 4, b"".join(struct.pack("<IH", h, len(n)) + n for h, n in entries)


def events(entries: list[tuple[bytes, bytes]]) -> tuple[int, bytes]:
    return 5, b"".join(struct.pack("<H", len(t)) + t + struct.pack("<I", len(p)) + p for t, p in entries)


def refusals(data: bytes, module: ModuleShape | None = None) -> list[SnapshotError]:
    """The refusal of every driver: push with the size, push without it, pull."""
    out = []
    for reader, drive in (
        (SnapshotReader(module, total_size=len(data)), lambda r: (r.feed(data), r.finish())),
        (SnapshotReader(module), lambda r: (r.feed(data), r.finish())),
        (SnapshotReader(module), lambda r: r.read_from(io.BytesIO(data))),
    ):
        with pytest.raises(SnapshotError) as info:
            drive(reader)
        out.append(info.value)
    return out


def refused(data: bytes, words: str, module: ModuleShape | None = None, cause: str = "section") -> None:
    for err in refusals(data, module):
        assert err.cause == cause and words in str(err), (err.cause, str(err))


# ------------------------------------------------------------------ CHANNELS
def test_more_channels_than_a_pod_can_open_are_refused_naming_the_bound() -> None:
    refused(crafted(channels([(h, b"c") for h in range(1, MAX_CHANNELS + 2)])),
            f"more than {MAX_CHANNELS} channels")


def test_the_attack_two_million_channels_on_one_handle_is_refused_at_the_section_head() -> None:
    """14 MB of entries on one handle: refused from the section's length, before any entry
    is built (the reader allocates a few kilobytes, not the 300 MB of 2,000,000 entries)."""
    data = crafted(channels([(1, b"a")] * 2_000_000))
    tracemalloc.start()
    try:
        errs = refusals(data)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    for err in errs:
        assert err.cause == "section" and "CHANNELS" in str(err) and "at most" in str(err), str(err)
    assert peak < 8 << 20, f"refusing it took {peak} bytes"


@pytest.mark.parametrize("entries, words", [
    ([(1, b"a"), (1, b"b")], "channel handle 1 appears twice"),
    ([(0, b"a")], "channel handle 0 is not one a pod can have"),
    ([(0x80000000, b"a")], "channel handle 2147483648 is not one a pod can have"),
    ([(1, b"")], "the name of channel 1 is 0 bytes long"),
    ([(1, b"n" * 256)], "the name of channel 1 is 256 bytes long"),
    ([(1, b"\xff")], "not valid UTF-8"),
])
def test_channels_a_pod_cannot_have_are_refused(entries, words) -> None:
    refused(crafted(channels(entries)), words)


def test_channels_at_the_bound_read() -> None:
    state = PodState(IMAGE, 0, 0, 0, 0, channels=tuple(
        ChannelState(h, "n" * k32s.MAX_CHANNEL_NAME) for h in range(1, MAX_CHANNELS + 1)))
    data = SnapshotWriter(state, b"").to_bytes()
    assert SnapshotReader(total_size=len(data)).read_from(io.BytesIO(data)).state == state


def test_damage_in_a_bounded_section_still_reads_as_damage() -> None:
    """The order of judgement holds: a structural fault is judged after the trailer."""
    data = bytearray(crafted(channels([(1, b"a"), (1, b"b")])))
    data[-1] ^= 1
    for err in refusals(bytes(data)):
        assert err.cause == "trailer", str(err)


# ------------------------------------------------------------------ EVENTS, GLOBALS, TABLE
def test_more_events_than_a_pods_queue_holds_are_refused() -> None:
    refused(crafted(events([(b"t", b"p")] * (MAX_EVENTS + 1))), f"more than {MAX_EVENTS} events")


def test_events_of_more_bytes_than_a_pods_queue_holds_are_refused() -> None:
    big = b"x" * (MAX_EVENT_BYTES // 2)
    refused(crafted(events([(b"t", big), (b"t", big)])), "a pod's queue holds")


def test_a_full_queue_reads() -> None:
    state = PodState(IMAGE, 0, 0, 0, 0, events=tuple(HeldEvent("t", b"p" * 1000) for _ in range(MAX_EVENTS)))
    data = SnapshotWriter(state, b"").to_bytes()
    assert SnapshotReader().read_from(io.BytesIO(data)).state == state


def test_more_globals_than_a_module_may_have_are_refused_at_the_head() -> None:
    body = b"".join(struct.pack("<IBQ", i, VALTYPE_I32, 0) for i in range(MAX_GLOBALS + 1))
    refused(crafted((2, body)), "GLOBALS")


def test_more_tables_than_a_module_may_have_are_refused() -> None:
    tables = [(3, struct.pack("<II", i, 0)) for i in range(MAX_TABLES + 1)]
    refused(crafted(*tables), f"more than {MAX_TABLES} TABLE sections")


def test_a_table_the_module_cannot_hold_is_refused_without_building_its_entries() -> None:
    """4,000,000 entries for a table of at most 4: the refusal is the module check's, after
    the trailer, as before; the entries are never built."""
    size = 4_000_000
    data = crafted((3, struct.pack("<II", 0, size) + b"\xff" * (4 * size)))
    module = ModuleShape(IMAGE, None, {}, {0: (1, 4)})
    tracemalloc.start()
    try:
        errs = refusals(data, module)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    for err in errs:
        assert err.cause == "table" and f"has {size} entries" in str(err) and "at most 4" in str(err), str(err)
    assert peak < 3 * len(data), f"refusing it took {peak} bytes for a {len(data)}-byte snapshot"
    state = PodState(IMAGE, 0, 0, 0, 0, tables=(TableState(0, (1, 2)),))
    good = SnapshotWriter(state, b"").to_bytes()
    assert SnapshotReader(module).read_from(io.BytesIO(good)).state == state


# ------------------------------------------------------------------ one home: the bounds are the pod's
def test_the_bounds_are_what_a_pod_and_a_module_can_have() -> None:
    assert abi.MAX_CHANNELS == MAX_CHANNELS and abi.MAX_CHANNEL_NAME == k32s.MAX_CHANNEL_NAME
    assert wasm_pod.MAX_QUEUED_EVENTS == MAX_EVENTS and wasm_pod.MAX_QUEUED_EVENT_BYTES == MAX_EVENT_BYTES
    assert wf.MAX_TABLES == MAX_TABLES
    assert k32s.format.max_section_length(4) == MAX_CHANNELS * (4 + 2 + 255)


# ------------------------------------------------------------------ restore: what is registered is kept
class Host:
    def __init__(self) -> None:
        self.channels = ChannelRegistry()

    def log(self, pod, line: str) -> None:
        pass

    def publish(self, pod, topic: str, payload: bytes) -> None:
        pass


@pytest.fixture(scope="module")
def counter():
    rt = Runtime(engine="wasmtime")
    yield rt, rt.load((ROOT / "examples" / "pods" / "counter.wasm").read_bytes())
    rt.close()


def snapshot_of_a_counter(counter, host: Host) -> bytes:
    rt, module = counter
    src = Pod(rt, module, PodConfig("default", "c", "main"), host)
    src.start()
    src.freeze(5000)
    snap = src.snapshot().to_bytes()
    src.stop()
    assert host.channels.channels() == {}
    return snap


def restored_from(counter, chans: tuple[ChannelState, ...]) -> tuple[dict[str, int], PodError | None]:
    """A counter pod restored from its own snapshot, as if that held ``chans``: the
    channels registered on the node after finish_restore, and its error."""
    rt, module = counter
    host = Host()
    snap = snapshot_of_a_counter(counter, host)
    dst = Pod(rt, module, PodConfig("default", "c2", "main"), host)
    result = dst.prepare_restore().read_from(io.BytesIO(snap))
    forged = dataclasses.replace(result, state=dataclasses.replace(result.state, channels=chans))
    error = None
    try:
        dst.finish_restore(forged)
    except PodError as e:
        error = e
    registered = host.channels.channels()
    dst.stop()
    assert host.channels.channels() == {}, "the pod's stop left channels registered"
    return registered, error


def test_a_restore_given_more_channels_than_a_pod_can_open_registers_none(counter) -> None:
    """Past the reader (any caller of finish_restore): nothing is opened, and the pod fails."""
    registered, error = restored_from(counter, tuple(ChannelState(1, "a") for _ in range(1000)))
    assert error is not None and "at most 16 channels" in str(error)
    assert registered == {}


def test_a_restore_registers_each_channel_it_keeps_once(counter) -> None:
    chans = tuple(ChannelState(h, f"ch{h}") for h in range(1, MAX_CHANNELS + 1))
    registered, error = restored_from(counter, chans)
    assert error is None, error
    assert registered == {f"default/ch{h}": 1 for h in range(1, MAX_CHANNELS + 1)}


def test_a_restore_that_fails_after_its_channels_gives_them_back(counter, monkeypatch) -> None:
    """k32_restored fails (its launch raises): the channels the restore reopened are
    released by the failed restore itself, not left for whoever stops the instance."""
    rt, module = counter
    host = Host()
    snap = snapshot_of_a_counter(counter, host)
    dst = Pod(rt, module, PodConfig("default", "c2", "main"), host)
    result = dst.prepare_restore().read_from(io.BytesIO(snap))
    assert result.state.channels, "the counter's snapshot has a channel"

    def fails(self: Pod, first_job: str) -> None:
        raise PodError("k32_restored failed: trap")
    monkeypatch.setattr(Pod, "_launch", fails)
    with pytest.raises(PodError):
        dst.finish_restore(result)
    assert host.channels.channels() == {}
    monkeypatch.undo()
    dst.stop()


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 40), st.binary(max_size=6)), max_size=40))
def test_any_channels_section_reads_only_as_channels_a_pod_can_have(entries) -> None:
    """Fuzz: whatever CHANNELS entries, a snapshot that reads holds at most 16 channels
    under distinct handles >= 1 with valid names; any other is refused as a section fault."""
    data = crafted(channels(entries))
    try:
        snap = SnapshotReader(total_size=len(data)).read_from(io.BytesIO(data))
    except SnapshotError as err:
        assert err.cause == "section", str(err)
        return
    chans = snap.state.channels
    assert len(chans) <= MAX_CHANNELS and len({c.handle for c in chans}) == len(chans)
    assert all(c.handle >= 1 and 1 <= len(c.name.encode()) <= k32s.MAX_CHANNEL_NAME for c in chans)
