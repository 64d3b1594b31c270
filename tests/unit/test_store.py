"""The store protocol on both backends (SQLite, etcd), and what is SQLite's own.

Revisions, compare-and-swap, prefixes, watch, compaction and restart are tested on
every backend (the `backend` fixture: a SQLite file under tmp_path, or a fresh prefix
on the session's real etcd); revisions are counted from the store's revision when the
test opens it, since etcd's counter is one for the whole cluster. Each test runs its
coroutine with asyncio.run (no pytest-asyncio).
"""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path
from typing import AsyncIterator, Awaitable, Callable

import pytest

from kube32.store import (
    Compacted,
    Conflict,
    KeyExists,
    KeyNotFound,
    KeyValue,
    SQLiteStore,
    Store,
    StoreError,
    WatchEvent,
)
from kube32.store.sqlite import prefix_end
from tests.unit.store_backends import Backend, backend  # noqa: F401 - the fixture

StoreTest = Callable[[SQLiteStore], Awaitable[None]]


def run_with_store(path: Path, test: StoreTest, **options: int) -> None:
    async def main() -> None:
        store = await SQLiteStore.open(path, **options)
        try:
            await test(store)
        finally:
            await store.close()

    asyncio.run(main())


async def take(events: AsyncIterator[WatchEvent], count: int) -> list[WatchEvent]:
    return [await asyncio.wait_for(anext(events), 5) for _ in range(count)]


def revisions(events: list[WatchEvent], base: int = 0) -> list[int]:
    return [event.revision - base for event in events]


# --- the protocol, on every backend --------------------------------------------


def test_the_store_satisfies_the_protocol(backend: Backend) -> None:
    async def check(store: Store) -> None:
        assert isinstance(store, Store)
        assert store.compacted_revision <= store.current_revision

    backend.run(check)


def test_revisions_are_monotonic_across_keys(backend: Backend) -> None:
    async def check(store: Store) -> None:
        base = store.current_revision
        a = await store.create("/a", b"1")
        b = await store.create("/b", b"1")
        a2 = await store.update("/a", b"2", a.mod_revision)
        gone = await store.delete("/b")
        written = [a.mod_revision, b.mod_revision, a2.mod_revision, gone.mod_revision]
        assert [r - base for r in written] == [1, 2, 3, 4]
        assert store.current_revision == base + 4
        assert a2.create_revision == base + 1
        with pytest.raises(KeyExists):
            await store.create("/a", b"again")
        with pytest.raises(Conflict):
            await store.update("/a", b"3", a.mod_revision)
        assert store.current_revision == base + 4, "failed writes must not use a revision"
        assert (await store.create("/c", b"1")).mod_revision == base + 5

    backend.run(check)


def test_compare_and_swap(backend: Backend) -> None:
    async def check(store: Store) -> None:
        first = await store.create("/k", b"v1")
        second = await store.update("/k", b"v2", first.mod_revision)
        assert second == KeyValue("/k", b"v2", first.mod_revision, second.mod_revision)
        with pytest.raises(Conflict) as stale:
            await store.update("/k", b"v3", first.mod_revision)
        assert stale.value.current == second
        assert stale.value.expected_mod_revision == first.mod_revision
        assert await store.get("/k") == second
        with pytest.raises(Conflict) as stale_delete:
            await store.delete("/k", first.mod_revision)
        assert stale_delete.value.current == second
        with pytest.raises(KeyNotFound):
            await store.update("/missing", b"x", 1)
        with pytest.raises(KeyNotFound):
            await store.update("/missing", b"x", 0)  # 0 never creates a missing key
        with pytest.raises(KeyNotFound):
            await store.delete("/missing")
        with pytest.raises(KeyExists) as exists:
            await store.create("/k", b"x")
        assert exists.value.current == second
        unconditional = await store.update("/k", b"v4", None)
        assert unconditional.value == b"v4"
        assert unconditional.create_revision == first.create_revision
        assert await store.get("/missing") is None

    backend.run(check)


def test_delete_returns_the_last_state(backend: Backend) -> None:
    async def check(store: Store) -> None:
        created = await store.create("/k", b"v1")
        updated = await store.update("/k", b"v2", created.mod_revision)
        deleted = await store.delete("/k", updated.mod_revision)
        assert deleted == KeyValue("/k", b"v2", created.create_revision, updated.mod_revision + 1)
        assert await store.get("/k") is None
        assert (await store.list("/"))[0] == []
        recreated = await store.create("/k", b"v3")
        assert recreated.create_revision == deleted.mod_revision + 1

    backend.run(check)


def test_list_by_prefix_respects_the_trailing_slash(backend: Backend) -> None:
    async def check(store: Store) -> None:
        for key in ["/pods/default/b", "/pods/default-x/a", "/pods/default/a",
                    "/pods/defaulta", "/pods/default/", "/services/default/a"]:
            await store.create(key, key.encode())
        items, revision = await store.list("/pods/default/")
        assert [kv.key for kv in items] == ["/pods/default/", "/pods/default/a", "/pods/default/b"]
        assert revision == store.current_revision
        assert [kv.key for kv in (await store.list("/pods/default-x/"))[0]] == ["/pods/default-x/a"]
        everything, _ = await store.list("")
        assert [kv.key for kv in everything] == sorted(kv.key for kv in everything)
        assert len(everything) == 6
        assert (await store.list("/nothing/"))[0] == []

    backend.run(check)


def test_a_long_list_is_one_snapshot(backend: Backend) -> None:
    async def check(store: Store) -> None:
        store.page_size = 7  # type: ignore[attr-defined] - etcd reads lists in pages
        for i in range(50):
            await store.create(f"/l/{i:03d}", b"%d" % i)
        items, revision = await store.list("/l/")
        assert [kv.key for kv in items] == [f"/l/{i:03d}" for i in range(50)]
        assert revision == store.current_revision

    backend.run(check)


def test_list_with_unusual_characters(backend: Backend) -> None:
    async def check(store: Store) -> None:
        keys = ["/x/\U0010ffff", "/x/\ud7ff", "/x/\ue000", "/x/é", "/x0", "/y"]
        for key in keys:
            await store.create(key, b"")
        got = [kv.key for kv in (await store.list("/x/"))[0]]
        assert got == sorted(k for k in keys if k.startswith("/x/"))
        assert [kv.key for kv in (await store.list("/x/\ud7ff"))[0]] == ["/x/\ud7ff"]

    backend.run(check)


def test_bad_input_is_refused_with_a_cause(backend: Backend) -> None:
    async def check(store: Store) -> None:
        base = store.current_revision
        cases = [
            (store.create("", b""), "non-empty"),
            (store.create(b"/k", b""), "non-empty string"),  # type: ignore[arg-type]
            (store.create("/k\x00", b""), "NUL"),
            (store.create("/\ud800", b""), "surrogate"),
            (store.create("/k", "text"), "bytes"),  # type: ignore[arg-type]
            (store.update("/k", b"", -1), "non-negative"),
            (store.list(None), "prefix"),  # type: ignore[arg-type]
            (store.compact(base + 99), "current revision"),
        ]
        for call, cause in cases:
            with pytest.raises(StoreError, match=cause):
                await call
        with pytest.raises(StoreError, match="start_revision"):
            await anext(store.watch("/", -5))
        assert store.current_revision == base

    backend.run(check)


def test_watch_event_contents_replayed_and_live_agree(backend: Backend) -> None:
    async def check(store: Store) -> None:
        start = (await store.create("/unwatched", b"")).mod_revision
        base = start - 1
        live_watch = store.watch("/w/", 0)
        a = await store.create("/w/a", b"1")
        await store.update("/w/a", b"2", a.mod_revision)
        await store.create("/other", b"x")
        await store.delete("/w/a")
        await store.create("/w/a", b"3")
        live = await take(live_watch, 4)
        replayed = await take(store.watch("/w/", start), 4)
        assert replayed == live
        create, update, delete, recreate = live
        b = base
        assert (create.type, create.prev, create.kv) == ("PUT", None, KeyValue("/w/a", b"1", b + 2, b + 2))
        assert (update.type, update.prev, update.kv) == ("PUT", create.kv, KeyValue("/w/a", b"2", b + 2, b + 3))
        assert (delete.type, delete.prev, delete.kv) == ("DELETE", update.kv, KeyValue("/w/a", b"2", b + 2, b + 5))
        assert (recreate.type, recreate.prev, recreate.kv) == ("PUT", None, KeyValue("/w/a", b"3", b + 6, b + 6))
        assert revisions(live, base) == [2, 3, 5, 6]
        await live_watch.aclose()

    backend.run(check)


def test_watch_replays_then_goes_live_without_gap_or_duplicate(backend: Backend) -> None:
    async def check(store: Store) -> None:
        store.replay_page_size = 7  # type: ignore[attr-defined] - SQLite: many pages
        base = store.current_revision
        for i in range(60):
            await store.create(f"/r/{i:03d}", b"old")
            await store.create(f"/s/{i:03d}", b"unwatched")
        start = base + 10
        expected_replay = [r for r in range(start + 1, store.current_revision + 1) if (r - base) % 2 == 1]
        received: list[WatchEvent] = []
        written: list[int] = []
        events = store.watch("/r/", start)
        async for event in events:
            received.append(event)
            if len(written) < 40:
                # Write while the replay is still running: these must come after it.
                written.append((await store.create(f"/r/new-{len(written):03d}", b"")).mod_revision)
                await store.create(f"/s/new-{len(written):03d}", b"")
            if len(received) == len(expected_replay) + len(written):
                break
        await events.aclose()
        assert revisions(received) == expected_replay + written
        assert len(set(revisions(received))) == len(received)
        assert store.watcher_count == 0  # type: ignore[attr-defined]

    backend.run(check)


def test_watch_from_zero_means_from_the_call(backend: Backend) -> None:
    async def check(store: Store) -> None:
        await store.create("/k/before", b"")
        events = store.watch("/k/", 0)
        between = await store.create("/k/between", b"")  # before the first iteration
        first = await take(events, 1)
        after = await store.create("/k/after", b"")
        second = await take(events, 1)
        assert revisions(first + second) == [between.mod_revision, after.mod_revision]
        await events.aclose()

    backend.run(check)


def test_watch_from_zero_is_not_broken_by_a_compaction_before_it_starts(backend: Backend) -> None:
    async def check(store: Store) -> None:
        events = store.watch("/k/", 0)
        kv = await store.create("/k/a", b"")
        await store.compact(store.current_revision)
        assert revisions(await take(events, 1)) == [kv.mod_revision]
        await events.aclose()
        assert store.watcher_count == 0  # type: ignore[attr-defined]

    backend.run(check)


def test_an_unstarted_watch_closes(backend: Backend) -> None:
    async def check(store: Store) -> None:
        events = store.watch("/k/", 0)
        await events.aclose()  # type: ignore[attr-defined]
        assert store.watcher_count == 0  # type: ignore[attr-defined]

    backend.run(check)


def test_watch_from_a_future_revision_skips_up_to_it(backend: Backend) -> None:
    async def check(store: Store) -> None:
        base = store.current_revision
        events = store.watch("/k/", base + 3)
        for name in "abcde":
            await store.create(f"/k/{name}", b"")
        assert revisions(await take(events, 2), base) == [4, 5]
        await events.aclose()

    backend.run(check)


def test_compaction_keeps_current_state_and_refuses_older_watches(backend: Backend) -> None:
    async def check(store: Store) -> None:
        b = store.current_revision
        kept = await store.create("/c/kept", b"v1")            # 1, never superseded
        churn = await store.create("/c/churn", b"v1")          # 2
        churn = await store.update("/c/churn", b"v2", churn.mod_revision)   # 3
        await store.create("/c/gone", b"v1")                   # 4
        await store.delete("/c/gone")                          # 5
        churn = await store.update("/c/churn", b"v3", churn.mod_revision)   # 6
        await store.compact(b + 5)
        assert store.compacted_revision == b + 5
        with pytest.raises(Compacted) as too_old:
            await anext(store.watch("/c/", b + 4))
        assert too_old.value.compacted_revision == b + 5 and too_old.value.requested_revision == b + 4
        # Everything after the compacted revision, with its prev, is still there.
        (event,) = await take(store.watch("/c/", b + 5), 1)
        assert event.kv == churn and event.prev == KeyValue("/c/churn", b"v2", b + 2, b + 3)
        items, _ = await store.list("/c/")
        assert items == [churn, kept]
        await store.compact(b + 3)  # older than compacted: nothing to do
        assert store.compacted_revision == b + 5
        await store.compact(store.current_revision)
        assert store.compacted_revision == b + 6
        assert (await store.list("/c/"))[0] == [churn, kept]

    backend.run(check)


def test_compaction_of_a_trailing_delete_keeps_the_revision_counter(backend: Backend) -> None:
    base: list[int] = []

    async def first(store: Store) -> None:
        base.append(store.current_revision)
        await store.create("/k", b"")
        await store.delete("/k")
        await store.compact(base[0] + 2)

    async def second(store: Store) -> None:
        b = base[0]
        assert (store.current_revision, store.compacted_revision) == (b + 2, b + 2)
        assert (await store.create("/k", b"")).mod_revision == b + 3

    backend.run(first)
    backend.run(second)


def test_objects_and_revision_survive_a_restart(backend: Backend) -> None:
    saved: dict[str, object] = {}

    async def first(store: Store) -> None:
        saved["base"] = store.current_revision
        a = await store.create("/p/a", b"a1")
        await store.update("/p/a", b"a2", a.mod_revision)
        await store.create("/p/b", b"b1")
        await store.create("/p/c", b"c1")
        await store.delete("/p/c")
        saved["list"] = await store.list("/p/")

    async def second(store: Store) -> None:
        b = saved["base"]
        assert isinstance(b, int)
        assert await store.list("/p/") == saved["list"]
        assert store.current_revision == b + 5
        d = await store.create("/p/d", b"d1")
        assert d.mod_revision == b + 6
        # The history before the restart is still there for watches.
        replay = await take(store.watch("/p/", b + 2), 4)
        assert revisions(replay, b) == [3, 4, 5, 6]

    backend.run(first)
    backend.run(second)


def test_a_thousand_watchers_all_see_each_write(backend: Backend) -> None:
    async def check(store: Store) -> None:
        watches = [store.watch("/pods/" if i % 2 else "/pods/ns/", 0) for i in range(1000)]
        pending = [asyncio.ensure_future(anext(w)) for w in watches]
        await asyncio.sleep(0)  # every watcher subscribes
        assert store.watcher_count == 1000  # type: ignore[attr-defined]
        kv = await store.create("/pods/ns/p", b"")
        await store.create("/nodes/n", b"")
        got = await asyncio.wait_for(asyncio.gather(*pending), 30)
        assert {event.kv for event in got} == {kv}
        await store.close()
        rest = await asyncio.wait_for(asyncio.gather(*(_drain(w) for w in watches)), 10)
        assert rest == [[]] * 1000, "closing the store ends every watch"

    backend.run(check)


async def _drain(events: AsyncIterator[WatchEvent]) -> list[WatchEvent]:
    return [event async for event in events]


def test_a_closed_store_refuses_calls(backend: Backend) -> None:
    async def check(store: Store) -> None:
        await store.create("/k", b"")
        await store.close()
        await store.close()  # idempotent
        for call in (store.get("/k"), store.list("/"), store.create("/j", b""),
                     store.update("/k", b"", 1), store.delete("/k"), store.compact(1)):
            with pytest.raises(StoreError, match="closed"):
                await call
        assert await _drain(store.watch("/", 0)) == []

    backend.run(check)


# --- SQLite's own ----------------------------------------------------------------


def test_prefix_end_handles_the_edges_of_unicode() -> None:
    assert prefix_end("") is None
    assert prefix_end("/a/") == "/a0"
    assert prefix_end("a\U0010ffff") == "b"
    assert prefix_end("\U0010ffff") is None
    assert prefix_end("a\ud7ff") == "a\ue000"


def test_sqlite_compaction_keeps_only_the_latest_row_of_each_live_key(tmp_path: Path) -> None:
    path = tmp_path / "s.db"

    async def check(store: SQLiteStore) -> None:
        await store.create("/c/kept", b"v1")
        churn = await store.create("/c/churn", b"v1")
        churn = await store.update("/c/churn", b"v2", churn.mod_revision)
        await store.create("/c/gone", b"v1")
        await store.delete("/c/gone")
        await store.update("/c/churn", b"v3", churn.mod_revision)
        await store.compact(store.current_revision)

    run_with_store(path, check)
    with sqlite3.connect(path) as db:
        rows = db.execute("SELECT revision FROM log ORDER BY revision").fetchall()
    db.close()
    assert rows == [(1,), (6,)], "only the latest row of each live key survives"


def test_automatic_compaction_keeps_the_history_window(tmp_path: Path) -> None:
    async def check(store: SQLiteStore) -> None:
        kv = await store.create("/k", b"0")
        for i in range(100):
            kv = await store.update("/k", str(i).encode(), kv.mod_revision)
        revision = store.current_revision
        assert revision - 10 - 5 < store.compacted_revision <= revision - 10
        events = await take(store.watch("/k", revision - 10), 10)
        assert revisions(events) == list(range(revision - 9, revision + 1))
        assert all(event.prev is not None for event in events)

    run_with_store(tmp_path / "s.db", check, history=10, compact_every=5)


def test_a_store_file_has_one_owner(tmp_path: Path) -> None:
    path = tmp_path / "s.db"

    async def check(store: SQLiteStore) -> None:
        with pytest.raises(StoreError, match="in use"):
            SQLiteStore(path)
        assert (await store.create("/still-works", b"")).mod_revision == 1

    run_with_store(path, check)


def test_a_file_that_is_not_a_store_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "junk.db"
    path.write_bytes(b"this is not a database" * 100)
    with pytest.raises(StoreError, match="not a Kube32 store"):
        SQLiteStore(path)
    with pytest.raises(StoreError, match="cannot open"):
        SQLiteStore(tmp_path / "missing-dir" / "s.db")


def test_a_slow_watcher_catches_up_from_the_log(tmp_path: Path) -> None:
    async def check(store: SQLiteStore) -> None:
        events = store.watch("/k/", 0)
        first = await store.create("/k/0", b"")
        assert revisions(await take(events, 1)) == [first.mod_revision]
        for i in range(1, 50):  # overflows the 4-event queue; writers never wait
            await store.create(f"/k/{i}", b"")
        assert store.watcher_count == 0, "the overflowing watcher was unsubscribed"
        caught_up = await take(events, 49)
        assert revisions(caught_up) == list(range(2, 51))
        live = await store.create("/k/live", b"")
        assert revisions(await take(events, 1)) == [live.mod_revision]
        await events.aclose()

    run_with_store(tmp_path / "s.db", check, watch_queue_size=4)


def test_a_watcher_left_behind_by_compaction_gets_compacted(tmp_path: Path) -> None:
    async def check(store: SQLiteStore) -> None:
        events = store.watch("/k/", 0)
        kv = await store.create("/k/x", b"")
        await take(events, 1)
        for i in range(20):
            kv = await store.update("/k/x", str(i).encode(), kv.mod_revision)
        await store.compact(store.current_revision - 2)
        with pytest.raises(Compacted):
            await take(events, 1)

    run_with_store(tmp_path / "s.db", check, watch_queue_size=4)


def test_a_failed_write_changes_nothing(tmp_path: Path) -> None:
    async def check(store: SQLiteStore) -> None:
        events = store.watch("/k/", 0)
        store._db.execute(
            "CREATE TRIGGER refuse BEFORE INSERT ON log "
            "BEGIN SELECT RAISE(ABORT, 'disk says no'); END"
        )
        with pytest.raises(StoreError, match="cannot write key '/k/a': disk says no"):
            await store.create("/k/a", b"")
        assert store.current_revision == 0 and await store.get("/k/a") is None
        store._db.execute("DROP TRIGGER refuse")
        kv = await store.create("/k/b", b"")
        assert kv.mod_revision == 1
        assert await take(events, 1) == [WatchEvent("PUT", kv, None, 1)]
        await events.aclose()

    run_with_store(tmp_path / "s.db", check)


def test_a_failed_automatic_compaction_does_not_fail_the_write(tmp_path: Path) -> None:
    async def check(store: SQLiteStore) -> None:
        store._db.execute(
            "CREATE TRIGGER keep BEFORE DELETE ON log BEGIN SELECT RAISE(ABORT, 'no'); END"
        )
        kv = await store.create("/k", b"")
        for i in range(10):
            kv = await store.update("/k", b"%d" % i, kv.mod_revision)
        assert store.compacted_revision == 0 and store.current_revision == 11
        store._db.execute("DROP TRIGGER keep")
        for i in range(2):
            kv = await store.update("/k", b"%d" % i, kv.mod_revision)
        assert store.compacted_revision == 12 - 2  # compacted at the 12th write

    run_with_store(tmp_path / "s.db", check, history=2, compact_every=2)


def test_a_store_of_another_schema_version_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    run_with_store(path, lambda store: store.create("/k", b""))
    with sqlite3.connect(path) as db:
        db.execute("UPDATE meta SET value = 99 WHERE name = 'schema'")
    db.close()
    with pytest.raises(StoreError, match="schema version 99"):
        SQLiteStore(path)
