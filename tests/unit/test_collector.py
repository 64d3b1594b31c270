"""kube32.collector: full collections scan only what survived since the last one, and
the cycles among survivors are freed once an interval (issue 25)."""
from __future__ import annotations

import gc
import time
import weakref
from typing import Any

from kube32.collector import SurvivorFreezer


class Node:
    def __init__(self) -> None:
        self.other: Any = self


def _full_collection_seconds() -> float:
    began = time.perf_counter()
    gc.collect()
    return time.perf_counter() - began


def test_survivors_are_not_scanned_again_and_their_cycles_go_within_an_interval() -> None:
    cache = [{"n": i, "l": [i]} for i in range(300_000)]   # a control plane's caches
    scanned_all = min(_full_collection_seconds() for _ in range(3))
    freezer = SurvivorFreezer(unfreeze_every=3600)
    freezer.start()
    try:
        assert freezer.frozen() >= 600_000
        assert min(_full_collection_seconds() for _ in range(3)) < scanned_all / 3
        # A cycle that survived a full collection and then became garbage waits...
        cycle = Node()
        gc.collect()
        assert freezer.freezes >= 1
        alive = weakref.ref(cycle)
        del cycle
        gc.collect()
        assert alive() is not None
        # ...until an interval has passed: the survivors are thawed, then freed.
        freezer.unfreeze_every = 0
        gc.collect()            # thaws (this one ran while they were frozen)
        assert freezer.unfreezes >= 1
        gc.collect()
        assert alive() is None
    finally:
        freezer.stop()
        gc.unfreeze()
    assert len(cache) == 300_000
