"""Issue #20, round 2: an outside tester's scenarios ("a pod's state is never lost"),
written from docs/moving-pods.md, the spec and the issue only.  One cluster, run process
by process (tests/attack/k20b.py), for the whole module; every test cleans up after
itself.  Run: .venv/bin/python -m pytest -q tests/attack/test_attack20b.py -p no:cacheprovider
"""
from __future__ import annotations

import json
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from .k20b import REPO, Cluster, wait_for

DATA = Path("/tmp/a20")


@pytest.fixture(scope="module")
def c() -> Cluster:
    subprocess.run(["rm", "-rf", str(DATA)], check=True)
    DATA.mkdir(parents=True)
    cl = Cluster(DATA)
    try:
        cl.start_cp()
        cl.start_worker("sim-1")
        cl.start_worker("sim-2")
        cl.push_image()
        yield cl
    finally:
        cl.shutdown()


@pytest.fixture(autouse=True)
def clean(c: Cluster):
    yield
    extra = [n for n in c.workers if n not in ("sim-1", "sim-2")]
    for n in extra:
        c.stop_worker(n, signal.SIGKILL)
    if c.cp is None or c.cp.poll() is not None:
        c.start_cp()
    for n in ("sim-1", "sim-2"):
        p = c.workers.get(n)
        if p is not None and p.poll() is not None:
            c.workers.pop(n)
    c.cleanup()
    time.sleep(2)


def cordon(c: Cluster, *nodes: str) -> None:
    for n in nodes:
        c.kubectl("cordon", n)


def uncordon(c: Cluster, *nodes: str) -> None:
    for n in nodes:
        c.kubectl("uncordon", n)


def move_ckpt(c: Cluster, pod: str) -> dict:
    cks = [k for k in c.ckpts(pod) if k["spec"].get("action") == "Move"]
    assert cks, f"no Move checkpoint for {pod}"
    return sorted(cks, key=lambda k: k["metadata"]["creationTimestamp"])[-1]


def wait_new_ckpt(c: Cluster, pod: str, phases: tuple[str, ...], before: set[str], timeout: float = 60) -> dict:
    def f():
        for k in c.ckpts(pod):
            if k["metadata"]["name"] not in before and k.get("status", {}).get("phase") in phases:
                return k
        return None
    return wait_for(f, timeout, 0.3, f"a new checkpoint of {pod} in {phases}")


def deployment(c: Cluster, name: str, replicas: int = 1, image: str | None = None,
               annotations: str = "") -> None:
    c.apply(f"""apiVersion: apps/v1
kind: Deployment
metadata:
  name: {name}
spec:
  replicas: {replicas}
  selector:
    matchLabels: {{app: {name}}}
  template:
    metadata:
      labels: {{app: {name}}}
      annotations: {{}}{annotations}
    spec:
      containers:
      - name: main
        image: {image or c.image}
""")


def dep_pods(c: Cluster, app: str, live_only: bool = True) -> list[dict]:
    items = c.get("pods", "", "-l", f"app={app}")["items"]
    if live_only:
        items = [p for p in items if not p["metadata"].get("deletionTimestamp")
                 and p["status"].get("phase") not in ("Failed", "Succeeded")]
    return items


class Watcher(threading.Thread):
    """Polls a Deployment's pods and ReplicaSet while a scenario runs: every pod name and
    uid seen, the most live pods seen at once, and the ReplicaSet's replicas."""

    def __init__(self, c: Cluster, app: str) -> None:
        super().__init__(daemon=True)
        self.c, self.app = c, app
        self.stop = threading.Event()
        self.names: set[str] = set()
        self.max_live = 0
        self.rs_replicas: list[int] = []
        self.terminating: set[str] = set()

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                items = self.c.get("pods", "", "-l", f"app={self.app}")["items"]
                live = [p for p in items if not p["metadata"].get("deletionTimestamp")]
                for p in items:
                    self.names.add(p["metadata"]["name"])
                    if p["metadata"].get("deletionTimestamp"):
                        self.terminating.add(p["metadata"]["name"])
                self.max_live = max(self.max_live, len(live))
                for rs in self.c.get("rs", "", "-l", f"app={self.app}")["items"]:
                    self.rs_replicas.append(rs.get("status", {}).get("replicas", 0))
            except Exception:  # noqa: BLE001
                pass
            time.sleep(0.5)

    def done(self) -> None:
        self.stop.set()
        self.join(10)


# ---------------------------------------------------------------------------------
# 1. A drain of a Deployment pod whose move rolls back (target hangs), with another
#    node uncordoned meanwhile: the pod restores there with its state, and the
#    Deployment counts one pod throughout.
def test_drain_deployment_hang_target_rolls_back_elsewhere_with_state(c: Cluster) -> None:
    c.start_worker("hang", "--fault", "hang-restores")
    cordon(c, "sim-2", "devkit", "hang")
    deployment(c, "d1")
    pod = wait_for(lambda: [p for p in dep_pods(c, "d1") if p["status"].get("phase") == "Running"],
                   90, 1, "d1 running")[0]
    name = pod["metadata"]["name"]
    assert pod["spec"]["nodeName"] == "sim-1"
    c.ask_wait(name)
    before = c.ask_wait(name)
    w = Watcher(c, "d1")
    w.start()
    uncordon(c, "hang")
    drain = subprocess.Popen(["kubectl", "drain", "sim-1", "--ignore-daemonsets", "--timeout=90s"],
                             env=c.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    ck = wait_new_ckpt(c, name, ("Moving",), set(), 40)
    assert ck["status"].get("targetNode") == "hang"
    uncordon(c, "sim-2")        # a place to roll back to other than the drained source
    out = drain.communicate(timeout=120)[0]
    ck = c.wait_ckpt_phase(ck["metadata"]["name"], ("Failed", "Completed"), 90)
    wait_for(lambda: c.pod(name) and c.pod(name)["status"].get("phase") == "Running"
             and c.node_of(name) == "sim-2", 60, 1, "pod running on sim-2")
    after = c.ask_wait(name)
    w.done()
    assert drain.returncode == 0, out
    assert ck["status"]["phase"] == "Failed", ck["status"]
    assert "rolled back to sim-2" in ck["status"].get("message", ""), ck["status"]
    assert ck["status"].get("rollbackNode") == "sim-2", ck["status"]
    assert after["requests"] == before["requests"] + 1, (before, after)
    assert after["init_calls"] == 1 and after["restored_calls"] == 1, after
    assert w.names == {name}, f"the Deployment made other pods: {w.names}"
    assert w.max_live <= 1 and max(w.rs_replicas or [1]) <= 1, (w.max_live, w.rs_replicas)
    assert not w.terminating, w.terminating
    assert after["time_ms"] >= before["time_ms"], (before, after)
    restored = c.events(name, "Restored")
    assert restored, "no Restored event after the rollback"


# 2. The same with restores that fail at once (corrupt-restores) and no other node:
#    the pod goes back to the drained source with its state and the drain is refused
#    with 429; it never says the node is drained.
def test_drain_bare_pod_corrupt_target_no_other_node_429_state_kept(c: Cluster) -> None:
    c.start_worker("bad", "--fault", "corrupt-restores")
    cordon(c, "sim-2", "devkit")
    c.run_counter("b2", "sim-1")
    before = c.ask_wait("b2")
    r = c.kubectl("drain", "sim-1", "--ignore-daemonsets", "--force", "--timeout=25s", check=False)
    assert r.returncode != 0, r.stdout + r.stderr
    assert "rolled back to sim-1" in r.stdout + r.stderr, r.stdout + r.stderr
    wait_for(lambda: c.pod("b2")["status"].get("phase") == "Running", 60, 1, "b2 running")
    assert c.node_of("b2") == "sim-1"
    after = c.ask_wait("b2")
    assert after["requests"] == before["requests"] + 1 and after["restored_calls"] == 1, (before, after)
    ck = move_ckpt(c, "b2")
    assert ck["status"]["phase"] == "Failed"
    assert ck["metadata"].get("labels", {}).get("kube32.io/trigger") == "eviction", ck["metadata"]


# 3. Two drains at once, with bare pods, Deployment pods and a DaemonSet: every movable
#    pod lands on the one node left with its state.
def test_two_drains_at_once(c: Cluster) -> None:
    cordon(c, "devkit")
    c.run_counter("t1", "sim-1")
    c.run_counter("t2", "sim-2")
    deployment(c, "d3", replicas=2)
    c.apply(f"""apiVersion: apps/v1
kind: DaemonSet
metadata:
  name: ds3
spec:
  selector:
    matchLabels: {{app: ds3}}
  template:
    metadata:
      labels: {{app: ds3}}
    spec:
      containers:
      - name: main
        image: {c.image}
""")
    deps = wait_for(lambda: (lambda ps: ps if len(ps) == 2 and all(p["status"].get("phase") == "Running" for p in ps)
                             else None)(dep_pods(c, "d3")), 90, 1, "d3 running")
    names = [p["metadata"]["name"] for p in deps] + ["t1", "t2"]
    before = {n: c.ask_wait(n) for n in names}
    uncordon(c, "devkit")
    ds_before = {p["metadata"]["name"] for p in dep_pods(c, "ds3")}
    d1 = subprocess.Popen(["kubectl", "drain", "sim-1", "--ignore-daemonsets", "--force", "--timeout=120s"],
                          env=c.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    d2 = subprocess.Popen(["kubectl", "drain", "sim-2", "--ignore-daemonsets", "--force", "--timeout=120s"],
                          env=c.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    o1, o2 = d1.communicate(timeout=180)[0], d2.communicate(timeout=180)[0]
    assert d1.returncode == 0 and d2.returncode == 0, o1 + o2
    for n in names:
        assert c.node_of(n) == "devkit", (n, c.node_of(n))
        a = c.ask_wait(n)
        assert a["requests"] == before[n]["requests"] + 1 and a["restored_calls"] == 1, (n, before[n], a)
        assert a["time_ms"] >= before[n]["time_ms"]
    assert {p["metadata"]["name"] for p in dep_pods(c, "d3")} == set(names[:2])
    assert {p["metadata"]["name"] for p in dep_pods(c, "ds3")} == ds_before


# 4. Events published while a move's snapshot is under way (slow-snapshots source): the
#    pod gets 8 of 10 after the restore, the 8 first in order, and EventsDropped counts 2.
def test_events_during_move_8_held_then_dropped_counted(c: Cluster) -> None:
    c.start_worker("slow", "--fault", "slow-snapshots")
    c.run_counter("ev", "slow", annotations={"kube32.io/events": "greet"})
    before = c.ask_wait("ev")
    mv = subprocess.Popen([str(REPO / ".venv/bin/kube32-cli"), "move", "ev", "--to", "sim-2"],
                          env=c.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    wait_new_ckpt(c, "ev", ("Saving",), set(), 30)
    time.sleep(1)
    for i in range(1, 11):
        r = c.cli("publish", "greet", f"e{i}")
        assert r.returncode == 0, r.stdout + r.stderr
    out = mv.communicate(timeout=120)[0]
    assert mv.returncode == 0, out
    assert c.node_of("ev") == "sim-2"
    a = wait_for(lambda: (lambda x: x if x["events"] >= 8 else None)(c.ask("ev")), 30, 1, "events delivered")
    time.sleep(2)
    a = c.ask("ev")
    assert a["events"] == before["events"] + 8, a
    assert a["last_event"] == "greet:e8", a
    dropped = wait_for(lambda: c.events("ev", "EventsDropped"), 30, 1, "EventsDropped")
    assert sum(e.get("count", 1) for e in dropped) == 2, dropped


# 5. A move whose target is SIGSTOPped during the snapshot: the replacement never runs,
#    the move rolls back to the source with the state, and the Checkpoint says so.
@pytest.mark.parametrize("how", ["sigstop", "sigkill", "cordon"])
def test_target_lost_during_move(c: Cluster, how: str) -> None:
    c.start_worker("slow", "--fault", "slow-snapshots")
    c.start_worker("tgt")
    c.run_counter("tl", "slow")
    before = c.ask_wait("tl")
    mv = subprocess.Popen([str(REPO / ".venv/bin/kube32-cli"), "move", "tl", "--to", "tgt"],
                          env=c.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    ck = wait_new_ckpt(c, "tl", ("Saving",), set(), 30)
    time.sleep(1)
    if how == "sigstop":
        c.workers["tgt"].send_signal(signal.SIGSTOP)
    elif how == "sigkill":
        c.workers["tgt"].kill()
    else:
        cordon(c, "tgt")
    out = mv.communicate(timeout=150)[0]
    ck = c.wait_ckpt_phase(ck["metadata"]["name"], ("Failed", "Completed"), 120)
    st = ck["status"]
    wait_for(lambda: c.pod("tl")["status"].get("phase") == "Running", 60, 1, "tl running")
    a = c.ask_wait("tl")
    where = c.node_of("tl")
    if st["phase"] == "Completed":
        assert where == "tgt" and how == "cordon", (st, where, out)
    else:
        assert where == "slow", (st, where)
        assert st.get("message"), st
    assert a["requests"] == before["requests"] + 1, (before, a, st, out)
    assert a["restored_calls"] == 1 and a["init_calls"] == 1, a
    assert a["time_ms"] >= before["time_ms"]


# 6. The control plane restarted (SIGTERM, SIGKILL) during the snapshot: the pod thaws
#    where it runs with its state, the Checkpoint is Failed "interrupted".
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_control_plane_restart_during_snapshot(c: Cluster, sig: int) -> None:
    c.start_worker("slow", "--fault", "slow-snapshots")
    c.run_counter("cr", "slow")
    before = c.ask_wait("cr")
    mv = subprocess.Popen([str(REPO / ".venv/bin/kube32-cli"), "move", "cr", "--to", "sim-2"],
                          env=c.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    ck = wait_new_ckpt(c, "cr", ("Saving",), set(), 30)
    time.sleep(1.5)
    t0 = time.monotonic()
    c.stop_cp(sig)
    stop_s = time.monotonic() - t0
    mv.kill()
    mv.wait()
    c.start_cp()
    ck = c.wait_ckpt_phase(ck["metadata"]["name"], ("Failed", "Completed"), 90)
    a = c.ask_wait("cr", 60)
    assert stop_s < 30, stop_s
    where = c.node_of("cr")
    if ck["status"]["phase"] == "Failed":
        assert where == "slow", (where, ck["status"])
    else:
        assert where == "sim-2", (where, ck["status"])
    assert a["requests"] == before["requests"] + 1, (before, a, ck["status"])
    # the other copy must not answer too
    pods = [p for p in c.get("pods")["items"] if p["metadata"]["name"] == "cr"]
    assert len(pods) == 1


# 7. The control plane SIGKILLed while the replacement restores (Moving, target hangs):
#    after the restart the Checkpoint tells what happened, and the pod runs once.
def test_control_plane_kill_during_moving(c: Cluster) -> None:
    c.start_worker("hang", "--fault", "hang-restores")
    c.run_counter("cm", "sim-1")
    before = c.ask_wait("cm")
    mv = subprocess.Popen([str(REPO / ".venv/bin/kube32-cli"), "move", "cm", "--to", "hang"],
                          env=c.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    ck = wait_new_ckpt(c, "cm", ("Moving",), set(), 40)
    time.sleep(1)
    c.stop_cp(signal.SIGKILL)
    mv.kill()
    mv.wait()
    c.start_cp()
    ck = c.wait_ckpt_phase(ck["metadata"]["name"], ("Failed", "Completed"), 120)
    st = ck["status"]
    wait_for(lambda: c.pod("cm") and c.pod("cm")["status"].get("phase") == "Running", 90, 1, "cm running")
    a = c.ask_wait("cm")
    assert st["phase"] == "Failed", st
    msg = st.get("message", "")
    if a["restored_calls"] == 0:
        # state lost: the Checkpoint must say so, not "rolled back"
        assert "afresh" in msg and "lost" in msg, st
        assert a["requests"] == 1 and a["init_calls"] == 1
    else:
        assert a["requests"] == before["requests"] + 1, (a, st)
    assert c.node_of("cm") == "sim-1", st


# 8. A pod deleted during its move: it is gone for good, no replacement appears, and the
#    Checkpoint is Failed.
def test_pod_deleted_during_move(c: Cluster) -> None:
    c.start_worker("slow", "--fault", "slow-snapshots")
    c.run_counter("pd", "slow")
    mv = subprocess.Popen([str(REPO / ".venv/bin/kube32-cli"), "move", "pd", "--to", "sim-2"],
                          env=c.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    ck = wait_new_ckpt(c, "pd", ("Saving",), set(), 30)
    time.sleep(1)
    c.kubectl("delete", "pod", "pd", "--timeout=60s")
    mv.communicate(timeout=120)
    ck = c.wait_ckpt_phase(ck["metadata"]["name"], ("Failed", "Completed"), 60)
    time.sleep(5)
    assert c.pod("pd") is None, c.pod("pd")
    assert ck["status"]["phase"] == "Failed", ck["status"]


# 9. A Deployment rolled out (new image) during a move of its pod: the move fails, the new
#    image runs, and no pod runs the new image with the old state.
def test_deployment_rollout_during_move(c: Cluster) -> None:
    c.start_worker("slow", "--fault", "slow-snapshots")
    cordon(c, "sim-1", "sim-2", "devkit")
    deployment(c, "d9")
    pod = wait_for(lambda: [p for p in dep_pods(c, "d9") if p["status"].get("phase") == "Running"],
                   90, 1, "d9 running")[0]
    name = pod["metadata"]["name"]
    uncordon(c, "sim-1", "sim-2", "devkit")
    c.ask_wait(name)
    mv = subprocess.Popen([str(REPO / ".venv/bin/kube32-cli"), "move", name, "--to", "sim-2"],
                          env=c.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    ck = wait_new_ckpt(c, name, ("Saving",), set(), 30)
    time.sleep(1)
    echo = c.cli("image", "push", str(REPO / "examples/pods/echo.wasm"), check=True).stdout.strip()
    c.kubectl("set", "image", "deployment/d9", f"main={echo}")
    out = mv.communicate(timeout=120)[0]
    c.kubectl("rollout", "status", "deployment/d9", "--timeout=120s")
    ck = c.ckpt(ck["metadata"]["name"])
    pods = dep_pods(c, "d9")
    assert len(pods) == 1, [p["metadata"]["name"] for p in pods]
    p = pods[0]
    assert p["spec"]["containers"][0]["image"] == echo
    assert not (p["metadata"].get("annotations") or {}).get("kube32.io/restore-from"), p["metadata"]
    cs = p["status"].get("containerStatuses", [{}])[0]
    assert cs.get("ready"), cs
    assert ck is None or ck["status"]["phase"] in ("Failed", "Completed"), (ck, out)


# 10. Scale a Deployment down to 0 and up to 2 during a move of its pod.
@pytest.mark.parametrize("to", [0, 2])
def test_scale_during_move(c: Cluster, to: int) -> None:
    c.start_worker("slow", "--fault", "slow-snapshots")
    cordon(c, "sim-1", "sim-2", "devkit")
    deployment(c, f"s{to}")
    pod = wait_for(lambda: [p for p in dep_pods(c, f"s{to}") if p["status"].get("phase") == "Running"],
                   90, 1, "running")[0]
    name = pod["metadata"]["name"]
    uncordon(c, "sim-1", "sim-2", "devkit")
    before = c.ask_wait(name)
    w = Watcher(c, f"s{to}")
    w.start()
    mv = subprocess.Popen([str(REPO / ".venv/bin/kube32-cli"), "move", name, "--to", "sim-2"],
                          env=c.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    wait_new_ckpt(c, name, ("Saving",), set(), 30)
    time.sleep(1)
    c.kubectl("scale", f"deployment/s{to}", f"--replicas={to}")
    mv.communicate(timeout=120)
    time.sleep(8)
    wait_for(lambda: (lambda ps: len(ps) == to and all(
        p["status"].get("phase") == "Running" for p in ps))(dep_pods(c, f"s{to}")), 90, 1, f"{to} pods")
    w.done()
    assert w.max_live <= max(1, to), w.max_live
    if to == 0:
        assert dep_pods(c, "s0") == []
    else:
        names = {p["metadata"]["name"] for p in dep_pods(c, "s2")}
        assert name in names, (name, names)
        a = c.ask_wait(name)
        assert a["requests"] == before["requests"] + 1, (before, a)


# 11. A node lost with periodic checkpoints: restore-from names the latest Saved periodic,
#     the Restored event names it with its age, the state is that checkpoint's and the
#     clock never goes behind the checkpoint's.
def test_node_lost_restores_latest_periodic(c: Cluster) -> None:
    c.start_worker("lost")
    c.run_counter("nl", "lost", annotations={"kube32.io/checkpoint-interval": "10s"})
    for _ in range(5):
        c.ask("nl")

    wait_for(lambda: [k for k in c.ckpts("nl") if k["status"].get("phase") == "Saved"], 60, 1, "a periodic")
    time.sleep(22)   # two more periods: the older ones must have gone
    saved = [k for k in c.ckpts("nl") if k["status"].get("phase") == "Saved"]
    latest = max(saved, key=lambda k: k["status"]["takenAt"])
    assert all(k["metadata"]["labels"].get("kube32.io/trigger") == "periodic" for k in saved)
    assert len(saved) == 1, f"older periodic checkpoints stay: {[k['metadata']['name'] for k in saved]}"
    t_kill = time.time()
    c.workers["lost"].kill()
    ev = wait_for(lambda: c.events("nl", "Restored"), 90, 1, "Restored")
    a = c.ask_wait("nl")
    msg = ev[-1]["message"]
    final = max([k for k in c.ckpts("nl") if k["status"].get("phase") == "Saved"] or [latest],
                key=lambda k: k["status"]["takenAt"])
    assert final["metadata"]["name"] in msg, (msg, final["metadata"]["name"])
    assert c.node_of("nl") != "lost"
    assert a["restored_calls"] == 1 and a["init_calls"] == 1, a
    assert a["time_ms"] >= final["status"]["podTimeMs"], (a, final["status"])
    import re
    m = re.search(r"taken (\d+) s ago", msg)
    assert m, msg
    assert int(m.group(1)) <= time.time() - t_kill + 12, msg


# 12. Blockers on every refusal: migration Never + capability DISPLAY; and a move with no
#     node that fits.  kubectl get ckpt -o wide shows the columns.
def test_blockers_and_wide_columns(c: Cluster) -> None:
    c.start_worker("disp", "--devices", "display")
    c.apply(c.pod_yaml("bl", "disp", annotations={"kube32.io/migration": "Never"}).replace(
        "    image:", "    securityContext:\n      capabilities:\n        add: [DISPLAY]\n    image:"))
    c.kubectl("wait", "--for=condition=Ready", "pod/bl", "--timeout=90s")
    r = c.cli("move", "bl", "--to", "sim-2")
    assert r.returncode == 1, r.stdout + r.stderr
    ck = move_ckpt(c, "bl")
    bl = ck["status"].get("blockers", [])
    assert "annotation kube32.io/migration: Never" in bl and "grant capability DISPLAY" in bl, bl
    ev = c.events("bl", "MoveFailed")
    assert ev and "DISPLAY" in ev[-1]["message"] and "Never" in ev[-1]["message"], ev
    wide = c.kubectl("get", "ckpt", "-o", "wide").stdout.splitlines()
    head = wide[0].split()
    assert head == ["NAME", "POD", "ACTION", "PHASE", "NODE", "SIZE", "AGE", "TARGET", "NEW", "POD", "MESSAGE"], head
    # no node fits: every other node cordoned
    c.run_counter("nf", "sim-1")
    cordon(c, "sim-2", "devkit", "disp")
    r = c.cli("move", "nf")
    assert r.returncode != 0, r.stdout
    ck = move_ckpt(c, "nf")
    assert ck["status"]["phase"] == "Failed" and ck["status"].get("message"), ck["status"]
    a = c.ask_wait("nf")
    assert a["restored_calls"] == 0 and a["requests"] >= 2


# 13. A pod whose memory limit is below one page moves with its state.
def test_sub_page_limit_moves(c: Cluster) -> None:
    c.apply(c.pod_yaml("sp", "sim-1", limits="60Ki"))
    r = c.kubectl("wait", "--for=condition=Ready", "pod/sp", "--timeout=60s", check=False)
    if r.returncode:
        pytest.skip(f"counter does not start under 60Ki: {c.pod('sp')['status']}")
    before = c.ask_wait("sp")
    r = c.cli("move", "sp", "--to", "devkit")
    assert r.returncode == 0, r.stdout + r.stderr
    a = c.ask_wait("sp")
    assert a["requests"] == before["requests"] + 1 and a["restored_calls"] == 1, a
    ck = move_ckpt(c, "sp")
    assert ck["status"]["sizeBytes"] < 65536 + 2048, ck["status"]


# 14. A PodDisruptionBudget during a drain with moves: 429 while it forbids, success once
#     it allows, state kept.
def test_pdb_drain_with_moves(c: Cluster) -> None:
    cordon(c, "sim-2", "devkit")
    deployment(c, "pb", replicas=2)
    pods = wait_for(lambda: (lambda ps: ps if len(ps) == 2 and all(p["status"].get("phase") == "Running" for p in ps)
                             else None)(dep_pods(c, "pb")), 90, 1, "pb running")
    names = [p["metadata"]["name"] for p in pods]
    before = {n: c.ask_wait(n) for n in names}
    c.apply("""apiVersion: policy/v1
kind: PodDisruptionBudget
metadata:
  name: pb
spec:
  minAvailable: 2
  selector:
    matchLabels: {app: pb}
""")
    time.sleep(3)
    uncordon(c, "sim-2")
    r = c.kubectl("drain", "sim-1", "--ignore-daemonsets", "--timeout=12s", check=False)
    assert r.returncode != 0 and "disruption budget" in (r.stdout + r.stderr), r.stdout + r.stderr
    for n in names:
        assert c.node_of(n) == "sim-1"
    c.kubectl("patch", "pdb", "pb", "--type=merge", "-p", '{"spec":{"minAvailable":1}}')
    r = c.kubectl("drain", "sim-1", "--ignore-daemonsets", "--timeout=120s", check=False)
    assert r.returncode == 0, r.stdout + r.stderr
    for n in names:
        assert c.node_of(n) == "sim-2", n
        a = c.ask_wait(n)
        assert a["requests"] == before[n]["requests"] + 1 and a["restored_calls"] == 1, (n, a)


# 15. Clock continuity: k32_time_ms never goes backward across moves between engines and
#     a restore.
def test_clock_continuity_across_moves(c: Cluster) -> None:
    c.run_counter("ck", "sim-1")
    last = c.ask_wait("ck")["time_ms"]
    for to in ("devkit", "sim-2", "sim-1"):
        t_before = c.ask("ck")["time_ms"]
        r = c.cli("move", "ck", "--to", to)
        assert r.returncode == 0, r.stdout + r.stderr
        a = c.ask_wait("ck")
        assert a["time_ms"] >= t_before >= last, (to, t_before, a)
        last = a["time_ms"]
    ck = move_ckpt(c, "ck")
    assert ck["status"]["podTimeMs"] <= last


# 16. Retention: finished non-periodic Checkpoints go after the retention (40 s here); the
#     latest periodic stays.
def test_retention(c: Cluster) -> None:
    c.run_counter("rt", "sim-1", annotations={"kube32.io/checkpoint-interval": "10s"})
    r = c.cli("move", "rt", "--to", "sim-2")
    assert r.returncode == 0, r.stdout
    mv = move_ckpt(c, "rt")["metadata"]["name"]
    sv = c.cli("checkpoint", "rt")
    assert sv.returncode == 0, sv.stdout + sv.stderr
    time.sleep(60)
    names = {k["metadata"]["name"]: k for k in c.ckpts("rt")}
    assert mv not in names, f"a Completed move stays after the retention: {list(names)}"
    periodic = [k for k in names.values() if k["metadata"].get("labels", {}).get("kube32.io/trigger") == "periodic"]
    saved = [k for k in periodic if k["status"].get("phase") == "Saved"]
    assert len(saved) == 1, [k["metadata"]["name"] for k in periodic]
    user = [k for k in names.values() if not k["metadata"].get("labels", {}).get("kube32.io/trigger")]
    assert not user, [k["metadata"]["name"] for k in user]


# 17. A rollback (target hangs) when the source has been cordoned by the user in the
#     meantime for a move the user asked for: back to the source (cordon keeps new pods
#     off, not the pods it runs), state kept.
def test_user_move_rollback_to_cordoned_source(c: Cluster) -> None:
    c.start_worker("hang", "--fault", "hang-restores")
    c.run_counter("uc", "sim-1")
    before = c.ask_wait("uc")
    mv = subprocess.Popen([str(REPO / ".venv/bin/kube32-cli"), "move", "uc", "--to", "hang"],
                          env=c.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    ck = wait_new_ckpt(c, "uc", ("Moving",), set(), 40)
    cordon(c, "sim-1")
    out = mv.communicate(timeout=150)[0]
    ck = c.wait_ckpt_phase(ck["metadata"]["name"], ("Failed", "Completed"), 60)
    a = c.ask_wait("uc")
    assert ck["status"]["phase"] == "Failed"
    assert c.node_of("uc") == "sim-1", (ck["status"], out)
    assert a["requests"] == before["requests"] + 1 and a["restored_calls"] == 1, a
    assert "with its state" in out, out


def cli_bg(c: Cluster, *args: str) -> subprocess.Popen:
    return subprocess.Popen([str(REPO / ".venv/bin/kube32-cli"), *args], env=c.env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


# 18. Events published while the replacement hangs are delivered, in order, to the pod
#     rolled back to its source.
def test_events_during_moving_delivered_after_rollback(c: Cluster) -> None:
    c.start_worker("hang", "--fault", "hang-restores")
    c.run_counter("er", "sim-1", annotations={"kube32.io/events": "greet"})
    before = c.ask_wait("er")
    mv = cli_bg(c, "move", "er", "--to", "hang")
    ck = wait_new_ckpt(c, "er", ("Moving",), set(), 40)
    for i in range(1, 4):
        assert c.cli("publish", "greet", f"r{i}").returncode == 0
    out = mv.communicate(timeout=150)[0]
    ck = c.wait_ckpt_phase(ck["metadata"]["name"], ("Failed", "Completed"), 60)
    wait_for(lambda: c.ask("er")["events"] >= 3, 30, 1, "events after the rollback")
    time.sleep(2)
    a = c.ask("er")
    assert c.node_of("er") == "sim-1", out
    assert a["events"] == before["events"] + 3 and a["last_event"] == "greet:r3", a
    assert a["restored_calls"] == 1 and a["requests"] > before["requests"], a
    assert not c.events("er", "EventsDropped")


# 19. The source lost (SIGKILL) while the replacement hangs: the rollback goes to the
#     scheduler and the pod restores, with its state, on a node that runs it.
def test_source_lost_while_moving(c: Cluster) -> None:
    c.start_worker("hang", "--fault", "hang-restores")
    c.start_worker("src")
    c.run_counter("sl", "src")
    before = c.ask_wait("sl")
    mv = cli_bg(c, "move", "sl", "--to", "hang")
    ck = wait_new_ckpt(c, "sl", ("Moving",), set(), 40)
    c.workers["src"].kill()
    out = mv.communicate(timeout=150)[0]
    ck = c.wait_ckpt_phase(ck["metadata"]["name"], ("Failed", "Completed"), 90)
    wait_for(lambda: c.pod("sl") and c.pod("sl")["status"].get("phase") == "Running", 90, 1, "sl running")
    a = c.ask_wait("sl")
    assert c.node_of("sl") not in ("src", "hang"), (c.node_of("sl"), ck["status"], out)
    assert a["requests"] == before["requests"] + 1 and a["restored_calls"] == 1, (a, ck["status"])
    assert "scheduler" in ck["status"].get("message", ""), ck["status"]


# 20. The target drained while the pod restores there: 429 while it restores; once the
#     move rolled back the drain completes and the pod has its state on its source.
def test_drain_target_while_restoring(c: Cluster) -> None:
    c.start_worker("hang", "--fault", "hang-restores")
    c.run_counter("dt", "sim-1")
    before = c.ask_wait("dt")
    mv = cli_bg(c, "move", "dt", "--to", "hang")
    ck = wait_new_ckpt(c, "dt", ("Moving",), set(), 40)
    r = c.kubectl("drain", "hang", "--ignore-daemonsets", "--force", "--timeout=60s", check=False)
    out = mv.communicate(timeout=150)[0]
    ck = c.wait_ckpt_phase(ck["metadata"]["name"], ("Failed", "Completed"), 60)
    assert "being restored here" in r.stdout + r.stderr, r.stdout + r.stderr
    assert r.returncode == 0, r.stdout + r.stderr
    wait_for(lambda: c.pod("dt") and c.pod("dt")["status"].get("phase") == "Running", 60, 1, "dt running")
    a = c.ask_wait("dt")
    assert a["requests"] == before["requests"] + 1 and a["restored_calls"] >= 1, a
    moves = sorted(c.ckpts("dt"), key=lambda k: k["metadata"]["creationTimestamp"])
    # a drain of "hang" must not move the pod off sim-1, a node nobody drains
    assert c.node_of("dt") == "sim-1", (c.node_of("dt"), [(k["metadata"]["name"],
        k["metadata"].get("labels"), k["status"].get("phase"), k["status"].get("nodeName"),
        k["status"].get("targetNode")) for k in moves], r.stdout + r.stderr)


# 21. A drain of a slow source with a Deployment pod whose target fails every restore;
#     another node is uncordoned during the snapshot: the rollback restores the pod there
#     (the source is cordoned), the drain completes, the Deployment counts one pod.
def test_drain_deployment_corrupt_target_rolls_back_to_other_node(c: Cluster) -> None:
    c.start_worker("slow", "--fault", "slow-snapshots")
    c.start_worker("bad", "--fault", "corrupt-restores")
    cordon(c, "sim-1", "sim-2", "devkit", "bad")
    deployment(c, "d21")
    pod = wait_for(lambda: [p for p in dep_pods(c, "d21") if p["status"].get("phase") == "Running"],
                   90, 1, "d21 running")[0]
    name = pod["metadata"]["name"]
    assert pod["spec"]["nodeName"] == "slow"
    before = c.ask_wait(name)
    uncordon(c, "bad")
    w = Watcher(c, "d21")
    w.start()
    drain = subprocess.Popen(["kubectl", "drain", "slow", "--ignore-daemonsets", "--timeout=90s"],
                             env=c.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    ck = wait_new_ckpt(c, name, ("Saving",), set(), 40)
    uncordon(c, "sim-2")
    out = drain.communicate(timeout=150)[0]
    ck = c.wait_ckpt_phase(ck["metadata"]["name"], ("Failed", "Completed"), 60)
    wait_for(lambda: c.pod(name) and c.pod(name)["status"].get("phase") == "Running", 60, 1, "running")
    a = c.ask_wait(name)
    w.done()
    assert drain.returncode == 0, out
    assert c.node_of(name) == "sim-2", (ck["status"], out)
    assert a["requests"] == before["requests"] + 1 and a["restored_calls"] == 1, (a, ck["status"])
    assert w.names == {name} and w.max_live <= 1 and not w.terminating, (w.names, w.max_live, w.terminating)


# 22. Two moves of one pod at once: the second waits for the first, then moves the pod
#     from where it runs; the state carries through both.
def test_two_moves_of_one_pod_at_once(c: Cluster) -> None:
    c.run_counter("mm", "sim-1")
    before = c.ask_wait("mm")
    m1 = cli_bg(c, "move", "mm", "--to", "sim-2")
    m2 = cli_bg(c, "move", "mm", "--to", "devkit")
    o1, o2 = m1.communicate(timeout=150)[0], m2.communicate(timeout=150)[0]
    a = c.ask_wait("mm")
    assert m1.returncode == 0 and m2.returncode == 0, o1 + o2
    assert c.node_of("mm") in ("devkit", "sim-2"), (o1, o2)
    assert a["requests"] == before["requests"] + 1 and a["restored_calls"] == 2, a


# 23. After a control plane restart a Saved periodic Checkpoint's data is gone: it says so
#     (SIZE <none>, DataStored False), and a node lost right then restores from a newer
#     periodic (with data), or starts afresh saying so, never "Restored" from data-less.
def test_periodic_after_cp_restart_then_node_lost(c: Cluster) -> None:
    c.start_worker("lost")
    c.run_counter("pr", "lost", annotations={"kube32.io/checkpoint-interval": "30s"})
    for _ in range(3):
        c.ask("pr")
    first = wait_for(lambda: [k for k in c.ckpts("pr") if k["status"].get("phase") == "Saved"], 60, 1, "saved")[0]
    c.stop_cp(signal.SIGTERM)
    c.start_cp()
    rows = c.kubectl("get", "ckpt").stdout
    for k in c.ckpts("pr"):
        name = k["metadata"]["name"]
        has = c.kubectl("get", "--raw", f"/apis/kube32.io/v1/namespaces/default/checkpoints/{name}/data",
                        check=False).returncode == 0
        conds = {x["type"]: x for x in k["status"].get("conditions", [])}
        if not has:
            assert conds.get("DataStored", {}).get("status") == "False", (name, k["status"])
            assert not k["status"].get("sizeBytes"), (name, k["status"])
        else:
            assert k["status"].get("sizeBytes"), (name, k["status"])
    print(rows)
    c.workers["lost"].kill()
    wait_for(lambda: c.pod("pr") and c.node_of("pr") not in ("lost", "") and
             c.pod("pr")["status"].get("phase") == "Running", 120, 1, "pr elsewhere")
    a = c.ask_wait("pr")
    restored = c.events("pr", "Restored")
    saved_now = [x for x in c.ckpts("pr") if x["status"].get("sizeBytes")]
    if a["restored_calls"]:
        assert saved_now and restored, (a, restored)
        assert any(x["metadata"]["name"] in restored[-1]["message"] for x in saved_now), restored[-1]
    else:
        assert a["init_calls"] == 1
        assert not restored or first["metadata"]["name"] not in restored[-1]["message"], restored
