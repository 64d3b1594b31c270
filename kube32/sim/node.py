"""The control plane's own node (``devkit``) in a process of its own: ``python -m kube32.sim.node``.

A pod's Wasm runs in its kubelet's process, and on pwasm (the board profiles' engine)
under that process's GIL: in the control plane's process, busy pods slowed every API
request.  So the control plane runs its node as a child process, which joins over the
API like any worker (``DIR/node.kubeconfig``, the node bootstrap token).

Design and invariants:
- The parent (:class:`NodeProcess`) passes the node's :class:`KubeletOptions` as JSON on
  the command line (:func:`options_to_json` / :func:`options_from_json`: every field, no
  flag parsing twice), its log level (``-v``) and a pipe; the child writes one byte to the pipe once its kubelet
  started (its Node registered), so ``ControlPlane.start`` returns with the node there,
  as when it ran in-process.  Its output goes where the control plane's does.
- The child never outlives the control plane: on Linux the kernel sends it SIGTERM when
  its parent ends (``PR_SET_PDEATHSIG``), elsewhere it checks its parent every second.
- SIGTERM (the control plane stopping, or gone) stops the kubelet without a drain, as
  the in-process kubelet stopped: its pods stop and its Node is marked NotReady.
  The parent waits :data:`STOP_SECONDS` for that, then kills it.
"""
from __future__ import annotations

import asyncio
import ctypes
import dataclasses
import json
import logging
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

from ..kubelet import KubeletOptions
from ..timing import NODE_STOP_SECONDS
from .worker import node_client, start_node, stop_node, stop_on_signals

log = logging.getLogger("kube32.sim.node")

START_SECONDS = 120.0    # how long the control plane waits for its node's kubelet to start
STOP_SECONDS = NODE_STOP_SECONDS   # and for it to stop (it drains itself first)
RESTART_SECONDS = 1.0    # before a node process that died is started again (doubling while it keeps dying)
RESTART_MAX_SECONDS = 30.0
PARENT_CHECK_SECONDS = 1.0
_PR_SET_PDEATHSIG = 1


def options_to_json(opts: KubeletOptions) -> str:
    data = dataclasses.asdict(opts)
    data["data_dir"] = str(opts.data_dir) if opts.data_dir is not None else None
    return json.dumps(data)


def options_from_json(text: str) -> KubeletOptions:
    """The options :func:`options_to_json` wrote (ValueError for anything else)."""
    data: dict[str, Any] = json.loads(text)
    names = {f.name for f in dataclasses.fields(KubeletOptions)}
    unknown = set(data) - names
    if unknown:
        raise ValueError(f"unknown kubelet options: {', '.join(sorted(unknown))}")
    for name in ("devices", "faults"):
        if name in data:
            data[name] = tuple(data[name])
    if data.get("data_dir") is not None:
        data["data_dir"] = Path(data["data_dir"])
    return KubeletOptions(**data)


def _die_with_parent() -> None:
    """In the child: SIGTERM when the parent ends (Linux; the caller then checks that the
    parent did not end before this)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    except (OSError, AttributeError):
        pass   # not Linux: the child checks its parent itself


class NodeProcess:
    """The control plane's side: starts the node's process, starts it again when it dies
    (as a board's supervisor or systemd would: logged, after RESTART_SECONDS, doubling up
    to RESTART_MAX_SECONDS while it keeps dying within a minute), and stops it."""

    def __init__(self, kubeconfig: Path, opts: KubeletOptions) -> None:
        self.kubeconfig = kubeconfig
        self.opts = opts
        self.proc: asyncio.subprocess.Process | None = None
        self._supervisor: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Start the node and wait until its kubelet started (RuntimeError when it ended
        first); from then on it is started again whenever it dies."""
        await self._start_once()
        self._supervisor = asyncio.create_task(self._supervise(), name=f"node-{self.opts.node_name}")

    async def _supervise(self) -> None:
        wait = RESTART_SECONDS
        while True:
            assert self.proc is not None
            began = time.monotonic()
            code = await self.proc.wait()
            log.warning("the node %s's process exited with %s: starting it again in %.0f s",
                        self.opts.node_name, code, wait)
            await asyncio.sleep(wait)
            try:
                await self._start_once()
            except (RuntimeError, OSError) as e:
                log.warning("%s", e)
            wait = RESTART_SECONDS if time.monotonic() - began > 60 else min(wait * 2, RESTART_MAX_SECONDS)

    async def _start_once(self) -> None:
        read_end, write_end = os.pipe()
        try:
            self.proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "kube32.sim.node", str(self.kubeconfig), options_to_json(self.opts),
                str(write_end), str(os.getpid()), str(logging.getLogger().getEffectiveLevel()),
                pass_fds=(write_end,))
            os.close(write_end)
            write_end = -1
            try:
                started = await asyncio.wait_for(asyncio.to_thread(os.read, read_end, 1), START_SECONDS)
            except asyncio.TimeoutError:
                self.proc.kill()
                started = b""
        finally:
            os.close(read_end)
            if write_end >= 0:
                os.close(write_end)
        if started != b"1":
            code = await self.proc.wait()
            raise RuntimeError(f"the node {self.opts.node_name} did not start (its process exited with {code})")

    async def stop(self) -> None:
        if self._supervisor is not None:
            self._supervisor.cancel()
            await asyncio.gather(self._supervisor, return_exceptions=True)
            self._supervisor = None
        proc = self.proc
        if proc is None or proc.returncode is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(proc.wait(), STOP_SECONDS)
        except asyncio.TimeoutError:
            log.warning("node %s did not stop in %.0f s: killed", self.opts.node_name, STOP_SECONDS)
            proc.kill()
            await proc.wait()


async def run_node(kubeconfig: Path, opts: KubeletOptions, started_fd: int, parent: int) -> int:
    """The child's side: run the kubelet until SIGTERM/SIGINT or until the parent is gone."""
    _die_with_parent()
    if os.getppid() != parent:
        return 1
    stop = stop_on_signals()
    kubelet = await start_node(node_client(kubeconfig, None, opts.node_name), opts)
    os.write(started_fd, b"1")
    os.close(started_fd)
    while not stop.is_set() and os.getppid() == parent:
        try:
            await asyncio.wait_for(stop.wait(), PARENT_CHECK_SECONDS)
        except asyncio.TimeoutError:
            pass
    await stop_node(kubelet, drain=False)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 5:
        print("usage: python -m kube32.sim.node KUBECONFIG OPTIONS_JSON STARTED_FD PARENT_PID LOG_LEVEL "
              "(the control plane starts it)", file=sys.stderr)
        return 2
    logging.basicConfig(level=int(args[4]), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    opts = options_from_json(args[1])
    return asyncio.run(run_node(Path(args[0]), opts, int(args[2]), int(args[3])))


if __name__ == "__main__":
    sys.exit(main())
