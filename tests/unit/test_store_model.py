"""Each store (SQLite, etcd) against a dict model: random create/update/delete/compact sequences.

After every operation the store's answer (value or refusal) must match the model;
at the end the current state, a watch replayed from the compacted revision, a watch
that was live all along, the state after a reopen, and the pages of every revision
(page(): each revision from the compacted one on, read in pages of a drawn size, is
the model's state at that revision; an older one is Compacted, a newer FutureRevision)
must all match it too.  The
model counts revisions from the store's revision at the start (etcd's counter is the
cluster's); each etcd example runs under a key prefix of its own.
"""

from __future__ import annotations

import asyncio
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pytest

from kube32.store import (
    Compacted,
    Conflict,
    FutureRevision,
    KeyExists,
    KeyNotFound,
    KeyValue,
    Store,
    StoreError,
    WatchEvent,
)
from tests.unit.store_backends import BACKENDS, Backend, make_backend

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
    states: dict[int, dict[str, KeyValue]] = field(default_factory=dict)  # revision -> state after it

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
        self.states[self.revision] = dict(self.state)
        return gone

    def _put(self, kv: KeyValue, prev: KeyValue | None) -> KeyValue:
        self.revision = kv.mod_revision
        self.state[kv.key] = kv
        self.events.append(WatchEvent("PUT", kv, prev, self.revision))
        self.states[self.revision] = dict(self.state)
        return kv


async def perform(store: Store, op: tuple) -> KeyValue | type[StoreError] | None:
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


async def _read_into(events, seen: list[WatchEvent]) -> None:
    async for event in events:
        seen.append(event)


async def collect(events, count: int) -> list[WatchEvent]:
    return [await asyncio.wait_for(anext(events), 5) for _ in range(count)]


async def read_pages(store: Store, prefix: str, revision: int, size: int) -> list[KeyValue]:
    """Every page of `prefix` at `revision`, `size` keys a page, checking each page's count."""
    page = await store.page(prefix, limit=size, revision=revision)
    items = list(page.items)
    while page.remaining:
        assert len(page.items) == size and page.revision == revision
        before = page.remaining
        page = await store.page(prefix, after=items[-1].key, limit=size, revision=revision)
        assert before == len(page.items) + page.remaining
        items += page.items
    return items


async def check_pages(store: Store, model: Model, first: int, size: int) -> None:
    for revision, state in model.states.items():
        if revision < first:
            continue
        if revision < store.compacted_revision:
            with pytest.raises(Compacted):
                await store.page("", limit=size, revision=revision)
            continue
        want = sorted(state.values(), key=lambda kv: kv.key)
        assert await read_pages(store, "", revision, size) == want, revision
        assert await read_pages(store, "/a/", revision, size) == [kv for kv in want if kv.key.startswith("/a/")]
    now = await store.page("", after="/a/", limit=0)
    assert (now.items, now.revision, now.remaining) == (
        sorted((kv for kv in model.state.values() if kv.key > "/a/"), key=lambda kv: kv.key), model.revision, 0)
    with pytest.raises(FutureRevision):
        await store.page("", revision=model.revision + 1)


async def check_sequence(backend: Backend, ops: list[tuple], size: int = 2) -> None:
    # SQLite compacts itself too: every 3 writes, keeping the last 5 revisions.
    store = await backend.open(**({"history": 5, "compact_every": 3} if backend.name == "sqlite" else {}))
    model = Model(revision=store.current_revision)
    sentinel = await store.create(SENTINEL, b"")
    model._put(sentinel, None)
    model.events.clear()
    live = store.watch("/a/", 0)
    # Read as the events come, as the API server's watches do: etcd reads an event's previous
    # value when it sends the event, and a compaction past it before then is a Compacted watch.
    seen: list[WatchEvent] = []
    reader = asyncio.ensure_future(_read_into(live, seen))
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
    await check_pages(store, model, sentinel.mod_revision, size)

    after = max(store.compacted_revision, sentinel.mod_revision)
    tail = [e for e in model.events if e.revision > after]
    assert await collect(store.watch("", after), len(tail)) == tail
    watched = [e for e in model.events if e.kv.key.startswith("/a/")]
    for _ in range(500):
        if len(seen) >= len(watched) or reader.done():
            break
        await asyncio.sleep(0.01)
    reader.cancel()
    await asyncio.gather(reader, return_exceptions=True)
    assert seen == watched
    await live.aclose()
    await store.close()

    reopened = await backend.open()
    assert await reopened.list("") == (want, model.revision)
    assert reopened.compacted_revision == store.compacted_revision
    await reopened.close()


@pytest.mark.parametrize("kind", BACKENDS)
def test_store_matches_a_dict_model(kind: str, request: pytest.FixtureRequest) -> None:
    if kind == "etcd":
        request.getfixturevalue("etcd_cluster")  # started once, outside the examples

    @settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(ops=operations, size=st.integers(1, 4))
    def run(ops: list[tuple], size: int) -> None:
        with tempfile.TemporaryDirectory() as directory:
            backend = make_backend(kind, request, Path(directory) / "s.db")
            asyncio.run(check_sequence(backend, ops, size))

    run()
