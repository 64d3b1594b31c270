"""kube32.stalls: a step that holds the event loop is logged, with the garbage collections
that ran meanwhile."""
from __future__ import annotations

import asyncio
import gc
import logging
import time

import pytest

from kube32.stalls import StallWatch


def test_a_held_loop_is_logged_with_the_collections_that_ran_in_it(caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> StallWatch:
        watch = StallWatch(threshold=0.2)
        watch.start()
        try:
            await asyncio.sleep(0.1)
            time.sleep(0.3)        # a step that holds the loop
            gc.collect(2)
            await asyncio.sleep(0.2)
            await asyncio.sleep(0.1)   # quiet: nothing more logged
        finally:
            await watch.stop()
        return watch
    with caplog.at_level(logging.WARNING, logger="kube32.stalls"):
        watch = asyncio.run(main())
    held = [r.getMessage() for r in caplog.records if "event loop held" in r.getMessage()]
    assert len(held) == 1 and watch.stalls == 1 and watch.longest >= 0.3
    assert "1 of generation 2" in held[0]
    assert watch._on_gc not in gc.callbacks  # noqa: SLF001 - the hook is gone
