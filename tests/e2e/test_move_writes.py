"""What users write and ask for while a pod moves: kept and served after the move.

Spec: a move "replaces the pod in one write: the same name, spec, labels and owners";
"The control plane takes one snapshot at a time. Others wait for it."  Real processes: a
control plane and workers as ``kube32-sim`` processes, the source with ``--fault
slow-snapshots`` (a snapshot pauses 8 s halfway), so that kubectl and kube32-cli act while
the move's Checkpoint is ``Saving``.
"""
from __future__ import annotations

import signal
import subprocess
import sys
from typing import Iterator

import pytest

from tests.conftest import ROOT
from tests.e2e.helpers import push
from tests.e2e.test_faults import FaultCluster, events_of, free_port, move_bg, serve_pod, the_checkpoint
from tests.e2e.test_moves import running, state

COUNTER = ROOT / "examples" / "pods" / "counter.wasm"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FaultCluster]:
    data_dir = tmp_path_factory.mktemp("move-writes")
    c = FaultCluster(data_dir, None, data_dir / "admin.kubeconfig", data_dir / "kubectl-cache")  # type: ignore[arg-type]
    c.port = free_port()
    c.start_control_plane()
    workers = [c.worker("slow", "--fault", "slow-snapshots"), c.worker("sim-2")]
    try:
        yield c
    finally:
        for w in workers:
            w.stop(signal.SIGKILL)
        c.proc.stop(timeout=30)


@pytest.fixture(scope="module")
def image(cluster: FaultCluster) -> str:
    return push(cluster, COUNTER)


def test_labels_and_annotations_written_during_the_snapshot_are_kept(cluster, image):
    serve_pod(cluster, "tagged", "slow", image)
    mover = move_bg(cluster, "tagged", "--to", "sim-2")
    the_checkpoint(cluster, "tagged", "Saving", 30)
    assert "labeled" in cluster.kubectl("label", "pod", "tagged", "during=saving").stdout
    assert "annotated" in cluster.kubectl("annotate", "pod", "tagged", "example.com/note=saving").stdout
    out = mover.communicate(timeout=90)[0].decode()
    assert mover.returncode == 0, out
    md = running(cluster, "tagged")["metadata"]
    assert md["labels"].get("during") == "saving", md
    assert md["annotations"].get("example.com/note") == "saving", md
    cluster.kubectl("delete", "pod", "tagged", "--wait=false")


def test_a_save_asked_during_a_move_waits_for_it_and_saves_the_pod_where_it_went(cluster, image):
    before = serve_pod(cluster, "queued", "slow", image)
    mover = move_bg(cluster, "queued", "--to", "sim-2")
    the_checkpoint(cluster, "queued", "Saving", 30)
    saver = subprocess.Popen([sys.executable, "-m", "kube32.cli.main", "checkpoint", "queued",
                              "--kubeconfig", str(cluster.kubeconfig)], cwd=ROOT,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    waiting = the_checkpoint(cluster, "queued", "Pending", 15)
    assert "its pod is under another move" in waiting["status"].get("message", ""), waiting["status"]
    assert mover.communicate(timeout=90)[0].decode().count("moved queued from slow to sim-2") == 1
    out = saver.communicate(timeout=90)[0].decode()
    assert saver.returncode == 0 and "saved queued on sim-2" in out, out
    assert not events_of(cluster, "queued", "CheckpointFailed")
    after = state(cluster, "queued")
    assert after["restored_calls"] == 1 and after["requests"] == before["requests"] + 1, after
    cluster.kubectl("delete", "pod", "queued", "--wait=false")
