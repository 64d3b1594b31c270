"""nodePorts allocated cluster-wide through the store (kube32.apiserver.nodeports), with
the registry's claims: one Service per port in the whole cluster, in the range, freed on
delete and update, one winner of a race, leftovers taken over only when old
(issue 19, attack round 19)."""
from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any, Awaitable, Callable

import pytest

from kube32.apiserver import errors, nodeports
from kube32.apiserver.registry import Registry
from kube32.apiserver.resources import by_plural
from kube32.store import Store
from tests.unit.store_backends import Backend, backend, sqlite_backend  # noqa: F401 - the fixture

SERVICES = by_plural("services")
NAMESPACES = ("default", "other", *(f"ns{i}" for i in range(20)))


def svc(name: str, *ports: int | None, kind: str = "NodePort", **spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": name},
            "spec": {"type": kind, "selector": {"app": name},
                     "ports": [{"name": f"p{i}", "port": 80 + i, **({"nodePort": n} if n is not None else {})}
                               for i, n in enumerate(ports)], **spec}}


def run(tmp_path: Path, test: Callable[[Registry, nodeports.NodePortAllocator], Awaitable[None]],
        ports: range = nodeports.NODE_PORT_RANGE, backend: Backend | None = None) -> None:
    async def go(store: Store) -> None:
        reg = Registry(store)
        allocator = nodeports.NodePortAllocator(store, ports)
        reg.claims["services"] = allocator
        for ns in NAMESPACES:
            await reg.create(by_plural("namespaces"), None, {"metadata": {"name": ns}}, check_namespace=False)
        await test(reg, allocator)
    (backend or sqlite_backend(tmp_path / "store.db")).run(go)


async def refused(coro: Awaitable[Any]) -> errors.APIError:
    with pytest.raises(errors.APIError) as e:
        await coro
    return e.value


def node_port(obj: dict[str, Any], i: int = 0) -> int:
    return obj["spec"]["ports"][i]["nodePort"]


def test_a_port_allocated_in_one_namespace_is_refused_in_another(tmp_path: Path, backend: Backend) -> None:  # noqa: F811
    async def test(reg: Registry, _: Any) -> None:
        await reg.create(SERVICES, "default", svc("sec-np", 31000))
        e = await refused(reg.create(SERVICES, "other", svc("steal", 31000)))
        assert e.code == 422 and e.message == ('Service "steal" is invalid: spec.ports[0].nodePort: Invalid value: '
                                               '31000: provided port is already allocated'), e.message
        assert await reg.try_get(SERVICES, "other", "steal") is None
    run(tmp_path, test, backend=backend)


@pytest.mark.parametrize("port", [80, 6443, 10250, 29999, 32768, 65535])
def test_a_port_outside_the_range_is_refused(tmp_path: Path, port: int) -> None:
    async def test(reg: Registry, _: Any) -> None:
        e = await refused(reg.create(SERVICES, "other", svc("np", port)))
        assert e.code == 422 and e.message == (
            f'Service "np" is invalid: spec.ports[0].nodePort: Invalid value: {port}: provided port is not in the '
            "valid range. The range of valid ports is 30000-32767"), e.message
    run(tmp_path, test)


def test_ports_left_out_are_given_free_ones_of_the_range(tmp_path: Path) -> None:
    async def test(reg: Registry, _: Any) -> None:
        taken = [node_port(await reg.create(SERVICES, "default", svc("fixed", 31000)))]
        for i in range(40):
            out = await reg.create(SERVICES, NAMESPACES[i % len(NAMESPACES)], svc(f"auto-{i}", None, None))
            taken += [node_port(out, 0), node_port(out, 1)]
        assert len(set(taken)) == len(taken) and all(p in nodeports.NODE_PORT_RANGE for p in taken)
    run(tmp_path, test)


def test_of_creates_at_once_for_one_port_exactly_one_wins(tmp_path: Path, backend: Backend) -> None:  # noqa: F811
    """On etcd too: several API servers on one etcd claim through its transactions."""
    async def test(reg: Registry, _: Any) -> None:
        results = await asyncio.gather(*(reg.create(SERVICES, ns, svc("race", 31234)) for ns in NAMESPACES),
                                       return_exceptions=True)
        won = [r for r in results if isinstance(r, dict)]
        lost = [r for r in results if isinstance(r, errors.APIError) and "already allocated" in r.message]
        assert len(won) == 1 and len(lost) == len(NAMESPACES) - 1, results
        autos = await asyncio.gather(*(reg.create(SERVICES, ns, svc("auto", None)) for ns in NAMESPACES))
        assert len({node_port(a) for a in autos} | {31234}) == len(NAMESPACES) + 1
    run(tmp_path, test, backend=backend)


def test_delete_and_update_free_what_the_service_no_longer_holds(tmp_path: Path) -> None:
    async def test(reg: Registry, _: Any) -> None:
        await reg.create(SERVICES, "default", svc("a", 31000, 31001))
        await reg.delete(SERVICES, "default", "a")
        await reg.create(SERVICES, "other", svc("b", 31000))            # freed by the delete
        await reg.patch(SERVICES, "other", "b", "application/merge-patch+json",
                        {"spec": {"ports": [{"name": "p0", "port": 80, "nodePort": 31002}]}})
        await reg.create(SERVICES, "default", svc("c", 31000))          # freed by the update
        e = await refused(reg.create(SERVICES, "default", svc("d", 31002)))
        assert "already allocated" in e.message
        # To ClusterIP: the nodePorts the update carried over go, and are free.
        out, _ = await reg.patch(SERVICES, "other", "b", "application/merge-patch+json", {"spec": {"type": "ClusterIP"}})
        assert "nodePort" not in out["spec"]["ports"][0], out["spec"]
        await reg.create(SERVICES, "default", svc("d", 31002))
    run(tmp_path, test)


def test_an_update_that_leaves_the_port_out_keeps_it(tmp_path: Path) -> None:
    """kubectl apply of a manifest without nodePorts: the ports stay as they were."""
    async def test(reg: Registry, _: Any) -> None:
        first = await reg.create(SERVICES, "default", svc("web", None))
        again = svc("web", None)
        again["metadata"]["resourceVersion"] = first["metadata"]["resourceVersion"]
        out = await reg.update(SERVICES, "default", "web", again)
        assert node_port(out) == node_port(first)
        assert out["metadata"]["resourceVersion"] == first["metadata"]["resourceVersion"]   # a no-op
    run(tmp_path, test)


def test_a_write_that_fails_gives_its_claims_back(tmp_path: Path) -> None:
    async def test(reg: Registry, _: Any) -> None:
        await reg.create(SERVICES, "default", svc("dup", 31000))
        e = await refused(reg.create(SERVICES, "default", svc("dup", 31005)))   # the name is taken
        assert e.code == 409
        e = await refused(reg.create(SERVICES, "default", svc("two", 31006, 31000)))   # the second is taken
        assert "spec.ports[1].nodePort" in e.message
        await reg.create(SERVICES, "other", svc("x", 31005, 31006))
        await reg.create(SERVICES, "default", svc("dry", 31007), dry_run=True)
        await reg.create(SERVICES, "other", svc("y", 31007))             # a dry run claims nothing
    run(tmp_path, test)


def test_a_leftover_claim_is_taken_over_only_when_old(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    async def test(reg: Registry, allocator: nodeports.NodePortAllocator) -> None:
        leftover = {"namespace": "default", "name": "gone", "uid": "u", "claimed": time.time()}
        await allocator.store.create(f"{nodeports.KEY_PREFIX}31000", json.dumps(leftover).encode())
        e = await refused(reg.create(SERVICES, "other", svc("a", 31000)))   # young: a write may be in flight
        assert "already allocated" in e.message
        monkeypatch.setattr(nodeports, "NODE_PORT_CLAIM_GRACE_SECONDS", 0.0)
        await reg.create(SERVICES, "other", svc("a", 31000))               # old, and no Service holds it
        e = await refused(reg.create(SERVICES, "default", svc("b", 31000)))   # a's is no leftover
        assert "already allocated" in e.message
    run(tmp_path, test)


def test_repair_claims_the_ports_of_services_stored_before_claims(tmp_path: Path) -> None:
    async def test(reg: Registry, allocator: nodeports.NodePortAllocator) -> None:
        del reg.claims["services"]
        await reg.create(SERVICES, "default", svc("old", 31010))          # as a store from before
        reg.claims["services"] = allocator
        await allocator.repair()
        e = await refused(reg.create(SERVICES, "other", svc("new", 31010)))
        assert "already allocated" in e.message
    run(tmp_path, test)


def test_a_full_range_is_a_422_that_says_so(tmp_path: Path) -> None:
    async def test(reg: Registry, _: Any) -> None:
        for i in range(3):
            await reg.create(SERVICES, "default", svc(f"s{i}", None))
        e = await refused(reg.create(SERVICES, "default", svc("s3", None)))
        assert e.code == 422 and "failed to allocate a nodePort: the range 30000-30002 is full" in e.message
        await reg.delete(SERVICES, "default", "s1")
        await reg.create(SERVICES, "default", svc("s3", None))
    run(tmp_path, test, range(30000, 30003))


@pytest.mark.parametrize("service, why", [
    (svc("c", 31000, kind="ClusterIP"), "spec.ports[0].nodePort: Forbidden: may not be used when `type` is 'ClusterIP'"),
    (svc("c", 31000, 31000), "spec.ports[1].nodePort: Duplicate value: 31000"),
    (svc("c", "31000"), 'spec.ports[0].nodePort: Invalid value: "31000": must be between 1 and 65535'),
    (svc("c", True), "spec.ports[0].nodePort: Invalid value: true: must be between 1 and 65535"),
    (svc("c", 70000), "spec.ports[0].nodePort: Invalid value: 70000: must be between 1 and 65535"),
])
def test_nodeports_are_validated_as_kubernetes_does(tmp_path: Path, service: dict, why: str) -> None:
    async def test(reg: Registry, _: Any) -> None:
        e = await refused(reg.create(SERVICES, "default", service))
        assert e.code == 422 and why in e.message, e.message
    run(tmp_path, test)


def test_one_nodeport_for_two_protocols_of_one_service(tmp_path: Path) -> None:
    async def test(reg: Registry, _: Any) -> None:
        both = svc("dns", 31053, 31053)
        both["spec"]["ports"][1]["protocol"] = "UDP"
        await reg.create(SERVICES, "default", both)
        await reg.delete(SERVICES, "default", "dns")
        await reg.create(SERVICES, "other", svc("after", 31053))
    run(tmp_path, test)


def test_two_api_servers_on_one_etcd_never_give_one_port_twice(tmp_path: Path, backend: Backend) -> None:  # noqa: F811
    if backend.name != "etcd":
        pytest.skip("one SQLite file has one API server")

    async def go(first: Store) -> None:
        second = await backend.open()
        try:
            regs = []
            for store in (first, second):
                reg = Registry(store)
                reg.claims["services"] = nodeports.NodePortAllocator(store)
                regs.append(reg)
            for ns in NAMESPACES:
                await regs[0].create(by_plural("namespaces"), None, {"metadata": {"name": ns}}, check_namespace=False)
            results = await asyncio.gather(*(regs[i % 2].create(SERVICES, ns, svc("race", 31234, None))
                                             for i, ns in enumerate(NAMESPACES)), return_exceptions=True)
            won = [r for r in results if isinstance(r, dict)]
            assert len(won) == 1, results
            autos = await asyncio.gather(*(regs[i % 2].create(SERVICES, ns, svc("auto", None, None))
                                           for i, ns in enumerate(NAMESPACES)))
            given = [node_port(a, i) for a in autos + won for i in (0, 1)]
            assert len(set(given)) == len(given), sorted(given)
        finally:
            await second.close()
    backend.run(go)


def test_a_nodeport_forwards_repeated_headers_repeated_and_drops_hop_and_impersonation() -> None:
    from aiohttp.test_utils import make_mocked_request
    from multidict import CIMultiDict

    from kube32.kubelet.nodeports import forwarded_headers
    headers = CIMultiDict([("X-A", "1"), ("X-A", "2"), ("Cookie", "a=1"), ("Cookie", "b=2"),
                           ("Connection", "keep-alive"), ("Authorization", "Bearer x"), ("Impersonate-User", "admin")])
    out = forwarded_headers(make_mocked_request("GET", "/", headers=headers))
    assert out.getall("X-A") == ["1", "2"] and out.getall("Cookie") == ["a=1", "b=2"]
    assert not {"connection", "authorization", "impersonate-user"} & {k.lower() for k in out}
