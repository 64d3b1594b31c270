"""A control plane on etcd (``--store etcd://...``): the API as on SQLite, objects in etcd.

Real processes: `kube32-sim control-plane --store etcd://...` on the session's etcd
(each test under a fresh data dir; the cluster's keys are shared, so each test uses
names of its own), kubectl and curl against it.
"""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from kube32.sim.etcd import EtcdCluster
from tests.conftest import start_control_plane

pytestmark = pytest.mark.e2e


def test_a_control_plane_on_etcd_serves_the_api_and_keeps_objects_across_a_restart(
        tmp_path: Path, etcd_cluster: EtcdCluster) -> None:
    store = ["--store", etcd_cluster.store_url, "--no-kubelet"]
    cp = start_control_plane(tmp_path / "cp", *store)
    try:
        cp.kubectl("create", "namespace", "etcd-a")
        cp.kubectl("-n", "etcd-a", "create", "configmap", "kept", "--from-literal=k=v1")
        out = json.loads(cp.kubectl("-n", "etcd-a", "get", "configmap", "kept", "-o", "json").stdout)
        rv = int(out["metadata"]["resourceVersion"])
        assert rv > 1, "etcd's revision is the resourceVersion"
        stale = cp.kubectl("-n", "etcd-a", "patch", "configmap", "kept", "--type=merge", "-p",
                           json.dumps({"metadata": {"resourceVersion": str(rv - 1)}, "data": {"k": "x"}}),
                           check=False)
        assert stale.returncode != 0 and "Conflict" in stale.stderr
        assert not (tmp_path / "cp" / "state.db").exists(), "nothing went to SQLite"
    finally:
        cp.proc.stop()
    cp = start_control_plane(tmp_path / "cp", *store)
    try:
        got = cp.kubectl("-n", "etcd-a", "get", "configmap", "kept", "-o", "jsonpath={.data.k}").stdout
        assert got == "v1"
    finally:
        cp.proc.stop()


def test_a_watch_from_a_compacted_revision_is_410_gone(tmp_path: Path, etcd_cluster: EtcdCluster) -> None:
    cp = start_control_plane(tmp_path / "cp", "--store", etcd_cluster.store_url, "--no-kubelet")
    try:
        cp.kubectl("create", "namespace", "etcd-b")
        for i in range(3):
            cp.kubectl("-n", "etcd-b", "create", "configmap", f"c{i}")
        out = json.loads(cp.kubectl("get", "--raw", "/api/v1/namespaces/etcd-b/configmaps").stdout)
        now = int(out["metadata"]["resourceVersion"])
        endpoint = etcd_cluster.endpoints[0]
        subprocess.run(["etcdctl", "--endpoints", endpoint, "compact", str(now)], check=True,
                       capture_output=True, env={"ETCDCTL_API": "3", "PATH": "/usr/bin:/bin"})
        raw = cp.kubectl("get", "--raw", f"/api/v1/namespaces/etcd-b/configmaps?watch=1&resourceVersion={now - 2}",
                         timeout=20, check=False)
        said = raw.stdout + raw.stderr
        assert '"code":410' in said.replace(" ", "") or "(Expired)" in said, said
        assert "too old resource version" in said, said
        # The objects themselves are all there after the compaction.
        fresh = cp.kubectl("-n", "etcd-b", "get", "configmaps", "-o", "name").stdout.split()
        assert {"configmap/c0", "configmap/c1", "configmap/c2"} <= set(fresh)
    finally:
        cp.proc.stop()


def test_an_unreachable_etcd_is_a_clear_start_failure(tmp_path: Path) -> None:
    from kube32.sim.etcd import free_port
    from tests.conftest import sim_command

    port = free_port("127.0.0.1")
    done = subprocess.run(sim_command("control-plane", "--data-dir", str(tmp_path / "cp"), "--port", "0",
                                      "--no-kubelet", "--store", f"etcd://127.0.0.1:{port}"),
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert f"etcd at 127.0.0.1:{port} did not answer" in done.stderr


def test_a_bad_store_flag_is_refused(tmp_path: Path) -> None:
    from tests.conftest import sim_command

    done = subprocess.run(sim_command("control-plane", "--data-dir", str(tmp_path), "--store", "etcd://nowhere"),
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 2 and "HOST:PORT" in done.stderr


def test_an_object_over_a_smaller_etcds_request_limit_is_413_saying_so_truly(tmp_path: Path) -> None:
    """Someone else's etcd with its default --max-request-bytes (1.5 MiB, under kube32's own
    limit): a 2 MB object is 413 naming etcd's flag, never quoting kube32's larger limit as
    the one it was over (attack 26: "is 2000806 bytes, over the store's limit of 4128768")."""
    import re
    import signal

    from kube32.sim.etcd import free_port
    from tests.etcd import need_etcd

    need_etcd()
    client, peer = free_port("127.0.0.1"), free_port("127.0.0.1")
    etcd = subprocess.Popen(["etcd", "--name", "solo", "--data-dir", str(tmp_path / "etcd"),
                             "--listen-client-urls", f"http://127.0.0.1:{client}",
                             "--advertise-client-urls", f"http://127.0.0.1:{client}",
                             "--listen-peer-urls", f"http://127.0.0.1:{peer}",
                             "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
                             "--initial-cluster", f"solo=http://127.0.0.1:{peer}", "--log-level", "error",
                             "--logger", "zap"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        cp = start_control_plane(tmp_path / "cp", "--store", f"etcd://127.0.0.1:{client}", "--no-kubelet")
        try:
            env = [{"name": "BIG", "value": "y" * 2_000_000}]
            deploy = json.dumps({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "big"},
                                 "spec": {"replicas": 0, "selector": {"matchLabels": {"a": "b"}},
                                          "template": {"metadata": {"labels": {"a": "b"}}, "spec": {
                                              "containers": [{"name": "c", "image": "x", "env": env}]}}}})
            big = cp.kubectl("create", "-f", "-", input=deploy, check=False)
            assert "RequestEntityTooLarge" in big.stderr and "max-request-bytes" in big.stderr, big.stderr
            assert "over etcd's request-size limit" in big.stderr, big.stderr
            said = re.search(r"is (\d+) bytes, over the store's limit of (\d+)", big.stderr)
            assert said is None or int(said[1]) > int(said[2]), big.stderr
            assert cp.kubectl("get", "deployment", "big", check=False).returncode != 0
        finally:
            cp.proc.stop()
    finally:
        etcd.send_signal(signal.SIGTERM)
        etcd.wait(15)
