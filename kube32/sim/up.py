"""``kube32-sim up``: a whole cluster on this machine in one command.

The control plane (with its own node ``devkit``) and ``--workers N`` workers
(``sim-1`` ... ``sim-N``) run as child processes of this one (``python -m
kube32.sim.main ...``, each kubelet on a free port), logging to
``<data-dir>/logs/<name>.log``.  ``up`` waits until every node is Ready, prints the
kubeconfig and how to use it, then the line ``cluster ready``.  Ctrl-C / SIGTERM
stops the workers first, then the control plane; a child that does not stop in
time is killed.  If the control plane dies, ``up`` stops everything and fails.
"""
from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from pathlib import Path

from ..aio import wait_set
from ..client import NODES, ApiError, Client

READY_TIMEOUT = 120.0
STOP_TIMEOUT = 30.0  # a worker drains itself for up to 20 s first


def _sim(*args: str) -> list[str]:
    return [sys.executable, "-m", "kube32.sim.main", *args]


async def _spawn(args: list[str], log: Path) -> asyncio.subprocess.Process:
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as f:
        return await asyncio.create_subprocess_exec(*args, stdout=f, stderr=asyncio.subprocess.STDOUT,
                                                    stdin=asyncio.subprocess.DEVNULL,
                                                    env={**os.environ, "PYTHONUNBUFFERED": "1"})


async def _stop(procs: dict[str, asyncio.subprocess.Process]) -> None:
    for proc in procs.values():
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
    for name, proc in procs.items():
        try:
            await asyncio.wait_for(proc.wait(), STOP_TIMEOUT)
        except TimeoutError:
            print(f"kube32-sim up: {name} did not stop in {STOP_TIMEOUT:g}s; killing it", flush=True)
            proc.kill()
            await proc.wait()


async def _nodes_ready(client: Client, names: list[str]) -> list[str]:
    """The nodes of ``names`` that are not Ready yet."""
    items, _ = await client.list(NODES)
    ready = {n["metadata"]["name"] for n in items
             if any(c.get("type") == "Ready" and c.get("status") == "True"
                    for c in (n.get("status") or {}).get("conditions") or [])}
    return [n for n in names if n not in ready]


async def run_up(data_dir: Path, workers: int, port: int, node_args: list[str],
                 cp_args: list[str] | tuple[str, ...] = ()) -> int:
    data_dir = data_dir.resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    admin = data_dir / "admin.kubeconfig"
    admin.unlink(missing_ok=True)
    logs = data_dir / "logs"
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    control = await _spawn(_sim("control-plane", "--data-dir", str(data_dir), "--port", str(port), *node_args,
                                *cp_args),
                           logs / "control-plane.log")
    children: dict[str, asyncio.subprocess.Process] = {}
    try:
        deadline = time.monotonic() + READY_TIMEOUT
        while not admin.exists():
            if control.returncode is not None or stop.is_set() or time.monotonic() > deadline:
                print(f"kube32-sim up: the control plane did not start; see {logs / 'control-plane.log'}",
                      file=sys.stderr, flush=True)
                return 1
            await asyncio.sleep(0.1)
        names = [f"sim-{i}" for i in range(1, workers + 1)]
        for i, name in enumerate(names, start=2):
            # Each node has an address of its own on loopback (127.0.0.2, ...), as boards
            # on a network do: its NodePort Services listen there.
            children[name] = await _spawn(
                _sim("worker", "--kubeconfig", str(data_dir / "node.kubeconfig"), "--name", name,
                     "--address", f"127.0.0.{i}", "--port", "0", "--data-dir", str(data_dir / "nodes" / name),
                     *node_args),
                logs / f"{name}.log")
        async with Client.from_kubeconfig(admin, user_agent="kube32-sim-up") as client:
            want = ["devkit", *names]
            missing = want
            while missing:
                dead = [n for n, p in [("control plane", control), *children.items()] if p.returncode is not None]
                if dead or stop.is_set() or time.monotonic() > deadline:
                    why = f"{', '.join(dead)} exited" if dead else "interrupted" if stop.is_set() else \
                        f"nodes not Ready after {READY_TIMEOUT:g}s: {', '.join(missing)}"
                    print(f"kube32-sim up: {why}; logs in {logs}", file=sys.stderr, flush=True)
                    return 1
                try:
                    missing = await _nodes_ready(client, want)
                except ApiError:
                    pass
                if missing:
                    await asyncio.sleep(0.2)
        print(f"kube32 cluster up: control plane + node devkit, workers {', '.join(names) or '(none)'}", flush=True)
        print(f"kubeconfig: {admin}", flush=True)
        print(f"  export KUBECONFIG={admin}", flush=True)
        print("  kubectl get nodes", flush=True)
        print(f"logs: {logs}", flush=True)
        print("cluster ready (Ctrl-C stops it)", flush=True)
        while not stop.is_set():
            if control.returncode is not None:
                print("kube32-sim up: the control plane exited; stopping", file=sys.stderr, flush=True)
                return 1
            for name, proc in list(children.items()):
                if proc.returncode is not None:
                    print(f"kube32-sim up: worker {name} exited with code {proc.returncode}", flush=True)
                    children.pop(name)
            await wait_set(stop, 0.5)
        print("kube32 cluster stopping", flush=True)
        return 0
    finally:
        await _stop(children)
        await _stop({"control plane": control})
