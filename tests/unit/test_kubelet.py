"""The kubelet's parts (quantities, logs, pod config, the module store's export parser)
and, in process against a real API server, its UID-keyed pod lifecycle."""
from __future__ import annotations

import asyncio
import base64
import functools
import hashlib
from pathlib import Path

import pytest

from tests.conftest import until

from kube32.apiserver.images import ExportParseError, module_exports
from kube32.client import NODES, PODS, Client
from kube32.kubelet import Kubelet, KubeletOptions
from kube32.kubelet.logs import LogBuffer, format_line
from kube32.kubelet.podspec import ConfigError, pod_config
from kube32.quantity import format_bytes, parse_bytes, parse_duration_ms
from kube32.sim.controlplane import ControlPlane, ControlPlaneOptions

ROOT = Path(__file__).resolve().parents[2]
COUNTER = ROOT / "examples" / "pods" / "counter.wasm"


def in_loop(fn):
    """Run an async test in a fresh event loop (no async plugin in this project)."""
    @functools.wraps(fn)
    def run(*args, **kwargs):
        return asyncio.run(fn(*args, **kwargs))
    return run


@pytest.mark.parametrize("text,value", [("512Ki", 512 << 10), ("8Mi", 8 << 20), ("1G", 10**9), ("65536", 65536),
                                        ("1.5Ki", 1536), ("129e3", 129000), ("2k", 2000)])
def test_memory_quantities(text: str, value: int) -> None:
    assert parse_bytes(text) == value


def test_bad_quantities_and_durations_name_the_text() -> None:
    with pytest.raises(ValueError, match='"8 MiB"'):
        parse_bytes("8 MiB")
    with pytest.raises(ValueError, match='"soon"'):
        parse_duration_ms("soon")
    assert [parse_duration_ms(t) for t in ("500ms", "2s", "1m", "250")] == [500, 2000, 60000, 250]
    assert format_bytes(320 << 10) == "320Ki" and format_bytes(8 << 20) == "8Mi" and format_bytes(1000) == "1000"


def test_export_parser_reads_the_counter_and_refuses_non_modules() -> None:
    names = {e["name"] for e in module_exports(COUNTER.read_bytes()) if e["kind"] == "func"}
    assert {"k32_handle", "k32_tick", "k32_event", "k32_init"} <= names
    with pytest.raises(ExportParseError, match="magic"):
        module_exports(b"MZ\x90\x00")
    with pytest.raises(ExportParseError):
        module_exports(COUNTER.read_bytes()[:40] + b"\x07\x7f")


@in_loop
async def test_log_buffer_tail_follow_and_close() -> None:
    buf = LogBuffer(asyncio.get_running_loop(), capacity=3)
    for i in range(5):
        buf.append(f"line {i}\n")
    assert [t for _, t, _ in buf.lines()] == ["line 2", "line 3", "line 4"]
    assert [t for _, t, _ in buf.lines(1)] == ["line 4"] and buf.lines(0) == []
    got: list[str] = []

    async def follow() -> None:
        async for _, text, _ in buf.follow(tail=1):
            got.append(text)
    task = asyncio.create_task(follow())
    await asyncio.sleep(0.01)
    await asyncio.to_thread(buf.append, "from a pod thread")
    await asyncio.sleep(0.01)
    buf.close()
    await asyncio.wait_for(task, 2)
    assert got == ["line 4", "from a pod thread"]
    stamped = format_line(buf.lines(1)[0], True).decode()
    assert stamped.endswith("Z from a pod thread\n") and stamped[10] == "T"


@in_loop
async def test_log_buffer_keeps_runs_apart_and_cuts_by_time() -> None:
    buf = LogBuffer(asyncio.get_running_loop())
    buf.append("first run", 0)
    buf.append("it crashed", 0)
    cut = buf.lines()[-1][0]
    await asyncio.sleep(0.002)
    buf.append("second run", 1)
    assert [t for _, t, _ in buf.lines(run=0)] == ["first run", "it crashed"]
    assert [t for _, t, _ in buf.lines(run=1)] == ["second run"]
    assert [t for _, t, _ in buf.lines(since=cut)] == ["it crashed", "second run"]
    assert [t for _, t, _ in buf.lines(tail=1, run=0)] == ["it crashed"]


def test_log_options_as_kubectl_sends_them() -> None:
    from kube32.kubelet.server import log_options
    tail, since, limit, stamps, follow, previous = log_options(
        {"tailLines": "5", "sinceSeconds": "60", "limitBytes": "100", "timestamps": "true", "previous": "true"})
    assert (tail, limit, stamps, follow, previous) == (5, 100, True, False, True) and since.endswith("Z")
    assert log_options({"sinceTime": "2026-11-30T10:00:00Z"})[1] == "2026-11-30T10:00:00.000000000Z"
    assert log_options({"sinceSeconds": "0"}) == "sinceSeconds: Invalid value: 0: must be greater than 0"
    assert log_options({"sinceSeconds": "5", "sinceTime": "2026-11-30T10:00:00Z"}) == \
        "at most one of sinceTime or sinceSeconds may be specified"
    assert "RFC 3339" in log_options({"sinceTime": "yesterday"})
    assert log_options({"limitBytes": "x"}) == 'limitBytes must be a number, not "x"'


class FakeClient:
    def __init__(self, objs: dict[tuple[str, str], dict]) -> None:
        self.objs = objs

    async def try_get(self, kind, name, namespace=None):
        return self.objs.get((kind.plural, name))


def _pod(**container) -> dict:
    return {"metadata": {"name": "p", "namespace": "ns", "uid": "u1",
                         "annotations": {"kube32.io/events": "a, b", "kube32.io/tick-interval": "250ms"}},
            "spec": {"nodeName": "n1", "containers": [{"name": "main", "image": "x", **container}],
                     "volumes": [{"name": "assets", "configMap": {"name": "cm"}}]}}


@in_loop
async def test_pod_config_resolves_env_assets_topics_ticks_and_memory() -> None:
    client = FakeClient({("configmaps", "cm"): {"data": {"greeting": "hello", "index.html": "<h1>"}},
                         ("secrets", "s"): {"data": {"pw": base64.b64encode(b"sekret").decode()}}})
    pod = _pod(env=[{"name": "A", "value": "1"},
                    {"name": "B", "valueFrom": {"configMapKeyRef": {"name": "cm", "key": "greeting"}}},
                    {"name": "C", "valueFrom": {"secretKeyRef": {"name": "s", "key": "pw"}}},
                    {"name": "D", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
                    {"name": "E", "value": "$(A)-$(B)"},
                    {"name": "F", "valueFrom": {"configMapKeyRef": {"name": "nope", "key": "k", "optional": True}}}],
               volumeMounts=[{"name": "assets", "mountPath": "/www/"}],
               resources={"limits": {"memory": "256Ki"}})
    cfg = await pod_config(client, pod, "127.0.0.1")  # type: ignore[arg-type]
    assert dict(cfg.env) == {"HOSTNAME": "p", "A": "1", "B": "hello", "C": "sekret", "D": "n1", "E": "1-hello"}
    assert cfg.topics == ("a", "b") and cfg.tick_interval_ms == 250 and cfg.memory_limit_bytes == 256 << 10
    assert dict(cfg.assets) == {"/www/greeting": b"hello", "/www/index.html": b"<h1>"}


@in_loop
async def test_pod_config_names_what_is_missing() -> None:
    pod = _pod(env=[{"name": "B", "valueFrom": {"configMapKeyRef": {"name": "cm", "key": "absent"}}}])
    with pytest.raises(ConfigError, match="couldn't find key absent in configmap ns/cm"):
        await pod_config(FakeClient({("configmaps", "cm"): {"data": {}}}), pod, "127.0.0.1")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match='configmap "cm" not found'):
        await pod_config(FakeClient({}), _pod(volumeMounts=[{"name": "assets", "mountPath": "/a"}]), "1")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="resources.limits.memory"):
        await pod_config(FakeClient({}), _pod(resources={"limits": {"memory": "lots"}}), "1")  # type: ignore[arg-type]


def _until(predicate, timeout: float = 20.0, what: str = "condition"):
    return until(predicate, timeout, what)


@in_loop
async def test_kubelets_key_pods_by_uid_across_a_replacement_and_delete(tmp_path: Path) -> None:
    cp = ControlPlane(ControlPlaneOptions(data_dir=tmp_path / "cp", port=0))
    await cp.start()
    assert cp.server is not None and cp.kubeconfig is not None
    image = cp.server.images.put(COUNTER.read_bytes())["reference"]
    assert image.endswith(hashlib.sha256(COUNTER.read_bytes()).hexdigest())
    admin = Client.from_kubeconfig(cp.kubeconfig)
    kubelets = []
    try:
        for name in ("unit-a", "unit-b"):
            kl = Kubelet(Client.from_kubeconfig(tmp_path / "cp" / "node.kubeconfig"),
                         KubeletOptions(node_name=name, interp_mops=1.0, lease_interval=0.2, status_interval=0.5))
            await kl.start()
            kubelets.append(kl)
        a, b = kubelets
        node = await admin.get(NODES, "unit-a")
        assert node["metadata"]["annotations"]["kube32.io/interp-mops"] == "1.00"
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "c", "namespace": "default"},
               "spec": {"nodeName": "unit-a", "containers": [{"name": "main", "image": image}]}}
        created = await admin.create(PODS, pod)
        old_uid = created["metadata"]["uid"]

        async def ready(pod_name: str = "c") -> dict | None:
            p = await admin.get(PODS, pod_name, "default")
            cs = (p.get("status") or {}).get("containerStatuses") or [{}]
            return p if cs[0].get("ready") else None
        running = await _until(ready, what="the pod Ready on unit-a")
        assert running["status"]["containerStatuses"][0]["imageID"] == image
        assert old_uid in a.workers and not b.workers
        async with admin.request("GET", "/api/v1/namespaces/default/pods/c/proxy/") as r:
            assert r.status == 200 and (await r.json())["hostname"] == "c"

        # The worker's freeze: a frozen pod answers 503 + Retry-After and turns not Ready at once.
        worker = a.workers[old_uid]
        assert worker.instance is not None
        await worker.freeze(worker.instance, 1000)
        async with admin.request("GET", "/api/v1/namespaces/default/pods/c/proxy/") as r:
            assert r.status == 503 and r.headers["Retry-After"] == "1"

        async def not_ready() -> bool:
            return not await ready()
        await _until(not_ready, 2, what="Ready=False after the freeze")
        await worker.thaw(worker.instance)
        running = await _until(ready, what="Ready again after the thaw")

        # One write: same name, new uid, other node.  unit-a stops the old uid and
        # leaves the new object alone; unit-b runs it.
        new = {**running, "metadata": {k: v for k, v in running["metadata"].items() if k != "resourceVersion"},
               "spec": {**running["spec"], "nodeName": "unit-b"}}
        new.pop("status")
        replaced = await admin._json("POST", "/api/v1/namespaces/default/pods/c/replacement",
                                     params={"uid": old_uid}, body=new)
        new_uid = replaced["metadata"]["uid"]
        assert new_uid != old_uid

        async def moved() -> bool:
            return not a.workers and new_uid in b.workers and bool(await ready())
        await _until(moved, what="the pod to move to unit-b")
        after = await admin.get(PODS, "c", "default")
        assert after["metadata"]["uid"] == new_uid and after["spec"]["nodeName"] == "unit-b"

        # A command pod that returns completes; restartPolicy Never leaves it Succeeded.
        import wasmtime
        job_image = cp.server.images.put(wasmtime.wat2wasm(
            '(module (memory (export "memory") 1) (func (export "_start")))'))["reference"]
        await admin.create(PODS, {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "job", "namespace": "default"},
                                  "spec": {"nodeName": "unit-b", "restartPolicy": "Never",
                                           "containers": [{"name": "main", "image": job_image}]}})

        async def succeeded() -> dict | None:
            p = await admin.get(PODS, "job", "default")
            return p if (p.get("status") or {}).get("phase") == "Succeeded" else None
        job = await _until(succeeded, what="the command pod to succeed")
        term = job["status"]["containerStatuses"][0]["state"]["terminated"]
        assert term["reason"] == "Completed" and term["exitCode"] == 0

        # The module store refuses what is too big, naming the limit.
        async with admin.request("POST", "/apis/kube32.io/v1/images", data=b"\0asm\1\0\0\0" + bytes(9 << 20)) as r:
            assert r.status == 413 and "limit of 8388608 bytes" in (await r.json())["message"]

        # Deleting: the kubelet stops the pod and removes the object (uid precondition).
        await admin.delete(PODS, "c", "default")

        async def gone() -> bool:
            return await admin.try_get(PODS, "c", "default") is None and new_uid not in b.workers
        await _until(gone, what="the pod to be stopped and deleted")
    finally:
        for kl in kubelets:
            await kl.stop()
            await kl.client.close()
        await admin.close()
        await cp.stop()


@in_loop
async def test_a_pod_kept_by_a_finalizer_is_stopped_and_deleted_once(tmp_path: Path) -> None:
    """The kubelet stops a pod marked for deletion once: while a finalizer keeps the object,
    the node's later events (another pod changing) send no DELETE again, and the object
    is not written again."""
    cp = ControlPlane(ControlPlaneOptions(data_dir=tmp_path / "cp", port=0))
    await cp.start()
    assert cp.server is not None and cp.kubeconfig is not None
    image = cp.server.images.put(COUNTER.read_bytes())["reference"]
    admin = Client.from_kubeconfig(cp.kubeconfig)
    kl = Kubelet(Client.from_kubeconfig(tmp_path / "cp" / "node.kubeconfig"),
                 KubeletOptions(node_name="unit-f", interp_mops=1.0, lease_interval=0.2, status_interval=0.5))
    deletes: list[str] = []
    real_delete = kl.client.delete

    async def counted(res, name, *args, **kwargs):
        if res is PODS:
            deletes.append(name)
        return await real_delete(res, name, *args, **kwargs)
    kl.client.delete = counted  # type: ignore[method-assign]
    await kl.start()
    try:
        def pod(name: str, **md) -> dict:
            return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default", **md},
                    "spec": {"nodeName": "unit-f", "containers": [{"name": "main", "image": image}]}}
        kept = await admin.create(PODS, pod("kept", finalizers=["example.com/cleanup"]))
        await admin.create(PODS, pod("other"))

        async def both_run() -> bool:
            return len(kl.workers) == 2 and all(w.started for w in kl.workers.values())
        await _until(both_run, what="both pods running")
        await admin.delete(PODS, "kept", "default")

        async def stopped() -> bool:
            return kept["metadata"]["uid"] not in kl.workers and deletes == ["kept"]
        await _until(stopped, what="kept stopped and deleted by the kubelet")
        rv = (await admin.get(PODS, "kept", "default"))["metadata"]["resourceVersion"]
        for i in range(5):
            await admin.patch(PODS, "other", {"metadata": {"labels": {"touch": str(i)}}}, "default")
            await asyncio.sleep(0.1)
        await asyncio.sleep(0.5)
        assert deletes == ["kept"]
        assert (await admin.get(PODS, "kept", "default"))["metadata"]["resourceVersion"] == rv
        await admin.patch(PODS, "kept", {"metadata": {"finalizers": None}}, "default")
        assert await admin.try_get(PODS, "kept", "default") is None
    finally:
        await kl.stop()
        await kl.client.close()
        await admin.close()
        await cp.stop()


def test_node_status_reports_memory_pressure_below_24_kib() -> None:
    from kube32.kubelet.node import NodeFacts, node_status
    facts = NodeFacts("n", "127.0.0.1", 1, "cardputer", 320 << 10, 96 << 10, ("keyboard",), 8, False, 7.0, "b",
                      "pwasm://0.2a0")
    conds = {c["type"]: c for c in node_status(facts, 20 << 10)["conditions"]}
    assert conds["MemoryPressure"]["status"] == "True" and conds["Ready"]["status"] == "True"
    status = node_status(facts, 200 << 10)
    assert {c["type"]: c["status"] for c in status["conditions"]}["MemoryPressure"] == "False"
    assert status["capacity"]["hardware.kube32.io/keyboard"] == "1" and status["capacity"]["pods"] == "8"
    assert all(status["nodeInfo"].values())
