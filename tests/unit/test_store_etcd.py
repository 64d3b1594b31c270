"""EtcdStore's own behaviour on a real etcd: several clients, sizes, compaction, failures.

The protocol itself is tested on both backends in test_store.py and test_store_model.py;
here is what only a shared, replicated store has: a second API server's writes, the
compactors taking turns, a member that dies under a watch and a write, an etcd that is
not there, and etcd's request-size limit.
"""
from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Awaitable, Callable

import pytest

from kube32.sim.etcd import EtcdCluster
from kube32.store import Compacted, Conflict, StoreError, Unavailable, ValueTooLarge
from kube32.store.config import MAX_REQUEST_BYTES, parse_store
from tests.etcd import etcd_endpoints, need_etcd, new_prefix


def run(test: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(test())


async def open_store(cluster: EtcdCluster, prefix: str, **options: Any):
    from kube32.store.etcd import EtcdStore

    options.setdefault("compact_interval", None)
    return await EtcdStore.open(etcd_endpoints(cluster), prefix=prefix, **options)


async def take(events, count: int, timeout: float = 10) -> list:
    return [await asyncio.wait_for(anext(events), timeout) for _ in range(count)]


def test_two_api_servers_share_one_revision_and_see_each_others_writes(etcd_cluster: EtcdCluster) -> None:
    async def check() -> None:
        prefix = new_prefix()
        one, two = await open_store(etcd_cluster, prefix), await open_store(etcd_cluster, prefix)
        try:
            events = one.watch("/p/", 0)
            a = await one.create("/p/a", b"1")
            b = await two.update("/p/a", b"2", a.mod_revision)
            with pytest.raises(Conflict) as stale:
                await one.update("/p/a", b"3", a.mod_revision)
            assert stale.value.current == b
            assert await one.get("/p/a") == b
            assert one.current_revision == b.mod_revision, "a read shows the other's revision"
            assert [e.kv for e in await take(events, 2)] == [a, b]
            assert await two.list("/p/") == ([b], b.mod_revision)
            await events.aclose()
        finally:
            await one.close()
            await two.close()

    run(check)


def test_values_over_the_request_limit_are_refused_clearly(etcd_cluster: EtcdCluster) -> None:
    async def check() -> None:
        store = await open_store(etcd_cluster, new_prefix())
        try:
            three_mib = b"x" * (3 << 20)  # the API's largest body fits
            kv = await store.create("/big/fits", three_mib)
            assert (await store.get("/big/fits")).value == three_mib  # type: ignore[union-attr]
            with pytest.raises(ValueTooLarge, match=r"is 4194305 bytes, over the store's limit"):
                await store.update("/big/fits", b"x" * (MAX_REQUEST_BYTES + 1), kv.mod_revision)
            # An etcd that takes less than we think (someone else's, --max-request-bytes
            # 1.5 MiB by default): its refusal is the same error, naming the flag.
            store.max_value_bytes = 64 << 20
            size = MAX_REQUEST_BYTES + (1 << 20)
            with pytest.raises(ValueTooLarge, match="max-request-bytes") as refused:
                await store.create("/big/refused", b"x" * size)
            # etcd does not say its limit: the message must not quote kube32's as if it were.
            assert refused.value.limit is None and f"is {size} bytes, over etcd's request-size limit" in str(
                refused.value) and "store's limit" not in str(refused.value)
            assert await store.get("/big/refused") is None
            assert (await store.get("/big/fits")).mod_revision == kv.mod_revision  # type: ignore[union-attr]
        finally:
            await store.close()

    run(check)


def test_another_clients_compaction_is_a_compacted_watch_and_is_found_at_open(etcd_cluster: EtcdCluster) -> None:
    async def check() -> None:
        prefix = new_prefix()
        one, two = await open_store(etcd_cluster, prefix), await open_store(etcd_cluster, prefix)
        try:
            first = await one.create("/c/k", b"1")
            kv = first
            for i in range(5):
                kv = await one.update("/c/k", b"%d" % i, kv.mod_revision)
            await two.compact(kv.mod_revision - 1)
            with pytest.raises(Compacted) as gone:
                await take(one.watch("/c/", first.mod_revision), 1)
            assert gone.value.compacted_revision == kv.mod_revision - 1
            assert one.compacted_revision == kv.mod_revision - 1, "learned from etcd's answer"
            three = await open_store(etcd_cluster, prefix)
            assert three.compacted_revision == kv.mod_revision - 1, "found at open"
            await three.close()
        finally:
            await one.close()
            await two.close()

    run(check)


def test_the_compactors_take_turns_and_keep_an_interval_of_history(etcd_cluster: EtcdCluster) -> None:
    """As kube-apiserver's: each interval one of the stores compacts what was current one
    interval before; the compactors' key is never listed or watched."""
    async def check() -> None:
        prefix = new_prefix()
        interval = 0.4
        stores = [await open_store(etcd_cluster, prefix, compact_interval=interval) for _ in range(2)]
        try:
            events = stores[0].watch("", 0)
            kv = await stores[0].create("/k", b"0")
            marks = []
            for i in range(8):
                await asyncio.sleep(interval / 2)
                kv = await stores[i % 2].update("/k", b"%d" % i, kv.mod_revision)
                marks.append((time.monotonic(), kv.mod_revision))
            compacted = max(s.compacted_revision for s in stores)
            assert compacted > 0, "someone compacted"
            assert compacted < kv.mod_revision - 1, "at least an interval of history is kept"
            items, _ = await stores[1].list("")
            assert [i.key for i in items] == ["/k"], "the compactors' key is not a store key"
            assert {e.kv.key for e in await take(events, 9)} == {"/k"}
            await events.aclose()
        finally:
            for store in stores:
                await store.close()

    run(check)


def test_an_etcd_that_does_not_answer_is_unavailable_naming_it(tmp_path: Path) -> None:
    need_etcd()
    from kube32.sim.etcd import free_port
    from kube32.store.etcd import EtcdStore

    port = free_port("127.0.0.1")

    async def check() -> None:
        started = time.monotonic()
        with pytest.raises(Unavailable, match=f"etcd at 127.0.0.1:{port} did not answer"):
            await EtcdStore.open(f"127.0.0.1:{port}", request_timeout=1.0)
        assert time.monotonic() - started < 5

    run(check)


@pytest.mark.parametrize("text, cause", [
    ("etcd://", "HOST:PORT"), ("etcd://host", "HOST:PORT"), ("etcd://h:0", "HOST:PORT"),
    ("etcd://::1:2379", "IPv6 as"), ("mysql://x", "sqlite"), ("etcd://h:1/x", "HOST:PORT"),
])
def test_bad_store_urls_are_refused_with_a_cause(text: str, cause: str) -> None:
    with pytest.raises(StoreError, match=cause):
        parse_store(text)


def test_kube32_without_etcd_never_imports_grpc() -> None:
    code = ("import sys, kube32.sim.main, kube32.sim.controlplane, kube32.sim.etcd, kube32.store.config; "
            "assert 'grpc' not in sys.modules and 'aetcd' not in sys.modules, 'grpc imported'")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_store_urls() -> None:
    assert str(parse_store("sqlite")) == "sqlite" and not parse_store("sqlite").is_etcd
    spec = parse_store("etcd://127.0.0.1:2379,[::1]:2380,etcd.local:2381")
    assert spec.etcd == (("127.0.0.1", 2379), ("::1", 2380), ("etcd.local", 2381))
    assert str(spec) == "etcd://127.0.0.1:2379,[::1]:2380,etcd.local:2381"


def test_etcd_endpoints_off_loopback_are_named_for_the_plain_grpc_warning() -> None:
    from kube32.store.config import off_loopback

    assert off_loopback(parse_store("etcd://127.0.0.1:2379,[::1]:2380,localhost:2381,127.9.9.9:1")) == []
    assert off_loopback(parse_store("etcd://10.0.0.5:2379,[fe80::1]:2380")) == ["10.0.0.5:2379", "[fe80::1]:2380"]
    assert off_loopback(parse_store("etcd://etcd.local:2379")) == ["etcd.local:2379"]


async def create_through(store: Any, key: str) -> Any:
    """Create `key` as an API client does through an etcd election: a write whose outcome
    etcd could not tell (Unavailable) is sent again, and KeyExists then means it landed."""
    from kube32.store import KeyExists

    for _ in range(5):
        try:
            return await store.create(key, b"")
        except Unavailable:
            continue
        except KeyExists as exists:
            return exists.current
    raise AssertionError(f"{key}: etcd stayed unavailable")


def test_a_member_dies_under_writes_and_a_watch_nothing_is_lost(tmp_path: Path) -> None:
    """Three members; one is killed while a client of two of them watches and one of all
    three writes: writes go on through the others, the watch (resumed on the other member
    if it was on the dead one) misses nothing and repeats nothing, and the member that
    comes back has caught up."""
    need_etcd()
    from kube32.store.etcd import EtcdStore

    cluster = EtcdCluster(tmp_path / "etcd", members=3)
    cluster.start()
    dead = cluster.members[0]

    async def check() -> None:
        prefix = new_prefix()
        writer = await open_store(cluster, prefix)
        watcher = await EtcdStore.open(",".join(cluster.endpoints[:2]), prefix=prefix,
                                       compact_interval=None)
        events = watcher.watch("/m/", 0)
        written = []
        try:
            for i in range(20):
                written.append(await writer.create(f"/m/{i:02d}", b""))
            assert [e.kv for e in await take(events, 20)] == written
            cluster.kill(dead)
            stalled = time.monotonic()
            for i in range(20, 40):
                written.append(await create_through(writer, f"/m/{i:02d}"))
            assert time.monotonic() - stalled < 20, "writes go on after the election"
            got = await take(events, 20, timeout=30)
            assert [e.kv for e in got] == written[20:], "no gap and no duplicate"
            cluster.start_member(dead)
            cluster.wait_healthy(members=[dead])
            alone = await EtcdStore.open(cluster.endpoints[0], prefix=prefix, compact_interval=None)
            assert [kv.key for kv in (await alone.list("/m/"))[0]] == [kv.key for kv in written]
            await alone.close()
        finally:
            await events.aclose()
            await watcher.close()
            await writer.close()

    try:
        run(check)
    finally:
        cluster.stop()
