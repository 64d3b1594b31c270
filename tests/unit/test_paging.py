"""kube32.apiserver.paging and .watchstream: continue tokens, list and watch options as
kube-apiserver reads them, paged listings over a real SQLiteStore (compacted under them),
and a watch feed's bounded queue, shared encoding and bookmarks."""
from __future__ import annotations

import asyncio
import base64
import json
from pathlib import Path
from typing import AsyncGenerator

import pytest
from hypothesis import given, settings, strategies as st

from kube32.apiserver import errors, paging, watchstream
from kube32.apiserver.registry import INITIAL_END, PROGRESS, WatchItem, decode, encoded
from kube32.store import KeyValue
from kube32.apiserver.routing import query_flag
from kube32.store import SQLiteStore

PREFIX = "/registry/configmaps/ns/"


# --- tokens --------------------------------------------------------------------------
def test_a_token_round_trips_and_names_a_key_under_the_prefix() -> None:
    token = paging.encode_token(PREFIX, 42, PREFIX + "cm-1")
    assert "/" not in token and "=" not in token
    assert paging.decode_token(token, PREFIX) == (42, PREFIX + "cm-1")
    assert paging.decode_token(paging.encode_token(PREFIX, -1, PREFIX + "x"), PREFIX) == (-1, PREFIX + "x")


def _forge(doc: object) -> str:
    return base64.urlsafe_b64encode(json.dumps(doc).encode()).decode()


@pytest.mark.parametrize("token, said", [
    ("garbage", "not base64-encoded JSON"),
    ("%%%", "not base64-encoded JSON"),
    (_forge([1]), "its version"),
    (_forge({"v": "v9", "rv": 1, "start": "a"}), "its version"),
    (_forge({"v": "meta.k8s.io/v1", "rv": 0, "start": "a"}), "not a positive integer"),
    (_forge({"v": "meta.k8s.io/v1", "rv": "7", "start": "a"}), "not a positive integer"),
    (_forge({"v": "meta.k8s.io/v1", "rv": True, "start": "a"}), "not a positive integer"),
    (_forge({"v": "meta.k8s.io/v1", "rv": 3}), "no key"),
    (_forge({"v": "meta.k8s.io/v1", "rv": 3, "start": "../secrets/x"}), "does not stay within"),
    (_forge({"v": "meta.k8s.io/v1", "rv": 3, "start": "/etc"}), "does not stay within"),
    ("a" * 5000, "longer than"),
])
def test_a_bad_token_is_400_naming_the_cause(token: str, said: str) -> None:
    with pytest.raises(errors.APIError) as e:
        paging.decode_token(token, PREFIX)
    assert e.value.code == 400 and said in e.value.message, e.value.message


# --- options -------------------------------------------------------------------------
def test_list_options_follow_kube_apiserver() -> None:
    o = paging.list_options
    assert o({}, PREFIX) == paging.ListOptions()
    assert o({"limit": "5"}, PREFIX) == paging.ListOptions(5)
    assert o({"resourceVersion": "0"}, PREFIX) == paging.ListOptions()
    assert o({"resourceVersion": "9"}, PREFIX) == paging.ListOptions(not_older_than=9)
    assert o({"resourceVersion": "9", "limit": "2"}, PREFIX) == paging.ListOptions(2, revision=9)  # legacy Exact
    assert o({"resourceVersion": "9", "limit": "2", "resourceVersionMatch": "NotOlderThan"},
             PREFIX) == paging.ListOptions(2, not_older_than=9)
    assert o({"resourceVersion": "9", "resourceVersionMatch": "Exact"}, PREFIX) == paging.ListOptions(revision=9)
    token = paging.encode_token(PREFIX, 7, PREFIX + "b")
    assert o({"continue": token, "limit": "1"}, PREFIX) == paging.ListOptions(1, PREFIX + "b", 7, continued=True)
    for bad, said in [({"limit": "-1"}, "non-negative"), ({"limit": "x"}, "non-negative"),
                      ({"resourceVersion": "x"}, "invalid resource version"),
                      ({"resourceVersionMatch": "Exact"}, "unless resourceVersion is provided"),
                      ({"resourceVersionMatch": "Exact", "resourceVersion": "0"}, "forbidden for resourceVersion"),
                      ({"resourceVersionMatch": "Maybe", "resourceVersion": "1"}, "Unsupported value"),
                      ({"continue": token, "resourceVersion": "1"}, "not allowed when using continue"),
                      ({"continue": token, "resourceVersionMatch": "Exact"}, "not allowed when using continue")]:
        with pytest.raises(errors.APIError) as e:
            o(bad, PREFIX)
        assert e.value.code == 400 and said in e.value.message, (bad, e.value.message)


def test_watch_options_follow_kube_apiserver() -> None:
    def o(q: dict[str, str]) -> paging.WatchOptions:
        return paging.watch_options(q, query_flag)
    assert o({}) == paging.WatchOptions(initial=True)
    assert o({"resourceVersion": "5", "allowWatchBookmarks": "true"}) == paging.WatchOptions(True, start=5)
    assert o({"sendInitialEvents": "true", "resourceVersionMatch": "NotOlderThan", "allowWatchBookmarks": "1",
              "resourceVersion": "3"}) == paging.WatchOptions(True, True, True, not_older_than=3)
    assert o({"sendInitialEvents": "false", "resourceVersionMatch": "NotOlderThan", "allowWatchBookmarks": "1",
              "resourceVersion": "3"}) == paging.WatchOptions(True, start=3)
    for bad in [{"resourceVersionMatch": "NotOlderThan", "resourceVersion": "1"},
                {"sendInitialEvents": "true", "allowWatchBookmarks": "1"},
                {"sendInitialEvents": "true", "resourceVersionMatch": "NotOlderThan"}]:
        with pytest.raises(errors.APIError) as e:
            o(bad)
        assert e.value.code == 400


# --- listings over a real store ------------------------------------------------------
async def _filled(path: Path, n: int) -> SQLiteStore:
    store = await SQLiteStore.open(path / "s.db", history=0, compact_every=1_000_000)
    for i in range(n):
        obj = {"kind": "ConfigMap", "metadata": {"name": f"cm-{i}", "labels": {"odd": str(i % 2)}}}
        await store.create(f"{PREFIX}cm-{i}", json.dumps(obj).encode())
    return store


async def _all(listing: paging.Listing) -> list[str]:
    return [item.object["metadata"]["name"] async for item in listing if item.object is not None]


def test_pages_of_a_listing_are_the_state_at_the_first_page(tmp_path: Path) -> None:
    async def go() -> None:
        store = await _filled(tmp_path, 5)
        first = await paging.Listing(store, PREFIX, paging.ListOptions(2), decode, None).open()
        assert await _all(first) == ["cm-0", "cm-1"] and first.metadata()["remainingItemCount"] == 3
        await store.delete(f"{PREFIX}cm-2")
        names = []
        token = first.token
        while token:
            page = await paging.Listing(store, PREFIX, paging.list_options({"limit": "2", "continue": token}, PREFIX),
                                        decode, None).open()
            names += await _all(page)
            assert page.revision == first.revision
            token = page.token
        assert names == ["cm-2", "cm-3", "cm-4"]
        odd = paging.Listing(store, PREFIX, paging.ListOptions(1), decode,
                             lambda obj: obj["metadata"]["labels"]["odd"] == "1")
        await odd.open()
        assert await _all(odd) == ["cm-1"] and "remainingItemCount" not in odd.metadata() and odd.token
        await store.close()
    asyncio.run(go())


def test_a_listing_turns_the_loop_by_bytes_not_per_object(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Small objects share a turn of the event loop (a turn each cost more than the
    object); a big one has one of its own, so no list holds the loop for long."""
    turns = [0]
    real_sleep = asyncio.sleep

    async def counted(delay: float, *args: object) -> object:
        turns[0] += delay == 0
        return await real_sleep(delay, *args)

    async def go() -> None:
        store = await _filled(tmp_path, 300)   # about 80 bytes each
        monkeypatch.setattr(paging.asyncio, "sleep", counted)
        listing = await paging.Listing(store, PREFIX, paging.ListOptions(), decode, None).open()
        assert len(await _all(listing)) == 300
        assert turns[0] <= 1
        for i in range(3):
            await store.create(f"{PREFIX}big-{i}", json.dumps({"metadata": {"name": f"big-{i}"},
                                                                "data": {"x": "y" * paging.TURN_BYTES}}).encode())
        turns[0] = 0
        listing = await paging.Listing(store, PREFIX, paging.ListOptions(), decode, None).open()
        assert len(await _all(listing)) == 303 and turns[0] >= 3
        await store.close()
    asyncio.run(go())


def test_a_compacted_token_is_410_with_a_token_that_goes_on(tmp_path: Path) -> None:
    async def go() -> None:
        store = await _filled(tmp_path, 4)
        first = await paging.Listing(store, PREFIX, paging.ListOptions(2), decode, None).open()
        await _all(first)
        await store.create(f"{PREFIX}cm-9", b'{"metadata":{"name":"cm-9"}}')
        await store.compact(store.current_revision)
        options = paging.list_options({"limit": "5", "continue": first.token}, PREFIX)
        with pytest.raises(paging.Expired) as e:
            await paging.Listing(store, PREFIX, options, decode, None).open()
        assert e.value.code == 410 and "start a new list" in e.value.message
        fresh = e.value.status()["metadata"]["continue"]
        options = paging.list_options({"limit": "5", "continue": fresh}, PREFIX)
        rest = await paging.Listing(store, PREFIX, options, decode, None).open()
        assert await _all(rest) == ["cm-2", "cm-3", "cm-9"]
        with pytest.raises(paging.Expired):
            await paging.Listing(store, PREFIX, paging.ListOptions(revision=first.revision), decode, None).open()
        with pytest.raises(errors.APIError) as too_new:
            await paging.Listing(store, PREFIX, paging.ListOptions(not_older_than=10**6), decode, None).open()
        assert too_new.value.code == 504
        await store.close()
    asyncio.run(go())


def test_a_streamed_list_is_json_with_its_metadata_last() -> None:
    async def items():
        for i in range(3):
            yield paging.dumps({"i": i})

    async def go() -> bytes:
        return b"".join([p async for p in paging.encoded_list({"kind": "L"}, "items", items(),
                                                             lambda: {"metadata": {"continue": "t"}})])
    assert json.loads(asyncio.run(go())) == {"kind": "L", "items": [{"i": 0}, {"i": 1}, {"i": 2}],
                                             "metadata": {"continue": "t"}}


@pytest.mark.parametrize("stored", [
    b'{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"a"},"data":{"metadata":"x"}}',
    b'{"metadata":{},"kind":"X"}',
    b'{"kind":"X","spec":{"template":{"metadata":{"name":"inner"}}},"metadata":{"name":"outer"}}',
    b'{"kind":"a\\"metadata\\":{","metadata":{"labels":{"\\"metadata\\":{":"1"}}}',
    b'{"kind":"X"}',
    b'{"kind":"a{","metadata":{"name":"b"}}',
    b'{"kind":"}{","x":"\\\\","metadata":{"name":"b"}}',
    b'{"kind":"[","metadata":{"name":"b"}}',
    b'{"x":{"a":"b"},"metadata":{"name":"b"}}',
])
def test_the_stored_bytes_answer_as_the_decoded_object(stored: bytes) -> None:
    kv = KeyValue("/k", stored, 3, 9)
    assert json.loads(encoded(kv)) == decode(kv)


_TEXT = st.text(alphabet='ab{}[]"\\:,m', max_size=6)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(_TEXT, st.one_of(_TEXT, st.dictionaries(_TEXT, _TEXT, max_size=2),
                                           st.lists(_TEXT, max_size=2))), max_size=4),
       st.integers(0, 4), st.dictionaries(_TEXT, _TEXT, max_size=2))
def test_any_stored_head_answers_as_the_decoded_object(before: list, at: int, md: dict) -> None:
    fields = [(k, v) for k, v in before if k != "metadata"]
    fields.insert(min(at, len(fields)), ("metadata", md))
    kv = KeyValue("/k", json.dumps(dict(fields), separators=(",", ":")).encode(), 3, 9)
    assert json.loads(encoded(kv)) == decode(kv)


# --- watch feeds ---------------------------------------------------------------------
def _obj(name: str, rv: int, size: int = 0) -> dict:
    return {"kind": "ConfigMap", "metadata": {"name": name, "namespace": "ns", "resourceVersion": str(rv)},
            "data": {"x": "y" * size}}


def test_one_event_is_encoded_once_for_every_watcher() -> None:
    enc = watchstream.WatchEncoder()
    obj = _obj("a", 5)
    lines = {enc.encode("configmaps", WatchItem("MODIFIED", obj, 5)) for _ in range(100)}
    assert len(lines) == 1 and enc.encoded == 1
    assert enc.encode("configmaps", WatchItem("DELETED", obj, 5, derived=True)) != lines.pop()


def test_a_watcher_that_does_not_read_is_dropped_and_the_writer_never_waits() -> None:
    async def events() -> AsyncGenerator[WatchItem, None]:
        for rv in range(1, 10_000):
            yield WatchItem("MODIFIED", _obj("a", rv, 100_000), rv)

    async def go() -> watchstream.WatchFeed:
        feed = watchstream.WatchFeed(events(), lambda item: watchstream.line(item.type, item.object or {}),
                                     "ConfigMap", "v1", bookmarks=False, timeout=30)
        lines = feed.lines()
        await anext(lines)            # read one, then stall: the pump fills the queue
        await asyncio.sleep(0.5)
        got = [line async for line in lines]
        assert len(got) * 100_000 <= watchstream.QUEUE_BYTES + 200_000
        return feed
    assert asyncio.run(asyncio.wait_for(go(), 20)).dropped


def test_bookmarks_come_periodically_and_before_the_timeout_at_the_watch_progress() -> None:
    async def events() -> AsyncGenerator[WatchItem, None]:
        yield WatchItem("ADDED", _obj("a", 3), 3, initial=True)
        yield WatchItem(INITIAL_END, None, 3)
        await asyncio.sleep(0.3)
        yield WatchItem(PROGRESS, None, 7)       # a write the selectors drop
        await asyncio.sleep(10)

    async def go() -> list[dict]:
        feed = watchstream.WatchFeed(events(), lambda item: watchstream.line(item.type, item.object or {}),
                                     "ConfigMap", "v1", bookmarks=True, timeout=2.5, initial_end_mark=True,
                                     interval=0.5)
        return [json.loads(line) async for line in feed.lines()]
    got = asyncio.run(asyncio.wait_for(go(), 10))
    assert [e["type"] for e in got[:2]] == ["ADDED", "BOOKMARK"]
    assert got[1]["object"]["metadata"] == {"resourceVersion": "3",
                                            "annotations": {"k8s.io/initial-events-end": "true"}}
    marks = [e["object"] for e in got[2:]]
    assert 3 <= len(marks) <= 6 and all(set(m) == {"kind", "apiVersion", "metadata"} for m in marks), got
    assert marks[-1]["metadata"] == {"resourceVersion": "7"}
