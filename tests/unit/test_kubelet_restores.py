"""Each way a pod's restore can go, through a real PodWorker and a real counter pod on a
fake node (kube32.kubelet.nodeapi.NodeServices): the restore a move's prefetch prepared,
taken or dropped; the data fetched by the worker's plan; a refusal; a damaged snapshot;
an injected crash.  And the worker's freeze state, and a pod instance's own host."""
from __future__ import annotations

import asyncio
import functools
import json
from pathlib import Path
from typing import Any, Callable

import pytest

from kube32.kubelet.nodeapi import KubeletOptions
from kube32.kubelet.podhost import PodHost, host_of
from kube32.kubelet.pods import PodWorker
from kube32.kubelet.restore import DataRequest, Prepared, RestorePlan, read_into
from kube32.testing import CRASH_RESTORES_MESSAGE
from kube32.terms import Annotation
from kube32.wasm import ChannelRegistry, HttpRequest, Module, Pod, PodConfig, Runtime

ROOT = Path(__file__).resolve().parents[2]
COUNTER = (ROOT / "examples" / "pods" / "counter.wasm").read_bytes()
IMAGE = "wasm://images.test/counter.wasm"
OTHER_IMAGE = "wasm://images.test/counter-2.wasm"
CHECKPOINT = "counter-move-1"
DATA_PATH = f"/apis/kube32.io/v1/namespaces/default/checkpoints/{CHECKPOINT}/data"


class FakeResponse:
    def __init__(self, status: int, body: bytes) -> None:
        self.status, self.body, self.released = status, body, False
        self.content = self

    async def read(self, n: int) -> bytes:
        chunk, self.body = self.body[:n], self.body[n:]
        await asyncio.sleep(0)
        return chunk

    async def text(self) -> str:
        return self.body.decode(errors="replace")

    def release(self) -> None:
        self.released = True

    async def __aenter__(self) -> "FakeResponse":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        self.release()


class FakeClient:
    """The API server as a restore sees it: the Checkpoint's data, and status writes."""

    def __init__(self, node: "FakeNode", data: bytes | None) -> None:
        self.node, self.data = node, data
        self.statuses: list[dict] = []

    def request(self, method: str, path: str, **kw: Any):
        self.node.calls.append(f"{method} {path}")

        async def answer() -> FakeResponse:
            return FakeResponse(200, self.data) if self.data is not None else \
                FakeResponse(404, b'{"kind":"Status","code":404}')
        return answer()

    async def patch(self, kind: Any, name: str, patch: Any, namespace: str | None = None, **kw: Any) -> dict:
        self.statuses.append(patch[1]["value"])
        return {}


class FakeEvents:
    def __init__(self) -> None:
        self.recorded: list[tuple[str, str, str]] = []

    async def record(self, obj: dict, type_: str, reason: str, message: str, count: int = 1) -> None:
        self.recorded.append((type_, reason, message))


class FakeNode:
    """NodeServices with a real runtime: modules, configs and instances as the Kubelet makes them."""

    def __init__(self, data: bytes | None = None, faults: tuple[str, ...] = (), env: dict | None = None) -> None:
        self.options = KubeletOptions(node_name="fake", backoff_base=0.05, backoff_max=0.05, faults=faults)
        self.ip = "127.0.0.1"
        self.calls: list[str] = []      # what the node did, in order
        self.client: Any = FakeClient(self, data)   # Any: it stands in for a Client
        self.events: Any = FakeEvents()
        self.runtime = Runtime(None, engine="wasmtime")
        self.channels = ChannelRegistry()
        self.published: list[tuple[str, str, bytes, str]] = []
        self.env = env or {}
        self._tasks: set[asyncio.Task] = set()

    def spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def node_changed(self) -> None:
        pass

    async def load_module(self, image: str, annotations: dict[str, str]) -> Module:
        self.calls.append(f"load {image}")
        return self.module()

    def module(self) -> Module:
        return self.runtime.load(COUNTER)

    async def config_for(self, pod: dict[str, Any]) -> PodConfig:
        md = pod["metadata"]
        return self.config(md["namespace"], md["name"])

    def config(self, namespace: str = "default", name: str = "counter") -> PodConfig:
        return PodConfig(namespace, name, "main", {"HOSTNAME": name, **self.env}, (), None, {}, 1 << 20)

    def new_instance(self, module: Module, config: PodConfig) -> Pod:
        return Pod(self.runtime, module, config, PodHost(self.channels, self.publish))

    def publish(self, ns: str, topic: str, payload: bytes, source: str) -> None:
        self.published.append((ns, topic, payload, source))


class Preparations:
    """The node's RestoreSource: a prefetch that prepared the restore (or not)."""

    def __init__(self, node: FakeNode, prepared: Prepared | None = None) -> None:
        self.node, self.prepared = node, prepared
        self.claimed: list[Prepared] = []
        self.discarded: list[Prepared] = []
        self.plans: list[RestorePlan] = []

    async def plan(self, namespace: str, checkpoint: str) -> RestorePlan:
        prepared, self.prepared = self.prepared, None
        plan = RestorePlan(self.node, namespace, checkpoint, prepared, self)
        self.plans.append(plan)
        return plan

    def claim(self, prepared: Prepared) -> Pod:
        self.claimed.append(prepared)
        return prepared.instance

    def discard(self, prepared: Prepared) -> None:
        self.discarded.append(prepared)
        prepared.instance.stop()


def get(pod: Pod) -> dict:
    return json.loads(pod.handle(HttpRequest("GET", "/")).result(timeout=10).body)


def snapshot_of_a_counter(node: FakeNode, requests: int = 3) -> bytes:
    """The K32S snapshot of a counter pod that served ``requests`` requests."""
    source = node.new_instance(node.module(), node.config())
    source.start()
    try:
        for _ in range(requests):
            get(source)
        source.freeze(2000)
        return source.snapshot().to_bytes()
    finally:
        source.stop()


async def prepared_restore(node: FakeNode, image: str = IMAGE, config: PodConfig | None = None) -> Prepared:
    """A restore the prefetch would have made: module, config, instance, the data streamed in."""
    module = node.module()
    config = config or node.config()
    instance = node.new_instance(module, config)
    request = DataRequest(node.client, "default", CHECKPOINT)
    try:
        snapshot = await read_into(instance, request)
    finally:
        await request.close()
    node.calls.clear()
    return Prepared(image, module, config, instance, snapshot)


def pod_object(restore_from: str | None = CHECKPOINT, policy: str = "Always") -> dict:
    annotations = {Annotation.RESTORE_FROM: restore_from} if restore_from else {}
    return {"metadata": {"uid": "uid-1", "namespace": "default", "name": "counter", "annotations": annotations},
            "spec": {"restartPolicy": policy, "containers": [{"name": "main", "image": IMAGE}]}}


async def until(predicate: Callable[[], Any], what: str, timeout: float = 10.0) -> Any:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while loop.time() < deadline:
        value = predicate()
        if value:
            return value
        await asyncio.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


def running(worker: PodWorker) -> bool:
    return "running" in worker.state and worker.instance is not None


def terminated(worker: PodWorker) -> dict | None:
    return (worker.state.get("terminated") or (worker.last_state or {}).get("terminated")) or None


def run(coro_fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(coro_fn)
    def wrapper(*args: Any, **kw: Any) -> Any:
        return asyncio.run(coro_fn(*args, **kw))
    return wrapper


async def restored_worker(node: FakeNode, source: Preparations) -> PodWorker:
    worker = PodWorker(node, source, pod_object())
    await until(lambda: running(worker), "the restored pod running")
    await until(lambda: any(r == "Started" for _, r, _ in node.events.recorded), "the Started event")
    return worker


def assert_restored(node: FakeNode, worker: PodWorker, requests_before: int = 3) -> None:
    assert worker.instance is not None
    state = get(worker.instance)
    assert state["requests"] == requests_before + 1            # the snapshot's count, then this one
    assert state["init_calls"] == 1 and state["restored_calls"] == 1   # k32_init ran on the source only
    assert ("Normal", "Started", f"Started container main (restored from checkpoint {CHECKPOINT})") \
        in node.events.recorded
    assert [text for _, text, _ in worker.logs.lines()] == ["counter: restored"]


@run
async def test_a_restore_prepared_for_the_pods_image_and_config_is_finished_as_it_is() -> None:
    node = FakeNode(data=None)
    node.client.data = snapshot_of_a_counter(node)
    prepared = await prepared_restore(node)
    node.client.data = None               # the data cannot be fetched again: the prepared one is used
    source = Preparations(node, prepared)
    worker = await restored_worker(node, source)
    try:
        assert worker.instance is prepared.instance and source.claimed == [prepared] and not source.discarded
        assert node.calls == []           # no module loaded, no data asked for
        assert_restored(node, worker)
        assert worker.image_id == f"kube32.io/wasm-sha256:{prepared.module.sha256}"
    finally:
        await worker.stop()


@pytest.mark.parametrize("mismatch", ["config", "image"])
@run
async def test_a_restore_prepared_for_another_config_or_image_is_dropped_and_the_data_fetched(mismatch: str) -> None:
    node = FakeNode()
    node.client.data = snapshot_of_a_counter(node)
    if mismatch == "config":
        prepared = await prepared_restore(node, config=node.config(name="counter-elsewhere"))
    else:
        prepared = await prepared_restore(node, image=OTHER_IMAGE)
    source = Preparations(node, prepared)
    worker = await restored_worker(node, source)
    try:
        assert source.discarded == [prepared] and not source.claimed
        assert worker.instance is not prepared.instance
        data = f"GET {DATA_PATH}"
        # The prepared module serves the same image; another image's is loaded first.
        assert node.calls == ([data] if mismatch == "config" else [f"load {IMAGE}", data])
        assert_restored(node, worker)
    finally:
        await worker.stop()


@run
async def test_without_a_prepared_restore_the_data_is_asked_for_once_the_module_is_loaded() -> None:
    node = FakeNode()
    node.client.data = snapshot_of_a_counter(node, requests=5)
    source = Preparations(node)
    worker = await restored_worker(node, source)
    try:
        assert node.calls == [f"load {IMAGE}", f"GET {DATA_PATH}"]
        assert_restored(node, worker, requests_before=5)
    finally:
        await worker.stop()


@run
async def test_a_checkpoint_without_data_fails_the_pod_for_good() -> None:
    node = FakeNode(data=None)
    source = Preparations(node)
    worker = PodWorker(node, source, pod_object())
    try:
        await until(lambda: worker.phase == "Failed", "the pod Failed")
        ended = worker.state["terminated"]
        assert ended["reason"] == "RestoreError" and ended["message"] == (
            f"cannot restore the snapshot: checkpoint {CHECKPOINT} has no data (lost with a control plane "
            "restart, or dropped to make room)")
        assert ("Warning", "RestoreError", ended["message"]) in node.events.recorded
        await asyncio.sleep(0.2)          # longer than the back-off: never tried again
        assert worker.restart_count == 0 and len(source.plans) == 1 and worker.instance is None
    finally:
        await worker.stop()


@pytest.mark.parametrize("restore_from", ["../../../../../../api/v1/namespaces/default/secrets/topsecret#",
                                          "%2e%2e", "a/b", "..;x"])
@run
async def test_a_restore_from_that_is_no_checkpoint_name_sends_no_request(restore_from: str) -> None:
    """Issue 19: the data path was a string with the annotation in it, and the client
    resolved its dot segments (the node's credentials read a Secret).  Now the name is
    one segment of the pod's namespace's checkpoints or no request at all."""
    node = FakeNode()
    node.client.data = snapshot_of_a_counter(node)
    node.calls.clear()
    source = Preparations(node)
    worker = PodWorker(node, source, pod_object(restore_from=restore_from))
    try:
        await until(lambda: worker.phase == "Failed", "the pod Failed")
        ended = worker.state["terminated"]
        assert ended["reason"] == "RestoreError" and ended["message"].startswith(
            f"cannot restore the snapshot: kube32.io/restore-from {restore_from!r} does not name a Checkpoint of "
            "namespace default: "), ended
        assert not [c for c in node.calls if c.startswith("GET")], node.calls
    finally:
        await worker.stop()


@run
async def test_a_damaged_snapshot_fails_the_pod_for_good() -> None:
    node = FakeNode()
    data = bytearray(snapshot_of_a_counter(node))
    data[300] ^= 0xFF
    node.client.data = bytes(data)
    worker = PodWorker(node, Preparations(node), pod_object())
    try:
        await until(lambda: worker.phase == "Failed", "the pod Failed")
        assert worker.state["terminated"]["reason"] == "RestoreError"
        assert worker.state["terminated"]["message"].startswith("cannot restore the snapshot: ")
    finally:
        await worker.stop()


@run
async def test_an_injected_crash_fails_each_start_before_its_restore_and_drops_the_prepared_one() -> None:
    node = FakeNode(faults=("crash-restores",))
    node.client.data = snapshot_of_a_counter(node)
    prepared = await prepared_restore(node)
    source = Preparations(node, prepared)
    worker = PodWorker(node, source, pod_object())
    try:
        await until(lambda: worker.restart_count >= 2, "two restarts")
        ended = terminated(worker)
        assert ended is not None and ended["reason"] == "Error"
        assert ended["message"] == f"image {IMAGE} is no pod: {CRASH_RESTORES_MESSAGE}"
        assert source.discarded == [prepared] and not source.claimed
        assert len(source.plans) >= 2     # each start restores again: none began
        assert node.calls == []           # nothing loaded, no data asked for
    finally:
        await worker.stop()


@run
async def test_a_fresh_pod_starts_with_init_and_no_plan() -> None:
    node = FakeNode()
    source = Preparations(node)
    worker = PodWorker(node, source, pod_object(restore_from=None))
    try:
        await until(lambda: running(worker), "the pod running")
        assert worker.instance is not None
        state = get(worker.instance)
        assert state["init_calls"] == 1 and state["restored_calls"] == 0
        assert source.plans == [] and node.calls == [f"load {IMAGE}"]
    finally:
        await worker.stop()


@run
async def test_the_worker_owns_its_freeze_state() -> None:
    node = FakeNode()
    worker = PodWorker(node, Preparations(node), pod_object(restore_from=None))
    try:
        await until(lambda: running(worker), "the pod running")
        inst = worker.instance
        assert inst is not None and worker.frozen_since is None and worker.ready
        await worker.freeze(inst, 1000)
        since = worker.frozen_since
        assert inst.frozen and since is not None and not worker.ready
        events = inst.snapshot().state.events
        assert worker.snapshot_digest(events) is None
        worker.keep_snapshot_digest(events, "ab" * 32)
        assert worker.snapshot_digest(events) == "ab" * 32
        await worker.freeze(inst, 1000)   # frozen already: the same frozen state
        assert worker.frozen_since == since and worker.snapshot_digest(events) == "ab" * 32
        await worker.thaw(inst)
        assert not inst.frozen and worker.frozen_since is None and worker.ready
        await worker.freeze(inst, 1000)   # another frozen state: the digest is not reused
        assert worker.snapshot_digest(inst.snapshot().state.events) is None
        await worker.thaw(inst)
    finally:
        await worker.stop()
    assert worker.terminating and worker.instance is None


def test_an_instance_host_belongs_to_the_worker_that_attached() -> None:
    published: list[tuple[str, str, bytes, str]] = []
    host = PodHost(ChannelRegistry(), lambda *event: published.append(event))
    lines: list[str] = []

    class Instance:
        config = PodConfig("default", "counter")

    host.log(Instance(), "before")          # unowned (a prefetch's): dropped
    host.publish(Instance(), "news", b"1")
    host.attach("pod/uid-1", lines.append)
    host.log(Instance(), "during")
    host.publish(Instance(), "news", b"2")
    host.detach()
    host.log(Instance(), "after")
    assert lines == ["during"]
    assert published == [("default", "news", b"1", ""), ("default", "news", b"2", "pod/uid-1")]
    assert len(host.random_bytes(16)) == 16

    node = FakeNode()
    assert host_of(node.new_instance(node.module(), node.config())).channels is node.channels
    with pytest.raises(TypeError):
        host_of(Pod(node.runtime, node.module(), node.config(), host=object()))  # type: ignore[arg-type]
