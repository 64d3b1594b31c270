"""The engine seam and the engines: a pod's state moves between wasmtime and pwasm both
ways (NaN-payload globals, a rewritten table, a funcref global, channels, held events,
the clock), the pwasm engine refuses what wasmtime refuses, and no module but the
engines touches an engine."""
from __future__ import annotations

import ast
import io
import threading
from pathlib import Path

import pytest
import wasmtime
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from kube32 import snapshot as k32s
from kube32.wasm import ENGINES, HttpRequest, ImageError, Pod, PodConfig, Runtime
from tests.unit.podhosts import Host
from kube32.wasm.runtime import MOPS_KERNEL_WASM, MOPS_KERNEL_WAT

ROOT = Path(__file__).resolve().parents[2]
PODS = ROOT / "examples" / "pods"
FIELDS = ("requests", "events", "restored", "time_ms", "f32", "f64", "table", "fg", "channel", "send")


@pytest.fixture(scope="module")
def runtimes():
    made = {name: Runtime(engine=name) for name in ENGINES}
    yield made
    for rt in made.values():
        rt.close()


@pytest.fixture
def pods():
    started: list[Pod] = []
    yield started
    for p in started:
        p.stop()


def state_pod(rt: Runtime, pods: list, host: Host, start: bool = True) -> Pod:
    pod = Pod(rt, rt.load((PODS / "state.wasm").read_bytes()),
              PodConfig("default", "state", memory_limit_bytes=1 << 20), host)
    pods.append(pod)
    if start:
        pod.start()
    return pod


def report(pod: Pod, path: str = "/") -> dict[str, str]:
    body = pod.handle(HttpRequest("POST" if path != "/" else "GET", path)).result(timeout=10).body
    return dict(zip(FIELDS, body.decode().split(), strict=False))


def freeze_with_events(pod: Pod) -> bytes:
    pod.freeze(1000)
    pod.deliver_event("t", b"held-1")
    pod.deliver_event("t", b"held-2")
    buf = io.BytesIO()
    pod.snapshot().write_to(buf)
    return buf.getvalue()


def restore(rt: Runtime, pods: list, host: Host, data: bytes) -> Pod:
    pod = state_pod(rt, pods, host, start=False)
    pod.finish_restore(pod.prepare_restore().read_from(io.BytesIO(data)))
    return pod


@pytest.mark.parametrize("source", ENGINES)
@pytest.mark.parametrize("target", ENGINES)
def test_state_moves_between_engines_and_back(runtimes, pods, source, target):
    host = Host()
    pod = state_pod(runtimes[source], pods, host)
    first = report(pod)
    assert (first["f32"], first["f64"], first["table"], first["fg"]) == ("7f800001", "fff4000000000001", "123", "2")
    report(pod, "/mutate")
    before = report(pod, "/mutate")
    assert (before["f32"], before["f64"], before["table"], before["fg"]) == ("7f800003", "fff4000000000003", "312", "2")
    data = freeze_with_events(pod)
    frozen_at = pod.pod_time_ms()
    snap = k32s.SnapshotReader().read_from(io.BytesIO(data)).state
    bits = {g.valtype: g.bits for g in snap.globals if g.valtype in (0x7D, 0x7C)}
    assert bits == {0x7D: 0x7F800003, 0x7C: 0xFFF4000000000003}     # signalling NaNs, payloads kept
    assert [t.entries for t in snap.tables][0] == (8, 6, 7)         # function indices, rotated
    pod.stop()

    there = restore(runtimes[target], pods, host, data)
    after = report(there)
    assert int(after["requests"], 16) == int(before["requests"], 16) + 1
    assert (after["events"], after["restored"]) == ("00000002", "00000001")
    for name in ("f32", "f64", "table", "fg", "channel"):
        assert after[name] == before[name], name
    assert int(after["send"], 16) < 1 << 31                         # the channel is open here
    assert int(after["time_ms"], 16) >= frozen_at >= int(before["time_ms"], 16)
    assert host.logs == ["state: restored"]

    # ... and back the other way, rewritten once more on the way.
    moved = report(there, "/mutate")
    assert (moved["f32"], moved["table"], moved["fg"]) == ("7f800004", "123", "3")
    data = freeze_with_events(there)
    there.stop()
    back = report(restore(runtimes[source], pods, host, data))
    assert (back["events"], back["restored"]) == ("00000004", "00000002")
    assert (back["f32"], back["f64"], back["table"], back["fg"]) == ("7f800004", "fff4000000000004", "123", "3")
    assert int(back["requests"], 16) == int(moved["requests"], 16) + 1
    assert int(back["time_ms"], 16) >= int(moved["time_ms"], 16)


# -- choosing an engine ------------------------------------------------------------------

def test_an_unknown_engine_is_refused_naming_the_engines():
    with pytest.raises(ValueError, match=r'unknown engine "v8" \(choose one of: wasmtime, pwasm\)'):
        Runtime(engine="v8")


@pytest.mark.parametrize("engine, version", [("wasmtime", "wasmtime://"), ("pwasm", "pwasm://0.2a0")])
def test_each_engine_names_itself_as_a_node_reports_it(runtimes, engine, version):
    assert runtimes[engine].engine.name == engine
    assert runtimes[engine].engine.runtime_version.startswith(version)


def test_the_kernel_every_engine_times_is_the_documented_one():
    assert wasmtime.wat2wasm(MOPS_KERNEL_WAT) == MOPS_KERNEL_WASM


# -- what every engine refuses alike -----------------------------------------------------

def _module(body: bytes, locals_: bytes = b"\x00", functype: bytes = b"\x60\x01\x7f\x01\x7f",
            export: bytes = b"f") -> bytes:
    """A module with a memory and one function of ``functype`` (default (i32) -> (i32)),
    exported as ``export``, whose body is ``body`` + end."""
    code = locals_ + body + b"\x0b"
    code = _uleb(len(code)) + code
    section = b"\x01" + code
    types = b"\x01" + functype
    exports = b"\x01" + _uleb(len(export)) + export + b"\x00\x00"
    return (b"\0asm\x01\0\0\0" + b"\x01" + _uleb(len(types)) + types + b"\x03\x02\x01\x00"
            + b"\x05\x03\x01\x00\x01" + b"\x07" + _uleb(len(exports)) + exports
            + b"\x0a" + _uleb(len(section)) + section)


def _uleb(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def test_a_function_declaring_too_many_locals_is_refused_before_any_allocation(runtimes):
    data = _module(b"", locals_=b"\x01" + _uleb(4_000_000_000) + b"\x7f")
    for rt in runtimes.values():
        with pytest.raises(ImageError, match="declares more than 50000 locals"):
            rt.load(data)


def test_pwasm_refuses_an_ill_typed_body_as_wasmtime_does(runtimes):
    ill_typed = _module(b"\x6a", functype=b"\x60\x00\x00", export=b"k32_handle")   # i32.add, empty stack
    assert _module(b"", functype=b"\x60\x00\x00", export=b"k32_handle") == \
        wasmtime.wat2wasm('(module (func (export "k32_handle")) (memory 1))')
    with pytest.raises(wasmtime.WasmtimeError):
        wasmtime.Module.validate(wasmtime.Engine(), ill_typed)
    for rt in runtimes.values():
        with pytest.raises(ImageError, match="module does not compile"):
            rt.load(ill_typed)


# Instructions the property test strings together: every one decodes on its own.
VOCABULARY = [
    b"\x41\x01", b"\x42\x01", b"\x43\0\0\0\0", b"\x44" + bytes(8), b"\x6a", b"\x7c", b"\x92", b"\x45",
    b"\x50", b"\x1a", b"\x1b", b"\x00", b"\x01", b"\x0f", b"\x20\x00", b"\x21\x00", b"\x22\x00",
    b"\x20\x01", b"\xa7", b"\xac", b"\xbc", b"\xbe", b"\x02\x40", b"\x02\x7f", b"\x03\x40", b"\x03\x7f",
    b"\x04\x40", b"\x04\x7f", b"\x05", b"\x0b", b"\x0c\x00", b"\x0c\x01", b"\x0d\x00", b"\x0d\x01",
    b"\x0e\x01\x00\x01", b"\x0e\x00\x00", b"\x28\x02\x00", b"\x28\x03\x00", b"\x36\x02\x00",
    b"\x2d\x00\x00", b"\x3f\x00", b"\x40\x00", b"\x10\x00", b"\xd0\x70", b"\xd1", b"\x1c\x01\x7f",
    b"\xfc\x00", b"\xfc\x0b\x00", b"\x23\x00",
]


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.sampled_from(VOCABULARY), max_size=12))
def test_pwasm_validates_exactly_what_wasmtime_validates(body):
    import pwasm
    from kube32.wasm.pwasm_validate import Invalid, validate
    data = _module(b"".join(body))
    try:
        module = pwasm.decode_module(data)
        for f in module.funcs:
            _ = f.body
    except pwasm.WasmError:
        assume(False)                 # not decodable as one body: nothing to compare
    try:
        wasmtime.Module.validate(wasmtime.Engine(), data)
        expected = True
    except wasmtime.WasmtimeError:
        expected = False
    try:
        validate(module)
        got = True
    except Invalid:
        got = False
    assert got == expected, b"".join(body).hex()


# -- the pwasm engine's own limits ---------------------------------------------------------

def test_pwasm_refuses_a_table_too_large_to_allocate(runtimes):
    data = wasmtime.wat2wasm('(module (memory 1) (table 2000000 funcref) (func (export "k32_handle")))')
    with pytest.raises(ImageError, match="table 0 starts with 2000000 elements"):
        runtimes["pwasm"].load(data)


def test_pwasm_memory_does_not_grow_while_a_view_of_it_lives_and_the_pod_keeps_running(runtimes, pods):
    rt = runtimes["pwasm"]
    pod = Pod(rt, rt.load((PODS / "counter.wasm").read_bytes()),
              PodConfig("default", "counter", memory_limit_bytes=8 * 65536), Host())
    pods.append(pod)
    pod.start()
    view = pod._instance.memory_view()
    refused = pod.handle(HttpRequest("POST", "/alloc", "kb=64")).result(timeout=10)
    assert refused.status == 507 and pod.state == "running"     # malloc failed; no trap
    view.release()
    assert pod.handle(HttpRequest("POST", "/alloc", "kb=64")).result(timeout=10).status == 200


def test_pwasm_keeps_generated_code_under_the_kubelets_cache_dir_only(tmp_path, pods):
    from pwasm import codegen
    rt = Runtime(cache_dir=tmp_path, engine="pwasm")
    try:
        assert codegen.CACHE_DIR == str(tmp_path / "pwasm")
        pod = state_pod(rt, pods, Host())
        for _ in range(4):             # called more than twice: translated to Python
            report(pod)
        assert list((tmp_path / "pwasm").rglob("*.bin"))
    finally:
        rt.close()
    Runtime(engine="pwasm").close()
    assert codegen.CACHE_DIR is None


def test_an_interrupt_from_another_thread_ends_a_spinning_call_on_every_engine(runtimes, pods):
    data = wasmtime.wat2wasm('(module (memory 1) (func (export "k32_handle") (loop (br 0))))')
    for rt in runtimes.values():
        pod = Pod(rt, rt.load(data), PodConfig("default", "spin"), Host())
        pods.append(pod)
        pod.start()
        fut = pod.handle(HttpRequest("GET", "/"))
        stopper = threading.Timer(0.05, pod.stop)
        stopper.start()
        with pytest.raises(Exception, match="k32_handle failed: pod stopped"):
            fut.result(timeout=5)
        stopper.join(5)
        assert pod.state == "stopped" and not pod._thread.is_alive()


# -- the seam itself -------------------------------------------------------------------------

def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def test_only_the_engine_modules_import_an_engine():
    wasm = ROOT / "kube32" / "wasm"
    for path in sorted((ROOT / "kube32").rglob("*.py")):
        found = _imports(path) & {"wasmtime", "pwasm"}
        if path.parent == wasm and path.name in ("engine_wasmtime.py", "engine_pwasm.py"):
            assert found == {path.stem.removeprefix("engine_")}, path
        else:
            assert not found, f"{path.relative_to(ROOT)} imports {found}"
