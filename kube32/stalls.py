"""Stalls of the event loop, and the garbage collections among them, in the log.

The control plane is one process, API server and controllers on one event loop: a step
that holds the loop (a walk over every pod, a list of 10,000 pods encoded at once, a
generation-2 garbage collection, which scans every tracked object of the process) delays
every watch event and request behind it, and only a watch-delivery p99 shows it (issue 25).
:class:`StallWatch` says which: a task that sleeps :data:`STEP` seconds logs a WARNING
when it woke over ``threshold`` late, with the garbage collections that ran meanwhile
(timed by a ``gc.callbacks`` hook), so a stall is either a collection or a long step,
and a py-spy profile of the same minute names the step.

Invariants: one hook per watch, removed by :meth:`StallWatch.stop`; the hook only adds
up times (it runs inside the collector); nothing is logged below ``threshold``.
"""
from __future__ import annotations

import asyncio
import gc
import logging
import time
from typing import Any

log = logging.getLogger("kube32.stalls")

STEP = 0.05            # seconds between two looks of the watching task
THRESHOLD = 0.25       # a stall this long (seconds) or longer is logged


class StallWatch:
    def __init__(self, threshold: float = THRESHOLD) -> None:
        self.threshold = threshold
        self.stalls = 0            # stalls logged
        self.longest = 0.0         # seconds, the longest stall seen
        self.gc_seconds = [0.0, 0.0, 0.0]   # by generation: time in collections so far
        self.gc_runs = [0, 0, 0]
        self._gc_began = 0.0
        self._task: asyncio.Task[None] | None = None

    def _on_gc(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._gc_began = time.perf_counter()
            return
        generation = min(2, int(info.get("generation", 0)))
        self.gc_seconds[generation] += time.perf_counter() - self._gc_began
        self.gc_runs[generation] += 1

    def start(self) -> asyncio.Task[None]:
        gc.callbacks.append(self._on_gc)
        self._task = asyncio.create_task(self._watch(), name="stall-watch")
        return self._task

    async def stop(self) -> None:
        if self._on_gc in gc.callbacks:
            gc.callbacks.remove(self._on_gc)
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _watch(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            began, gc_before, runs_before = loop.time(), list(self.gc_seconds), list(self.gc_runs)
            await asyncio.sleep(STEP)
            late = loop.time() - began - STEP
            self.longest = max(self.longest, late)
            if late < self.threshold:
                continue
            self.stalls += 1
            in_gc = [(g, self.gc_runs[g] - runs_before[g], self.gc_seconds[g] - gc_before[g]) for g in range(3)]
            collections = ", ".join(f"{n} of generation {g} ({s:.2f} s)" for g, n, s in in_gc if n)
            log.warning("event loop held for %.2f s; garbage collections meanwhile: %s", late,
                        collections or "none")
