"""Checkpoint data (`checkpoints/<name>/data`): validated on upload, facts in status,
held in memory within the space, dropped with its Checkpoint."""
from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.request
import base64

import pytest
import yaml

from kube32.snapshot import GlobalState, PodState, SnapshotWriter, VALTYPE_I32
from tests.conftest import ControlPlane

IMAGE = bytes(range(32))


def snapshot(memory: bytes, pod_time_ms: int = 1234) -> bytes:
    state = PodState(image_sha256=IMAGE, memory_bytes=len(memory), memory_pages=max(1, -(-len(memory) // 65536)),
                     pod_time_ms=pod_time_ms, unix_time_ms=0, globals=(GlobalState(0, VALTYPE_I32, 4096),))
    return SnapshotWriter(state, memory).to_bytes()


class Api:
    def __init__(self, cp: ControlPlane) -> None:
        doc = yaml.safe_load(cp.kubeconfig.read_text())
        self.server = doc["clusters"][0]["cluster"]["server"]
        self.token = doc["users"][0]["user"]["token"]
        self.ctx = ssl.create_default_context(
            cadata=base64.b64decode(doc["clusters"][0]["cluster"]["certificate-authority-data"]).decode())

    def call(self, method: str, path: str, body: bytes | None = None,
             ctype: str = "application/json") -> tuple[int, bytes]:
        req = urllib.request.Request(self.server + path, data=body, method=method,
                                     headers={"Authorization": f"Bearer {self.token}", "Content-Type": ctype})
        try:
            with urllib.request.urlopen(req, context=self.ctx, timeout=60) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()


DATA = "/apis/kube32.io/v1/namespaces/default/checkpoints/ck/data"


@pytest.fixture
def api(control_plane: ControlPlane) -> Api:
    control_plane.kubectl("apply", "-f", "-", input="apiVersion: kube32.io/v1\nkind: Checkpoint\n"
                          "metadata: {name: ck}\nspec: {podName: p}\n")
    return Api(control_plane)


def test_upload_download_and_status_facts(api: Api, control_plane: ControlPlane) -> None:
    assert api.call("GET", DATA)[0] == 404
    snap = snapshot(b"\x07" * 70000)
    code, body = api.call("PUT", DATA, snap, "application/octet-stream")
    assert code == 200, body
    status = json.loads(body)["status"]
    assert status["sizeBytes"] == len(snap) and status["imageSha256"] == IMAGE.hex()
    assert status["snapshotSha256"] == snap[-32:].hex() and status["podTimeMs"] == 1234
    assert api.call("GET", DATA) == (200, snap)
    out = control_plane.kubectl("get", "ckpt").stdout
    assert "69Ki" in out or "68Ki" in out


@pytest.mark.parametrize("damage, message", [
    (lambda s: b"XXXX" + s[4:], "not a K32S snapshot"),
    (lambda s: s[:4] + b"\x09\x00" + s[6:], "version 9"),
    (lambda s: s[:100] + bytes([s[100] ^ 1]) + s[101:], "trailer does not match its contents"),
])
def test_bad_uploads_are_refused_and_nothing_is_stored(api: Api, damage, message) -> None:
    code, body = api.call("PUT", DATA, damage(snapshot(b"\x01" * 1000)), "application/octet-stream")
    assert code == 422 and message in json.loads(body)["message"], body
    assert api.call("GET", DATA)[0] == 404
    ck = json.loads(api.call("GET", DATA[: -len("/data")])[1])
    assert "sizeBytes" not in ck["status"]


def test_too_large_is_413_and_delete_drops_data(api: Api, control_plane: ControlPlane) -> None:
    code, body = api.call("PUT", DATA, snapshot(b"\x00" * (17 << 20)), "application/octet-stream")
    assert code == 413 and "more than the 16777216 bytes" in json.loads(body)["message"]
    assert api.call("PUT", DATA, snapshot(b"\x02" * 100), "application/octet-stream")[0] == 200
    control_plane.kubectl("delete", "ckpt", "ck")
    control_plane.kubectl("apply", "-f", "-", input="apiVersion: kube32.io/v1\nkind: Checkpoint\n"
                          "metadata: {name: ck}\nspec: {podName: p}\n")
    assert api.call("GET", DATA)[0] == 404, "a new Checkpoint of the same name has no data"


def test_oldest_data_goes_first_when_the_space_is_full(api: Api, control_plane: ControlPlane) -> None:
    for name in ("a", "b"):
        control_plane.kubectl("apply", "-f", "-", input="apiVersion: kube32.io/v1\nkind: Checkpoint\n"
                              f"metadata: {{name: {name}}}\nspec: {{podName: p}}\n")
    def path(n: str) -> str:
        return f"/apis/kube32.io/v1/namespaces/default/checkpoints/{n}/data"
    assert api.call("PUT", path("a"), snapshot(b"\x01" * (7 << 20)), "application/octet-stream")[0] == 200
    assert api.call("PUT", path("b"), snapshot(b"\x02" * (7 << 20)), "application/octet-stream")[0] == 200
    assert api.call("PUT", path("ck"), snapshot(b"\x03" * (7 << 20)), "application/octet-stream")[0] == 200
    assert api.call("GET", path("a"))[0] == 404
    assert api.call("GET", path("b"))[0] == 200 and api.call("GET", path("ck"))[0] == 200
