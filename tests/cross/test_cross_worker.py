"""A worker on a CPU that wasmtime has no build for (armhf: 32-bit; s390x) runs pods in
pwasm; asked for wasmtime (the laptop profile's engine) it stops with one line that
names the cause and the way out, never a traceback.

Two installs are tried under the CPU's own Python: kube32's dependencies as pip now
resolves them there (no wasmtime: pyproject.toml asks for it on x86_64 and arm64 only),
and with wasmtime's pure-Python wheel on the path, the one pip would take on such a
CPU, whose import raises RuntimeError ("wasmtime only works on 64-bit platforms").
"""
from __future__ import annotations

import subprocess
import sys
import tomllib
from importlib import metadata

import pytest
from packaging.requirements import Requirement

from tests.conftest import ROOT

NO_WASMTIME = ("armhf", "s390x")


def wasmtime_requirement() -> Requirement:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    return next(r for r in map(Requirement, deps) if r.name == "wasmtime")


@pytest.mark.parametrize("machine,wanted", [("x86_64", True), ("aarch64", True), ("AMD64", True), ("arm64", True),
                                            ("armv7l", False), ("armv6l", False), ("s390x", False),
                                            ("riscv64", False)])
def test_wasmtime_is_a_dependency_only_where_it_has_a_build(machine: str, wanted: bool) -> None:
    marker = wasmtime_requirement().marker
    assert marker is not None and marker.evaluate({"platform_machine": machine}) is wanted


@pytest.mark.parametrize("name", NO_WASMTIME)
def test_a_worker_asked_for_wasmtime_where_it_cannot_run_says_to_use_pwasm(cross_run, name: str) -> None:
    run = cross_run(name)
    any_wheel = run.workspace / "wasmtime-any"
    pip = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-compile",
                          "--disable-pip-version-check", "--target", str(run.host(any_wheel)),
                          "--only-binary=:all:", "--platform", f"manylinux2014_{run.rootfs.facts['machine']}",
                          "--python-version", ".".join(run.rootfs.facts["python"].split(".")[:2]),
                          "--implementation", "cp", f"wasmtime=={metadata.version('wasmtime')}"],
                         capture_output=True, text=True, timeout=300)
    assert pip.returncode == 0, pip.stderr
    assert not list(run.host(any_wheel).glob("wasmtime/linux-*")), "pip found a build of wasmtime for this CPU"
    for path in ((), (any_wheel,)):
        cp = subprocess.run(run.python("-m", "kube32.sim.main", "worker", "--kubeconfig", "/nonexistent",
                                       "--name", "board", path=path),
                            capture_output=True, text=True, timeout=300)
        assert cp.returncode != 0 and "Traceback" not in cp.stderr, cp.stderr
        line = cp.stderr.strip().splitlines()[-1]
        assert line.startswith("kube32-sim: --engine (the laptop profile's): engine \"wasmtime\" is not available "
                               "on this machine: ") and line.endswith("; --engine pwasm runs on any CPU"), cp.stderr
