"""Watch bookmarks and streaming lists (issue #23, item 5) against a real control plane:
``allowWatchBookmarks=true`` BOOKMARKs through the ``kubernetes`` Python client's watch,
and ``sendInitialEvents=true`` (client-go's WatchList) with curl: the initial ADDED
events, then the BOOKMARK annotated ``k8s.io/initial-events-end``, then live events.
"""
from __future__ import annotations

import json
import re
import subprocess
import threading
import time

import pytest

from kube32.terms import Annotation
from tests.conftest import ControlPlane, wait_for

pytestmark = pytest.mark.e2e


def curl(cp: ControlPlane, path: str, seconds: float) -> subprocess.Popen:
    """A streaming GET of ``path`` for ``seconds`` at most (curl -N), admin's token."""
    token = re.search(r"token: (\S+)", cp.kubeconfig.read_text()).group(1)
    return subprocess.Popen(["curl", "-sSN", "--max-time", str(seconds), "--cacert", str(cp.data_dir / "pki" / "ca.crt"),
                             "-H", f"Authorization: Bearer {token}", cp.server + path],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def lines_of(proc: subprocess.Popen, into: list[dict]) -> threading.Thread:
    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.strip():
                into.append(json.loads(line))
    t = threading.Thread(target=read, daemon=True)
    t.start()
    return t


def test_allow_watch_bookmarks_yields_bookmarks_to_the_python_client(control_plane: ControlPlane) -> None:
    cp = control_plane
    cp.kubectl("create", "namespace", "marks")
    cp.kubectl("-n", "marks", "create", "configmap", "one")
    from kubernetes import client, watch
    api = client.CoreV1Api(cp.client())
    rv = api.list_namespaced_config_map("marks").metadata.resource_version
    seen = []
    for ev in watch.Watch().stream(api.list_namespaced_config_map, "marks", resource_version=rv,
                                   allow_watch_bookmarks=True, timeout_seconds=3, _request_timeout=15):
        seen.append(ev)
    kinds = [ev["type"] for ev in seen]
    assert "BOOKMARK" in kinds, kinds
    mark = next(ev for ev in seen if ev["type"] == "BOOKMARK")
    raw = mark["raw_object"]
    assert set(raw) == {"kind", "apiVersion", "metadata"} and raw["kind"] == "ConfigMap", raw
    assert set(raw["metadata"]) == {"resourceVersion"} and int(raw["metadata"]["resourceVersion"]) >= int(rv)
    # without asking, no bookmarks
    plain = list(watch.Watch().stream(api.list_namespaced_config_map, "marks", resource_version=rv,
                                      timeout_seconds=2, _request_timeout=15))
    assert all(ev["type"] != "BOOKMARK" for ev in plain), plain


def test_send_initial_events_ends_them_with_an_annotated_bookmark(control_plane: ControlPlane) -> None:
    cp = control_plane
    cp.kubectl("create", "namespace", "initial")
    for name in ("a", "b", "c"):
        cp.kubectl("-n", "initial", "create", "configmap", name)
    got: list[dict] = []
    proc = curl(cp, "/api/v1/namespaces/initial/configmaps?watch=1&sendInitialEvents=true"
                    "&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true&timeoutSeconds=20", 25)
    reader = lines_of(proc, got)
    try:
        wait_for(lambda: len(got) >= 4, 15, what="three ADDED events and a bookmark")
        assert [e["type"] for e in got[:4]] == ["ADDED", "ADDED", "ADDED", "BOOKMARK"], got
        assert [e["object"]["metadata"]["name"] for e in got[:3]] == ["a", "b", "c"]
        mark = got[3]["object"]
        assert mark["metadata"]["annotations"] == {Annotation.INITIAL_EVENTS_END: "true"}, mark
        start = int(mark["metadata"]["resourceVersion"])
        assert start >= max(int(e["object"]["metadata"]["resourceVersion"]) for e in got[:3])
        cp.kubectl("-n", "initial", "create", "configmap", "d")
        wait_for(lambda: any(e["type"] == "ADDED" and e["object"]["metadata"]["name"] == "d" for e in got[4:]),
                 10, what="the live event after the bookmark")
        live = next(e for e in got[4:] if e["type"] == "ADDED")
        assert int(live["object"]["metadata"]["resourceVersion"]) > start
    finally:
        proc.kill()
        proc.wait(10)
        reader.join(5)


def test_watch_options_are_validated_as_kube_apiserver_does(control_plane: ControlPlane) -> None:
    cp = control_plane
    base = "/api/v1/namespaces/default/configmaps?watch=1&timeoutSeconds=2"
    cases = {
        "&sendInitialEvents=true&resourceVersionMatch=NotOlderThan": "allowWatchBookmarks must be set",
        "&sendInitialEvents=true&allowWatchBookmarks=true": "requires setting resourceVersionMatch",
        "&resourceVersionMatch=NotOlderThan&resourceVersion=1": "forbidden for watch unless sendInitialEvents",
    }
    for query, said in cases.items():
        proc = curl(cp, base + query, 10)
        out, _ = proc.communicate(timeout=15)
        body = json.loads(out)
        assert body["code"] == 400 and said in body["message"], (query, body)
    proc = curl(cp, "/api/v1/namespaces/default/configmaps?sendInitialEvents=true", 10)
    out, _ = proc.communicate(timeout=15)
    assert json.loads(out)["code"] == 400


def test_kubectl_watch_still_streams_tables(control_plane: ControlPlane) -> None:
    cp = control_plane
    cp.kubectl("create", "namespace", "tables")
    w = cp.kubectl_bg("-n", "tables", "get", "configmaps", "-w", "--request-timeout=20s")
    try:
        time.sleep(1.5)
        cp.kubectl("-n", "tables", "create", "configmap", "shown")
        assert w.stdout is not None
        deadline = time.monotonic() + 15
        line = ""
        while time.monotonic() < deadline and "shown" not in line:
            line = w.stdout.readline()
        assert "shown" in line, line
    finally:
        w.kill()
        w.wait(10)
