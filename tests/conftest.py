"""Shared fixtures: real control planes (and later whole clusters) as processes on 127.0.0.1.

Each fixture starts ``kube32-sim`` exactly as a user would, reads where it listens
from the kubeconfig it writes, and stops it with SIGTERM (SIGKILL after a grace
period).  Tests talk to it only through real clients: the preinstalled kubectl
(with a private ``--cache-dir``) and the ``kubernetes`` Python client.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
pytest_plugins = ["tests.etcd"]  # the session's etcd (etcd_cluster)

# The e2e modules CI runs on both Pythons (3.11 and 3.13): the API with real clients, TLS
# and certificates (3.13's ssl verifies X.509 strictly), a cluster and a move.  Every other
# e2e module (processes, faults, moves under load, timing: marker ``once``) runs on one
# Python, 3.11, the README's `make test`; the unit tests run on both (.ci/run).
BOTH_PYTHONS = frozenset({
    "test_sim_cluster", "test_apiserver_kubectl", "test_apiserver_proxy", "test_security", "test_adversarial_pki",
    "test_api_fidelity", "test_api_paging", "test_watch_bookmarks", "test_etcd_store", "test_ha_peers",
    "test_moves", "test_metrics", "test_kubectl_create", "test_engines", "test_clients",
})


# ``once`` modules CI runs on 3.13 rather than 3.11 (marker ``on313``), the longest ones:
# the 3.11 leg runs on two workers, the 3.13 leg on one, and both legs end about together.
ON_313 = frozenset({"test_move_scenarios", "test_adversarial_data", "test_service_hold_attacks"})


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        module = item.module.__name__ if item.module is not None else ""
        name = module.rsplit(".", 1)[-1]
        if module.startswith("tests.e2e.") and name not in BOTH_PYTHONS:
            item.add_marker(pytest.mark.once)
            if name in ON_313:
                item.add_marker(pytest.mark.on313)


LOG_TAIL_LINES = 40   # of each node's log, shown under a failed test that used a cluster


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Iterator[None]:
    """A failed test that used a cluster shows the end of each of its nodes' logs and
    the cluster's recent events: a CI run keeps nothing else of the cluster's side."""
    outcome = yield
    report = outcome.get_result()
    if not report.failed or call.when == "teardown":
        return
    for value in getattr(item, "funcargs", {}).values():
        if isinstance(value, ControlPlane):
            report.sections.append(("cluster logs and events", value.diagnosis()))
            return


@dataclass
class Proc:
    popen: subprocess.Popen
    log: Path

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 15) -> int:
        if self.popen.poll() is None:
            self.popen.send_signal(sig)
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(5)
        return self.popen.returncode

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""


def sim_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "kube32.sim.main", *args]


def start(args: list[str], log: Path, env: dict[str, str] | None = None) -> Proc:
    f = open(log, "wb")
    popen = subprocess.Popen(args, stdout=f, stderr=subprocess.STDOUT, cwd=ROOT,
                             env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
                             start_new_session=True)
    return Proc(popen, log)


def wait_for(predicate, timeout: float = 30, interval: float = 0.1, what: str = "condition"):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            last = predicate()
            if last:
                return last
        except Exception as e:  # noqa: BLE001 - keep polling; report the last error
            last = e
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what} (last: {last!r})")


async def until(predicate, timeout: float = 30.0, what: str = "condition"):
    """The first truthy value of ``await predicate()``, asked every 50 ms; AssertionError
    naming ``what`` after ``timeout`` seconds (the async sibling of :func:`wait_for`)."""
    import asyncio
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        value = await predicate()
        if value:
            return value
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


@dataclass
class ControlPlane:
    data_dir: Path
    proc: Proc
    kubeconfig: Path
    cache_dir: Path

    @property
    def server(self) -> str:
        return yaml.safe_load(self.kubeconfig.read_text())["clusters"][0]["cluster"]["server"]

    def kubectl(self, *args: str, check: bool = True, input: str | None = None,
                timeout: float = 60) -> subprocess.CompletedProcess:
        cmd = ["kubectl", "--kubeconfig", str(self.kubeconfig), "--cache-dir", str(self.cache_dir), *args]
        cp = subprocess.run(cmd, capture_output=True, text=True, input=input, timeout=timeout)
        if check and cp.returncode != 0:
            raise AssertionError(f"{' '.join(args)} failed ({cp.returncode}):\n{cp.stdout}\n{cp.stderr}")
        return cp

    def kubectl_bg(self, *args: str) -> subprocess.Popen:
        cmd = ["kubectl", "--kubeconfig", str(self.kubeconfig), "--cache-dir", str(self.cache_dir), *args]
        return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def diagnosis(self, lines: int = LOG_TAIL_LINES) -> str:
        """The last ``lines`` of each log under ``data_dir/logs`` and the cluster's events."""
        parts = []
        for log in sorted((self.data_dir / "logs").glob("*.log")):
            tail = log.read_text(errors="replace").splitlines()[-lines:]
            parts.append(f"--- {log.name} (last {len(tail)} lines)\n" + "\n".join(tail))
        try:
            events = self.kubectl("get", "events", "-A", "--sort-by=.lastTimestamp", check=False, timeout=15)
            parts.append("--- kubectl get events -A\n" + "\n".join(events.stdout.splitlines()[-lines:]))
        except subprocess.TimeoutExpired:
            parts.append("--- kubectl get events -A: no answer in 15 s")
        return "\n".join(parts)

    def client(self):
        from kubernetes import config
        return config.new_client_from_config(str(self.kubeconfig))


def start_control_plane(data_dir: Path, *extra: str) -> ControlPlane:
    data_dir.mkdir(parents=True, exist_ok=True)
    kubeconfig = data_dir / "admin.kubeconfig"
    if kubeconfig.exists():
        kubeconfig.unlink()
    proc = start(sim_command("control-plane", "--data-dir", str(data_dir), "--port", "0", *extra),
                 data_dir / "control-plane.log")
    wait_for(lambda: kubeconfig.exists() or proc.popen.poll() is not None, 30, what="kubeconfig")
    if proc.popen.poll() is not None:
        raise AssertionError(f"control plane exited:\n{proc.output()}")
    return ControlPlane(data_dir, proc, kubeconfig, data_dir / "kubectl-cache")


@pytest.fixture
def control_plane(tmp_path: Path) -> Iterator[ControlPlane]:
    """The API server alone: ``--no-kubelet`` keeps the control plane's own node out of
    API tests that count or fake nodes (``sim_cluster`` runs real nodes)."""
    cp = start_control_plane(tmp_path / "cp", "--no-kubelet")
    try:
        yield cp
    finally:
        cp.proc.stop()


def start_cluster(data_dir: Path, workers: int = 2, *extra: str, env: dict[str, str] | None = None) -> ControlPlane:
    """``kube32-sim up --workers N`` as a user runs it; returns once it printed ``cluster ready``.

    The returned ControlPlane's ``proc`` is the ``up`` process (stopping it stops
    every node); ``data_dir/logs`` holds each node's log."""
    data_dir.mkdir(parents=True, exist_ok=True)
    proc = start(sim_command("up", "--workers", str(workers), "--data-dir", str(data_dir), "--port", "0", *extra),
                 data_dir / "up.log", env)
    wait_for(lambda: "cluster ready" in proc.output() or proc.popen.poll() is not None, 120,
             what="kube32-sim up to report the cluster ready")
    if proc.popen.poll() is not None:
        logs = "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}"
                         for p in sorted((data_dir / "logs").glob("*.log")))
        raise AssertionError(f"kube32-sim up exited:\n{proc.output()}\n{logs}")
    return ControlPlane(data_dir, proc, data_dir / "admin.kubeconfig", data_dir / "kubectl-cache")


@pytest.fixture(scope="module")
def sim_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """One ``kube32-sim up --workers 2`` cluster shared by a test module (nodes devkit, sim-1, sim-2)."""
    cluster = start_cluster(tmp_path_factory.mktemp("cluster"), 2, "--backoff", "1")
    try:
        yield cluster
    finally:
        cluster.proc.stop(timeout=30)
