"""Fuzzing API bodies (hypothesis): mutated JSON and YAML objects for every stored
resource get a clear 4xx (a Status with a message), never a 500, and never leave a
half-object behind: after a refusal the collection is exactly as before; after an
acceptance the stored object is the one answered.

The API server runs in process (``APIServer`` + ``SQLiteStore`` on a temp dir, the same
handlers the control plane serves) on a loopback port in a background thread; the
test talks HTTP to it with the admin token.  FUZZ_API_EXAMPLES raises the example count.
"""
from __future__ import annotations

import asyncio
import json
import os
import threading
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml
from aiohttp import web
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kube32.apiserver.auth import ADMIN, load_or_create_tokens
from kube32.apiserver.checkpointdata import CheckpointDataSpace
from kube32.apiserver.server import APIServer
from kube32.store import SQLiteStore

SETTINGS = settings(max_examples=int(os.environ.get("FUZZ_API_EXAMPLES", "40")), deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])

POD_SPEC = {"containers": [{"name": "main", "image": "kube32.io/wasm-sha256:" + "ab" * 32}]}
LABELS = {"app": "fz"}
# A valid object of every resource users create, and its collection path.
OBJECTS: dict[str, tuple[str, dict[str, Any]]] = {
    "pods": ("/api/v1/namespaces/default/pods", {"apiVersion": "v1", "kind": "Pod", "spec": POD_SPEC}),
    "services": ("/api/v1/namespaces/default/services", {
        "apiVersion": "v1", "kind": "Service", "spec": {"selector": LABELS, "ports": [{"port": 80}]}}),
    "configmaps": ("/api/v1/namespaces/default/configmaps", {"apiVersion": "v1", "kind": "ConfigMap",
                                                             "data": {"a": "b"}}),
    "secrets": ("/api/v1/namespaces/default/secrets", {"apiVersion": "v1", "kind": "Secret",
                                                       "stringData": {"a": "b"}}),
    "namespaces": ("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace"}),
    "nodes": ("/api/v1/nodes", {"apiVersion": "v1", "kind": "Node", "spec": {}}),
    "events": ("/api/v1/namespaces/default/events", {
        "apiVersion": "v1", "kind": "Event", "reason": "R", "message": "m", "type": "Normal",
        "involvedObject": {"kind": "Pod", "name": "x", "namespace": "default"}}),
    "serviceaccounts": ("/api/v1/namespaces/default/serviceaccounts", {"apiVersion": "v1", "kind": "ServiceAccount"}),
    "leases": ("/apis/coordination.k8s.io/v1/namespaces/default/leases", {
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "spec": {"holderIdentity": "x"}}),
    "deployments": ("/apis/apps/v1/namespaces/default/deployments", {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "spec": {"replicas": 1, "selector": {"matchLabels": LABELS},
                 "template": {"metadata": {"labels": LABELS}, "spec": POD_SPEC}}}),
    "replicasets": ("/apis/apps/v1/namespaces/default/replicasets", {
        "apiVersion": "apps/v1", "kind": "ReplicaSet",
        "spec": {"replicas": 1, "selector": {"matchLabels": LABELS},
                 "template": {"metadata": {"labels": LABELS}, "spec": POD_SPEC}}}),
    "daemonsets": ("/apis/apps/v1/namespaces/default/daemonsets", {
        "apiVersion": "apps/v1", "kind": "DaemonSet",
        "spec": {"selector": {"matchLabels": LABELS}, "template": {"metadata": {"labels": LABELS}, "spec": POD_SPEC}}}),
    "poddisruptionbudgets": ("/apis/policy/v1/namespaces/default/poddisruptionbudgets", {
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
        "spec": {"minAvailable": 1, "selector": {"matchLabels": LABELS}}}),
    "checkpoints": ("/apis/kube32.io/v1/namespaces/default/checkpoints", {
        "apiVersion": "kube32.io/v1", "kind": "Checkpoint",
        "spec": {"podName": "x", "action": "Move", "target": {"nodeName": "n"}}}),
    "roles": ("/apis/rbac.authorization.k8s.io/v1/namespaces/default/roles", {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
        "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}]}),
    "rolebindings": ("/apis/rbac.authorization.k8s.io/v1/namespaces/default/rolebindings", {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "r"},
        "subjects": [{"kind": "User", "name": "u", "apiGroup": "rbac.authorization.k8s.io"}]}),
}


class Server:
    """The API server on a loopback port, its loop on a thread."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.loop = asyncio.new_event_loop()
        self.url = ""
        self.token = ""
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_until_complete(self._start())
        self._ready.set()
        self.loop.run_forever()

    async def _start(self) -> None:
        self.store = await SQLiteStore.open(self.data_dir / "state.db")
        auth = load_or_create_tokens(self.data_dir)
        server = APIServer(self.store, auth, data_space=CheckpointDataSpace())
        await server.ensure_defaults()
        self.runner = web.AppRunner(server.app, access_log=None)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"  # type: ignore[union-attr]
        self.token = auth.token_for(ADMIN)

    def start(self) -> None:
        self._thread.start()
        assert self._ready.wait(30)

    def stop(self) -> None:
        async def down() -> None:
            await self.store.close()
            await self.runner.cleanup()
        asyncio.run_coroutine_threadsafe(down(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)

    def call(self, method: str, path: str, body: bytes | None = None,
             ctype: str = "application/json") -> tuple[int, bytes]:
        req = urllib.request.Request(self.url + path, data=body, method=method,
                                     headers={"Authorization": f"Bearer {self.token}", "Content-Type": ctype,
                                              "Accept": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    s = Server(tmp_path_factory.mktemp("fuzzapi"))
    s.start()
    try:
        yield s
    finally:
        s.stop()


json_leaves = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(allow_nan=False),
                        st.text(max_size=12), st.just(""), st.just("-1"), st.just("9" * 40))
json_values = st.recursive(json_leaves, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                               st.dictionaries(st.text(max_size=8), inner,
                                                                               max_size=3)), max_leaves=6)


def paths_of(obj: Any, prefix: tuple = ()) -> list[tuple]:
    out = [prefix]
    if isinstance(obj, dict):
        for k, v in obj.items():
            out += paths_of(v, prefix + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            out += paths_of(v, prefix + (i,))
    return out


def mutate(obj: Any, path: tuple, action: str, value: Any) -> Any:
    if not path:
        return value if action == "replace" else obj
    head, rest = path[0], path[1:]
    obj = list(obj) if isinstance(obj, list) else dict(obj)
    if rest:
        obj[head] = mutate(obj[head], rest, action, value)
    elif action == "delete":
        del obj[head]
    elif action == "add" and isinstance(obj[head], dict):
        obj[head] = {**obj[head], "x-fuzz": value}
    else:
        obj[head] = value
    return obj


def names(api: Server, collection: str) -> dict[str, str]:
    status, body = api.call("GET", collection)
    assert status == 200, body
    return {o["metadata"]["name"]: o["metadata"]["resourceVersion"] for o in json.loads(body)["items"]}


def check_answer(api: Server, collection: str, before: dict[str, str], status: int, body: bytes) -> None:
    assert status < 500, (status, body[:300])
    if 200 <= status < 300:
        obj = json.loads(body)
        name = obj["metadata"]["name"]
        got_status, stored = api.call("GET", f"{collection}/{name}")
        assert got_status == 200 and json.loads(stored) == obj, "the stored object is the one answered"
        assert api.call("DELETE", f"{collection}/{name}")[0] in (200, 202)
        return
    assert 400 <= status < 500, status
    answer = json.loads(body)
    assert answer.get("kind") == "Status" and answer.get("message"), answer
    assert names(api, collection) == before, "a refused write leaves nothing behind"


counter = iter(range(10**9))


@SETTINGS
@given(resource=st.sampled_from(sorted(OBJECTS)), data=st.data(), as_yaml=st.booleans())
def test_mutated_objects_get_a_clear_4xx_or_are_stored_whole(api: Server, resource: str, data, as_yaml: bool) -> None:
    collection, base = OBJECTS[resource]
    obj = json.loads(json.dumps(base))
    obj["metadata"] = {"name": f"fz-{next(counter)}", "labels": dict(LABELS)}
    path = data.draw(st.sampled_from(paths_of(obj)))
    action = data.draw(st.sampled_from(["replace", "delete", "add"]))
    obj = mutate(obj, path, action, data.draw(json_values))
    before = names(api, collection)
    if as_yaml:
        body, ctype = yaml.safe_dump(obj).encode(), "application/yaml"
    else:
        body, ctype = json.dumps(obj).encode(), "application/json"
    status, answer = api.call("POST", collection, body, ctype)
    check_answer(api, collection, before, status, answer)


@SETTINGS
@given(resource=st.sampled_from(sorted(OBJECTS)), cut=st.integers(0, 400), junk=st.binary(max_size=20),
       ctype=st.sampled_from(["application/json", "application/yaml", "text/plain", "application/octet-stream"]))
def test_broken_bodies_get_a_clear_4xx(api: Server, resource: str, cut: int, junk: bytes, ctype: str) -> None:
    collection, base = OBJECTS[resource]
    obj = {**base, "metadata": {"name": f"fz-{next(counter)}"}}
    text = json.dumps(obj).encode()
    body = text[: cut % (len(text) + 1)] + junk
    before = names(api, collection)
    status, answer = api.call("POST", collection, body, ctype)
    check_answer(api, collection, before, status, answer)


@SETTINGS
@given(resource=st.sampled_from(sorted(OBJECTS)), data=st.data(),
       patch_type=st.sampled_from(["application/merge-patch+json", "application/strategic-merge-patch+json",
                                   "application/json-patch+json"]))
def test_mutated_updates_and_patches_keep_the_object_whole(api: Server, resource: str, data, patch_type: str) -> None:
    collection, base = OBJECTS[resource]
    name = f"fz-{next(counter)}"
    status, created = api.call("POST", collection, json.dumps({**base, "metadata": {"name": name,
                                                                                   "labels": LABELS}}).encode())
    assert status == 201, created
    original = json.loads(created)
    value = data.draw(json_values)
    if patch_type == "application/json-patch+json":
        op = data.draw(st.sampled_from(["add", "replace", "remove", "test", "move", "bogus"]))
        where = "/" + "/".join(str(p) for p in data.draw(st.sampled_from(paths_of(original)[1:])))
        body = json.dumps([{"op": op, "path": where, "value": value, "from": "/metadata"}]).encode()
    else:
        path = data.draw(st.sampled_from(paths_of(original)))
        body = json.dumps(mutate(original, path, "replace", value) if path else value).encode()
    status, answer = api.call("PATCH", f"{collection}/{name}", body, patch_type)
    assert status < 500, (status, answer[:300])
    got, stored = api.call("GET", f"{collection}/{name}")
    if 200 <= status < 300:
        assert json.loads(stored) == json.loads(answer)
    else:
        assert json.loads(answer).get("message")
        assert json.loads(stored) == original, "a refused patch changes nothing"
    api.call("DELETE", f"{collection}/{name}")
