"""Several control planes on one etcd: leader election, and the failover drills.

Real processes: a 3-member etcd (kube32.sim.etcd), two ``kube32-sim control-plane
--store etcd://...`` with short leader-election timings (the documented
``--leader-elect-*`` flags; the defaults are client-go's 15 s / 10 s / 2 s), kubectl
against each.  The leader is SIGKILLed: the other takes the Lease over and its
controllers act (a new namespace gets its ServiceAccount ``default``, made by the
serviceaccounts controller) within lease duration + retry period.

The drills (``-m drill``) run on one ``kube32-sim up --control-planes 3 --store etcd
--workers 2`` cluster, in order: the leading control plane dies during a drain of 20
pods; an etcd member dies during ten moves; a power cut of everything.  About 2 minutes
on the 2-core machine.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Iterator

import pytest
import yaml

from kube32.sim.etcd import EtcdCluster
from tests.conftest import ROOT, ControlPlane, start_cluster, start_control_plane, wait_for
from tests.e2e.helpers import cli, get_json, push
from tests.e2e.test_moves import counter_pod
from tests.etcd import need_etcd

pytestmark = pytest.mark.e2e

LEASE = ["--leader-elect-lease-duration", "3s", "--leader-elect-renew-deadline", "2s",
         "--leader-elect-retry-period", "0.5s"]


@pytest.fixture
def etcd3(tmp_path: Path) -> Iterator[EtcdCluster]:
    need_etcd()
    cluster = EtcdCluster(tmp_path / "etcd", members=3)
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


def holder(cp: ControlPlane) -> str:
    lease = json.loads(cp.kubectl("-n", "kube-system", "get", "lease", "kube32-controller-manager",
                                  "-o", "json").stdout)
    return lease["spec"].get("holderIdentity") or ""


def identity(cp: ControlPlane) -> str:
    return (cp.data_dir / "controller-identity").read_text().strip()


def has_default_account(cp: ControlPlane, ns: str) -> bool:
    return cp.kubectl("-n", ns, "get", "serviceaccount", "default", check=False).returncode == 0


def test_the_controllers_fail_over_when_the_leading_control_plane_dies(tmp_path: Path, etcd3: EtcdCluster) -> None:
    flags = ["--store", etcd3.store_url, "--no-kubelet", *LEASE]
    one = start_control_plane(tmp_path / "cp-1", *flags)
    two = None
    try:
        wait_for(lambda: holder(one) == identity(one), 20, what="the first control plane to lead")
        two = start_control_plane(tmp_path / "cp-2", *flags)
        one.kubectl("create", "namespace", "ha-before")
        wait_for(lambda: has_default_account(two, "ha-before"), 20, what="the leader's controllers")
        assert holder(two) == identity(one), "the second control plane waits as a candidate"

        one.proc.stop(signal.SIGKILL)
        killed = time.monotonic()
        wait_for(lambda: holder(two) == identity(two), 20, interval=0.2, what="the other to take the Lease")
        took = time.monotonic() - killed
        assert took < 3 + 0.5 + 3, f"took over after {took:.1f}s (lease 3s + retry 0.5s, plus slack)"
        two.kubectl("create", "namespace", "ha-after")
        wait_for(lambda: has_default_account(two, "ha-after"), 20, what="the new leader's controllers")
        lease = json.loads(two.kubectl("-n", "kube-system", "get", "lease", "kube32-controller-manager",
                                       "-o", "json").stdout)["spec"]
        assert lease["leaseTransitions"] >= 1 and lease["leaseDurationSeconds"] == 3
    finally:
        one.proc.stop()
        if two is not None:
            two.proc.stop()


def test_a_control_plane_that_stops_cleanly_hands_the_lease_over_at_once(tmp_path: Path,
                                                                          etcd3: EtcdCluster) -> None:
    """The leader releases the Lease on SIGTERM: the other leads at its next try, not
    after a whole lease duration (here 30 s, longer than the test waits)."""
    flags = ["--store", etcd3.store_url, "--no-kubelet", "--leader-elect-lease-duration", "30s",
             "--leader-elect-renew-deadline", "20s", "--leader-elect-retry-period", "0.5s"]
    one = start_control_plane(tmp_path / "cp-1", *flags)
    two = None
    try:
        wait_for(lambda: holder(one) == identity(one), 20, what="the first control plane to lead")
        two = start_control_plane(tmp_path / "cp-2", *flags)
        time.sleep(1)
        assert holder(two) == identity(one)
        assert one.proc.stop() == 0
        wait_for(lambda: holder(two) == identity(two), 10, interval=0.2, what="the hand-over")
    finally:
        one.proc.stop()
        if two is not None:
            two.proc.stop()


# --- failover drills on `kube32-sim up --control-planes 3 --store etcd` -----------------

COUNTER = ROOT / "examples" / "pods" / "counter.wasm"
PODS = 20


@pytest.fixture(scope="module")
def ha(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    need_etcd()
    c = start_cluster(tmp_path_factory.mktemp("ha"), 2, "--control-planes", "3", "--store", "etcd",
                      "--backoff", "1", "--interp-mops", "100", *LEASE)
    try:
        yield c
    finally:
        c.proc.stop(timeout=90)


def planes(cluster: ControlPlane) -> list[Path]:
    return sorted(cluster.data_dir.glob("cp-*"))


def leading_plane(cluster: ControlPlane, context: str) -> Path:
    who = json.loads(cluster.kubectl("--context", context, "-n", "kube-system", "get", "lease",
                                     "kube32-controller-manager", "-o", "json").stdout)["spec"]["holderIdentity"]
    return next(p for p in planes(cluster) if (p / "controller-identity").read_text().strip() == who)


def plane_pid(plane: Path) -> int:
    """The process id of the control plane on `plane` (a child of this test's `up`)."""
    out = subprocess.run(["pgrep", "-f", f"kube32.sim.main control-plane --data-dir {plane} "],
                         capture_output=True, text=True)
    (pid,) = out.stdout.split()
    return int(pid)


def pods_on(cluster: ControlPlane, context: str) -> dict[str, dict]:
    items = json.loads(cluster.kubectl("--context", context, "get", "pods", "-l", "drill=ha",
                                       "-o", "json").stdout)["items"]
    return {p["metadata"]["name"]: p for p in items}


def answering(cluster: ControlPlane, context: str, name: str) -> dict:
    return json.loads(cluster.kubectl("--context", context, "get", "--raw",
                                      f"/api/v1/namespaces/default/pods/{name}/proxy/").stdout)


@pytest.mark.drill
def test_drill_the_leading_control_plane_dies_during_a_drain(ha: ControlPlane) -> None:
    """20 pods with periodic checkpoints on sim-1; `kubectl drain sim-1` through another
    API server; the leading control plane is SIGKILLed as the moves go.  Another takes the
    controllers over within lease + retry, the drain ends, every pod runs once on sim-2
    with its state (moved, or restored from its periodic checkpoint), and kubectl keeps
    working against the others."""
    image = push(ha, COUNTER)
    leader = leading_plane(ha, "admin@cp-1")
    other = next(p for p in planes(ha) if p != leader)
    ctx = f"admin@{other.name}"
    for i in range(PODS):
        pod = yaml.safe_load(counter_pod(f"ha-{i:02d}", "sim-1", image,
                                         annotations={"kube32.io/checkpoint-interval": "10s"}))
        pod["metadata"]["labels"]["drill"] = "ha"
        ha.kubectl("--context", ctx, "apply", "-f", "-", input=yaml.safe_dump(pod))
    names = [f"ha-{i:02d}" for i in range(PODS)]
    wait_for(lambda: all(((p.get("status") or {}).get("containerStatuses") or [{}])[0].get("ready")
                         for p in pods_on(ha, ctx).values()) and len(pods_on(ha, ctx)) == PODS,
             90, what="20 pods ready")
    saved = lambda: {c["spec"]["podName"] for c in json.loads(ha.kubectl(  # noqa: E731
        "--context", ctx, "get", "checkpoints", "-o", "json").stdout)["items"]
        if c["status"].get("phase") == "Saved"}
    wait_for(lambda: set(names) <= saved(), 60, what="a periodic checkpoint of every pod")
    uids = {n: p["metadata"]["uid"] for n, p in pods_on(ha, ctx).items()}

    drain = ha.kubectl_bg("--context", ctx, "drain", "sim-1", "--ignore-daemonsets", "--force",
                          "--timeout=240s")
    wait_for(lambda: sum(p["metadata"]["uid"] != uids[n] for n, p in pods_on(ha, ctx).items()) >= 3,
             60, interval=0.2, what="the first moves")
    os.kill(plane_pid(leader), signal.SIGKILL)
    killed = time.monotonic()
    survivor = wait_for(lambda: leading_plane(ha, ctx) != leader and leading_plane(ha, ctx), 20,
                        interval=0.2, what="another control plane to lead")
    took = time.monotonic() - killed
    assert took < 3 + 0.5 + 3, f"the controllers failed over after {took:.1f}s"
    assert survivor != leader
    out, err = drain.communicate(timeout=300)
    assert drain.returncode == 0 and "node/sim-1 drained" in out, out + err

    def not_moved() -> list[str]:
        pods = pods_on(ha, ctx)
        wrong = [f"{n} missing" for n in names if n not in pods]
        for n, p in sorted(pods.items()):
            ready = ((p.get("status") or {}).get("containerStatuses") or [{}])[0].get("ready")
            if p["spec"].get("nodeName") != "sim-2" or p["metadata"]["uid"] == uids[n] or not ready:
                wrong.append(f"{n} on {p['spec'].get('nodeName')} ready={ready} "
                             f"phase={(p.get('status') or {}).get('phase')} "
                             f"moved={p['metadata']['uid'] != uids[n]}")
        return wrong
    try:
        wait_for(lambda: not not_moved(), 60, what="every pod running on sim-2")
    except AssertionError:
        checkpoints = json.loads(ha.kubectl("--context", ctx, "get", "checkpoints", "-o", "json").stdout)
        summary = [(c["metadata"]["name"], c["spec"].get("podName"), c["status"].get("phase"),
                    c["status"].get("message")) for c in checkpoints["items"]
                   if c["status"].get("phase") not in ("Saved", "Completed")]
        raise AssertionError(f"not moved: {not_moved()}; checkpoints: {summary}") from None
    for name in names:
        st = answering(ha, ctx, name)
        assert st["restored_calls"] >= 1, f"{name} started afresh: {st}"
    assert ha.kubectl("--context", ctx, "get", "pods", "--field-selector", "spec.nodeName=sim-1",
                      "-o", "name").stdout.split() == []
    ha.kubectl("--context", ctx, "uncordon", "sim-1")


def live_context(cluster: ControlPlane) -> str:
    """A context of a control plane that runs (drills kill some)."""
    for plane in planes(cluster):
        if subprocess.run(["pgrep", "-f", f"kube32.sim.main control-plane --data-dir {plane} "],
                          capture_output=True).returncode == 0:
            return f"admin@{plane.name}"
    raise AssertionError("no control plane runs")


@pytest.mark.drill
def test_drill_an_etcd_member_dies_during_moves(ha: ControlPlane) -> None:
    """Ten pods move from sim-1 to sim-2 one after another (kube32-cli, failing over
    between API servers as it needs); an etcd member is SIGKILLed after the third: every
    move completes with the pod's state, and writes go on."""
    image = push(ha, COUNTER)
    ctx = live_context(ha)

    def get(*args: str) -> dict:
        return json.loads(ha.kubectl("--context", ctx, "get", *args, "-o", "json").stdout)

    ha.kubectl("--context", ctx, "uncordon", "sim-1", check=False)
    names = [f"em-{i}" for i in range(10)]
    for name in names:
        ha.kubectl("--context", ctx, "apply", "-f", "-", input=counter_pod(name, "sim-1", image))
    wait_for(lambda: all(((p.get("status") or {}).get("containerStatuses") or [{}])[0].get("ready")
                         for p in (get("pod", n) for n in names)), 90, what="ten pods ready")
    before = {n: answering(ha, ctx, n)["requests"] for n in names}
    member = ha.data_dir / "etcd" / "etcd-0.pid"
    for i, name in enumerate(names):
        if i == 3:
            os.kill(int(member.read_text()), signal.SIGKILL)
        out = cli(ha, "move", name, "--to", "sim-2")
        assert out.returncode == 0, out.stdout.decode() + out.stderr.decode()
    for name in names:
        assert get("pod", name)["spec"]["nodeName"] == "sim-2"
        st = wait_for(lambda: answering(ha, ctx, name), 20, what=f"{name} answering")
        assert st["requests"] == before[name] + 1 and st["restored_calls"] == 1, st
    ha.kubectl("--context", ctx, "create", "configmap", "after-etcd-loss", "--from-literal=k=v")
    assert ha.kubectl("--context", ctx, "get", "configmap", "after-etcd-loss",
                      "-o", "jsonpath={.data.k}").stdout == "v"


@pytest.mark.drill
def test_drill_the_api_server_holding_a_checkpoints_data_dies_and_the_checkpoint_says_so(
        ha: ControlPlane) -> None:
    """A Save of em-0 (from the drill above); the API server holding its data SIGKILLed:
    within its Lease's 15 s and a renewal, another marks the Checkpoint DataStored=False
    (reason APIServerLost), its facts gone (attack 26: it went on saying Saved, 64Ki)."""
    out = cli(ha, "checkpoint", "em-0")
    assert out.returncode == 0, out.stdout.decode() + out.stderr.decode()
    ck = out.stdout.decode().split("checkpoint ")[-1].strip()
    path = f"/apis/kube32.io/v1/namespaces/default/checkpoints/{ck}"
    token = yaml.safe_load(ha.kubeconfig.read_text())["users"][0]["user"]["token"]

    def holds(plane: Path) -> bool:  # answers from its own memory (the peer header): holds the data
        ctx = f"admin@{plane.name}"
        done = subprocess.run(["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "--max-time", "5",
                               "--cacert", str(ha.data_dir / "cp-1" / "pki" / "ca.crt"),
                               "-H", f"Authorization: Bearer {token}", "-H", "X-Kube32-Peer: 1",
                               f"{kubeconfig_server(ha, ctx)}{path}/data"], capture_output=True, text=True)
        return done.stdout == "200"
    live = [p for p in planes(ha) if plane_alive(p)]
    holder = next(p for p in live if holds(p))
    os.kill(plane_pid(holder), signal.SIGKILL)
    other = next(p for p in live if p != holder)

    def marked() -> bool:
        st = json.loads(ha.kubectl("--context", f"admin@{other.name}", "get", "--raw", path).stdout)["status"]
        conds = {c["type"]: c for c in st.get("conditions") or []}
        return "sizeBytes" not in st and conds.get("DataStored", {}).get("reason") == "APIServerLost"
    wait_for(marked, 30, interval=1, what=f"{ck} saying its data went with {holder.name}")


def plane_alive(plane: Path) -> bool:
    return subprocess.run(["pgrep", "-f", f"kube32.sim.main control-plane --data-dir {plane} "],
                          capture_output=True).returncode == 0


def kubeconfig_server(cluster: ControlPlane, context: str) -> str:
    doc = yaml.safe_load(cluster.kubeconfig.read_text())
    name = next(c["context"]["cluster"] for c in doc["contexts"] if c["name"] == context)
    return next(c["cluster"]["server"] for c in doc["clusters"] if c["name"] == name)


@pytest.mark.drill
def test_drill_everything_restarts_objects_stay_data_goes_pods_start_afresh(ha: ControlPlane) -> None:
    """A power cut: every process of the cluster SIGKILLed (etcd members, control planes,
    workers), then `up` again on its data directory: etcd comes back on its ports with every
    object; checkpoint data was in memory and is gone; the pods start afresh."""
    os.killpg(ha.proc.popen.pid, signal.SIGKILL)  # up and its control planes and workers
    ha.proc.popen.wait(10)
    for pid_file in (ha.data_dir / "etcd").glob("*.pid"):
        try:
            os.kill(int(pid_file.read_text()), signal.SIGKILL)
        except ProcessLookupError:
            pass  # the member drill 2 killed
    again = start_cluster(ha.data_dir, 2, "--control-planes", "3", "--store", "etcd", "--backoff", "1",
                          "--interp-mops", "100", *LEASE)
    try:
        assert again.kubectl("get", "configmap", "after-etcd-loss", "-o", "jsonpath={.data.k}").stdout == "v"
        names = [f"em-{i}" for i in range(10)]
        for name in names:
            st = wait_for(lambda: answering(again, "admin@cp-1", name), 60, what=f"{name} running again")
            assert st["restored_calls"] == 0, f"{name} did not start afresh: {st}"
        ck = next(c for c in get_json(again, "checkpoints")["items"] if c["spec"].get("podName") == "em-0")
        gone = again.kubectl("get", "--raw", f"/apis/kube32.io/v1/namespaces/default/checkpoints/"
                                             f"{ck['metadata']['name']}/data", check=False)
        assert gone.returncode != 0 and "has no data" in gone.stderr
    finally:
        again.proc.stop(timeout=90)


def test_without_etcd_quorum_writes_fail_fast_as_503_not_ready_and_the_api_servers_lease_comes_back(
        tmp_path: Path, etcd3: EtcdCluster) -> None:
    """Two etcd members of three killed: a write is 503 with Retry-After naming the cause
    within the store's 10 s (never 500), kubectl gives up within 30 s (each of client-go's
    retries of the 503 is answered at once once the store knows it is down), /readyz fails (500, its etcd check);
    with the members back the API server's own Lease is renewed again (attack 26: it was
    never renewed after a quorum loss, so its peers lost it) and /readyz is 200."""
    import datetime as dt

    import requests

    from kube32.apiserver.peers import lease_name

    cp = start_control_plane(tmp_path / "cp", "--store", etcd3.store_url, "--no-kubelet", *LEASE)
    try:
        token = yaml.safe_load(cp.kubeconfig.read_text())["users"][0]["user"]["token"]

        def call(method: str, path: str, body: dict | None = None, timeout: float = 30) -> requests.Response:
            return requests.request(method, cp.server + path, json=body, timeout=timeout,
                                    headers={"Authorization": f"Bearer {token}"},
                                    verify=str(cp.data_dir / "pki" / "ca.crt"))

        own = f"/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/{lease_name(cp.server)}"
        wait_for(lambda: call("GET", own).status_code == 200, 20, what="the API server's Lease")
        for member in etcd3.members[1:]:
            etcd3.kill(member)
        t0 = time.monotonic()
        r = call("POST", "/api/v1/namespaces/default/configmaps", {"metadata": {"name": "noquorum"}})
        took = time.monotonic() - t0
        assert r.status_code == 503 and r.headers.get("Retry-After") and took < 12, (r.status_code, took, r.text)
        assert "etcd" in r.json()["message"] and "internal error" not in r.text
        ready = call("GET", "/readyz?verbose", timeout=10)   # kube-apiserver answers a failed check 500
        assert ready.status_code == 500 and "[-]etcd failed" in ready.text, ready.text
        t0 = time.monotonic()
        k = cp.kubectl("create", "configmap", "noquorum-kubectl", check=False, timeout=45)
        took = time.monotonic() - t0
        assert k.returncode != 0 and took < 30 and "internal error" not in k.stderr, (took, k.stderr)
        back = dt.datetime.now(dt.timezone.utc)
        for member in etcd3.members[1:]:
            etcd3.start_member(member)
        etcd3.wait_healthy()

        def renewed() -> bool:
            spec = call("GET", own, timeout=5).json()["spec"]
            when = dt.datetime.strptime(spec["renewTime"], "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=dt.timezone.utc)
            return when > back

        wait_for(renewed, 20, what="the API server's Lease renewed after the quorum came back")
        assert call("GET", "/readyz").status_code == 200
        names = cp.kubectl("get", "configmaps", "-o", "name").stdout
        assert "noquorum" not in names, names
    finally:
        cp.proc.stop()


def test_a_hung_etcd_member_stalls_no_write(tmp_path: Path, etcd3: EtcdCluster) -> None:
    """One etcd member of three SIGSTOPped (a hung disk or machine: connections open,
    nothing answers): every create through the API server answers within a few seconds
    (attack 26: each waited the store's 10 s on that member, then 503), and the leader
    keeps renewing its Lease."""
    cp = start_control_plane(tmp_path / "cp", "--store", etcd3.store_url, "--no-kubelet", *LEASE)
    try:
        wait_for(lambda: holder(cp) == identity(cp), 20, what="the control plane to lead")
        member = etcd3.members[0]
        assert member.process is not None
        member.process.send_signal(signal.SIGSTOP)
        try:
            slow = []
            for i in range(8):
                t0 = time.monotonic()
                done = cp.kubectl("create", "configmap", f"hung-member-{i}", check=False)
                took = time.monotonic() - t0
                if done.returncode != 0 or took > 4:
                    slow.append((i, round(took, 1), done.stderr.strip()[-200:]))
            assert holder(cp) == identity(cp), "the leader lost its Lease"
        finally:
            member.process.send_signal(signal.SIGCONT)
        assert not slow, slow
    finally:
        cp.proc.stop()


def test_kube32_cli_leaves_a_hung_first_api_server_within_seconds(tmp_path: Path, control_plane: ControlPlane) -> None:
    """kube32-cli with a kubeconfig whose first API server hangs (a socket that takes
    connections and never answers, as a SIGSTOPped API server): it goes to the next one
    within seconds (attack 26: after a 30 s read timeout) and answers from there."""
    import socket
    import sys

    hung = socket.socket()
    hung.bind(("127.0.0.1", 0))
    hung.listen(16)
    try:
        doc = yaml.safe_load(control_plane.kubeconfig.read_text())
        cluster = doc["clusters"][0]["cluster"]
        real = cluster["server"]
        cluster["server"] = f"https://127.0.0.1:{hung.getsockname()[1]}"
        cluster["extensions"] = [{"name": "kube32.io/servers",
                                  "extension": {"servers": [cluster["server"], real]}}]
        kubeconfig = tmp_path / "hung-first.kubeconfig"
        kubeconfig.write_text(yaml.safe_dump(doc))
        t0 = time.monotonic()
        done = subprocess.run([sys.executable, "-m", "kube32.cli.main", "checkpoint", "no-such-pod",
                               "--kubeconfig", str(kubeconfig)], capture_output=True, text=True, timeout=60)
        took = time.monotonic() - t0
        assert done.returncode == 1 and "not found" in done.stdout + done.stderr, done.stdout + done.stderr
        assert took < 12, f"kube32-cli answered after {took:.1f}s"
    finally:
        hung.close()
