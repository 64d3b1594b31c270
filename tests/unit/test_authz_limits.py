"""Limits a pod cannot cross: asset paths stay in their volume, memory stops at the
limit, and a runaway call ends when its pod is stopped (deleted)."""
from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import wasmtime

from kube32.kubelet.podspec import ConfigError, pod_config
from kube32.wasm import HttpRequest, Pod, PodConfig, PodError, Runtime

PODS = Path(__file__).resolve().parents[2] / "examples" / "pods"


class Host:
    def log(self, pod, line): pass
    def publish(self, pod, topic, payload): pass
    def random_bytes(self, n): return bytes(n)

    def __init__(self) -> None:
        from kube32.wasm import ChannelRegistry
        self.channels = ChannelRegistry()


@pytest.fixture(scope="module")
def rt():
    runtime = Runtime()
    yield runtime
    runtime.close()


def config(**kw) -> PodConfig:
    base = dict(namespace="default", name="p", container="main", env={}, topics=(), tick_interval_ms=None,
                assets={}, memory_limit_bytes=1 << 20)
    base.update(kw)
    return PodConfig(**base)


# k32_handle opens the path given as the request body and answers the result code.
OPEN_POD = """
(module
  (import "k32" "k32_fs_open" (func $open (param i32 i32) (result i32)))
  (import "k32" "k32_req_body" (func $req (param i32 i32 i32) (result i32)))
  (import "k32" "k32_resp_body" (func $body (param i32 i32) (result i32)))
  (memory 1)
  (func (export "k32_handle") (local $n i32)
    (local.set $n (call $req (i32.const 0) (i32.const 256) (i32.const 0)))
    (i32.store (i32.const 512) (call $open (i32.const 0) (local.get $n)))
    (drop (call $body (i32.const 512) (i32.const 4))))
)
"""


def _open(pod: Pod, path: str) -> int:
    resp = pod.handle(HttpRequest("POST", "/", "", (), path.encode())).result(timeout=10)
    return int.from_bytes(resp.body[:4], "little", signed=True)


def test_asset_paths_cannot_climb_out_of_their_volume(rt) -> None:
    assets = {"/cfg/app.conf": b"x", "/secret/token": b"s"}
    pod = Pod(rt, rt.load(wasmtime.wat2wasm(OPEN_POD)), config(assets=assets), Host())
    pod.start()
    try:
        assert _open(pod, "/cfg/app.conf") >= 3
        for path in ("/cfg/../secret/token", "../secret/token", "/cfg/../../etc/passwd", ".."):
            assert _open(pod, path) == -1, path          # K32_EINVAL: never a file
        assert _open(pod, "/etc/passwd") == -2           # K32_ENOENT: the host's files do not exist here
    finally:
        pod.stop()


class FakeClient:
    def __init__(self, objects: dict) -> None:
        self.objects = objects

    async def try_get(self, kind, name, namespace=None):
        return self.objects.get(name)


@pytest.mark.parametrize("mount,item,why", [
    ("/cfg", "../secret/token", "item path"),
    ("/cfg", "/etc/passwd", "item path"),
    ("cfg", "a", "mountPath"),
    ("/cfg/../secret", "a", "mountPath"),
])
def test_volume_paths_that_leave_the_volume_are_refused(mount: str, item: str, why: str) -> None:
    pod = {"metadata": {"name": "p", "namespace": "default"},
           "spec": {"containers": [{"name": "main", "image": "x",
                                    "volumeMounts": [{"name": "v", "mountPath": mount}]}],
                    "volumes": [{"name": "v", "configMap": {"name": "cm", "items": [{"key": "a", "path": item}]}}]}}
    client = FakeClient({"cm": {"data": {"a": "1"}}})
    with pytest.raises(ConfigError, match=why):
        asyncio.run(pod_config(client, pod, "1"))  # type: ignore[arg-type]


def test_memory_stops_at_the_pods_limit(rt) -> None:
    pod = Pod(rt, rt.load((PODS / "counter.wasm").read_bytes()), config(memory_limit_bytes=2 * 65536), Host())
    pod.start()
    try:
        for _ in range(4):
            pod.handle(HttpRequest("POST", "/alloc", "kb=64", (), b"")).result(timeout=10)
        assert pod.memory_bytes <= 2 * 65536
        assert pod.state == "running"
    finally:
        pod.stop()


def test_a_runaway_call_ends_when_its_pod_is_stopped(rt) -> None:
    # The call would run for ten minutes of pod time and its own timeout is longer still:
    # only the stop can end it.
    pod = Pod(rt, rt.load((PODS / "counter.wasm").read_bytes()),
              config(call_timeout_ms=3_600_000), Host())
    pod.start()
    fut = pod.handle(HttpRequest("POST", "/work", "ms=600000", (), b""))
    with pytest.raises(TimeoutError):
        fut.result(timeout=0.2)   # it is running
    pod.stop()
    with pytest.raises(PodError, match="stopped"):
        fut.result(timeout=10)
    assert pod._thread is not None and not pod._thread.is_alive()
    assert pod.state == "stopped"
