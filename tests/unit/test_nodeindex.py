"""kube32.apiserver.nodeindex: lists of pods by spec.nodeName from a watch-fed index, as
consistent reads from cache (KEP-2340): the answer is what a scan of the store answers
at the index's revision, and that revision is at least the store's when the list began
(issue 25: one node's list read and filtered every pod)."""
from __future__ import annotations

import asyncio
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kube32.apiserver import nodeindex, paging
from kube32.apiserver.binding import _bound
from kube32.apiserver.nodeindex import NodeListing, NodeIndex
from kube32.apiserver.registry import Registry, decode
from kube32.apiserver.resources import by_plural
from kube32.apiserver.selectors import parse_field_selector, parse_label_selector
from kube32.store import KeyValue, SQLiteStore

PODS, CMS = by_plural("pods"), by_plural("configmaps")
NAMESPACES = ("default", "other")
NODES = ("", "n1", "n2", "n3")


def pod(name: str, ns: str, node: str, label: str = "a") -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "main", "image": "sha256:" + "0" * 64}]}
    if node:
        spec["nodeName"] = node
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": ns, "labels": {"l": label}},
            "spec": spec}


async def _cluster(index: bool = True) -> tuple[Registry, SQLiteStore]:
    store = await SQLiteStore.open(":memory:")
    registry = Registry(store)
    for ns in NAMESPACES:
        await registry.create(by_plural("namespaces"), None, {"metadata": {"name": ns}}, check_namespace=False)
    if index:
        registry.pods_by_node = NodeIndex(store, registry.shared_decode)
        await registry.pods_by_node.start()
    return registry, store


async def _close(registry: Registry, store: SQLiteStore) -> None:
    if registry.pods_by_node is not None:
        await registry.pods_by_node.close()
    await store.close()


async def _list(registry: Registry, ns: str | None, fields: str, labels: str | None = None,
                options: paging.ListOptions | None = None) -> tuple[paging.Listing, list[KeyValue]]:
    listing = await registry.listing(PODS, ns, parse_label_selector(labels), parse_field_selector(fields),
                                     options or paging.ListOptions()).open()
    return listing, [item.kv async for item in listing]


async def _scan(registry: Registry, ns: str | None, fields: str, labels: str | None, revision: int,
                limit: int = 0) -> tuple[list[KeyValue], str]:
    """What today's scan answers at ``revision``: its items and continue token."""
    fs, ls = parse_field_selector(fields), parse_label_selector(labels)
    listing = await paging.Listing(registry.store, PODS.prefix(ns), paging.ListOptions(limit, revision=revision),
                                   decode, lambda obj: Registry.matches(PODS, obj, ls, fs)).open()
    return [item.kv async for item in listing], listing.token


def test_a_list_by_node_reads_its_pods_only_and_sees_a_write_at_once() -> None:
    async def main() -> None:
        registry, store = await _cluster()
        index = registry.pods_by_node
        assert index is not None
        try:
            for i in range(30):
                await registry.create(PODS, "default", pod(f"p{i:02}", "default", NODES[i % 4]))
            decoded: list[str] = []
            real = registry._shared_decode

            def counted(kv: KeyValue) -> Any:
                decoded.append(kv.key)
                return real(kv)
            registry._shared_decode = counted  # type: ignore[method-assign]
            listing, kvs = await _list(registry, None, "spec.nodeName=n1")
            assert isinstance(listing, NodeListing) and listing.indexed is not None
            assert [kv.key.rsplit("/", 1)[1] for kv in kvs] == [f"p{i:02}" for i in range(1, 30, 4)]
            assert listing.revision == store.current_revision
            assert set(decoded) <= {kv.key for kv in kvs}   # no other pod decoded
            # Read-your-writes: a pod bound, then listed in the same turn of the loop.
            await registry.create(PODS, "default", pod("new", "default", ""))
            await registry.mutate(PODS, "default", "new", lambda p: _bound(p, "new", "n1", {}), subresource="binding")
            await registry.create(CMS, "default", {"metadata": {"name": "c"}})   # another kind's write last
            listing, kvs = await _list(registry, "default", "spec.nodeName=n1")
            assert listing.indexed is not None and listing.revision == store.current_revision
            assert PODS.key("default", "new") in {kv.key for kv in kvs}
            assert (kvs, "") == await _scan(registry, "default", "spec.nodeName=n1", None, listing.revision)
            # The pending pods (the scheduler's list): spec.nodeName= selects the unbound.
            listing, kvs = await _list(registry, None, "spec.nodeName=")
            assert listing.indexed is not None and len(kvs) == 8   # p00, p04, ... p28
            index.check()
        finally:
            await _close(registry, store)
    asyncio.run(main())


def test_what_the_index_does_not_answer_is_the_scan() -> None:
    async def main() -> None:
        registry, store = await _cluster()
        try:
            for i in range(5):
                await registry.create(PODS, "default", pod(f"p{i}", "default", "n1"))
            for options in (paging.ListOptions(limit=3), paging.ListOptions(revision=store.current_revision)):
                listing, kvs = await _list(registry, None, "spec.nodeName=n1", options=options)
                assert listing.indexed is None if isinstance(listing, NodeListing) else True
                assert len(kvs) == (3 if options.limit else 5) and bool(listing.token) == bool(options.limit)
            listing, kvs = await _list(registry, None, "spec.nodeName=n1", options=paging.ListOptions(limit=6))
            assert isinstance(listing, NodeListing) and listing.indexed is not None   # one page: kubectl's 500
            assert len(kvs) == 5 and not listing.token
            listing, _ = await _list(registry, None, "spec.nodeName!=n1")
            assert not isinstance(listing, NodeListing)
            # A revision the store has not reached: the scan's 504, not a wait.
            try:
                await _list(registry, None, "spec.nodeName=n1",
                            options=paging.ListOptions(not_older_than=store.current_revision + 5))
            except Exception as e:  # noqa: BLE001
                assert getattr(e, "code", None) == 504, e
            else:
                raise AssertionError("no 504")
            # Not started, or stopped: the scan.
            index = registry.pods_by_node
            assert index is not None
            await index.close()
            listing, kvs = await _list(registry, None, "spec.nodeName=n1")
            assert isinstance(listing, NodeListing) and listing.indexed is None and len(kvs) == 5
        finally:
            await _close(registry, store)
    asyncio.run(main())


def test_an_index_that_cannot_catch_up_falls_back_within_its_wait() -> None:
    async def main() -> None:
        registry, store = await _cluster()
        index = registry.pods_by_node
        assert index is not None and index._task is not None
        index.wait = 0.3
        try:
            await registry.create(PODS, "default", pod("p", "default", "n1"))
            index._task.cancel()              # the watch no longer read: never at the store's revision
            await asyncio.gather(index._task, return_exceptions=True)
            index.synced = True
            await registry.create(PODS, "default", pod("q", "default", "n1"))
            loop = asyncio.get_running_loop()
            began = loop.time()
            listing, kvs = await _list(registry, None, "spec.nodeName=n1")
            assert loop.time() - began < 1.0
            assert isinstance(listing, NodeListing) and listing.indexed is None
            assert len(kvs) == 2 and index.fell_back == 1
        finally:
            await _close(registry, store)
    asyncio.run(main())


def test_a_failed_watch_relists_and_serves_again() -> None:
    async def main() -> None:
        registry, store = await _cluster()
        index = registry.pods_by_node
        assert index is not None
        old_pause, nodeindex.RESTART_PAUSE = nodeindex.RESTART_PAUSE, 0.05
        try:
            await registry.create(PODS, "default", pod("p", "default", "n1"))
            for _ in range(3):
                await asyncio.sleep(0)
            assert index._stream is not None and len(store._progress_watchers) == 1
            for watcher in store._progress_watchers:
                watcher.close()              # the store ends the index's watch
            await asyncio.sleep(0)
            assert not index.synced
            await registry.create(PODS, "default", pod("q", "default", "n2"))
            listing, kvs = await _list(registry, None, "spec.nodeName=n2")
            assert len(kvs) == 1
            for _ in range(50):
                await asyncio.sleep(0.02)
                if index.synced and index._stream is not None:
                    break
            await registry.create(PODS, "default", pod("r", "default", "n2"))
            listing, kvs = await _list(registry, None, "spec.nodeName=n2")
            assert isinstance(listing, NodeListing) and listing.indexed is not None and len(kvs) == 2
            index.check()
        finally:
            nodeindex.RESTART_PAUSE = old_pause
            await _close(registry, store)
    asyncio.run(main())


# --- the model: random writes, every answer is the scan at its revision -------------------
op = st.one_of(
    st.tuples(st.just("create"), st.integers(0, 7), st.sampled_from(NAMESPACES), st.sampled_from(NODES),
              st.sampled_from("ab")),
    st.tuples(st.just("label"), st.integers(0, 7), st.sampled_from(NAMESPACES), st.sampled_from("ab")),
    st.tuples(st.just("bind"), st.integers(0, 7), st.sampled_from(NAMESPACES), st.sampled_from(NODES[1:])),
    st.tuples(st.just("move"), st.integers(0, 7), st.sampled_from(NAMESPACES), st.sampled_from(NODES)),
    st.tuples(st.just("delete"), st.integers(0, 7), st.sampled_from(NAMESPACES)),
    st.tuples(st.just("other"), st.integers(0, 3)),     # another kind's write: the store's revision moves on
    st.tuples(st.just("turn"),),                         # the loop's turn: the index may read what is queued
    st.tuples(st.just("list"), st.sampled_from((None, *NAMESPACES)), st.sampled_from(NODES),
              st.sampled_from((None, "l=a", "l!=a")), st.booleans(), st.sampled_from((0, 0, 2, 500))),
)


async def _step(registry: Registry, store: SQLiteStore, step: tuple[Any, ...]) -> bool:
    """Run one step; True when it was a list answered from the index."""
    kind = step[0]
    if kind in ("create", "label", "bind", "move", "delete"):
        name, ns = f"p{step[1]}", step[2]
        current = await registry.try_get(PODS, ns, name)
        if kind == "create" and current is None:
            await registry.create(PODS, ns, pod(name, ns, step[3], step[4]))
        elif current is not None and kind == "label":
            await registry.patch(PODS, ns, name, "application/merge-patch+json",
                                 {"metadata": {"labels": {"l": step[3]}}})
        elif current is not None and kind == "bind" and not current["spec"].get("nodeName"):
            await registry.mutate(PODS, ns, name, lambda p: _bound(p, name, step[3], {}), subresource="binding")
        elif current is not None and kind == "move":
            await registry.replace(PODS, ns, name, pod(name, ns, step[3]), expected_uid=current["metadata"]["uid"])
        elif current is not None and kind == "delete":
            await registry.delete(PODS, ns, name)
    elif kind == "other":
        name = f"c{step[1]}"
        if await registry.try_get(CMS, "default", name) is None:
            await registry.create(CMS, "default", {"metadata": {"name": name}})
        else:
            await registry.delete(CMS, "default", name)
    elif kind == "turn":
        await asyncio.sleep(0)
    else:
        _, ns, node, labels, rv0, limit = step
        fields = f"spec.nodeName={node}" + (",metadata.name!=p3" if labels == "l!=a" else "")
        began = store.current_revision
        options = paging.ListOptions(limit=limit, not_older_than=0) if rv0 else paging.ListOptions(limit=limit)
        listing, kvs = await _list(registry, ns, fields, labels, options)
        assert listing.revision >= began
        assert (kvs, listing.token) == await _scan(registry, ns, fields, labels, listing.revision, limit)
        served = isinstance(listing, NodeListing) and listing.indexed is not None
        assert served or limit, "a live index answers every list by node that holds in a page"
        return served
    return False


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(op, min_size=1, max_size=40))
def test_the_index_answers_what_the_scan_answers_at_its_revision(steps: list[tuple[Any, ...]]) -> None:
    async def main() -> None:
        registry, store = await _cluster()
        index = registry.pods_by_node
        assert index is not None
        try:
            served = lists = 0
            for step in [*steps, ("list", None, "n1", None, False, 0)]:
                served += await _step(registry, store, step)
                lists += step[0] == "list"
                index.check()
            assert served and lists
        finally:
            await _close(registry, store)
    asyncio.run(main())


def test_a_list_by_name_reads_that_names_keys_and_pages_with_the_namespaces_tokens() -> None:
    # Issue 25: `metadata.name=<x>` (a kubelet's Node, `kubectl get pod x -w`) read and
    # decoded every object of the kind.
    async def main() -> None:
        registry, store = await _cluster(index=False)
        try:
            for name in ("a", "ab", "abc", "b"):
                await registry.create(PODS, "default", pod(name, "default", "n1"))
            read: list[str] = []
            page = store.page

            async def spied(prefix: str, **kw: Any) -> Any:
                read.append(prefix)
                return await page(prefix, **kw)
            store.page = spied  # type: ignore[method-assign]
            fields = parse_field_selector("metadata.name=a")
            listing = await registry.listing(PODS, "default", None, fields, paging.ListOptions()).open()
            assert [i.kv.key async for i in listing] == [PODS.key("default", "a")]
            assert read == [PODS.key("default", "a")]
            # A token of a list of the namespace still continues one by name.
            options = paging.list_options({"limit": "1"}, PODS.prefix("default"))
            first = await registry.listing(PODS, "default", None, parse_field_selector("metadata.name!=b"),
                                           options).open()
            assert [i.kv.key async for i in first] == [PODS.key("default", "a")] and first.token
            options = paging.list_options({"limit": "5", "continue": first.token}, PODS.prefix("default"))
            rest = await registry.listing(PODS, "default", None, parse_field_selector("metadata.name=abc"),
                                          options).open()
            assert [i.kv.key async for i in rest] == [PODS.key("default", "abc")]
        finally:
            await _close(registry, store)
    asyncio.run(main())
