"""SQLiteStore against a dict model: random create/update/delete/compact sequences.

After every operation the store's answer (value or refusal) must match the model;
at the end the current state, a watch replayed from the compacted revision, a watch
that was live all along, and the state after a reopen must all match it too.
"""

from __future__ import annotations

import asyncio
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kube32.store import (
    Conflict,
    KeyExists,
    KeyNotFound,
    KeyValue,
    SQLiteStore,
    StoreError,
    WatchEvent,
)

KEYS = ["/a/x", "/a/y", "/a-b/x", "/ab", "/a/"]
SENTINEL = "/sentinel"  # written first, so "every event after revision 1" is all of them

revision_choices = st.sampled_from(["current", "stale", "none"])
operations = st.lists(
    st.one_of(
        st.tuples(st.just("create"), st.sampled_from(KEYS), st.binary(max_size=8)),
        st.tuples(st.just("update"), st.sampled_from(KEYS), st.binary(max_size=8), revision_choices),
        st.tuples(st.just("delete"), st.sampled_from(KEYS), revision_choices),
        st.tuples(st.just("compact"), st.floats(0, 1)),
    ),
    max_size=40,
)


@dataclass
class Model:
    state: dict[str, KeyValue] = field(default_factory=dict)
    events: list[WatchEvent] = field(default_factory=list)
    revision: int = 0
    compacted: int = 0

    def resolve(self, op: tuple) -> tuple:
        """`op` with its revision choice replaced by the revision to send."""
        if op[0] not in ("update", "delete"):
            return op
        choice, key = op[-1], op[1]
        if choice == "none":
            return (*op[:-1], None)
        current = self.state.get(key)
        mod = current.mod_revision if current else 7
        return (*op[:-1], mod if choice == "current" else mod + 1)

    def apply(self, op: tuple) -> KeyValue | type[StoreError] | None:
        """What the store must answer to `op`, updating the model as the store should."""
        kind, *args = op
        if kind == "compact":
            self.compacted = max(self.compacted, int(args[0] * self.revision))
            return None
        key = args[0]
        current = self.state.get(key)
        if kind == "create":
            if current is not None:
                return KeyExists
            kv = KeyValue(key, args[1], self.revision + 1, self.revision + 1)
            return self._put(kv, None)
        expected = args[-1]
        if current is None:
            return KeyNotFound
        if expected is not None and expected != current.mod_revision:
            return Conflict
        if kind == "update":
            kv = KeyValue(key, args[1], current.create_revision, self.revision + 1)
            return self._put(kv, current)
        self.revision += 1
        gone = KeyValue(key, current.value, current.create_revision, self.revision)
        del self.state[key]
        self.events.append(WatchEvent("DELETE", gone, current, self.revision))
        return gone

    def _put(self, kv: KeyValue, prev: KeyValue | None) -> KeyValue:
        self.revision = kv.mod_revision
        self.state[kv.key] = kv
        self.events.append(WatchEvent("PUT", kv, prev, self.revision))
        return kv


async def perform(store: SQLiteStore, op: tuple) -> KeyValue | type[StoreError] | None:
    kind, *args = op
    try:
        if kind == "compact":
            await store.compact(int(args[0] * store.current_revision))
            return None
        if kind == "create":
            return await store.create(args[0], args[1])
        if kind == "update":
            return await store.update(args[0], args[1], args[2])
        return await store.delete(args[0], args[1])
    except StoreError as err:
        return type(err)


async def collect(events, count: int) -> list[WatchEvent]:
    return [await asyncio.wait_for(anext(events), 5) for _ in range(count)]


async def check_sequence(path: Path, ops: list[tuple]) -> None:
    store = SQLiteStore(path, history=5, compact_every=3)
    model = Model()
    sentinel = await store.create(SENTINEL, b"")
    model._put(sentinel, None)
    model.events.clear()
    live = store.watch("/a/", 0)
    for choice in ops:
        op = model.resolve(choice)
        expected = model.apply(op)
        assert await perform(store, op) == expected, op
        assert store.current_revision == model.revision
    assert store.compacted_revision >= model.compacted

    want = sorted(model.state.values(), key=lambda kv: kv.key)
    assert await store.list("") == (want, model.revision)
    assert (await store.list("/a/"))[0] == [kv for kv in want if kv.key.startswith("/a/")]
    for key in KEYS:
        assert await store.get(key) == model.state.get(key)

    after = store.compacted_revision or sentinel.mod_revision
    tail = [e for e in model.events if e.revision > after]
    assert await collect(store.watch("", after), len(tail)) == tail
    watched = [e for e in model.events if e.kv.key.startswith("/a/")]
    assert await collect(live, len(watched)) == watched
    await live.aclose()
    await store.close()

    reopened = SQLiteStore(path)
    assert await reopened.list("") == (want, model.revision)
    assert reopened.compacted_revision == store.compacted_revision
    await reopened.close()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=operations)
def test_store_matches_a_dict_model(ops: list[tuple]) -> None:
    with tempfile.TemporaryDirectory() as directory:
        asyncio.run(check_sequence(Path(directory) / "s.db", ops))
