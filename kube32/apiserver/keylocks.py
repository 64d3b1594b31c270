"""One write at a time per stored key, within one API server.

Why: every write is a compare-and-swap on the key's revision, retried on conflict, as
kube-apiserver's GuaranteedUpdate.  Writes of one object that overlap in one server (a
kubelet's status, a controller's patch, a user's ``kubectl annotate``: each reads,
computes, and writes across awaits) made each other's swaps fail, and a dozen at once
ran out of retries and answered 409 to requests that name no resourceVersion, which
kube-apiserver always carries out.  Taking the key's turn first makes them queue instead:
a conflict is then left only between API servers sharing a store (HA), where a few
retries suffice.

Invariants: a holder never takes the same key again (no write path writes its own key
from inside its write); a key's entry lives only while someone holds or waits for it, so
the table is as large as the writes in flight, not the store.
"""
from __future__ import annotations

import asyncio
from contextlib import asynccontextmanager
from typing import AsyncIterator


class KeyLocks:
    def __init__(self) -> None:
        self._locks: dict[str, tuple[asyncio.Lock, list[int]]] = {}   # key -> (lock, [holders and waiters])

    @asynccontextmanager
    async def hold(self, key: str) -> AsyncIterator[None]:
        entry = self._locks.get(key)
        if entry is None:
            entry = self._locks[key] = (asyncio.Lock(), [0])
        lock, users = entry
        users[0] += 1
        try:
            async with lock:
                yield
        finally:
            users[0] -= 1
            if users[0] == 0:
                del self._locks[key]

    def __len__(self) -> int:
        return len(self._locks)
