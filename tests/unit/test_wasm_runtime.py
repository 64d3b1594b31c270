"""kube32.wasm Runtime: loading, digest check, classification, refusals, cache, MOPS."""
from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import wasmtime

from kube32 import wasmformat
from kube32.wasm import ENGINES, ImageError, Runtime, binary

PODS = Path(__file__).resolve().parents[2] / "examples" / "pods"


def pod_bytes(name: str) -> bytes:
    return (PODS / f"{name}.wasm").read_bytes()


@pytest.fixture(scope="module", params=ENGINES)
def rt(request):
    runtime = Runtime(engine=request.param)
    yield runtime
    runtime.close()


def wat(text: str) -> bytes:
    return wasmtime.wat2wasm(text)


def test_counter_is_a_request_pod_with_hidden_state(rt):
    data = pod_bytes("counter")
    module = rt.load(data, expected_sha256=hashlib.sha256(data).hexdigest())
    assert module.kind == "request" and module.entry_point is None
    assert module.sha256 == hashlib.sha256(data).hexdigest() and module.size == len(data)
    assert {"k32_init", "k32_handle", "k32_tick", "k32_event", "k32_restored"} <= module.exports
    assert not any(e.startswith("__k32_") for e in module.exports)
    info = binary.parse(data)
    assert 0 in info.mutable_globals and "__stack_pointer" not in info.exports  # hidden global
    assert info.tables and len(info.table_funcs) >= 3                          # route table


def test_clock_is_a_command_pod(rt):
    module = rt.load(pod_bytes("clock"))
    assert module.kind == "command" and module.entry_point == "_start"


def test_digest_mismatch_is_refused_by_name(rt):
    with pytest.raises(ImageError, match="image digest mismatch"):
        rt.load(pod_bytes("counter"), expected_sha256="00" * 32)


@pytest.mark.parametrize("data, cause", [
    (b"not wasm at all", "not a valid WebAssembly module"),
    (b"\0asm\x01\0\0\0\x01\xff", "not a valid WebAssembly module"),
])
def test_garbage_is_refused(rt, data, cause):
    with pytest.raises(ImageError, match=cause):
        rt.load(data)


@pytest.mark.parametrize("text, cause", [
    ('(module (import "env" "f" (func)) (memory 1) (func (export "k32_handle")))',
     "import env.f is not part of the pod ABI"),
    ('(module (import "k32" "k32_log" (func (param i32))) (memory 1) (func (export "k32_handle")))',
     "import k32.k32_log has the wrong signature"),
    ('(module (memory 1) (func (export "hello")))', "exports none of k32_handle"),
    ('(module (func (export "k32_handle")))', "defines no linear memory"),
    ('(module (memory 1) (func (export "k32_handle") (param i32)))', "export k32_handle has the wrong signature"),
    ('(module (memory 1) (func (export "k32_handle")) (func (export "__k32_g0")))', "reserved prefix"),
])
def test_modules_outside_the_abi_are_refused(rt, text, cause):
    with pytest.raises(ImageError, match=cause):
        rt.load(wat(text))


def test_module_that_does_not_compile(rt):
    # Structurally readable, but the function body is ill-typed.
    data = wat('(module (memory 1) (func (export "k32_handle")))')
    broken = data.replace(b"\x02\x00\x0b", b"\x02\x00\x6a")   # body "end" -> "i32.add" with an empty stack
    assert broken != data
    with pytest.raises(ImageError, match="module does not compile|not a valid"):
        rt.load(broken)


def test_rewrite_touches_only_the_export_section():
    data = pod_bytes("counter")
    info = binary.parse(data)
    rewritten = binary.add_exports(data, binary.reserved_exports(info))
    before = {sid: data[s:e] for sid, _h, s, e in wasmformat.sections(data) if sid != binary.SEC_EXPORT}
    after = {sid: rewritten[s:e] for sid, _h, s, e in wasmformat.sections(rewritten) if sid != binary.SEC_EXPORT}
    assert before == after
    exports = binary.parse(rewritten).exports
    assert exports["__k32_g0"] == (binary.KIND_GLOBAL, 0)
    assert "__k32_t0" in exports and binary.MEMORY_EXPORT in exports


def test_export_section_is_created_when_missing():
    data = wat('(module (memory 1) (global (mut i32) (i32.const 7)) (func))')
    info = binary.parse(data)
    rewritten = binary.add_exports(data, binary.reserved_exports(info))
    wasmtime.Module.validate(wasmtime.Engine(), rewritten)
    assert "__k32_g0" in binary.parse(rewritten).exports


def test_compiled_modules_are_cached_on_disk(tmp_path):
    first = Runtime(cache_dir=tmp_path)
    try:
        module = first.load(pod_bytes("echo"))
    finally:
        first.close()
    cached = list(tmp_path.glob(f"{module.sha256}-*.cwasm"))
    assert len(cached) == 1
    second = Runtime(cache_dir=tmp_path)
    try:
        again = second.load(pod_bytes("echo"))
        assert again.sha256 == module.sha256 and again.kind == "request"
    finally:
        second.close()


def test_measure_mops_reports_a_speed(rt):
    assert rt.measure_mops() > 0
