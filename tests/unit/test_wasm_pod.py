"""kube32.wasm Pod: calls, ABI behaviour, freeze/thaw, blockers, snapshot and restore
(refusals included), with the example pods built from examples/pods and a fake host."""
from __future__ import annotations

import io
import json
import threading
import time
from pathlib import Path

import pytest
import wasmtime

from kube32 import snapshot as k32s
from kube32.wasm import (
    ENGINES, CallTimeout, ChannelRegistry, HttpRequest, ImageError, Pod, PodConfig, PodError, PodFrozen, Runtime,
)

PODS = Path(__file__).resolve().parents[2] / "examples" / "pods"


class FakeHost:
    def __init__(self, channels: ChannelRegistry | None = None) -> None:
        self.channels = channels or ChannelRegistry()
        self.logs: list[tuple[str, str]] = []
        self.published: list[tuple[str, str, bytes]] = []

    def log(self, pod, line):
        self.logs.append((pod.config.name, line))

    def publish(self, pod, topic, payload):
        self.published.append((pod.config.name, topic, payload))

    def random_bytes(self, n):
        return bytes(range(n))


@pytest.fixture(scope="module", params=ENGINES)
def rt(request):
    runtime = Runtime(engine=request.param)
    yield runtime
    runtime.close()


@pytest.fixture
def pods():
    started: list[Pod] = []
    yield started
    for p in started:
        p.stop()


def load(rt, name):
    return rt.load((PODS / f"{name}.wasm").read_bytes())


def config(name="counter", **kw) -> PodConfig:
    base = dict(namespace="default", name=name, container="main", env={"HOSTNAME": name},
                topics=(), tick_interval_ms=None, assets={}, memory_limit_bytes=1 << 20)
    base.update(kw)
    return PodConfig(**base)


def make(rt, pods, name="counter", host=None, module=None, start=True, **kw) -> Pod:
    pod = Pod(rt, module or load(rt, name), config(name, **kw), host or FakeHost())
    pods.append(pod)
    if start:
        pod.start()
    return pod


def get(pod, path="/", method="GET", query="", headers=(), body=b""):
    return pod.handle(HttpRequest(method, path, query, tuple(headers), body)).result(timeout=10)


def state(pod) -> dict:
    return json.loads(get(pod).body)


def wait_for(predicate, timeout=5.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return
        time.sleep(0.005)
    raise AssertionError("condition not reached")


def snapshot_bytes(pod) -> bytes:
    buf = io.BytesIO()
    pod.snapshot().write_to(buf)
    return buf.getvalue()


def restore(rt, pods, data: bytes, name="counter", host=None, module=None, **kw) -> Pod:
    pod = make(rt, pods, name, host=host, module=module, start=False, **kw)
    snap = pod.prepare_restore().read_from(io.BytesIO(data))
    pod.finish_restore(snap)
    return pod


def wat_pod(rt, text):
    return rt.load(wasmtime.wat2wasm(text))


# -- the counter pod --------------------------------------------------------------------

def test_counter_counts_requests_ticks_events(rt, pods):
    pod = make(rt, pods, tick_interval_ms=10)
    assert state(pod)["requests"] == 1
    s = state(pod)
    assert s["requests"] == 2 and s["init_calls"] == 1 and s["restored_calls"] == 0
    assert s["hostname"] == "counter" and s["channel"] == 1
    wait_for(lambda: state(pod)["ticks"] >= 2)
    pod.deliver_event("news", b"hello")
    wait_for(lambda: state(pod)["events"] == 1)
    assert state(pod)["last_event"] == "news:hello"
    assert get(pod, "/nope").status == 404


def test_clock_advances_during_a_call(rt, pods):
    pod = make(rt, pods)
    t0 = state(pod)["time_ms"]
    assert json.loads(get(pod, "/work", "POST", "ms=30").body) == {"worked_ms": 30}
    assert state(pod)["time_ms"] >= t0 + 30


def test_memory_grows_up_to_the_limit(rt, pods):
    pod = make(rt, pods, memory_limit_bytes=4 * 65536)
    assert pod.memory_bytes == 65536
    assert get(pod, "/alloc", "POST", "kb=128").status == 200
    assert pod.memory_bytes == 3 * 65536
    refused = get(pod, "/alloc", "POST", "kb=128")
    assert refused.status == 507 and pod.state == "running"


def test_memory_limit_below_the_initial_memory_fails_start(rt, pods):
    module = wat_pod(rt, '(module (memory 4) (func (export "k32_handle")))')
    with pytest.raises(PodError, match="below the module's initial memory"):
        make(rt, pods, "big", module=module, memory_limit_bytes=65536)


# -- the other example pods --------------------------------------------------------------

def test_echo_answers_the_request_back(rt, pods):
    pod = make(rt, pods, "echo")
    r = get(pod, "/a/b", "PUT", "x=1&y=2", (("X-Test", "yes"), ("Accept", "*/*")), b"payload")
    text = r.body.decode()
    assert "method: PUT\n" in text and "path: /a/b\n" in text and "query: x=1&y=2\n" in text
    assert "X-Test: yes\n" in text and "Accept: */*\n" in text and text.endswith("body: payload")


def test_echo_pulls_a_large_body_in_pieces(rt, pods):
    pod = make(rt, pods, "echo")
    body = bytes(range(256)) * 200
    assert get(pod, "/", "POST", body=body).body.endswith(body)


def test_chat_pods_talk_over_a_channel(rt, pods):
    host = FakeHost()
    a = make(rt, pods, "chat", host=host)
    b = make(rt, pods, "chat", host=host)
    assert json.loads(get(a, "/send", "POST", "msg=hi-from-a").body)["receivers"] == 1
    assert json.loads(get(b, "/send", "POST", "msg=hi-from-b").body)["receivers"] == 1
    assert get(b).body == b"hi-from-a\n"
    assert get(a).body == b"hi-from-b\n"
    assert get(a).body == b""


def test_channels_are_scoped_by_namespace(rt, pods):
    host = FakeHost()
    a = make(rt, pods, "chat", host=host)
    make(rt, pods, "chat", host=host, namespace="other")
    assert json.loads(get(a, "/send", "POST", "msg=x").body)["receivers"] == 0


def test_ticker_ticks_gets_events_and_publishes(rt, pods):
    host = FakeHost()
    pod = make(rt, pods, "ticker", host=host, tick_interval_ms=5, topics=("alerts",))
    pod.deliver_event("alerts", b"fire")
    wait_for(lambda: json.loads(get(pod).body)["ticks"] >= 10)
    s = json.loads(get(pod).body)
    assert s["events"] == 1 and s["last_topic"] == "alerts"
    assert ("ticker", "ticker.tens", b"10") in host.published


def test_command_pod_runs_on_its_own_thread_and_exits(rt, pods):
    host = FakeHost()
    pod = make(rt, pods, "clock", host=host, start=False, env={"LINES": "3", "PERIOD_MS": "5"})
    exits = []
    done = threading.Event()
    pod.on_exit = lambda code, reason, msg: (exits.append((code, reason)), done.set())
    pod.start()
    assert done.wait(5)
    assert exits == [(0, "Completed")] and pod.state == "exited"
    assert [line for _n, line in host.logs][0].startswith("clock: tick 1 at ")
    assert len(host.logs) == 3


@pytest.mark.parametrize(("env", "wat", "want"), [
    ({"EXIT_CODE": "42"}, None, (42, "Error", "main returned 42")),
    ({"EXIT_CODE": "0"}, None, (0, "Completed", "main returned 0")),
    ({"EXIT_CODE": "7", "JOB_COMPLETION_INDEX": "2", "EXIT_CODE_2": "3"}, None, (3, "Error", "main returned 3")),
    ({}, '(func (export "main") (result i32) i32.const 256)', (0, "Completed", "main returned 256")),
    ({}, '(func (export "main") (result i32) i32.const -1)', (255, "Error", "main returned -1")),
    ({}, '(func (export "_start"))', (0, "Completed", "_start returned")),
])
def test_a_command_pods_entry_point_returns_its_exit_code(rt, pods, env, wat, want):
    """The i32 an entry point returns is the exit code, its low 8 bits as a process's."""
    module = rt.load(wasmtime.wat2wasm(f'(module (memory (export "memory") 1) {wat})')) if wat else None
    pod = make(rt, pods, "exit", module=module, start=False, env=env)
    exits = []
    done = threading.Event()
    pod.on_exit = lambda code, reason, msg: (exits.append((code, reason, msg)), done.set())
    pod.start()
    assert done.wait(5)
    assert exits == [want] and pod.state == "exited"


def test_command_pod_cannot_move_and_stops_on_request(rt, pods):
    pod = make(rt, pods, "clock", env={"PERIOD_MS": "5"})
    assert pod.blockers() == ["entry point _start runs on its own thread"]
    with pytest.raises(PodError, match="entry point _start runs on its own thread"):
        pod.freeze(100)
    assert get(pod).status == 501
    pod.stop()
    assert pod.state == "stopped"


def test_command_pod_spinning_without_host_calls_is_stopped(rt, pods):
    module = wat_pod(rt, '(module (memory 1) (func (export "_start") (loop (br 0))))')
    pod = make(rt, pods, "spin", module=module)
    time.sleep(0.05)
    pod.stop()
    assert pod.state == "stopped" and not pod._thread.is_alive()


# -- ABI edge cases: never a trap from the host ------------------------------------------

ABI_PROBE = """
(module
  (import "k32" "k32_log" (func $log (param i32 i32) (result i32)))
  (import "k32" "k32_req_method" (func $method (param i32 i32) (result i32)))
  (import "k32" "k32_resp_status" (func $status (param i32) (result i32)))
  (import "k32" "k32_resp_body" (func $body (param i32 i32) (result i32)))
  (import "k32" "kube32_channel_send" (func $send (param i32 i32 i32) (result i32)))
  (import "k32" "k32_fs_open" (func $open (param i32 i32) (result i32)))
  (import "k32" "k32_env" (func $env (param i32 i32 i32 i32) (result i32)))
  (import "k32" "k32_random" (func $random (param i32 i32) (result i32)))
  (memory 1)
  (global $inits (mut i32) (i32.const 0))
  (data (i32.const 0) "GONE")
  (func $store (param $at i32) (param $v i32) (i32.store (local.get $at) (local.get $v)))
  (func (export "k32_init")
    (global.set $inits (i32.add (global.get $inits) (i32.const 1)))
    ;; request access outside k32_handle -> K32_ESTATE (-6)
    (call $store (i32.const 100) (call $method (i32.const 0) (i32.const 4))))
  (func (export "k32_handle")
    (call $store (i32.const 104) (call $log (i32.const 65530) (i32.const 100)))      ;; -1 EINVAL
    (call $store (i32.const 108) (call $send (i32.const 42) (i32.const 0) (i32.const 1)))  ;; -3 EBADF
    (call $store (i32.const 112) (call $open (i32.const 0) (i32.const 4)))           ;; -2 ENOENT
    (call $store (i32.const 116) (call $env (i32.const 0) (i32.const 4) (i32.const 0) (i32.const 0))) ;; -2
    (call $store (i32.const 120) (call $method (i32.const 200) (i32.const 2)))       ;; 3, 2 bytes copied
    (call $store (i32.const 124) (call $random (i32.const 300) (i32.const 4)))       ;; 4
    (call $store (i32.const 128) (call $status (i32.const 1000)))                    ;; -1
    (drop (call $status (i32.const 201)))
    (drop (call $body (i32.const 100) (i32.const 32)))
    (drop (call $body (i32.const 200) (i32.const 8)))
    (drop (call $body (i32.const 300) (i32.const 4))))
)
"""


def test_host_functions_return_error_codes_instead_of_trapping(rt, pods):
    pod = make(rt, pods, "probe", module=wat_pod(rt, ABI_PROBE))
    r = get(pod, "/", "GET")
    assert r.status == 201
    codes = [int.from_bytes(r.body[i:i + 4], "little", signed=True) for i in range(0, 32, 4)]
    assert codes == [-6, -1, -3, -2, -2, 3, 4, -1]
    assert r.body[32:34] == b"GE" and r.body[40:44] == bytes(range(4))


def test_a_trap_fails_the_pod_and_is_reported(rt, pods):
    module = wat_pod(rt, '(module (memory 1) (func (export "k32_handle") unreachable))')
    pod = make(rt, pods, "trap", module=module, start=False)
    exits = []
    pod.on_exit = lambda *a: exits.append(a)
    pod.start()
    with pytest.raises(PodError, match="k32_handle failed: .*unreachable"):
        get(pod)
    wait_for(lambda: exits)
    assert exits[0][:2] == (1, "Error") and pod.state == "failed" and "unreachable" in pod.last_error
    with pytest.raises(PodError, match="pod is failed"):
        pod.handle(HttpRequest("GET", "/"))


def test_a_trap_in_init_is_raised_by_start(rt, pods):
    module = wat_pod(rt, '(module (memory 1) (func (export "k32_init") unreachable) (func (export "k32_handle")))')
    with pytest.raises(PodError, match="k32_init failed"):
        make(rt, pods, "bad", module=module)


def test_a_call_past_the_call_timeout_is_interrupted(rt, pods):
    module = wat_pod(rt, '(module (memory 1) (func (export "k32_handle") (loop (br 0))))')
    pod = make(rt, pods, "loop", module=module, call_timeout_ms=100)
    with pytest.raises(PodError, match="exceeded the call timeout of 100 ms"):
        get(pod)


# -- freeze and thaw -----------------------------------------------------------------------

def test_frozen_pod_refuses_requests_holds_events_and_stops_ticking(rt, pods):
    pod = make(rt, pods, tick_interval_ms=5)
    wait_for(lambda: state(pod)["ticks"] >= 1)
    pod.freeze(1000)
    assert pod.frozen and pod.state == "frozen"
    with pytest.raises(PodFrozen):
        pod.handle(HttpRequest("GET", "/"))
    for i in range(10):
        pod.deliver_event("t", str(i).encode())
    assert pod.dropped_events == 2
    frozen_time = pod.pod_time_ms()
    ticks_at_freeze = pod.snapshot().total_size  # a snapshot is possible while frozen
    time.sleep(0.05)
    assert pod.pod_time_ms() == frozen_time        # the clock stops while frozen
    pod.thaw()
    s = state(pod)                                  # held events were delivered before this request
    assert s["events"] == 8 and s["last_event"] == "t:7"
    assert s["time_ms"] >= frozen_time
    assert ticks_at_freeze > 0


def test_the_events_a_pod_had_queued_before_its_freeze_are_all_kept_and_snapshotted(rt, pods):
    """A freeze drops none of the events the pod had queued (12, behind a long call): the
    snapshot carries them all, and a frozen pod takes more only while fewer than 8 wait."""
    pod = make(rt, pods)
    working = pod.handle(HttpRequest("POST", "/work", "ms=300", (), b""))
    wait_for(working.running)                       # the call runs: events queue behind it
    for i in range(12):
        pod.deliver_event("t", f"q{i}".encode())
    pod.freeze(5000)                                # once the call returned
    assert working.result(timeout=5).status == 200
    assert pod.dropped_events == 0
    pod.deliver_event("t", b"while-frozen")         # 12 wait already: dropped and counted
    assert pod.dropped_events == 1
    snap = k32s.SnapshotReader().read_from(io.BytesIO(snapshot_bytes(pod)))
    assert [e.payload for e in snap.state.events] == [f"q{i}".encode() for i in range(12)]
    pod.thaw()
    s = state(pod)
    assert s["events"] == 12 and s["last_event"] == "t:q11", s


def test_a_running_pods_event_queue_is_bounded_in_payload_bytes_too(rt, pods):
    pod = make(rt, pods)
    working = pod.handle(HttpRequest("POST", "/work", "ms=300", (), b""))
    wait_for(working.running)
    big = b"x" * ((64 << 10) - 1)
    for _ in range(20):                            # 1280 KiB: the last 4 do not fit 1 MiB
        pod.deliver_event("t", big)
    assert pod.dropped_events == 4
    working.result(timeout=5)


def test_a_snapshot_of_a_full_event_queue_stays_readable() -> None:
    """The queue a snapshot carries whole fits, framing and all, well inside the EVENTS
    section a reader takes."""
    from kube32.snapshot.reader import MAX_SMALL_SECTION
    from kube32.wasm.pod import MAX_QUEUED_EVENT_BYTES, MAX_QUEUED_EVENTS
    framing = 2 + 4   # u16 topic length, u32 payload length
    assert MAX_QUEUED_EVENT_BYTES + MAX_QUEUED_EVENTS * framing < MAX_SMALL_SECTION // 4


def test_a_snapshots_size_is_known_before_the_freeze(rt, pods):
    """The kubelet's dry run says it, so the control plane finds room before the freeze."""
    pod = make(rt, pods)
    get(pod)
    before = pod.snapshot_size()
    pod.freeze(1000)
    assert before == pod.snapshot().total_size == len(snapshot_bytes(pod))
    for i in range(3):
        pod.deliver_event("topic", b"x" * (100 + i))  # held while frozen: in the snapshot too
    assert pod.snapshot_size() == pod.snapshot().total_size == len(snapshot_bytes(pod)) > before
    pod.thaw()
    # Globals and tables count as the snapshot writes them.
    module = wat_pod(rt, '(module (memory 2) (global (mut i64) (i64.const 7)) (global (mut i32) (i32.const 1))'
                         ' (table 5 funcref) (func (export "k32_handle")))')
    pod = make(rt, pods, "shaped", module=module)
    before = pod.snapshot_size()
    pod.freeze(1000)
    assert before == len(snapshot_bytes(pod))
    pod.thaw()


def test_ticks_stop_while_frozen(rt, pods):
    pod = make(rt, pods, tick_interval_ms=2)
    wait_for(lambda: state(pod)["ticks"] >= 2)
    pod.freeze(1000)
    first = snapshot_bytes(pod)
    time.sleep(0.05)
    assert snapshot_bytes(pod) == first            # no tick ran, nothing changed
    pod.thaw()


def test_same_frozen_pod_gives_the_same_snapshot(rt, pods):
    pod = make(rt, pods)
    get(pod)
    pod.freeze(1000)
    pod.deliver_event("a", b"1")
    assert snapshot_bytes(pod) == snapshot_bytes(pod)


def test_freeze_timeout_names_the_call_and_the_pod_keeps_running(rt, pods):
    pod = make(rt, pods)
    slow = pod.handle(HttpRequest("POST", "/work", "ms=400"))
    wait_for(lambda: pod._busy == "k32_handle")
    with pytest.raises(CallTimeout, match=r"^call k32_handle still running after 50 ms$"):
        pod.freeze(50)
    assert not pod.frozen
    assert slow.result(timeout=5).status == 200
    assert state(pod)["requests"] == 2


def test_thaw_of_a_running_pod_is_refused(rt, pods):
    pod = make(rt, pods)
    with pytest.raises(PodError, match="not frozen"):
        pod.thaw()
    with pytest.raises(PodError, match="not frozen"):
        pod.snapshot()


FILE_POD = """
(module
  (import "k32" "k32_fs_open" (func $open (param i32 i32) (result i32)))
  (import "k32" "k32_fs_read" (func $read (param i32 i32 i32) (result i32)))
  (import "k32" "k32_fs_close" (func $close (param i32) (result i32)))
  (import "k32" "k32_resp_body" (func $body (param i32 i32) (result i32)))
  (memory 1)
  (global $fd (mut i32) (i32.const -1))
  (data (i32.const 0) "/etc/app.conf")
  (func (export "k32_init") (global.set $fd (call $open (i32.const 0) (i32.const 13))))
  (func (export "k32_handle")
    (drop (call $body (i32.const 100) (call $read (global.get $fd) (i32.const 100) (i32.const 64))))
    (drop (call $close (global.get $fd)))
    (global.set $fd (i32.const -1)))
)
"""


def test_open_file_between_calls_blocks_a_move(rt, pods):
    pod = make(rt, pods, "files", module=wat_pod(rt, FILE_POD), assets={"etc/app.conf": b"mode=fast\n"})
    assert pod.blockers() == ["open file /etc/app.conf (descriptor 3)"]
    pod.freeze(1000)
    with pytest.raises(PodError, match=r"open file /etc/app.conf \(descriptor 3\)"):
        pod.snapshot()
    pod.thaw()
    assert get(pod).body == b"mode=fast\n"
    assert pod.blockers() == []


# -- snapshot and restore in one process ----------------------------------------------------

def test_snapshot_holds_hidden_globals_tables_clock_channels_events(rt, pods):
    pod = make(rt, pods)
    get(pod)
    pod.freeze(1000)
    pod.deliver_event("held", b"x")
    data = snapshot_bytes(pod)
    snap = k32s.SnapshotReader().read_from(io.BytesIO(data))
    st = snap.state
    assert st.image_sha256.hex() == pod.module.sha256
    assert st.memory_bytes == 65536 and st.memory_pages == 1
    assert [g.index for g in st.globals] == [0] and st.globals[0].valtype == 0x7F
    assert 0 < st.globals[0].bits <= 65536                  # __stack_pointer
    assert len(st.tables) == 1 and len([e for e in st.tables[0].entries if e != k32s.NULL_FUNC]) == 3
    assert st.channels == (k32s.ChannelState(1, "counter-log"),)
    assert st.events == (k32s.HeldEvent("held", b"x"),)
    assert st.pod_time_ms == pod.pod_time_ms()


def test_restore_continues_state_clock_channels_and_events(rt, pods):
    host = FakeHost()
    src = make(rt, pods, host=host)
    for _ in range(3):
        get(src)
    get(src, "/alloc", "POST", "kb=64")
    src.freeze(1000)
    src.deliver_event("late", b"1")
    t_freeze = src.pod_time_ms()
    data = snapshot_bytes(src)
    src.stop()
    dst = restore(rt, pods, data, host=host)
    s = state(dst)
    assert s["requests"] == 5 and s["init_calls"] == 1 and s["restored_calls"] == 1
    assert s["events"] == 1 and s["last_event"] == "late:1"
    assert s["grown_kb"] == 64 and dst.memory_bytes == 2 * 65536
    assert s["time_ms"] >= t_freeze
    assert host.channels.channels() == {"default/counter-log": 1}
    assert [line for _n, line in host.logs].count("counter: restored") == 1


# -- restore refusals, each by name -----------------------------------------------------------

@pytest.fixture(scope="module")
def counter_snapshot(rt):
    pod = Pod(rt, load(rt, "counter"), config(), FakeHost())
    pod.start()
    pod.handle(HttpRequest("POST", "/alloc", "kb=128")).result()
    pod.freeze(1000)
    buf = io.BytesIO()
    pod.snapshot().write_to(buf)
    pod.stop()
    return buf.getvalue()


def refused(rt, pods, data, **kw) -> k32s.SnapshotError:
    pod = make(rt, pods, start=False, **kw)
    reader = pod.prepare_restore()
    with pytest.raises(k32s.SnapshotError) as err:
        reader.read_from(io.BytesIO(data))
    return err.value


def test_restore_into_too_small_a_memory_limit_is_refused(rt, pods, counter_snapshot):
    err = refused(rt, pods, counter_snapshot, memory_limit_bytes=2 * 65536)
    assert err.cause == "memory-limit" and "memory limit" in str(err)


def test_restore_from_another_module_is_refused(rt, pods, counter_snapshot):
    pod = make(rt, pods, "echo", start=False)
    with pytest.raises(k32s.SnapshotError) as err:
        pod.prepare_restore().read_from(io.BytesIO(counter_snapshot))
    assert err.value.cause == "image"


@pytest.mark.parametrize("damage, cause", [
    (lambda d: b"XXXX" + d[4:], "magic"),
    (lambda d: d[:4] + b"\x09\x00" + d[6:], "version"),
    (lambda d: d[:-1] + bytes([d[-1] ^ 1]), "trailer"),
    (lambda d: d[:1000] + bytes([d[1000] ^ 0xFF]) + d[1001:], "trailer"),
    (lambda d: d[:-40], "truncated"),
])
def test_damaged_snapshots_are_refused(rt, pods, counter_snapshot, damage, cause):
    assert refused(rt, pods, damage(counter_snapshot)).cause == cause


def _forged(rt, counter_snapshot, **changes) -> bytes:
    st = k32s.SnapshotReader().read_from(io.BytesIO(counter_snapshot)).state
    import dataclasses
    memory = bytearray(st.memory_bytes)
    return b"".join(bytes(p) for p in k32s.SnapshotWriter(dataclasses.replace(st, **changes), memory).pieces())


def test_snapshot_whose_globals_do_not_match_is_refused(rt, pods, counter_snapshot):
    data = _forged(rt, counter_snapshot, globals=(k32s.GlobalState(0, 0x7E, 1),))
    assert refused(rt, pods, data).cause == "global"


def test_snapshot_whose_tables_do_not_match_is_refused(rt, pods, counter_snapshot):
    data = _forged(rt, counter_snapshot, tables=(k32s.TableState(3, (0,)),))
    assert refused(rt, pods, data).cause == "table"


def test_image_error_is_distinct_from_pod_error():
    assert not issubclass(ImageError, PodError)


def test_memory_limit_below_one_page_snapshots_only_the_backed_bytes(rt, pods):
    pod = make(rt, pods, memory_limit_bytes=40000)
    get(pod)
    assert pod.memory_bytes == 40000
    pod.freeze(1000)
    data = snapshot_bytes(pod)
    header = k32s.SnapshotReader().read_from(io.BytesIO(data)).header
    assert (header.memory_bytes, header.memory_pages) == (40000, 1)
    restored = restore(rt, pods, data, memory_limit_bytes=40000)
    assert state(restored)["requests"] == 2
    assert refused(rt, pods, data, memory_limit_bytes=30000).cause == "memory-limit"
