"""Attack 21: the engine seam, the pwasm interpreter engine and workers of other CPUs.

Every test here is a confirmed finding and fails on the code it was written against.
They run real processes the way a user does: ``kube32-sim up`` (through
tests/conftest.py's start_cluster), an extra ``kube32-sim worker --engine pwasm``,
``kube32-cli`` and the preinstalled ``kubectl``.  One test also runs an s390x worker
under qemu-user as docs/cross-cpu.md shows (skipped when the root filesystems of
``make test-cross`` are not built).

Hostile pods are written in WAT here and assembled with the venv's wasmtime.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import statistics
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import wasmtime

from tests.conftest import ROOT, Proc, start, start_cluster, sim_command, wait_for

pytestmark = pytest.mark.e2e

CLI = [sys.executable, "-m", "kube32.cli.main"]
COUNTER = ROOT / "examples" / "pods" / "counter.wasm"
PW_ADDRESS = "127.0.0.41"        # the extra pwasm worker's node address
S390X_ADDRESS = "127.0.0.42"     # the qemu s390x worker's
CROSS_CACHE = Path(os.environ.get("KUBE32_CROSS_CACHE", "/var/cache/kube32-cross"))

HEAD = '(import "k32" "k32_resp_body" (func $rb (param i32 i32) (result i32)))'


def wat(src: str) -> bytes:
    return wasmtime.wat2wasm(src)


def rss_mib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) // 1024
    raise AssertionError(f"no VmRSS for {pid}")


def children(pid: int) -> list[int]:
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


class Cluster:
    """One ``kube32-sim up --workers 2`` cluster plus a pwasm worker ``pw-1``."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.cp = start_cluster(base / "cluster", 2, "--backoff", "1")
        self.env = {**os.environ, "KUBECONFIG": str(self.cp.kubeconfig)}
        self.pw = self.worker("pw-1", PW_ADDRESS, "--engine", "pwasm")
        self.qemu: list[Proc] = []

    def worker(self, name: str, address: str, *extra: str) -> Proc:
        proc = start(sim_command("worker", "--kubeconfig", str(self.cp.data_dir / "node.kubeconfig"),
                                 "--name", name, "--address", address, "--port", "0",
                                 "--data-dir", str(self.base / name), *extra),
                     self.base / f"{name}.log")
        wait_for(lambda: self.node_ready(name), 90, 0.5, what=f"node {name} Ready")
        return proc

    def node_ready(self, name: str) -> bool:
        cp = self.cp.kubectl("get", "node", name, "-o", "json", check=False)
        if cp.returncode != 0:
            return False
        conds = json.loads(cp.stdout)["status"].get("conditions") or []
        return any(c["type"] == "Ready" and c["status"] == "True" for c in conds)

    @property
    def control_plane_pid(self) -> int:
        """``up``'s child that runs the API server and the node devkit."""
        for pid in children(self.cp.proc.popen.pid):
            if "control-plane" in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace"):
                return pid
        raise AssertionError("no control-plane process under kube32-sim up")

    def push(self, wasm: bytes, name: str) -> str:
        path = self.base / f"{name}.wasm"
        path.write_bytes(wasm)
        cp = subprocess.run([*CLI, "image", "push", str(path)], capture_output=True, text=True,
                            env=self.env, cwd=ROOT, timeout=120)
        assert cp.returncode == 0, cp.stderr
        return cp.stdout.strip()

    def run_pod(self, name: str, image: str, node: str, annotations: dict | None = None,
                memory: str | None = None, ready: bool = True, timeout: float = 90) -> None:
        container: dict = {"name": "main", "image": image}
        if memory:
            container["resources"] = {"limits": {"memory": memory}}
        pod = {"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": name, "annotations": annotations or {}},
               "spec": {"nodeName": node, "restartPolicy": "Never", "containers": [container]}}
        self.cp.kubectl("delete", "pod", name, "--ignore-not-found", "--wait=true", timeout=120)
        self.cp.kubectl("apply", "-f", "-", input=json.dumps(pod))
        if ready:
            self.cp.kubectl("wait", "--for=condition=Ready", f"pod/{name}", f"--timeout={int(timeout)}s",
                            timeout=timeout + 30)

    def delete(self, *names: str) -> None:
        self.cp.kubectl("delete", "pod", *names, "--ignore-not-found", "--wait=false", check=False)

    def wait_empty(self, node: str) -> None:
        """Until no pod is bound to ``node`` any more (the previous tests' are gone)."""
        def empty() -> bool:
            out = self.cp.kubectl("get", "pods", "-o", "json", "--field-selector", f"spec.nodeName={node}").stdout
            return not json.loads(out)["items"]
        wait_for(empty, 120, 0.5, what=f"no pods on {node}")
        time.sleep(2)

    def get(self, pod: str, path: str = "/", timeout: float = 60) -> str:
        return self.cp.kubectl("get", "--raw", f"/api/v1/namespaces/default/pods/{pod}/proxy{path}",
                               timeout=timeout).stdout

    def post(self, pod: str, path: str) -> str:
        return self.cp.kubectl("create", "--raw", f"/api/v1/namespaces/default/pods/{pod}/proxy{path}",
                               "-f", "-", input="").stdout

    def move(self, pod: str, to: str) -> subprocess.CompletedProcess:
        return subprocess.run([*CLI, "move", pod, "--to", to], capture_output=True, text=True,
                              env=self.env, cwd=ROOT, timeout=180)

    def checkpoint_data(self, pod: str) -> bytes:
        cp = subprocess.run([*CLI, "checkpoint", pod], capture_output=True, text=True, env=self.env,
                            cwd=ROOT, timeout=120)
        assert cp.returncode == 0, cp.stdout + cp.stderr
        name = next(w.strip("(),.:") for w in cp.stdout.split() if w.startswith(f"{pod}-save-"))
        raw = subprocess.run(["kubectl", "--kubeconfig", str(self.cp.kubeconfig), "get", "--raw",
                              f"/apis/kube32.io/v1/namespaces/default/checkpoints/{name}/data"],
                             capture_output=True, timeout=60)
        assert raw.returncode == 0, raw.stderr
        return raw.stdout

    def stop(self) -> None:
        for proc in [*self.qemu, self.pw]:
            proc.stop(timeout=30)
        self.cp.proc.stop(timeout=40)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory):
    c = Cluster(tmp_path_factory.mktemp("atk21"))
    try:
        yield c
    finally:
        c.stop()


def sections(data: bytes) -> dict[int, list[bytes]]:
    """A K32S snapshot's sections by type (docs: the snapshot format)."""
    assert data[:4] == b"K32S", data[:16]
    count = struct.unpack_from("<I", data, 64)[0]
    pos, out = 68, {}
    for _ in range(count):
        kind, length = struct.unpack_from("<HI", data, pos)
        out.setdefault(kind, []).append(data[pos + 6:pos + 6 + length])
        pos += 6 + length
    return out


def counter_state(c: Cluster, pod: str) -> dict:
    return json.loads(c.get(pod, "/"))


# --------------------------------------------------------------------------------------------
# 1. A memory limit that is not a whole number of pages: the engines let the pod grow to the
#    limit rounded up to whole pages (engine.py: "Memory is capped at the limit rounded up to
#    whole 64 KiB pages"), and the restore then refuses the snapshot because it holds more
#    bytes than the limit: every move of such a pod loses its state, on both engines.
# --------------------------------------------------------------------------------------------
def test_pod_with_a_limit_between_pages_keeps_its_state_when_moved(cluster: Cluster) -> None:
    c = cluster
    image = c.push(COUNTER.read_bytes(), "counter")
    c.run_pod("between", image, "pw-1", memory="100Ki")
    # counter's own /alloc: one more page, which the engine allows (2 pages <= 100Ki rounded up)
    assert json.loads(c.post("between", "/alloc?kb=64"))["grown_kb"] == 64
    before = counter_state(c, "between")
    assert before["grown_kb"] == 64 and before["init_calls"] == 1

    out = c.move("between", "devkit")
    after = counter_state(c, "between")
    # A move that cannot happen must be refused with the pod running where it is; a move
    # that happens carries the state.  Either way the counters go on.
    assert after["requests"] == before["requests"] + 1 and after["grown_kb"] == 64, (
        f"the pod's state was lost by a move:\nbefore {before}\nafter  {after}\n"
        f"kube32-cli move said:\n{out.stdout}{out.stderr}")
    c.delete("between")


# --------------------------------------------------------------------------------------------
# 2. A memory limit below one page: the pod gets the whole page (it can read and write all of
#    it, memory.size says 1 page), but only the limit is saved: what it keeps past the limit
#    silently goes back to zero after a move.
# --------------------------------------------------------------------------------------------
SUBPAGE_WAT = f"""(module {HEAD}
  (memory 1)
  ;; a counter at byte 60000: inside the pod's one page, past a 4 KiB limit
  (func (export "k32_handle")
    (i32.store (i32.const 60000) (i32.add (i32.load (i32.const 60000)) (i32.const 1)))
    (i32.store8 (i32.const 0) (i32.add (i32.const 0x30) (i32.load (i32.const 60000))))
    (drop (call $rb (i32.const 0) (i32.const 1)))))"""


def test_sub_page_pod_does_not_lose_what_it_wrote_past_its_limit(cluster: Cluster) -> None:
    c = cluster
    image = c.push(wat(SUBPAGE_WAT), "subpage")
    c.run_pod("subpage", image, "pw-1", memory="4Ki")
    answers = [c.get("subpage") for _ in range(3)]
    assert answers == ["1", "2", "3"], answers     # the writes past the limit worked
    out = c.move("subpage", "devkit")
    assert "moved subpage" in out.stdout, out.stdout + out.stderr
    # Either the pod may not use bytes past its limit (its first call fails), or what it
    # keeps there moves with it.  Here it could, and after the move they are zero.
    assert c.get("subpage") == "4", "the counter the pod kept at byte 60000 was reset by the move"
    c.delete("subpage")


# --------------------------------------------------------------------------------------------
# 3. pwasm translates a function to Python on its second call, with CPython's compile(), which
#    holds the GIL and checks no deadline.  One pod on devkit (the control plane's own node,
#    which runs in the control plane's process) with a large straight-line function freezes
#    the API server for the whole compile: ~10 s for this 5.6 MB module, ~40 s (a worker's
#    Lease unrenewed for 34 s) for a 7 MB one, well inside the 8 MiB image limit.
# --------------------------------------------------------------------------------------------
def big_module(repeats: int, salt: int) -> bytes:
    body = "(global.set 0 (i32.add (global.get 0) (i32.const 1)))\n" * repeats
    return wat(f"""(module {HEAD} (memory 1) (global (mut i32) (i32.const {salt}))
      (func (export "k32_handle") {body} (drop (call $rb (i32.const 0) (i32.const 0)))))""")


def test_a_pod_on_devkit_cannot_freeze_the_api_server(cluster: Cluster) -> None:
    c = cluster
    # a salt of its own: pwasm caches generated code on disk per module digest
    image = c.push(big_module(800_000, time.time_ns() & 0x7FFFFFFF), "big-devkit")
    c.run_pod("bigdev", image, "devkit", timeout=150)
    c.get("bigdev", timeout=150)                      # first call: interpreted
    latencies: list[float] = []
    done = threading.Event()

    def probe() -> None:
        while not done.is_set() and len(latencies) < 400:
            t = time.monotonic()
            c.cp.kubectl("get", "--raw", "/readyz", check=False, timeout=200)
            latencies.append(time.monotonic() - t)
            time.sleep(0.2)

    prober = threading.Thread(target=probe, daemon=True)
    prober.start()
    try:
        time.sleep(1)
        t = time.monotonic()
        c.get("bigdev", timeout=200)                  # second call: pwasm's tier-up compile
        call_s = time.monotonic() - t
    finally:
        time.sleep(1)
        done.set()
        prober.join(timeout=210)
        c.delete("bigdev")
    print(f"devkit: second call {call_s:.1f} s, /readyz max {max(latencies):.1f} s over {len(latencies)} probes")
    assert max(latencies) < 5.0, (
        f"/readyz took up to {max(latencies):.1f} s while one pod's call ran ({call_s:.1f} s) on devkit "
        f"(median {statistics.median(latencies):.2f} s): the API server stalls with the pod")


# --------------------------------------------------------------------------------------------
# 4. What a pod costs its node beyond its linear memory is not bounded: tables grow (pwasm:
#    up to 10,000,000 entries per table, any number of tables) outside the memory limit and
#    outside the node's heap accounting.  A pod limited to 64 KiB makes its pwasm kubelet
#    allocate ~300 MiB in one call; the node still reports its whole heap free.
# --------------------------------------------------------------------------------------------
TABLES_WAT = f"""(module {HEAD}
  (memory 1)
  (table $t0 0 funcref) (table $t1 0 funcref) (table $t2 0 funcref) (table $t3 0 funcref)
  (func (export "k32_handle")
    (i32.store (i32.const 0) (table.grow $t0 (ref.null func) (i32.const 10000000)))
    (drop (table.grow $t1 (ref.null func) (i32.const 10000000)))
    (drop (table.grow $t2 (ref.null func) (i32.const 10000000)))
    (drop (table.grow $t3 (ref.null func) (i32.const 10000000)))
    (drop (call $rb (i32.const 0) (i32.const 4)))))"""


def test_tables_do_not_escape_the_pods_memory_limit(cluster: Cluster) -> None:
    c = cluster
    image = c.push(wat(TABLES_WAT), "tables")
    c.wait_empty("pw-1")
    c.run_pod("tables", image, "pw-1", memory="64Ki")
    before = rss_mib(c.pw.popen.pid)
    old_size = c.cp.kubectl("get", "--raw", "/api/v1/namespaces/default/pods/tables/proxy/").stdout
    grown = rss_mib(c.pw.popen.pid) - before
    c.delete("tables")
    assert grown < 100, (
        f"a pod limited to 64 KiB grew 4 tables by 10M entries (table.grow answered "
        f"{old_size.encode()!r}, not -1) and its pwasm kubelet's RSS grew by {grown} MiB")


# --------------------------------------------------------------------------------------------
# 5. The same, kept: a pwasm kubelet keeps every module it ever decoded (and the Python it
#    generated for it) for its whole life.  After the pod of one 3.5 MB image is deleted, the
#    kubelet holds ~0.5 GB more than before (a 7 MB image: 2.3 GB); a few such images exhaust
#    the machine (on devkit: the control plane's process).
# --------------------------------------------------------------------------------------------
def test_pwasm_node_gives_memory_back_after_the_pod_is_deleted(cluster: Cluster) -> None:
    c = cluster
    c.wait_empty("pw-1")
    before = rss_mib(c.pw.popen.pid)
    image = c.push(big_module(500_000, (time.time_ns() + 1) & 0x7FFFFFFF), "big-pw")
    c.run_pod("bigpw", image, "pw-1", timeout=150)
    for _ in range(3):
        c.get("bigpw", timeout=200)
    peak = rss_mib(c.pw.popen.pid)
    c.cp.kubectl("delete", "pod", "bigpw", "--wait=true", timeout=120)
    time.sleep(3)
    after = rss_mib(c.pw.popen.pid)
    print(f"pw-1 RSS: {before} MiB before, {peak} MiB with the pod, {after} MiB after it was deleted")
    assert after - before < 150, (
        f"pw-1's RSS was {before} MiB, {peak} MiB while the pod ran, and {after} MiB after the "
        f"pod was deleted: the node keeps what a deleted pod's image cost it")


# --------------------------------------------------------------------------------------------
# 6. Busy pwasm pods on devkit share the control plane's interpreter (the GIL): each one adds
#    ~0.15 s to every API request.  Half of devkit's 16 pod slots busy make kubectl calls
#    ~12x slower and a move take 10 s.
# --------------------------------------------------------------------------------------------
SPIN_WAT = f"""(module {HEAD}
  (memory 1)
  (global $x (mut i32) (i32.const 0))
  (func (export "k32_tick")
    (local $n i32)
    (local.set $n (i32.const 3000000))
    (loop $l
      (global.set $x (i32.add (global.get $x) (i32.const 1)))
      (local.set $n (i32.sub (local.get $n) (i32.const 1)))
      (br_if $l (local.get $n))))
  (func (export "k32_handle") (drop (call $rb (i32.const 0) (i32.const 1)))))"""


def api_median(c: Cluster, n: int = 12) -> float:
    samples = []
    for _ in range(n):
        t = time.monotonic()
        c.cp.kubectl("get", "pods", "-o", "name", timeout=60)
        samples.append(time.monotonic() - t)
        time.sleep(0.2)
    return statistics.median(samples)


def test_busy_pods_on_devkit_do_not_slow_the_api_server(cluster: Cluster) -> None:
    c = cluster
    baseline = api_median(c)
    image = c.push(wat(SPIN_WAT), "spin")
    names = [f"spin{i}" for i in range(6)]
    try:
        for name in names:
            c.run_pod(name, image, "devkit", annotations={"kube32.io/tick-interval": "10ms"})
        time.sleep(2)
        busy = api_median(c)
    finally:
        c.delete(*names)
    assert busy < max(3 * baseline, 0.3), (
        f"kubectl get pods: median {baseline:.2f} s, {busy:.2f} s with 6 busy pods on devkit")


# --------------------------------------------------------------------------------------------
# 7. "The same input gives the same K32S bytes on every CPU" (issue #21): not for a pod that
#    computes a NaN.  pwasm computes f64 arithmetic with the host's floats, and the NaN an
#    invalid operation gives is the CPU's: 0xfff8000000000000 on x86_64, 0x7ff8000000000000 on
#    s390x, armhf and arm64.  (wasmtime does not canonicalize NaNs either.)
# --------------------------------------------------------------------------------------------
NAN_WAT = f"""(module {HEAD}
  (memory 1)
  (global $g (mut f64) (f64.const 0))
  (global $inf (mut f64) (f64.const inf))
  (func (export "k32_handle")
    (global.set $g (f64.sub (global.get $inf) (global.get $inf)))
    (f64.store (i32.const 0) (global.get $g))
    (drop (call $rb (i32.const 0) (i32.const 0)))))"""


def s390x_rootfs() -> Path | None:
    found = sorted(CROSS_CACHE.glob("rootfs-s390x-*"))
    if not found or not (found[0] / "usr/local/libexec/kube32/qemu-s390x").exists() or os.geteuid() != 0:
        return None
    return found[0]


def test_same_calls_give_the_same_snapshot_on_every_cpu(cluster: Cluster) -> None:
    c = cluster
    root = s390x_rootfs()
    if root is None:
        pytest.skip("needs root and the s390x root filesystem of make test-cross")
    mine = root / "run" / "kube32" / "atk21"
    shutil.rmtree(mine, ignore_errors=True)
    mine.mkdir(parents=True)
    shutil.copytree(ROOT / "kube32", mine / "kube32", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(c.cp.data_dir / "node.kubeconfig", mine / "node.kubeconfig")
    log = c.base / "s390x.log"
    proc = start(["env", "-i", "PYTHONPATH=/run/kube32/atk21:/opt/kube32/site", "/usr/sbin/chroot", str(root),
                  "/usr/local/libexec/kube32/qemu-s390x", "/usr/bin/python3", "-m", "kube32.sim.main", "worker",
                  "--kubeconfig", "/run/kube32/atk21/node.kubeconfig", "--name", "s390x-1",
                  "--address", S390X_ADDRESS, "--engine", "pwasm"], log)
    c.qemu.append(proc)
    try:
        wait_for(lambda: c.node_ready("s390x-1"), 240, 1, what="the s390x worker Ready")
        image = c.push(wat(NAN_WAT), "nan")
        globals_by_node = {}
        for node in ("pw-1", "s390x-1"):
            pod = f"nan-{node}"
            c.run_pod(pod, image, node, timeout=180)
            c.get(pod, timeout=120)
            snap = sections(c.checkpoint_data(pod))
            globals_by_node[node] = (snap[2][0], hashlib.sha256(snap[1][0]).hexdigest())
            c.delete(pod)
    finally:
        proc.stop(timeout=40)
        c.cp.kubectl("delete", "node", "s390x-1", "--ignore-not-found", check=False)
        shutil.rmtree(mine, ignore_errors=True)

    def g(node: str) -> str:
        raw = globals_by_node[node][0]
        return " ".join(f"g{struct.unpack_from('<IBQ', raw, i)[0]}={struct.unpack_from('<IBQ', raw, i)[2]:#018x}"
                        for i in range(0, len(raw), 13))
    assert globals_by_node["pw-1"] == globals_by_node["s390x-1"], (
        f"one call of the same pod gives different snapshots: x86_64 {g('pw-1')}, s390x {g('s390x-1')}")


# --------------------------------------------------------------------------------------------
# 8. pwasm's validator is not wasmtime's: it accepts a ref.func of a function the module never
#    declares (wasmtime: "undeclared function reference").  The same image runs on pwasm nodes
#    and is refused on wasmtime nodes (engine_pwasm.py: "a module is refused at load as
#    wasmtime refuses it").
# --------------------------------------------------------------------------------------------
UNDECLARED_WAT = f"""(module {HEAD}
  (memory 1) (table 1 funcref) (func $f)
  (func (export "k32_handle") (table.set (i32.const 0) (ref.func $f))))"""


def test_pwasm_refuses_what_wasmtime_refuses(cluster: Cluster) -> None:
    c = cluster
    image = c.push(wat(UNDECLARED_WAT), "undeclared")
    states = {}
    for node in ("sim-1", "pw-1"):
        pod = f"undecl-{node}"
        c.run_pod(pod, image, node, ready=False)

        def settled() -> dict | None:
            st = json.loads(c.cp.kubectl("get", "pod", pod, "-o", "json").stdout)["status"]
            cs = (st.get("containerStatuses") or [{}])[0]
            state = cs.get("state") or {}
            if "terminated" in state or cs.get("ready"):
                return state
            return None
        states[node] = wait_for(settled, 60, 0.5, what=f"{pod} to start or fail")
        c.delete(pod)
    assert "terminated" in states["sim-1"] and "does not compile" in states["sim-1"]["terminated"]["message"]
    assert "terminated" in states["pw-1"], (
        f"wasmtime refuses the module ({states['sim-1']['terminated']['message']}) but pwasm runs it: {states['pw-1']}")


# --------------------------------------------------------------------------------------------
# 9. On pwasm a checkpoint makes the pod's own memory.grow fail.  Linear memory is a
#    bytearray, which cannot grow while a view of it lives; the kubelet thaws a pod after a
#    Save checkpoint while the snapshot's view of its memory is still alive (the coroutine
#    that wrote it drops it only once it runs again), and pwasm then waits 0.1 s and answers
#    memory.grow with -1.  On a node whose pwasm pods keep it busy, a pod far below any
#    limit (200 pages of a 512 MiB heap) sees memory.grow fail after checkpoints: for a C
#    pod, malloc returns NULL.
# --------------------------------------------------------------------------------------------
GROWER_WAT = f"""(module {HEAD}
  (memory 1)
  (global $fail (mut i32) (i32.const 0))
  (global $ok (mut i32) (i32.const 0))
  (func (export "k32_tick")
    (if (i32.lt_u (memory.size) (i32.const 200))
      (then (if (i32.eq (memory.grow (i32.const 1)) (i32.const -1))
              (then (global.set $fail (i32.add (global.get $fail) (i32.const 1))))
              (else (global.set $ok (i32.add (global.get $ok) (i32.const 1))))))))
  (func (export "k32_handle")
    (i32.store (i32.const 0) (global.get $ok))
    (i32.store (i32.const 4) (global.get $fail))
    (drop (call $rb (i32.const 0) (i32.const 8)))))"""


def test_checkpoints_do_not_make_memory_grow_fail(cluster: Cluster) -> None:
    c = cluster
    spin = c.push(wat(SPIN_WAT), "spin")
    grower = c.push(wat(GROWER_WAT), "grower")
    busy = [f"busy{i}" for i in range(3)]

    def counts() -> tuple[int, int]:
        raw = subprocess.run(["kubectl", "--kubeconfig", str(c.cp.kubeconfig), "get", "--raw",
                              "/api/v1/namespaces/default/pods/grower/proxy/"],
                             capture_output=True, timeout=60).stdout
        return struct.unpack("<II", raw[:8])
    ok = failed = saved = 0
    try:
        for name in busy:
            c.run_pod(name, spin, "pw-1", annotations={"kube32.io/tick-interval": "10ms"})
        for _round in range(4):          # a fresh grower each round: 200 pages fit the checkpoint space
            c.run_pod("grower", grower, "pw-1", annotations={"kube32.io/tick-interval": "20ms"})
            deadline = time.monotonic() + 60
            while sum(counts()) < 199 and time.monotonic() < deadline:
                out = subprocess.run([*CLI, "checkpoint", "grower"], capture_output=True, text=True,
                                     env=c.env, cwd=ROOT, timeout=60)
                saved += "saved grower" in out.stdout
            round_ok, round_failed = counts()
            ok, failed = ok + round_ok, failed + round_failed
            if failed:
                break
        print(f"grower: {ok} grows, {failed} failed, {saved} checkpoints saved")
    finally:
        c.delete("grower", *busy)
    assert saved > 0
    assert failed == 0, (
        f"memory.grow failed {failed} times (succeeded {ok}) for pods of at most 200 pages, "
        f"during {saved} Save checkpoints on a busy pwasm node")


# --------------------------------------------------------------------------------------------
# 10. The same for the call stack: on pwasm every Wasm frame is a Python frame on the heap,
#     bounded only by the Python recursion limit (20,000), whatever its locals.  A pod limited
#     to 64 KiB recursing 19,000 deep through a function with 1,000 live i64 locals makes its
#     kubelet allocate ~750 MiB in one call (50,000 locals, the parser's limit: ~35 GB).
# --------------------------------------------------------------------------------------------
def deep_module(nlocals: int, depth: int) -> bytes:
    sets = " ".join(f"(local.set {i + 1} (i64.extend_i32_u (i32.add (local.get 0) (i32.const {i}))))"
                    for i in range(nlocals))
    acc = " ".join(f"(local.set 1 (i64.add (local.get 1) (local.get {i})))" for i in range(2, nlocals + 1))
    return wat(f"""(module {HEAD} (memory 1)
      (func $r (param $n i32) (result i64) (local {" ".join(["i64"] * nlocals)})
        {sets}
        (if (i32.eqz (local.get $n)) (then (return (i64.const 0))))
        (local.set 1 (i64.add (local.get 1) (call $r (i32.sub (local.get $n) (i32.const 1)))))
        {acc}
        (local.get 1))
      (func (export "k32_handle") (i64.store (i32.const 0) (call $r (i32.const {depth})))
        (drop (call $rb (i32.const 0) (i32.const 0)))))""")


def test_the_call_stack_does_not_escape_the_pods_memory_limit(cluster: Cluster) -> None:
    c = cluster
    image = c.push(deep_module(1000, 19000), "deep")
    c.wait_empty("pw-1")
    c.run_pod("deep", image, "pw-1", memory="64Ki")
    pid = c.pw.popen.pid
    before = rss_mib(pid)
    peak = [before]
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], rss_mib(pid))
            time.sleep(0.02)
    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        for _ in range(2):
            c.get("deep", timeout=120)
    finally:
        done.set()
        sampler.join(timeout=5)
        c.delete("deep")
    assert peak[0] - before < 100, (
        f"one call of a pod limited to 64 KiB took pw-1 from {before} MiB to {peak[0]} MiB "
        f"(its Wasm call stack, on the Python heap)")
