"""The same input, the same K32S bytes: run on every CPU and compared by test_golden_bytes.

``python -m tests.cross.golden [--engine NAME ...]`` prints one JSON object:

- ``cpu``: what this Python runs on (machine, byte order, pointer size);
- ``format``: the hex of the snapshot SnapshotWriter makes of one fixed PodState with
  every section kind and value kind (negative i32, u64 beyond 2**32, NaN payloads, the
  null function, UTF-8 names, a binary event payload, a partly used last page), and
  whether reading those bytes back and writing the result again gives the same bytes;
- ``pods``: per engine, the sha256 of the snapshot of a counter pod after the same
  calls (memory grown twice, an event delivered, events held while frozen), its two
  clock fields set to zero (they are the moment of the freeze, not the pod's state),
  and the pod's own answer after the same snapshot is restored into a fresh pod; and
  ``nan``: the bits of a NaN the pod computed (the CPU's) and of one it set by bits.

Nothing here depends on the clock: the pod gets no ticks and its calls read no time.
"""
from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import platform
import struct
import sys
from pathlib import Path
from typing import Any

from kube32.snapshot import (
    NULL_FUNC, VALTYPE_F32, VALTYPE_F64, VALTYPE_FUNCREF, VALTYPE_I32, VALTYPE_I64, ChannelState, GlobalState,
    HeldEvent, ModuleShape, PodState, SnapshotReader, SnapshotWriter, TableState, TRAILER_SIZE,
)

COUNTER = Path(__file__).resolve().parents[2] / "examples" / "pods" / "counter.wasm"
# tests/unit/test_wasm_bounds.py's NAN_WAT, assembled (wasmtime, which assembles WAT, is not
# on every CPU): its k32_handle sets global 1 to inf - inf (the CPU's NaN) and global 2 to
# a NaN by its bits (0x7FF4000000000123), and answers both, the second negated.
NAN_WASM = bytes.fromhex(
    "0061736d01000000010a0260027f7f017f600000021501036b33320d6b33325f726573705f626f647900000302010105030100"
    "010625037c0144000000000000f07f0b7c014400000000000000000b7c014400000000000000000b070e010a6b33325f68616e"
    "646c6500010a2f012d0023002300a1240142a3828080808080faff00bf240241002301390300410823029a3903004100411010"
    "001a0b001f046e616d65010501000272620711030003696e6601046d6164650203736574")


def fixed_state() -> tuple[PodState, bytes]:
    memory = bytes((i * 7 + (i >> 8)) & 0xFF for i in range(65536 + 1000))  # 1000 bytes into page 2
    state = PodState(
        image_sha256=hashlib.sha256(b"kube32 golden").digest(),
        memory_bytes=len(memory), memory_pages=2,
        pod_time_ms=0x1_2345_6789, unix_time_ms=1_700_000_000_123,
        globals=(
            GlobalState(0, VALTYPE_I32, (-2) & 0xFFFF_FFFF),
            GlobalState(1, VALTYPE_I64, 0x0102_0304_0506_0708),
            GlobalState(2, VALTYPE_F32, 0x7FC0_0001),                  # f32 NaN with a payload
            GlobalState(3, VALTYPE_F64, 0xFFF8_0000_0000_0002),        # negative f64 NaN with a payload
            GlobalState(4, VALTYPE_F64, struct.unpack("<Q", struct.pack("<d", -0.0))[0]),
            GlobalState(5, VALTYPE_FUNCREF, 3),
            GlobalState(6, VALTYPE_FUNCREF, NULL_FUNC),
        ),
        tables=(TableState(0, (1, NULL_FUNC, 2, 0x0102_0304)), TableState(1, ())),
        channels=(ChannelState(1, "log"), ChannelState(0x0A0B_0C0D, "grüße/✓")),
        events=(HeldEvent("sensor/temp", bytes(range(256))), HeldEvent("greet", b"")),
    )
    return state, memory


def format_golden() -> dict:
    state, memory = fixed_state()
    data = SnapshotWriter(state, memory).to_bytes()
    shape = ModuleShape(state.image_sha256, None, {g.index: g.valtype for g in state.globals},
                        {t.index: (len(t.entries), None) for t in state.tables})
    target = bytearray(state.memory_pages * 65536)
    back = SnapshotReader(shape, lambda header: memoryview(target)[:header.memory_bytes]).read_from(
        _Chunks(data, 4093))
    again = SnapshotWriter(back.state, target).to_bytes()
    return {"hex": data.hex(), "sha256": hashlib.sha256(data).hexdigest(), "reread_identical": again == data}


class _Chunks:
    """A file whose reads return odd-sized pieces, as a socket does."""

    def __init__(self, data: bytes, size: int) -> None:
        self.data, self.size, self.pos = data, size, 0

    def read(self, n: int = -1) -> bytes:
        n = self.size if n < 0 else min(n, self.size)
        piece = self.data[self.pos: self.pos + n]
        self.pos += len(piece)
        return piece


def pod_golden(engine: str) -> dict:
    from kube32.wasm import ChannelRegistry, HttpRequest, Pod, PodConfig, Runtime

    class Host:
        channels = ChannelRegistry()

        def log(self, pod, line):
            pass

        def publish(self, pod, topic, payload):
            pass

    def call(pod, method: str, path: str, query: str = "") -> dict:
        return json.loads(pod.handle(HttpRequest(method, path, query)).result(timeout=120).body)

    rt = Runtime(engine=engine)
    module = rt.load(COUNTER.read_bytes())
    config = PodConfig("default", "golden", "main", {"HOSTNAME": "golden"}, ("greet",), None, {}, 1 << 20)
    pod = Pod(rt, module, config, Host())
    pod.start()
    call(pod, "POST", "/alloc", "kb=64")
    call(pod, "POST", "/alloc", "kb=1")
    pod.deliver_event("greet", b"golden \x00\xff")
    call(pod, "POST", "/alloc", "kb=0")  # a pod runs its held events before requests: the event ran
    pod.freeze(60_000)
    pod.deliver_event("greet", b"held")
    taken = pod.snapshot()
    memory = taken.to_bytes()[-TRAILER_SIZE - taken.state.memory_bytes: -TRAILER_SIZE]
    data = SnapshotWriter(dataclasses.replace(taken.state, pod_time_ms=0, unix_time_ms=0), memory).to_bytes()
    pod.stop()
    fresh = Pod(rt, module, config, Host())
    reader = fresh.prepare_restore()
    fresh.finish_restore(reader.read_from(_Chunks(data, 65521)))
    after = call(fresh, "GET", "/")
    fresh.stop()
    return {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data),
            "restored": {k: after[k] for k in ("requests", "events", "init_calls", "restored_calls", "grown_kb",
                                               "last_event", "memory_bytes")},
            "nan": nan_bits(rt, Host())}


def nan_bits(rt: Any, host: Any) -> dict:
    """The bits of the NaN pod's answer and of its snapshot's globals (docs/cross-cpu.md:
    the NaN arithmetic makes is the CPU's; a NaN that exists keeps its bits)."""
    from kube32.wasm import HttpRequest, Pod, PodConfig

    pod = Pod(rt, rt.load(NAN_WASM), PodConfig("default", "nan", memory_limit_bytes=65536), host)
    pod.start()
    made, negated = struct.unpack("<QQ", pod.handle(HttpRequest("GET", "/")).result(timeout=120).body)
    pod.freeze(60_000)
    state = pod.snapshot().state
    pod.stop()
    return {"made": made, "negated": negated, "globals": {str(g.index): g.bits for g in state.globals}}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.cross.golden")
    p.add_argument("--engine", action="append", default=[], help="an engine to snapshot a pod under")
    args = p.parse_args(argv)
    out = {"cpu": {"machine": platform.machine(), "byteorder": sys.byteorder,
                   "pointer_bits": struct.calcsize("P") * 8, "python": platform.python_version()},
           "format": format_golden(),
           "pods": {e: pod_golden(e) for e in args.engine}}
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
