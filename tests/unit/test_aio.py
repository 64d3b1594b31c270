"""kube32.aio.wait_set: a status loop built on it ends when its task is cancelled,
even when the cancellation and the event arrive in the same turn of the loop (Python
3.11's wait_for loses the cancellation then: the loop ran on and its process did not
stop on SIGTERM)."""
from __future__ import annotations

import asyncio

from kube32.aio import wait_set


async def _status_loop(event: asyncio.Event, turns: list[int]) -> None:
    while True:
        await wait_set(event, 10)
        event.clear()
        turns.append(1)


def test_a_cancellation_with_the_event_set_in_the_same_turn_is_not_lost():
    async def scenario() -> None:
        for _ in range(20):
            event, turns = asyncio.Event(), []
            task = asyncio.create_task(_status_loop(event, turns))
            await asyncio.sleep(0)
            event.set()
            task.cancel()
            done, _ = await asyncio.wait({task}, timeout=2)
            assert done and task.cancelled(), "the loop ran on after its cancellation"

    asyncio.run(scenario())


def test_wait_set_answers_whether_the_event_came():
    async def scenario() -> tuple[bool, bool, bool]:
        event = asyncio.Event()
        late = await wait_set(event, 0.01)
        asyncio.get_running_loop().call_later(0.01, event.set)
        came = await wait_set(event, 5)
        already = await wait_set(event, 0)
        return late, came, already

    assert asyncio.run(scenario()) == (False, True, True)
