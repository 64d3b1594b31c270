"""The round trip the issue asks for, across two processes: a counter pod serves
requests, ticks and gets events in a child process, is frozen with events held, and
its snapshot streams over a real TCP socket straight into a fresh pod of a fresh
Runtime in this process.  State, clock, channels and held events must continue - on
every pair of engines, the same one on both sides or two different ones."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kube32.wasm import ENGINES, HttpRequest, Pod, PodConfig, Runtime
from tests.unit.podhosts import Host

ROOT = Path(__file__).resolve().parents[2]
COUNTER = ROOT / "examples" / "pods" / "counter.wasm"

SOURCE_PROCESS = r"""
import json, socket, sys, time
from kube32.wasm import ChannelRegistry, HttpRequest, Pod, PodConfig, Runtime

class Host:
    channels = ChannelRegistry()
    def log(self, pod, line): pass
    def publish(self, pod, topic, payload): pass

def get(pod):
    return json.loads(pod.handle(HttpRequest("GET", "/")).result(timeout=10).body)

rt = Runtime(engine=sys.argv[3])
module = rt.load(open(sys.argv[2], "rb").read())
pod = Pod(rt, module, PodConfig("default", "counter", "main", {"HOSTNAME": "counter"}, ("news",), 5, {}, 1 << 20), Host())
pod.start()
for _ in range(4):
    get(pod)
pod.handle(HttpRequest("POST", "/alloc", "kb=64")).result(timeout=10)
end = time.monotonic() + 5
while get(pod)["ticks"] < 3 and time.monotonic() < end:
    time.sleep(0.01)
pod.deliver_event("news", b"before")
while get(pod)["events"] < 1 and time.monotonic() < end:
    time.sleep(0.01)
last = get(pod)
pod.freeze(2000)
pod.deliver_event("news", b"held-1")
pod.deliver_event("news", b"held-2")
writer = pod.snapshot()
with socket.create_connection(("127.0.0.1", int(sys.argv[1]))) as sock:
    trailer = writer.write_to(sock)
print(json.dumps({"last": last, "pod_time_ms": pod.pod_time_ms(), "trailer": trailer.hex(),
                  "size": writer.total_size}))
"""


def get(pod) -> dict:
    return json.loads(pod.handle(HttpRequest("GET", "/")).result(timeout=10).body)


@pytest.mark.parametrize("source", ENGINES)
@pytest.mark.parametrize("target", ENGINES)
def test_snapshot_in_one_process_restores_in_another(source, target):
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(30)
    port = listener.getsockname()[1]
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    child = subprocess.Popen([sys.executable, "-c", SOURCE_PROCESS, str(port), str(COUNTER), source],
                             cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    rt = Runtime(engine=target)
    host = Host()
    pod = Pod(rt, rt.load(COUNTER.read_bytes()),
              PodConfig("default", "counter", "main", {"HOSTNAME": "counter"}, ("news",), 5, {}, 1 << 20), host)
    try:
        conn, _ = listener.accept()
        with conn:
            conn.settimeout(30)
            reader = pod.prepare_restore()
            snap = reader.read_from(conn)          # streams into the new instance's memory
        out, err = child.communicate(timeout=30)
        assert child.returncode == 0, err.decode()
        source = json.loads(out)
        before = source["last"]
        assert snap.sha256.hex() == source["trailer"]
        assert snap.state.pod_time_ms == source["pod_time_ms"]

        pod.finish_restore(snap)
        after = get(pod)
        assert after["requests"] == before["requests"] + 1
        assert after["init_calls"] == 1 and after["restored_calls"] == 1
        assert after["events"] == before["events"] + 2 and after["last_event"] == "news:held-2"
        assert after["time_ms"] >= source["pod_time_ms"] >= before["time_ms"]
        assert after["grown_kb"] == 64 and after["hostname"] == "counter" and after["channel"] == 1
        assert after["ticks"] >= before["ticks"]
        assert host.channels.channels() == {"default/counter-log": 1}
        assert host.logs == ["counter: restored"]                     # k32_init did not run
        end = time.monotonic() + 5
        while get(pod)["ticks"] <= after["ticks"] and time.monotonic() < end:
            time.sleep(0.01)
        later = get(pod)
        assert later["ticks"] > after["ticks"] and later["time_ms"] >= after["time_ms"]
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        pod.stop()
        rt.close()
        listener.close()
