"""The same input gives the same K32S bytes on every CPU (spec: "All numbers are
little-endian. No field has the size of a pointer, so the same bytes restore on the
ESP32-S3, arm64 and x86_64").

tests/cross/golden.py runs on this machine (x86_64) and, at the same time, under each
other CPU's Python (s390x big-endian, armhf 32-bit, arm64): the snapshot of one fixed
PodState holding every section and value kind must be byte for byte this machine's, and
read back and written again it must stay so; a counter pod driven by the same calls
under the CPU's engine must give the snapshot this machine's engines give, and go on
from it.
"""
from __future__ import annotations

import json
import subprocess
import sys
from typing import Iterator

import pytest

from tests.conftest import ROOT
from tests.cross import rootfs as cross

ENGINES = ("wasmtime", "pwasm")


def _engines_here() -> list[str]:
    from importlib.util import find_spec
    return [e for e in ENGINES if find_spec(e) is not None]


@pytest.fixture(scope="module")
def results(cross_run) -> Iterator[dict[str, dict]]:
    """Every CPU's golden.py output, the emulated ones run side by side."""
    runs = {name: cross_run(name) for name in cross.ARCHES}
    procs = {name: subprocess.Popen(run.python("-m", "tests.cross.golden", "--engine", run.rootfs.arch.engine),
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for name, run in runs.items()}
    host = [sys.executable, "-m", "tests.cross.golden", *(x for e in _engines_here() for x in ("--engine", e))]
    procs["host"] = subprocess.Popen(host, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    out: dict[str, dict] = {}
    try:
        for name, proc in procs.items():
            stdout, stderr = proc.communicate(timeout=900)
            assert proc.returncode == 0, f"golden.py on {name} failed ({proc.returncode}):\n{stderr[-5000:]}"
            out[name] = json.loads(stdout.strip().splitlines()[-1])
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    yield out


def first_difference(a: str, b: str) -> str:
    x, y = bytes.fromhex(a), bytes.fromhex(b)
    at = next((i for i, (p, q) in enumerate(zip(x, y, strict=False)) if p != q), min(len(x), len(y)))
    return f"{len(x)} vs {len(y)} bytes, first difference at offset {at}: {x[at:at + 16].hex()} vs {y[at:at + 16].hex()}"


@pytest.mark.parametrize("name", list(cross.ARCHES))
def test_the_same_state_gives_the_same_k32s_bytes(results: dict[str, dict], name: str) -> None:
    arch = cross.ARCHES[name]
    got, here = results[name], results["host"]
    assert (got["cpu"]["machine"], got["cpu"]["byteorder"], got["cpu"]["pointer_bits"]) == \
        (arch.machine, arch.byteorder, arch.pointer_bits), got["cpu"]
    assert got["format"]["reread_identical"], f"on {name}, a snapshot read back and written again differs"
    assert got["format"]["sha256"] == here["format"]["sha256"], \
        f"{name} writes other bytes: {first_difference(got['format']['hex'], here['format']['hex'])}"


@pytest.mark.parametrize("name", list(cross.ARCHES))
def test_a_pod_gives_the_same_snapshot_on_every_cpu(results: dict[str, dict], name: str) -> None:
    engine = cross.ARCHES[name].engine
    got, here = results[name]["pods"][engine], results["host"]["pods"]
    if engine not in here:
        pytest.skip(f"{engine} is not installed on this machine")
    got, mine = {k: v for k, v in got.items() if k != "nan"}, {k: v for k, v in here[engine].items() if k != "nan"}
    assert got == mine, f"{name} ({engine}) vs this machine ({engine})"


@pytest.mark.parametrize("name", [*cross.ARCHES, "host"])
def test_nan_bits_are_the_cpus_when_computed_and_exact_once_set(results: dict[str, dict], name: str) -> None:
    """What docs/cross-cpu.md says of NaNs, on every CPU and engine: inf - inf is a quiet
    NaN without payload, its sign the CPU's (so snapshots of it may differ by CPU); a NaN
    set by its bits keeps them, in the snapshot and through neg."""
    for engine, pod in results[name]["pods"].items():
        nan = pod["nan"]
        assert nan["made"] & 0x7FFF_FFFF_FFFF_FFFF == 0x7FF8_0000_0000_0000, (name, engine, hex(nan["made"]))
        assert nan["globals"] == {"0": 0x7FF0_0000_0000_0000, "1": nan["made"], "2": 0x7FF4_0000_0000_0123}, \
            (name, engine, nan["globals"])
        assert nan["negated"] == 0xFFF4_0000_0000_0123, (name, engine, hex(nan["negated"]))


def test_both_engines_give_the_same_snapshot(results: dict[str, dict]) -> None:
    here = results["host"]["pods"]
    if len(here) < 2:
        pytest.skip(f"only {', '.join(here)} is installed on this machine")
    assert {k: v for k, v in here["wasmtime"].items() if k != "nan"} == \
        {k: v for k, v in here["pwasm"].items() if k != "nan"}
