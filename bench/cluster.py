"""A real cluster for benchmarks: the processes `kube32-sim up` starts, started here
one by one so the bench knows each one's pid (for /proc/<pid>/status).

The control plane runs without its own node (`--no-kubelet`: its RSS is the API
server's and the controllers' alone) and with room for a 64 MiB pod's checkpoint
(`--checkpoint-space 256Mi`); workers are laptop-profile boards (512 MiB heap).
Every process runs in its own session and is stopped by its pid: workers are killed
(a worker's SIGTERM drains itself, which a benchmark teardown does not want), then
the control plane gets SIGTERM (SIGKILL after 15 s).  The data directory is a
temporary one, removed at the end.
"""
from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from kube32.client import NODES, PODS, ApiError, Client

ROOT = Path(__file__).resolve().parent.parent
COUNTER = ROOT / "examples" / "pods" / "counter.wasm"
Obj = dict[str, Any]


def sim(*args: str) -> list[str]:
    return [sys.executable, "-m", "kube32.sim.main", *args]


def run(coro: Any) -> Any:
    """asyncio.run, with SIGINT and SIGTERM cancelling the benchmark (so every
    ``async with Cluster()`` stops its processes) even when the shell that started it
    left SIGINT ignored, as a non-interactive shell does for background jobs."""
    async def main() -> Any:
        task = asyncio.current_task()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, task.cancel)
        return await coro
    return asyncio.run(main())


def rss_bytes(pid: int, field: str = "VmRSS") -> int:
    """VmRSS (now) or VmHWM (peak) of a process, from /proc."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} for pid {pid}")


class RssSampler:
    """Samples VmRSS of some processes every ``interval`` seconds on a thread-free
    asyncio task; ``peak[pid]`` is the highest seen."""

    def __init__(self, pids: list[int], interval: float = 0.002) -> None:
        self.pids = pids
        self.interval = interval
        self.peak = {p: 0 for p in pids}
        self._task: asyncio.Task | None = None

    async def _run(self) -> None:
        while True:
            for p in self.pids:
                self.peak[p] = max(self.peak[p], rss_bytes(p))
            await asyncio.sleep(self.interval)

    def __enter__(self) -> "RssSampler":
        for p in self.pids:
            self.peak[p] = rss_bytes(p)
        self._task = asyncio.get_running_loop().create_task(self._run())
        return self

    def __exit__(self, *exc: Any) -> None:
        assert self._task is not None
        self._task.cancel()
        for p in self.pids:
            self.peak[p] = max(self.peak[p], rss_bytes(p))


class Cluster:
    def __init__(self, *, workers: int = 2, cp_flags: tuple[str, ...] = ()) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="kube32-bench-"))
        self.procs: dict[str, subprocess.Popen] = {}
        self.workers = workers
        self.cp_flags = cp_flags
        self.client: Client | None = None
        self.image = ""

    def _start(self, name: str, args: list[str]) -> subprocess.Popen:
        log = open(self.dir / f"{name}.log", "wb")
        p = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=ROOT,
                             env={**os.environ, "PYTHONUNBUFFERED": "1"}, start_new_session=True)
        log.close()
        self.procs[name] = p
        return p

    def pid(self, name: str) -> int:
        return self.procs[name].pid

    async def __aenter__(self) -> "Cluster":
        try:
            await self._up()
        except BaseException:
            await self.__aexit__()
            raise
        return self

    async def _up(self) -> None:
        kubeconfig = self.dir / "admin.kubeconfig"
        cp = self._start("control-plane", sim("control-plane", "--data-dir", str(self.dir), "--port", "0",
                                              "--no-kubelet", "--checkpoint-space", "256Mi",
                                              "--checkpoint-retention", "5s", *self.cp_flags))
        deadline = time.monotonic() + 60
        while not kubeconfig.exists():
            if cp.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the control plane did not start:\n" + self.log("control-plane"))
            await asyncio.sleep(0.05)
        self.client = Client.from_kubeconfig(kubeconfig, user_agent="kube32-bench")
        for i in range(1, self.workers + 1):
            await self.add_worker(f"sim-{i}")
        self.image = await self.push(COUNTER)

    def log(self, name: str) -> str:
        path = self.dir / f"{name}.log"
        return path.read_text(errors="replace")[-3000:] if path.exists() else ""

    async def add_worker(self, name: str, *flags: str) -> None:
        self._start(name, sim("worker", "--kubeconfig", str(self.dir / "node.kubeconfig"), "--name", name,
                              "--port", "0", "--data-dir", str(self.dir / "nodes" / name),
                              "--interp-mops", "100", "--backoff", "1", *flags))
        await self.wait(lambda: self._node_ready(name), 60, f"node {name} Ready")

    async def stop_worker(self, name: str) -> None:
        p = self.procs.pop(name)
        if p.poll() is None:
            p.kill()
            p.wait(10)
        try:
            await self.api.delete(NODES, name)
        except ApiError:
            pass

    async def _node_ready(self, name: str) -> bool:
        if self.procs[name].poll() is not None:
            raise RuntimeError(f"{name} exited:\n{self.log(name)}")
        node = await self.api.try_get(NODES, name)
        return bool(node) and any(c.get("type") == "Ready" and c.get("status") == "True"
                                  for c in (node.get("status") or {}).get("conditions") or [])

    async def push(self, path: Path) -> str:
        out = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "kube32.cli.main", "image", "push", str(path),
            "--kubeconfig", str(self.dir / "admin.kubeconfig"), cwd=ROOT, stdout=subprocess.PIPE)
        stdout, _ = await out.communicate()
        if out.returncode != 0:
            raise RuntimeError(f"image push failed: {stdout!r}")
        return stdout.decode().strip()

    @property
    def api(self) -> Client:
        assert self.client is not None
        return self.client

    async def kubectl(self, *args: str, input: str | None = None, timeout: float = 120) -> str:
        p = await asyncio.create_subprocess_exec(
            "kubectl", "--kubeconfig", str(self.dir / "admin.kubeconfig"), "--cache-dir",
            str(self.dir / "kubectl-cache"), *args, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT)
        out, _ = await asyncio.wait_for(p.communicate(input.encode() if input else None), timeout)
        if p.returncode != 0:
            raise RuntimeError(f"kubectl {' '.join(args)} failed: {out.decode()}")
        return out.decode()

    @staticmethod
    async def wait(predicate, timeout: float, what: str, interval: float = 0.02) -> Any:
        deadline = time.monotonic() + timeout
        while True:
            value = await predicate()
            if value:
                return value
            if time.monotonic() > deadline:
                raise RuntimeError(f"timed out after {timeout:g}s waiting for {what}")
            await asyncio.sleep(interval)

    async def __aexit__(self, *exc: Any) -> None:
        if self.client is not None:
            await self.client.close()
        for name, p in list(self.procs.items()):
            if name != "control-plane" and p.poll() is None:
                p.kill()
                p.wait(10)
        cp = self.procs.get("control-plane")
        if cp is not None and cp.poll() is None:
            cp.send_signal(signal.SIGTERM)
            try:
                cp.wait(15)
            except subprocess.TimeoutExpired:
                cp.kill()
                cp.wait(5)
        shutil.rmtree(self.dir, ignore_errors=True)


# --- pods -------------------------------------------------------------------------------

def counter_pod(name: str, image: str, node: str | None = None, *, memory_limit: str | None = None,
                labels: dict[str, str] | None = None) -> Obj:
    container: Obj = {"name": "main", "image": image}
    if memory_limit:
        container["resources"] = {"limits": {"memory": memory_limit}}
    spec: Obj = {"containers": [container]}
    if node:
        spec["nodeName"] = node
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": labels or {"app": name}},
            "spec": spec}


def pod_ready(pod: Obj | None) -> bool:
    cs = ((pod or {}).get("status") or {}).get("containerStatuses") or [{}]
    return bool(cs[0].get("ready"))


async def pod_state(api: Client, name: str, ns: str = "default") -> tuple[int, Obj | None]:
    """The counter's JSON answer through the API server's pod proxy (status, body)."""
    import json
    async with api.request("GET", f"/api/v1/namespaces/{ns}/pods/{name}/proxy/") as r:
        body = await r.read()
        return r.status, (json.loads(body) if r.status == 200 else None)


async def alloc(api: Client, name: str, kb: int, ns: str = "default") -> None:
    async with api.request("POST", f"/api/v1/namespaces/{ns}/pods/{name}/proxy/alloc?kb={kb}") as r:
        body = await r.read()
        if r.status != 200:
            raise RuntimeError(f"alloc {kb} KiB in {name}: {r.status} {body!r}")


async def wait_ready(cluster: Cluster, name: str, timeout: float = 60) -> Obj:
    async def check() -> Obj | None:
        pod = await cluster.api.try_get(PODS, name, "default")
        return pod if pod_ready(pod) else None
    return await cluster.wait(check, timeout, f"pod {name} Ready")
