"""The garbage collector's policy for a long-running process: full collections scan
only what is new since the last one.

CPython's generation-2 collection scans every tracked object of the process, and runs
whenever a quarter as many objects again as survived the last one have survived the
younger generations.  A control plane under writes reaches that every few seconds, and
with 1,000 Nodes and 10,000 pods in its caches each full collection held the event loop
for 1-1.8 s (issue 25; bench/notes.md): every watch event, request and Lease renewal
behind it waited, and the controller manager lost its Lease.

:class:`SurvivorFreezer` moves what survived a full collection into the permanent
generation (``gc.freeze()``, the policy Instagram's servers use after warm-up), so the
next full collections scan only what is newer: their cost grows with the writes since
the last one, not with the size of the caches.  Objects freed by their reference count
(nearly all of a replaced cache entry) are freed as before; only garbage *cycles* among
frozen objects stay.  So every ``unfreeze_every`` seconds the freezer thaws everything
(``gc.unfreeze()``) and the next full collection scans the whole process once: one long
pause an interval instead of one every few seconds, and no cycle outlives an interval
and a collection.

Invariants: one hook per freezer, removed by :meth:`SurvivorFreezer.stop`; the hook
runs after a collection has finished (``"stop"``), never inside one; nothing but the
collector's own generations is touched.
"""
from __future__ import annotations

import gc
import time
from typing import Any

UNFREEZE_EVERY = 900.0   # seconds: how long a garbage cycle among survivors may wait


class SurvivorFreezer:
    def __init__(self, unfreeze_every: float = UNFREEZE_EVERY) -> None:
        self.unfreeze_every = unfreeze_every
        self.freezes = 0           # full collections whose survivors were frozen
        self.unfreezes = 0
        self._thawed_at = time.monotonic()
        self._installed = False

    def start(self) -> None:
        """From now on (a process started, its imports and set-up done): what exists now
        is frozen, as what survives each full collection will be."""
        if self._installed:
            return
        self._installed = True
        gc.collect()
        gc.freeze()
        gc.callbacks.append(self._on_gc)

    def stop(self) -> None:
        if self._on_gc in gc.callbacks:
            gc.callbacks.remove(self._on_gc)
        self._installed = False

    @staticmethod
    def frozen() -> int:
        """How many objects the permanent generation holds."""
        return gc.get_freeze_count()

    def _on_gc(self, phase: str, info: dict[str, Any]) -> None:
        if phase != "stop" or int(info.get("generation", 0)) < 2:
            return
        now = time.monotonic()
        if now - self._thawed_at >= self.unfreeze_every:
            # The survivors go back to the oldest generation: the next full collection
            # scans them all once, and frees the cycles among them.
            gc.unfreeze()
            self._thawed_at = now
            self.unfreezes += 1
            return
        gc.freeze()
        self.freezes += 1
