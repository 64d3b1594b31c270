"""Small parts of issue 23: health checks, a follow that ends with its run, the CLI's
console when piped, and the defaults kube-apiserver sets (Services, container ports)."""
from __future__ import annotations

import asyncio
import io
import functools

from kube32.apiserver import errors
from kube32.apiserver.health import Health
from kube32.apiserver.strategies.pod import PodStrategy
from kube32.apiserver.strategies.service import ServiceStrategy
from kube32.cli import output
from kube32.kubelet.logs import LogBuffer
from kube32.store import Unavailable


def in_loop(fn):
    @functools.wraps(fn)
    def run(*args, **kwargs):
        return asyncio.run(fn(*args, **kwargs))
    return run


class Store:
    """A store that answers, or not (a neighbour faked: get and health are used)."""
    def __init__(self, down: bool = False, hang: bool = False) -> None:
        self.down, self.hang = down, hang

    async def get(self, key: str) -> None:
        if self.hang:
            await asyncio.sleep(60)
        if self.down:
            raise Unavailable("no etcd member answers")
        return None

    async def health(self) -> str | None:
        return None


@in_loop
async def test_readyz_verbose_lists_its_checks_as_kube_apiserver() -> None:
    status, text = await Health(Store()).report("readyz", True, [])   # type: ignore[arg-type]
    assert status == 200
    assert text == "[+]ping ok\n[+]log ok\n[+]etcd ok\n[+]shutdown ok\nreadyz check passed\n"
    assert await Health(Store()).report("livez", False, []) == (200, "ok")   # type: ignore[arg-type]


@in_loop
async def test_the_etcd_check_fails_when_the_store_cannot_be_reached() -> None:
    health = Health(Store(down=True))   # type: ignore[arg-type]
    status, text = await health.report("healthz", False, [])   # failures are always verbose
    assert status == 500
    assert text == "[+]ping ok\n[+]log ok\n[-]etcd failed: reason withheld\nhealthz check failed\n"
    assert await health.report("healthz", False, ["etcd"]) == (200, "ok")
    status, text = await health.report("healthz", True, ["etcd", "nope"])
    assert "[+]etcd excluded: ok" in text and 'no matches for "nope"' in text
    assert await health.failure(health.checks("readyz")["etcd"]) == "no etcd member answers"


@in_loop
async def test_the_etcd_check_is_bounded(monkeypatch) -> None:
    monkeypatch.setattr("kube32.apiserver.health.STORE_TIMEOUT", 0.05)
    health = Health(Store(hang=True))   # type: ignore[arg-type]
    assert "did not answer within" in (await health.failure(health.checks("readyz")["etcd"]) or "")


@in_loop
async def test_readyz_fails_once_the_server_stops() -> None:
    health = Health(Store())   # type: ignore[arg-type]
    health.stopping = True
    status, text = await health.report("readyz", True, [])
    assert status == 500 and "[-]shutdown failed: reason withheld" in text
    assert (await health.report("livez", True, []))[0] == 200


@in_loop
async def test_a_follow_ends_when_its_run_ends() -> None:
    buf = LogBuffer(asyncio.get_running_loop())
    buf.append("one", 0)
    got: list[str] = []

    async def follow(run: int) -> None:
        async for _, text, _ in buf.follow(run=run):
            got.append(text)
    task = asyncio.create_task(follow(0))
    await asyncio.sleep(0.01)
    await asyncio.to_thread(buf.append, "two", 0)
    await asyncio.sleep(0.01)
    buf.end_run(0)
    await asyncio.wait_for(task, 2)
    assert got == ["one", "two"]
    got.clear()
    await asyncio.wait_for(follow(0), 2)   # a follow of a run that already ended ends at once
    assert got == ["one", "two"]
    # a follow of the next run sees only its lines, and ends with it
    got.clear()
    task = asyncio.create_task(follow(1))
    await asyncio.sleep(0.01)
    buf.append("three", 1)
    await asyncio.sleep(0.01)
    buf.end_run(1)
    await asyncio.wait_for(task, 2)
    assert got == ["three"]


def test_piped_cli_output_is_never_wrapped() -> None:
    from rich.table import Table
    out = io.StringIO()
    console = output.console(out)
    digest = "ab" * 32
    table = Table()
    table.add_column("field")
    table.add_column("value", overflow="fold")
    table.add_row("a-long-field-name-" * 3, digest)
    console.print(table)
    console.print("trailer sha256:" + digest + " matches " + "x" * 100)
    assert digest in out.getvalue()
    assert any(line.startswith("trailer sha256:" + digest) and line.endswith("x" * 100)
               for line in out.getvalue().splitlines())


def test_services_get_the_defaults_kube_apiserver_sets() -> None:
    svc = {"metadata": {"name": "web", "namespace": "default"},
           "spec": {"selector": {"app": "web"}, "ports": [{"port": 80}]}}
    ServiceStrategy().default(svc)
    spec = svc["spec"]
    assert spec["ipFamilies"] == ["IPv4"] and spec["ipFamilyPolicy"] == "SingleStack"
    assert spec["internalTrafficPolicy"] == "Cluster" and spec["sessionAffinity"] == "None"
    assert spec["clusterIPs"] == [spec["clusterIP"]] and "externalTrafficPolicy" not in spec
    assert spec["ports"] == [{"port": 80, "protocol": "TCP", "targetPort": 80}]
    assert len(ServiceStrategy().row(svc)) == len(ServiceStrategy.columns)   # the kind's own parts intact
    assert ServiceStrategy().validate(svc) == []
    lb = {"metadata": {"name": "lb", "namespace": "default"}, "spec": {"type": "LoadBalancer", "ports": [{"port": 1}]}}
    ServiceStrategy().default(lb)
    assert lb["spec"]["externalTrafficPolicy"] == "Cluster" and lb["spec"]["allocateLoadBalancerNodePorts"] is True
    named = {"metadata": {"name": "x", "namespace": "default"},
             "spec": {"type": "ExternalName", "externalName": "example.com"}}
    ServiceStrategy().default(named)
    assert "ipFamilies" not in named["spec"] and "clusterIP" not in named["spec"]


def test_a_service_turned_cluster_ip_drops_its_external_traffic_policy() -> None:
    old = {"metadata": {"name": "n", "namespace": "default"}, "spec": {"type": "NodePort", "ports": [{"port": 1}]}}
    ServiceStrategy().default(old)
    new = {"metadata": old["metadata"], "spec": {**old["spec"], "type": "ClusterIP"}}
    ServiceStrategy().prepare_for_update(new, old)
    assert "externalTrafficPolicy" not in new["spec"]


def test_container_ports_default_to_tcp() -> None:
    pod = {"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "image": "i",
                                                               "ports": [{"containerPort": 80},
                                                                         {"containerPort": 53, "protocol": "UDP"}]}]}}
    PodStrategy().default(pod)
    assert [p["protocol"] for p in pod["spec"]["containers"][0]["ports"]] == ["TCP", "UDP"]


def test_the_data_415_names_octet_stream() -> None:
    e = errors.unsupported_media_type("application/json", ("application/octet-stream",))
    assert e.code == 415 and "accepted media types include: application/octet-stream" in e.message


def test_a_null_field_of_a_built_in_kind_is_the_field_unset_then_defaulted(tmp_path) -> None:
    """kube-apiserver decodes a body into typed fields, where ``backoffLimit: null`` (a YAML
    key left empty, as Helm templates leave it) is the field unset: defaulted to 6, as on
    create, update and a JSON patch's "add" (attack round 23: stored as null, it wedged the
    Job controller).  A custom resource keeps its nulls for its schema to judge."""
    from kube32.apiserver.registry import PATCH_JSON, Registry
    from kube32.apiserver.resources import by_plural
    from kube32.store import SQLiteStore

    jobs = by_plural("jobs")
    job = {"apiVersion": "batch/v1", "kind": "Job",
           "metadata": {"name": "j", "labels": None},
           "spec": {"backoffLimit": None, "template": {"spec": {
               "restartPolicy": "Never", "containers": [{"name": "c", "image": "x", "args": None}]}}}}

    async def go() -> None:
        store = await SQLiteStore.open(tmp_path / "s.db")
        try:
            reg = Registry(store)
            await reg.create(by_plural("namespaces"), None, {"metadata": {"name": "default"}}, check_namespace=False)
            made = await reg.create(jobs, "default", job)
            assert made["spec"]["backoffLimit"] == 6 and "labels" not in made["metadata"]
            assert "args" not in made["spec"]["template"]["spec"]["containers"][0]
            put = {**made, "spec": {**made["spec"], "backoffLimit": None}}
            assert (await reg.update(jobs, "default", "j", put))["spec"]["backoffLimit"] == 6
            patched, _ = await reg.patch(jobs, "default", "j", PATCH_JSON,
                                         [{"op": "add", "path": "/spec/activeDeadlineSeconds", "value": None}])
            assert "activeDeadlineSeconds" not in patched["spec"]
            stored = await reg.get(jobs, "default", "j")
            assert stored["spec"]["backoffLimit"] == 6 and "activeDeadlineSeconds" not in stored["spec"]
        finally:
            await store.close()
    asyncio.run(go())


def test_a_built_in_kinds_unknown_fields_are_found_by_its_schema_and_dropped() -> None:
    """As kube-apiserver's typed decoding: every member a built-in kind's schema does not
    name, at any depth, is reported as kube-apiserver words its path and dropped (attack
    round 23c: spec.replica of a Deployment, a Service port's targetport were stored)."""
    from kube32.apiserver import typedfields
    from kube32.apiserver.resources import by_plural
    dep = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "x", "labels": {"any": "b"}},
           "spec": {"replica": 3, "selector": {"matchLabels": {"a": "b"}},
                    "strategy": {"rollingUpdate": {"maxSurge": "25%"}},
                    "template": {"metadata": {"labels": {"a": "b"}}, "spec": {"containers": [
                        {"name": "c", "image": "x", "resources": {"limits": {"memory": "1Mi"}},
                         "ports": [{"containerPort": 1, "prot": "TCP"}]}]}}}}
    assert typedfields.prune_unknown(by_plural("deployments"), dep) == [
        "spec.replica", "spec.template.spec.containers[0].ports[0].prot"]
    assert "replica" not in dep["spec"] and dep["metadata"]["labels"] == {"any": "b"}
    svc = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s"},
           "spec": {"selectr": {"a": "b"}, "ports": [{"port": 80, "targetport": 1}]}}
    assert typedfields.prune_unknown(by_plural("services"), svc) == ["spec.selectr", "spec.ports[0].targetport"]
    # a kind without a vendored schema is its strategy's to judge
    assert typedfields.prune_unknown(by_plural("checkpoints"), {"spec": {"x": 1}}) is None
