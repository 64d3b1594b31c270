"""SQLiteStore: revisions, compare-and-swap, prefixes, watch, compaction, restart.

Each test runs its coroutine with asyncio.run (no pytest-asyncio) against a real
SQLite file under tmp_path.
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


def revisions(events: list[WatchEvent]) -> list[int]:
    return [event.revision for event in events]


def test_sqlite_store_satisfies_the_protocol(tmp_path: Path) -> None:
    async def check(store: SQLiteStore) -> None:
        assert isinstance(store, Store)
        assert store.current_revision == 0 and store.compacted_revision == 0

    run_with_store(tmp_path / "s.db", check)


def test_revisions_are_monotonic_across_keys(tmp_path: Path) -> None:
    async def check(store: SQLiteStore) -> None:
        a = await store.create("/a", b"1")
        b = await store.create("/b", b"1")
        a2 = await store.update("/a", b"2", a.mod_revision)
        gone = await store.delete("/b")
        assert [a.mod_revision, b.mod_revision, a2.mod_revision, gone.mod_revision] == [1, 2, 3, 4]
        assert store.current_revision == 4
        assert a2.create_revision == 1
        with pytest.raises(KeyExists):
            await store.create("/a", b"again")
        with pytest.raises(Conflict):
            await store.update("/a", b"3", a.mod_revision)
        assert store.current_revision == 4, "failed writes must not use a revision"
        assert (await store.create("/c", b"1")).mod_revision == 5

    run_with_store(tmp_path / "s.db", check)


def test_compare_and_swap(tmp_path: Path) -> None:
    async def check(store: SQLiteStore) -> None:
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
            await store.delete("/missing")
        with pytest.raises(KeyExists) as exists:
            await store.create("/k", b"x")
        assert exists.value.current == second
        unconditional = await store.update("/k", b"v4", None)
        assert unconditional.value == b"v4"

    run_with_store(tmp_path / "s.db", check)


def test_delete_returns_the_last_state(tmp_path: Path) -> None:
    async def check(store: SQLiteStore) -> None:
        created = await store.create("/k", b"v1")
        updated = await store.update("/k", b"v2", created.mod_revision)
        deleted = await store.delete("/k", updated.mod_revision)
        assert deleted == KeyValue("/k", b"v2", created.create_revision, updated.mod_revision + 1)
        assert await store.get("/k") is None
        assert (await store.list("/"))[0] == []
        recreated = await store.create("/k", b"v3")
        assert recreated.create_revision == deleted.mod_revision + 1

    run_with_store(tmp_path / "s.db", check)


def test_list_by_prefix_respects_the_trailing_slash(tmp_path: Path) -> None:
    async def check(store: SQLiteStore) -> None:
        for key in ["/pods/default/b", "/pods/default-x/a", "/pods/default/a",
                    "/pods/defaulta", "/pods/default/", "/services/default/a"]:
            await store.create(key, key.encode())
        items, revision = await store.list("/pods/default/")
        assert [kv.key for kv in items] == ["/pods/default/", "/pods/default/a", "/pods/default/b"]
        assert revision == store.current_revision == 6
        assert [kv.key for kv in (await store.list("/pods/default-x/"))[0]] == ["/pods/default-x/a"]
        everything, _ = await store.list("")
        assert [kv.key for kv in everything] == sorted(kv.key for kv in everything)
        assert len(everything) == 6
        assert (await store.list("/nothing/"))[0] == []

    run_with_store(tmp_path / "s.db", check)


def test_prefix_end_handles_the_edges_of_unicode() -> None:
    assert prefix_end("") is None
    assert prefix_end("/a/") == "/a0"
    assert prefix_end("a\U0010ffff") == "b"
    assert prefix_end("\U0010ffff") is None
    assert prefix_end("a\ud7ff") == "a\ue000"


def test_list_with_unusual_characters(tmp_path: Path) -> None:
    async def check(store: SQLiteStore) -> None:
        keys = ["/x/\U0010ffff", "/x/\ud7ff", "/x/\ue000", "/x/é", "/x0", "/y"]
        for key in keys:
            await store.create(key, b"")
        got = [kv.key for kv in (await store.list("/x/"))[0]]
        assert got == sorted(k for k in keys if k.startswith("/x/"))
        assert [kv.key for kv in (await store.list("/x/\ud7ff"))[0]] == ["/x/\ud7ff"]

    run_with_store(tmp_path / "s.db", check)


def test_bad_input_is_refused_with_a_cause(tmp_path: Path) -> None:
    async def check(store: SQLiteStore) -> None:
        cases = [
            (store.create("", b""), "non-empty"),
            (store.create(b"/k", b""), "non-empty string"),  # type: ignore[arg-type]
            (store.create("/k\x00", b""), "NUL"),
            (store.create("/\ud800", b""), "surrogate"),
            (store.create("/k", "text"), "bytes"),  # type: ignore[arg-type]
            (store.update("/k", b"", -1), "non-negative"),
            (store.list(None), "prefix"),  # type: ignore[arg-type]
            (store.compact(99), "current revision"),
        ]
        for call, cause in cases:
            with pytest.raises(StoreError, match=cause):
                await call
        with pytest.raises(StoreError, match="start_revision"):
            await anext(store.watch("/", -5))
        assert store.current_revision == 0

    run_with_store(tmp_path / "s.db", check)


def test_watch_event_contents_replayed_and_live_agree(tmp_path: Path) -> None:
    async def check(store: SQLiteStore) -> None:
        start = (await store.create("/unwatched", b"")).mod_revision
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
        assert (create.type, create.prev, create.kv) == ("PUT", None, KeyValue("/w/a", b"1", 2, 2))
        assert (update.type, update.prev, update.kv) == ("PUT", create.kv, KeyValue("/w/a", b"2", 2, 3))
        assert (delete.type, delete.prev, delete.kv) == ("DELETE", update.kv, KeyValue("/w/a", b"2", 2, 5))
        assert (recreate.type, recreate.prev, recreate.kv) == ("PUT", None, KeyValue("/w/a", b"3", 6, 6))
        assert revisions(live) == [2, 3, 5, 6]

    run_with_store(tmp_path / "s.db", check)


def test_watch_replays_then_goes_live_without_gap_or_duplicate(tmp_path: Path) -> None:
    async def check(store: SQLiteStore) -> None:
        store.replay_page_size = 7  # many pages, so writes land between them
        for i in range(60):
            await store.create(f"/r/{i:03d}", b"old")
            await store.create(f"/s/{i:03d}", b"unwatched")
        start = 10
        expected_replay = [r for r in range(start + 1, store.current_revision + 1) if r % 2 == 1]
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
        assert store.watcher_count == 0

    run_with_store(tmp_path / "s.db", check)


def test_watch_from_zero_means_from_the_call(tmp_path: Path) -> None:
    async def check(store: SQLiteStore) -> None:
        await store.create("/k/before", b"")
        events = store.watch("/k/", 0)
        between = await store.create("/k/between", b"")  # before the first iteration
        first = await take(events, 1)
        after = await store.create("/k/after", b"")
        second = await take(events, 1)
        assert revisions(first + second) == [between.mod_revision, after.mod_revision]
        await events.aclose()

    run_with_store(tmp_path / "s.db", check)


def test_watch_from_zero_is_not_broken_by_a_compaction_before_it_starts(tmp_path: Path) -> None:
    async def check(store: SQLiteStore) -> None:
        events = store.watch("/k/", 0)
        kv = await store.create("/k/a", b"")
        await store.compact(store.current_revision)
        assert revisions(await take(events, 1)) == [kv.mod_revision]
        await events.aclose()
        assert store.watcher_count == 0

    run_with_store(tmp_path / "s.db", check)


def test_watch_from_a_future_revision_skips_up_to_it(tmp_path: Path) -> None:
    async def check(store: SQLiteStore) -> None:
        events = store.watch("/k/", 3)
        for name in "abcde":
            await store.create(f"/k/{name}", b"")
        assert revisions(await take(events, 2)) == [4, 5]
        await events.aclose()

    run_with_store(tmp_path / "s.db", check)


def test_compaction_keeps_current_state_and_refuses_older_watches(tmp_path: Path) -> None:
    path = tmp_path / "s.db"

    async def check(store: SQLiteStore) -> None:
        kept = await store.create("/c/kept", b"v1")            # 1, never superseded
        churn = await store.create("/c/churn", b"v1")          # 2
        churn = await store.update("/c/churn", b"v2", churn.mod_revision)   # 3
        await store.create("/c/gone", b"v1")                   # 4
        await store.delete("/c/gone")                          # 5
        churn = await store.update("/c/churn", b"v3", churn.mod_revision)   # 6
        await store.compact(5)
        assert store.compacted_revision == 5
        with pytest.raises(Compacted) as too_old:
            await anext(store.watch("/c/", 4))
        assert too_old.value.compacted_revision == 5 and too_old.value.requested_revision == 4
        # Everything after the compacted revision, with its prev, is still there.
        (event,) = await take(store.watch("/c/", 5), 1)
        assert event.kv == churn and event.prev == KeyValue("/c/churn", b"v2", 2, 3)
        items, _ = await store.list("/c/")
        assert items == [churn, kept]
        await store.compact(3)  # older than compacted: nothing to do
        assert store.compacted_revision == 5
        await store.compact(store.current_revision)
        assert store.compacted_revision == 6
        assert (await store.list("/c/"))[0] == [churn, kept]

    run_with_store(path, check)
    with sqlite3.connect(path) as db:
        rows = db.execute("SELECT revision FROM log ORDER BY revision").fetchall()
    assert rows == [(1,), (6,)], "only the latest row of each live key survives"


def test_compaction_of_a_trailing_delete_keeps_the_revision_counter(tmp_path: Path) -> None:
    path = tmp_path / "s.db"

    async def first(store: SQLiteStore) -> None:
        await store.create("/k", b"")
        await store.delete("/k")
        await store.compact(2)

    async def second(store: SQLiteStore) -> None:
        assert (store.current_revision, store.compacted_revision) == (2, 2)
        assert (await store.create("/k", b"")).mod_revision == 3

    run_with_store(path, first)
    run_with_store(path, second)


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


def test_objects_and_revision_survive_a_restart(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    saved: dict[str, object] = {}

    async def first(store: SQLiteStore) -> None:
        a = await store.create("/p/a", b"a1")
        await store.update("/p/a", b"a2", a.mod_revision)
        await store.create("/p/b", b"b1")
        await store.create("/p/c", b"c1")
        await store.delete("/p/c")
        saved["list"] = await store.list("/p/")

    async def second(store: SQLiteStore) -> None:
        assert await store.list("/p/") == saved["list"]
        assert store.current_revision == 5
        d = await store.create("/p/d", b"d1")
        assert d.mod_revision == 6
        # The history before the restart is still there for watches.
        replay = await take(store.watch("/p/", 2), 4)
        assert revisions(replay) == [3, 4, 5, 6]

    run_with_store(path, first)
    run_with_store(path, second)


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


def test_a_thousand_watchers_all_see_each_write(tmp_path: Path) -> None:
    async def check(store: SQLiteStore) -> None:
        watches = [store.watch("/pods/" if i % 2 else "/pods/ns/", 0) for i in range(1000)]
        pending = [asyncio.ensure_future(anext(w)) for w in watches]
        await asyncio.sleep(0)  # every watcher subscribes
        assert store.watcher_count == 1000
        kv = await store.create("/pods/ns/p", b"")
        await store.create("/nodes/n", b"")
        got = await asyncio.wait_for(asyncio.gather(*pending), 10)
        assert {event.kv for event in got} == {kv}
        await store.close()
        rest = await asyncio.wait_for(asyncio.gather(*(_drain(w) for w in watches)), 10)
        assert rest == [[]] * 1000, "closing the store ends every watch"

    run_with_store(tmp_path / "s.db", check)


async def _drain(events: AsyncIterator[WatchEvent]) -> list[WatchEvent]:
    return [event async for event in events]


def test_a_closed_store_refuses_calls(tmp_path: Path) -> None:
    async def check(store: SQLiteStore) -> None:
        await store.create("/k", b"")
        await store.close()
        await store.close()  # idempotent
        for call in (store.get("/k"), store.list("/"), store.create("/j", b""),
                     store.update("/k", b"", 1), store.delete("/k"), store.compact(1)):
            with pytest.raises(StoreError, match="closed"):
                await call
        assert await _drain(store.watch("/", 0)) == []

    run_with_store(tmp_path / "s.db", check)


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
