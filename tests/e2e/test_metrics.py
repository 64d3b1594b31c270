"""/metrics (issue 23 item 8): scraped from a real cluster and read by Prometheus' own
parser after a move: moves by outcome, the freeze-to-running histogram, snapshot bytes,
the data space, API requests by verb/resource/code with latency; who may scrape it; and
a client cannot grow it with made-up paths."""
from __future__ import annotations

import ssl
import urllib.error
import urllib.request
from typing import Iterator

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import ROOT, ControlPlane, start_cluster, wait_for
from tests.e2e.helpers import cli, get_json, push

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    c = start_cluster(tmp_path_factory.mktemp("metrics"), 2, "--backoff", "1")
    try:
        yield c
    finally:
        c.proc.stop(timeout=30)


def scrape(cluster: ControlPlane, token: str | None = None) -> tuple[int, str]:
    token = token or cluster.kubectl("config", "view", "--raw", "-o", "jsonpath={.users[0].user.token}").stdout
    ctx = ssl.create_default_context(cafile=str(cluster.data_dir / "pki" / "ca.crt"))
    req = urllib.request.Request(cluster.server + "/metrics", headers={"Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(req, timeout=30, context=ctx) as r:
            assert r.headers["Content-Type"].startswith("text/plain; version=0.0.4")
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def samples(text: str) -> dict[tuple[str, tuple], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(text) for s in f.samples}


def test_a_move_shows_in_metrics_as_prometheus_reads_them(cluster: ControlPlane) -> None:
    image = push(cluster, ROOT / "examples/pods/counter.wasm")
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "m"},
           "spec": {"nodeName": "sim-1", "containers": [{"name": "main", "image": image}]}}
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(pod))
    cluster.kubectl("wait", "--for=condition=Ready", "pod/m", "--timeout=60s", timeout=70)
    out = cli(cluster, "move", "m", "--to", "sim-2")
    assert out.returncode == 0, out.stdout.decode() + out.stderr.decode()
    wait_for(lambda: get_json(cluster, "pod", "m")["spec"]["nodeName"] == "sim-2", 30, what="the pod on sim-2")

    status, text = scrape(cluster)
    assert status == 200, text
    got = samples(text)
    assert got[("kube32_checkpoints_ended_total", (("action", "Move"), ("outcome", "Completed")))] >= 1
    assert got[("kube32_move_freeze_to_running_seconds_count", ())] >= 1
    assert got[("kube32_move_freeze_to_running_seconds_bucket", (("le", "+Inf"),))] >= 1
    assert got[("kube32_checkpoint_snapshot_bytes_count", ())] >= 1
    assert got[("kube32_checkpoint_snapshot_bytes_sum", ())] > 0
    assert got[("kube32_checkpoint_data_space_bytes", (("state", "capacity"),))] > 0
    assert ("kube32_checkpoint_data_space_bytes", (("state", "used"),)) in got
    lists = [v for (name, labels), v in got.items() if name == "apiserver_request_total"
             and dict(labels).get("verb") == "LIST" and dict(labels).get("resource") == "pods"
             and dict(labels).get("code") == "200"]
    assert lists and lists[0] >= 1
    assert any(name == "apiserver_request_duration_seconds_count" and dict(labels).get("resource") == "checkpoints"
               for name, labels in got)


def test_only_who_may_get_metrics_scrapes_them(cluster: ControlPlane) -> None:
    cluster.kubectl("create", "serviceaccount", "scraper")
    token = cluster.kubectl("create", "token", "scraper").stdout.strip()
    status, text = scrape(cluster, token)
    assert status == 403 and 'cannot get path \\"/metrics' in text, text
    cluster.kubectl("create", "clusterrolebinding", "scraper", "--clusterrole=system:monitoring",
                    "--serviceaccount=default:scraper")
    status, text = wait_for(lambda: (r := scrape(cluster, token))[0] == 200 and r, 10, what="the binding to count")
    assert "apiserver_request_total" in text


def test_made_up_paths_do_not_grow_the_metrics(cluster: ControlPlane) -> None:
    token = cluster.kubectl("config", "view", "--raw", "-o", "jsonpath={.users[0].user.token}").stdout
    ctx = ssl.create_default_context(cafile=str(cluster.data_dir / "pki" / "ca.crt"))
    for i in range(200):
        req = urllib.request.Request(f"{cluster.server}/api/v1/made-up-{i}/x?verb={i}",
                                     headers={"Authorization": f"Bearer {token}"})
        try:
            urllib.request.urlopen(req, timeout=10, context=ctx).close()
        except urllib.error.HTTPError:
            pass
    _, text = scrape(cluster)
    resources = {dict(labels).get("resource") for name, labels in samples(text) if name == "apiserver_request_total"}
    assert not any(r and r.startswith("made-up") for r in resources), resources
