"""A page of the SQLite store at a past revision (every page after a list's first, once
anything was written meanwhile) reads each key's latest version from the index on
(key, revision), not every logged version's row (issue 25: a list of a thousand pods
read the whole log, values and all, for each of its 64-key chunks)."""
from __future__ import annotations

import asyncio

from kube32.store import SQLiteStore
from kube32.store.sqlite import _STATE_AT


def test_a_past_page_is_planned_on_the_index_and_right() -> None:
    async def main() -> None:
        s = await SQLiteStore.open(":memory:")
        try:
            kvs = [await s.create(f"/p/{i:03d}", b"v0") for i in range(100)]
            for _ in range(3):
                kvs = [await s.update(kv.key, b"v1", kv.mod_revision) for kv in kvs]
            at = s.current_revision
            await s.delete("/p/000")
            await s.create("/p/zzz", b"new")
            kvs = [await s.update(kv.key, b"v2", kv.mod_revision) for kv in kvs[1:]]
            plan = " ".join(str(r) for r in s._db.execute(
                "EXPLAIN QUERY PLAN " + _STATE_AT.format(range="key >= ? AND key < ?") + " LIMIT ?",
                (at, "/p/", "/p0", "", 10)).fetchall())
            assert "COVERING INDEX log_key_revision" in plan, plan
            page = await s.page("/p/", after="/p/049", limit=10, revision=at)
            assert [kv.key for kv in page.items] == [f"/p/{i:03d}" for i in range(50, 60)]
            assert {kv.value for kv in page.items} == {b"v1"} and page.remaining == 40
            first = await s.page("/p/", limit=2, revision=at)
            assert [kv.key for kv in first.items] == ["/p/000", "/p/001"]   # deleted since: there at `at`
        finally:
            await s.close()
    asyncio.run(main())


def test_a_chunk_asks_no_count_of_what_follows() -> None:
    async def main() -> None:
        s = await SQLiteStore.open(":memory:")
        try:
            for i in range(10):
                await s.create(f"/p/{i}", b"v")
            counted = []
            real = s._page_rows

            def rows(*args, **kwargs):   # type: ignore[no-untyped-def]
                counted.append(kwargs.get("count", False))
                return real(*args, **kwargs)
            s._page_rows = rows  # type: ignore[method-assign]
            page = await s.page("/p/", limit=4, count=False)
            assert [kv.key for kv in page.items] == ["/p/0", "/p/1", "/p/2", "/p/3"] and page.remaining > 0
            last = await s.page("/p/", after="/p/5", limit=4, count=False)
            assert [kv.key for kv in last.items] == ["/p/6", "/p/7", "/p/8", "/p/9"] and last.remaining == 0
            assert counted == [False, False]             # no COUNT of the rest of the range
            assert (await s.page("/p/", limit=4)).remaining == 6   # asked for: exact
        finally:
            await s.close()
    asyncio.run(main())


def test_automatic_compaction_keeps_the_last_minutes_too(monkeypatch) -> None:
    # Issue 25: 10,000 revisions were 30 s of a 1,000-node fleet; watches resumed from a
    # bookmark found theirs compacted and a thousand kubelets listed every pod again.
    import kube32.store.sqlite as sq
    clock = [1000.0]
    monkeypatch.setattr(sq.time, "monotonic", lambda: clock[0])

    async def main() -> None:
        s = sq.SQLiteStore(":memory:", history=10, compact_every=5, history_seconds=300.0)
        try:
            kv = await s.create("/k", b"0")
            for i in range(40):
                kv = await s.update("/k", str(i).encode(), kv.mod_revision)
            assert s.compacted_revision == 0            # all of it younger than 300 s
            clock[0] += 301
            for i in range(10):
                kv = await s.update("/k", str(i).encode(), kv.mod_revision)
            assert 0 < s.compacted_revision <= 41       # what is older than 300 s may go
        finally:
            await s.close()
    asyncio.run(main())
