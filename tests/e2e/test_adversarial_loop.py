"""Issue #19, finding 5 (from tests/attack/test_attack19.py): no list and no watch holds
the event loop that answers ``/healthz`` and node Lease renewals.

A user with ``edit`` in its own namespace only (``bot``) stores big ConfigMaps (each
within every limit) and then lists them whole, a page of one, patches one; or opens 200
watches it never reads and writes one big ConfigMap they all select.  Meanwhile a probe
asks ``/healthz`` and renews a Lease (as a kubelet renews its node's) every 0.2 s, each on
a fresh connection: neither may wait 2 s.  A real control plane (``kube32-sim
control-plane``, its own node), raw HTTPS from outside.
"""
from __future__ import annotations

import json
import re
import socket
import ssl
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Iterator

import pytest

from tests.conftest import ControlPlane, start_control_plane

pytestmark = pytest.mark.e2e

STALL = 2.0   # the slowest answer the probe accepts, seconds
LEASES = "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases"

SETUP = """
apiVersion: v1
kind: Namespace
metadata: {name: other}
---
apiVersion: v1
kind: ServiceAccount
metadata: {name: bot, namespace: other}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: bot-edit, namespace: other}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: edit}
subjects: [{kind: ServiceAccount, name: bot, namespace: other}]
"""


class Api:
    """HTTPS to the API server with any token (urllib, the cluster CA)."""

    def __init__(self, cp: ControlPlane) -> None:
        self.base = cp.server
        self.host, port = self.base.split("//")[1].rsplit(":", 1)
        self.port = int(port)
        self.ctx = ssl.create_default_context(cafile=str(cp.data_dir / "pki" / "ca.crt"))
        self.admin = re.search(r"token: (\S+)", cp.kubeconfig.read_text()).group(1)

    def req(self, method: str, path: str, token: str | None, body: Any = None,
            ctype: str = "application/json", timeout: float = 120) -> tuple[int, bytes]:
        data = None if body is None else json.dumps(body).encode()
        r = urllib.request.Request(self.base + path, data=data, method=method)
        if token:
            r.add_header("Authorization", f"Bearer {token}")
        if data is not None:
            r.add_header("Content-Type", ctype)
        try:
            with urllib.request.urlopen(r, timeout=timeout, context=self.ctx) as resp:
                return resp.status, resp.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()

    def tls_socket(self) -> ssl.SSLSocket:
        s = socket.create_connection((self.host, self.port), timeout=30)
        return self.ctx.wrap_socket(s, server_hostname=self.host)


class Probe:
    """``/healthz`` and a Lease renewal every 0.2 s, each timed; ``worst()`` stops it."""

    def __init__(self, api: Api) -> None:
        self.api = api
        self.health: list[float] = []
        self.renewals: list[float] = []
        self._stop = threading.Event()
        st, _ = api.req("POST", LEASES, api.admin, {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                                                     "metadata": {"name": "probe"}, "spec": {}})
        assert st in (201, 409), st
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def _timed(self, into: list[float], *call: Any) -> None:
        t0 = time.monotonic()
        try:
            self.api.req(*call, timeout=60)
        except Exception:  # noqa: BLE001 - a timeout is a slow answer
            pass
        into.append(time.monotonic() - t0)

    def _run(self) -> None:
        while not self._stop.is_set():
            self._timed(self.health, "GET", "/healthz", None)
            now = time.strftime("%Y-%m-%dT%H:%M:%S.000000Z", time.gmtime())
            self._timed(self.renewals, "PATCH", f"{LEASES}/probe", self.api.admin,
                        {"spec": {"holderIdentity": "probe", "renewTime": now}}, "application/merge-patch+json")
            self._stop.wait(0.2)

    def worst(self) -> tuple[float, float]:
        self._stop.set()
        self._t.join(120)
        return max(self.health, default=0.0), max(self.renewals, default=0.0)


@pytest.fixture
def plane(tmp_path: Path) -> Iterator[tuple[ControlPlane, Api, str]]:
    cp = start_control_plane(tmp_path / "cp")
    try:
        cp.kubectl("apply", "-f", "-", input=SETUP)
        bot = cp.kubectl("create", "token", "bot", "-n", "other", "--duration", "1h").stdout.strip()
        yield cp, Api(cp), bot
    finally:
        cp.proc.stop(timeout=30)


def _labels(n: int) -> dict[str, str]:
    return {f"l{i}": "" for i in range(n)}


def quiet(api: Api) -> None:
    """Wait for the server to be idle (three quick /healthz in a row): what a create set off
    (its watchers' events) is not charged to the requests measured next."""
    quick, deadline = 0, time.monotonic() + 60
    while quick < 3 and time.monotonic() < deadline:
        t0 = time.monotonic()
        api.req("GET", "/healthz", None)
        quick = quick + 1 if time.monotonic() - t0 < 0.1 else 0
        time.sleep(0.1)


def _big(api: Api, bot: str, name: str, labels: dict[str, str]) -> None:
    st, out = api.req("POST", "/api/v1/namespaces/other/configmaps", bot,
                      {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "labels": labels}})
    assert st == 201, (st, out[:300])


def test_lists_of_big_objects_do_not_stall_healthz_or_leases(plane: tuple[ControlPlane, Api, str]) -> None:
    cp, api, bot = plane
    for i in range(3):
        _big(api, bot, f"big-{i}", _labels(60_000))
    quiet(api)
    probe = Probe(api)
    answers: list[tuple[int, bytes]] = []
    readers = [threading.Thread(target=lambda q=q: answers.append(
        api.req("GET", f"/api/v1/namespaces/other/configmaps{q}", bot))) for q in ("", "?limit=1", "")]
    for t in readers:
        t.start()
    for t in readers:
        t.join(300)
    time.sleep(0.5)
    health, renewal = probe.worst()
    quiet(api)
    lists = sorted((json.loads(body) for st, body in answers if st == 200), key=lambda doc: len(doc["items"]))
    assert [len(doc["items"]) for doc in lists] == [1, 3, 3], [len(doc["items"]) for doc in lists]
    assert lists[0]["metadata"]["remainingItemCount"] == 2 and lists[0]["metadata"]["continue"]
    assert all(len(item["metadata"]["labels"]) == 60_000 and item["metadata"]["resourceVersion"]
               for item in lists[2]["items"])
    assert health < STALL and renewal < STALL, (
        f"three lists of 3 ConfigMaps of 60,000 labels held /healthz up to {health:.1f} s and a Lease "
        f"renewal up to {renewal:.1f} s")


def test_a_patch_of_a_big_object_does_not_stall_healthz_or_leases(plane: tuple[ControlPlane, Api, str]) -> None:
    """A strategic merge patch of all 60,000 labels of a ConfigMap: its passes (decode,
    patch, validation, managedFields, encode: seconds of Python on a loaded machine) run on
    a worker thread (kube32/apiserver/offload.py), so /healthz and Lease renewals wait at
    most one C-level decode or encode behind it.  Twice: the second patches what the first
    stored (a big stored object and a big body)."""
    cp, api, bot = plane
    _big(api, bot, "big-0", _labels(60_000))
    quiet(api)
    probe = Probe(api)
    answers = [api.req("PATCH", "/api/v1/namespaces/other/configmaps/big-0", bot,
                       {"metadata": {"labels": {f"l{i}": value for i in range(60_000)}}},
                       ctype="application/strategic-merge-patch+json") for value in ("y", "z")]
    time.sleep(0.5)
    health, renewal = probe.worst()
    assert [st for st, _ in answers] == [200, 200], [(st, body[:300]) for st, body in answers]
    labels = json.loads(answers[1][1])["metadata"]["labels"]
    assert len(labels) == 60_000 and set(labels.values()) == {"z"}
    assert health < STALL and renewal < STALL, (
        f"a strategic merge patch of 60,000 labels held /healthz up to {health:.1f} s and a Lease renewal "
        f"up to {renewal:.1f} s")


def test_a_write_fanned_out_to_many_watchers_does_not_stall_healthz_or_leases(
        plane: tuple[ControlPlane, Api, str]) -> None:
    """200 watches of ``bot``'s ConfigMaps that read nothing, then three ConfigMaps of 10,000
    labels they all select: each event is encoded once, not once per watcher (200 encodes of
    each held the loop for seconds; a watcher that cannot take its events is dropped instead
    of growing the server, tests/unit/test_paging.py).  The objects are small enough that
    their own create is not what is measured."""
    cp, api, bot = plane
    socks = []
    try:
        for _ in range(200):
            s = api.tls_socket()
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            s.sendall(f"GET /api/v1/namespaces/other/configmaps?watch=true&labelSelector=amp%3D1 HTTP/1.1\r\n"
                      f"Host: x\r\nAuthorization: Bearer {bot}\r\n\r\n".encode())
            socks.append(s)
        quiet(api)
        probe = Probe(api)
        for i in range(3):
            _big(api, bot, f"amp-{i}", {"amp": "1", **_labels(10_000)})
        time.sleep(3)
        health, renewal = probe.worst()
    finally:
        for s in socks:
            s.close()
    assert health < STALL and renewal < STALL, (
        f"three ConfigMap creates seen by 200 non-reading watchers held /healthz up to {health:.1f} s and a "
        f"Lease renewal up to {renewal:.1f} s")
    # and the server is still whole: a watcher that reads gets the events
    st, body = api.req("GET", "/api/v1/namespaces/other/configmaps?labelSelector=amp%3D1&limit=2", bot)
    assert st == 200 and len(json.loads(body)["items"]) == 2
