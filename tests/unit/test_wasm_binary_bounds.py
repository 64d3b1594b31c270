"""Module readers cost near a module's size, never a multiple (issue 19, attack round 19).

The kubelet parses every module it pulls (kube32.wasm.binary, over kube32.wasmformat)
before an engine sees it; the module store reads a pushed module's exports.  10 MiB of
zeros after the Wasm header used to be 5 million empty custom sections, a tuple each:
a gigabyte.  Here each structure a module can repeat is built near its limit and
parsed under tracemalloc: what the parser holds is a few bytes per byte of module at
most, plus the fixed caps' worth; and past a limit, or past what its bytes can hold,
the refusal comes at once.  Modules wasmtime accepts are accepted (hypothesis mutates
the examples and asks wasmtime).
"""
from __future__ import annotations

import asyncio
import gc
import hashlib
import time
import tracemalloc
import weakref
from pathlib import Path
from typing import Callable

import pytest
import wasmtime
from aiohttp import web
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kube32 import wasmformat as wf
from kube32.apiserver.images import ExportParseError, module_exports
from kube32.kubelet import images
from kube32.wasm import ImageError, Runtime, binary, engine_pwasm, runtime

EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "examples" / "pods").glob("*.wasm"))
MiB = 1 << 20


def uleb(n: int) -> bytes:
    out = bytearray()
    while True:
        b, n = n & 0x7F, n >> 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def sec(sid: int, body: bytes) -> bytes:
    return bytes([sid]) + uleb(len(body)) + body


def vec(items: list[bytes]) -> bytes:
    return uleb(len(items)) + b"".join(items)


def name(text: str) -> bytes:
    return uleb(len(text.encode())) + text.encode()


M = binary.MAGIC
ONE_TYPE = sec(1, vec([b"\x60\x00\x00"]))


def types(n: int) -> bytes:
    return M + sec(1, vec([b"\x60\x00\x00"] * n))


def functions(n: int) -> bytes:
    return M + ONE_TYPE + sec(3, vec([b"\x00"] * n)) + sec(10, vec([b"\x02\x00\x0b"] * n))


def exports(n: int) -> bytes:
    return (M + ONE_TYPE + sec(3, vec([b"\x00"])) + sec(7, vec([name(str(i)) + b"\x00\x00" for i in range(n)]))
            + sec(10, vec([b"\x02\x00\x0b"])))


def imports(n: int) -> bytes:
    return M + ONE_TYPE + sec(2, vec([name("k32") + name(str(i)) + b"\x00\x00" for i in range(n)]))


def mutable_globals(n: int) -> bytes:
    return M + sec(6, vec([b"\x7f\x01\x41\x00\x0b"] * n))


def table_functions(n: int) -> bytes:
    return (M + ONE_TYPE + sec(3, vec([b"\x00"] * n)) + sec(4, vec([b"\x70\x00" + uleb(n)]))
            + sec(9, vec([b"\x00\x41\x00\x0b" + vec([uleb(i) for i in range(n)])]))
            + sec(10, vec([b"\x02\x00\x0b"] * n)))


def held_by(parse: Callable[[bytes], object], data: bytes) -> tuple[int, object]:
    """(peak bytes allocated while parsing, what parse returned or raised)."""
    gc.collect()
    tracemalloc.start()
    try:
        out: object = parse(data)
    except Exception as e:  # noqa: BLE001 - the caller looks at it
        out = e
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return peak, out


@pytest.mark.parametrize("size", [10 * MiB, 64 * MiB])
def test_zeros_after_the_header_are_refused_at_once(size: int) -> None:
    data = M + bytes(size - 8)
    start = time.monotonic()
    peak, out = held_by(binary.parse, data)
    assert isinstance(out, binary.BinaryError) and "custom section at offset 8 has no whole name" in str(out)
    assert peak < 64 << 10 and time.monotonic() - start < 1


@pytest.mark.parametrize("build, n", [(types, 100_000), (functions, 100_000), (exports, 50_000),
                                      (imports, 50_000), (mutable_globals, 50_000), (table_functions, 50_000)],
                         ids=lambda x: getattr(x, "__name__", str(x)))
def test_what_a_module_repeats_costs_a_few_bytes_per_byte(build: Callable[[int], bytes], n: int) -> None:
    data = build(n)
    peak, out = held_by(binary.parse, data)
    assert isinstance(out, binary.ModuleInfo), out
    # Per byte: offsets and indices in arrays; per entry that costs an object (exports,
    # imports, globals, table functions): capped by MAX_EXPORTS / MAX_IMPORTS in all.
    assert peak < 4 * len(data) + 256 * n, f"{build.__name__}: {len(data)} bytes held {peak} bytes"


def test_function_types_are_read_when_asked() -> None:
    data = M + sec(1, vec([b"\x60\x02\x7f\x7e\x01\x7d", b"\x60\x00\x00"]))
    info = binary.parse(data)
    assert len(info.types) == 2
    assert info.types[0] == binary.FuncSig((binary.I32, binary.I64), (binary.F32,))
    assert info.types[1] == binary.FuncSig((), ())


CUSTOM = sec(0, name("x"))


@pytest.mark.parametrize("data, why", [
    (M + CUSTOM * (wf.MAX_CUSTOM_SECTIONS + 1), f"more than {wf.MAX_CUSTOM_SECTIONS} custom sections"),
    (M + sec(0, b"\x05ab"), "custom section at offset 8 has no whole name"),
    (M + sec(0, b"\x02\xff\xfe"), "not valid UTF-8"),
    (M + sec(14, b""), "unknown section id 14"),
    (M + ONE_TYPE + ONE_TYPE, "section 1 at offset 14 is repeated or out of order"),
    (M + sec(3, vec([])) + ONE_TYPE, "repeated or out of order"),
    (M + sec(1, uleb(1 << 32) + b"\x60"), f"{1 << 32} types, more than the limit of {wf.MAX_TYPES}"),
    (M + sec(1, uleb(900) + b"\x60\x00\x00"), "900 types cannot fit in the 3 bytes left"),
    (M + sec(1, vec([b"\x60\x01\x55\x00"])), "unsupported value type"),
    (M + ONE_TYPE + sec(3, vec([b"\x07"])), "type 7 does not exist"),
    (M + ONE_TYPE + sec(3, vec([b"\x00"])), "function and code section have inconsistent lengths"),
    (M + ONE_TYPE + sec(3, vec([b"\x00"])) + sec(7, vec([name("f") + b"\x00\x01"])) + sec(10, vec([b"\x02\x00\x0b"])),
     "export f names function 1, which does not exist"),
    (M + ONE_TYPE + sec(3, vec([b"\x00"])) + sec(7, vec([name("f") + b"\x00\x00"] * 2)) + sec(10, vec([b"\x02\x00\x0b"])),
     "duplicate export name f"),
    (M + sec(6, vec([b"\x7f\x00\x41\x00\x0b"]) + b"\x00"), "section 6 has 1 bytes after its content"),
    (mutable_globals(wf.MAX_EXPORTS + 1), f"more than {wf.MAX_EXPORTS} mutable globals"),
    (table_functions(3), None),
], ids=lambda x: str(x)[:40])
def test_a_module_past_a_bound_or_that_names_nothing_is_refused_at_once(data: bytes, why: str | None) -> None:
    start = time.monotonic()
    if why is None:
        binary.parse(data)
        return
    with pytest.raises(binary.BinaryError) as e:
        binary.parse(data)
    assert why in str(e.value)
    assert time.monotonic() - start < 2


def test_the_hidden_state_counts_against_the_export_limit() -> None:
    """Every mutable global becomes an export of the rewritten module: with the module's own
    exports they stay within wasmtime's limit, or the module is refused here, clearly."""
    info = binary.parse(mutable_globals(wf.MAX_EXPORTS - 1))
    assert len(binary.reserved_exports(info)) == wf.MAX_EXPORTS - 1
    with pytest.raises(binary.BinaryError, match="for its hidden state"):
        binary.parse(M + sec(5, vec([b"\x00\x01"])) + sec(6, vec([b"\x7f\x01\x41\x00\x0b"] * wf.MAX_EXPORTS)))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(EXAMPLES), st.lists(st.tuples(st.integers(0, 1 << 16), st.integers(0, 255)), max_size=4))
def test_mutated_modules_are_refused_only_as_binary_errors_and_never_when_wasmtime_takes_them(
        path: Path, edits: list[tuple[int, int]]) -> None:
    data = bytearray(path.read_bytes())
    for at, value in edits:
        data[at % len(data)] = value
    try:
        binary.parse(bytes(data))
        ours = None
    except binary.BinaryError as e:
        ours = e
    try:
        wasmtime.Module.validate(wasmtime.Engine(), bytes(data))
        theirs = True
    except Exception:  # noqa: BLE001 - wasmtime's refusal, whatever its type
        theirs = False
    assert not (theirs and ours), f"wasmtime takes the module, kube32.wasm.binary refuses it: {ours}"


def test_the_module_store_reads_exports_with_the_same_bounds() -> None:
    data = M + sec(7, uleb(wf.MAX_EXPORTS + 1) + (name("e") + b"\x00\x00") * 10)
    with pytest.raises(ExportParseError, match=f"more than the limit of {wf.MAX_EXPORTS}"):
        module_exports(data)
    with pytest.raises(ExportParseError, match="no whole name"):
        module_exports(M + bytes(8 * MiB - 8))
    assert module_exports(exports(3)) == [{"name": str(i), "kind": "func"} for i in range(3)]


def test_pwasm_refuses_a_module_larger_than_it_may_decode() -> None:
    rt = Runtime(engine="pwasm")
    body = b"\x00" + b"\x01" * engine_pwasm.MAX_MODULE_BYTES + b"\x0b"   # a function of nops
    module = (M + ONE_TYPE + sec(3, vec([b"\x00"])) + sec(5, vec([b"\x00\x01"]))
              + sec(7, vec([name("k32_handle") + b"\x00\x00"])) + sec(10, vec([uleb(len(body)) + body])))
    start = time.monotonic()
    with pytest.raises(ImageError, match=f"more than this engine's limit of {engine_pwasm.MAX_MODULE_BYTES} bytes"):
        rt.load(module)
    assert time.monotonic() - start < 2
    rt.close()


def test_modules_no_pod_uses_do_not_stay_compiled_past_the_last_few() -> None:
    """An image whose host answers new bytes at every pull: each load is a new module, and
    the runtime keeps the last KEPT_MODULES of them, not all."""
    rt = Runtime(engine="wasmtime")
    base = EXAMPLES[0].read_bytes()
    first = weakref.ref(rt.load(base + sec(0, name("v0"))))
    for i in range(1, runtime.KEPT_MODULES + 2):
        rt.load(base + sec(0, name(f"v{i}")))
    gc.collect()
    assert first() is None, "the first module stayed compiled"
    again = rt.load(base + sec(0, name(f"v{runtime.KEPT_MODULES + 1}")))
    assert again is rt.load(base + sec(0, name(f"v{runtime.KEPT_MODULES + 1}")))
    rt.close()


def test_the_pullers_memory_holds_a_bounded_number_of_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    """An unpinned ``wasm://`` image whose host answers new bytes at every pull: the
    kubelet's memory cache keeps the last ones up to MAX_CACHED_BYTES, not every one."""
    monkeypatch.setattr(images, "MAX_CACHED_BYTES", 3000)
    served = [0]

    async def module(request: web.Request) -> web.Response:
        served[0] += 1
        return web.Response(body=M + sec(0, name(f"pull-{served[0]}") + bytes(1000)))

    async def run() -> list[bytes]:
        app = web.Application()
        app.router.add_get("/m.wasm", module)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        puller = images.ImagePuller(None)  # type: ignore[arg-type]  # wasm:// needs no API client
        try:
            pulled = [await puller.pull(f"wasm://127.0.0.1:{port}/m.wasm") for _ in range(10)]
            kept = [d for d in pulled if puller.cached(hashlib.sha256(d).hexdigest()) is not None]
        finally:
            await puller.close()
            await runner.cleanup()
        assert len(set(pulled)) == 10
        return kept
    kept = asyncio.run(run())
    assert 1 <= len(kept) <= 3, f"{len(kept)} of 10 distinct modules stayed in memory"
