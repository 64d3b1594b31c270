"""Fixtures for workers of other CPUs under qemu-user (tests/cross/rootfs.py).

These tests run with ``make test-cross`` (CI calls it), not in ``make test``: the first
run on a machine builds the root filesystems (a few minutes), and emulated Python is
slow.  ``make test-cross`` sets KUBE32_CROSS_REQUIRED=1: a machine that cannot run them
fails there; elsewhere (``pytest tests/cross`` as a user, not root) they are skipped
with the reason.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Callable, Iterator

import pytest

from tests.conftest import ControlPlane, Proc, start
from tests.cross import rootfs as cross

REQUIRED = os.environ.get("KUBE32_CROSS_REQUIRED") == "1"


@pytest.fixture(scope="session")
def rootfs_of() -> Callable[[str], cross.Rootfs]:
    """``rootfs_of("s390x")``: that CPU's root filesystem, built on first use."""
    made: dict[str, cross.Rootfs | str] = {}

    def get(name: str) -> cross.Rootfs:
        if name not in made:
            try:
                made[name] = cross.prepare(name)
            except cross.CrossUnavailable as e:
                made[name] = str(e)
        fs = made[name]
        if isinstance(fs, str):
            if REQUIRED:
                pytest.fail(f"cannot run {name} workers here: {fs}")
            pytest.skip(f"cannot run {name} workers here: {fs}")
        return fs
    return get


@dataclass
class CrossRun:
    """This run's copy of the code and its workspace inside one root filesystem."""
    rootfs: cross.Rootfs
    src: PurePosixPath        # on PYTHONPATH inside
    workspace: PurePosixPath  # this run's files inside

    def host(self, inside: PurePosixPath) -> Path:
        return self.rootfs.host_path(inside)

    def python(self, *args: str, path: tuple[PurePosixPath, ...] = ()) -> list[str]:
        """This CPU's python3 with the code under test (and ``path``) importable."""
        return self.rootfs.python(*args, pythonpath=[self.src, *path])

    def run_python(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
        return subprocess.run(self.python(*args), capture_output=True, text=True, timeout=timeout)

    def start_worker(self, cluster: ControlPlane, name: str, address: str, log: Path, *extra: str) -> Proc:
        """``kube32-sim worker`` of this CPU joining ``cluster``, with this CPU's engine."""
        kubeconfig = self.workspace / "node.kubeconfig"
        shutil.copyfile(cluster.data_dir / "node.kubeconfig", self.host(kubeconfig))
        return start(self.python("-m", "kube32.sim.main", "worker", "--kubeconfig", str(kubeconfig),
                                 "--name", name, "--address", address, "--port", "0",
                                 "--data-dir", str(self.workspace / name), *engine_flags(self.rootfs.arch),
                                 *extra), log)


def engine_flags(arch: cross.Arch) -> list[str]:
    return [] if arch.engine == "wasmtime" else ["--engine", arch.engine]


@pytest.fixture(scope="session")
def cross_run(rootfs_of) -> Iterator[Callable[[str], CrossRun]]:
    """``cross_run("arm64")``: the CPU's root filesystem with this worktree's code in it
    and a workspace that goes when the session ends."""
    runs: dict[str, CrossRun] = {}
    with contextlib.ExitStack() as spaces:
        def get(name: str) -> CrossRun:
            if name not in runs:
                fs = rootfs_of(name)
                runs[name] = CrossRun(fs, cross.install_source(fs), spaces.enter_context(cross.workspace(fs)))
            return runs[name]
        yield get
