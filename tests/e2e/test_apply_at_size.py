"""Server-side apply at size (5,000-item lists of every list type), /status applies,
list-type ratcheting, bindings, conflict wording and /metrics, with real clients
(requests, kubectl 1.32, the kubernetes Python client) against a ``kube32-sim
control-plane``: an outside tester's round e on issue 23 (2026-12-03), kept.  Each
docstring says what Kubernetes (v1.32) does and what Kube32 did when the round ran (a
finding, fixed since, or what held); every test here passes.
"""
from __future__ import annotations

import base64
import json
import os
import subprocess
import tempfile
import threading
import time
from datetime import datetime

import pytest

pytestmark = pytest.mark.e2e
# A stall of the API server, not a slow answer on a loaded machine (CI runs three suites
# on two cores): a write held the loop for 10-24 s before the fix; the figures on an idle
# machine are in each docstring.
STALL = 10.0
SLACK = 3.0

GROUP = "atk23f.example.com"
BIGS = f"/apis/{GROUP}/v1/namespaces/default/bigs"
RATS = f"/apis/{GROUP}/v1/namespaces/default/rats"
CRDS = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
IMG = "kube32.io/wasm-sha256:" + "0" * 64


# --------------------------------------------------------------------------- client


class Cluster:
    def __init__(self, data_dir: str) -> None:
        import requests
        import yaml

        self.kubeconfig = os.path.join(data_dir, "admin.kubeconfig")
        cfg = yaml.safe_load(open(self.kubeconfig))
        cl = cfg["clusters"][0]["cluster"]
        self.server = cl["server"]
        ca = tempfile.NamedTemporaryFile(delete=False, suffix=".crt")
        ca.write(base64.b64decode(cl["certificate-authority-data"]))
        ca.close()
        self.ca = ca.name
        self.token = cfg["users"][0]["user"]["token"]
        self._requests = requests

    def session(self):
        s = self._requests.Session()
        s.trust_env = False  # REQUESTS_CA_BUNDLE would override verify
        s.verify = self.ca
        s.headers["Authorization"] = "Bearer " + self.token
        return s

    def req(self, method, path, body=None, ctype="application/json", params=None, timeout=120, s=None):
        s = s or self.session()
        data = body if isinstance(body, (str, bytes)) or body is None else json.dumps(body)
        headers = {"Content-Type": ctype} if body is not None else {}
        t = time.monotonic()
        r = s.request(method, self.server + path, data=data, headers=headers, params=params, timeout=timeout)
        r.elapsed_s = time.monotonic() - t
        return r

    def apply(self, path, obj, manager, force=False, **params):
        p = {"fieldManager": manager}
        if force:
            p["force"] = "true"
        p.update(params)
        return self.req("PATCH", path, obj, "application/apply-patch+yaml", params=p)

    def merge(self, path, patch, manager=None):
        return self.req(
            "PATCH", path, patch, "application/merge-patch+json", params={"fieldManager": manager} if manager else None
        )

    def delete_and_wait(self, path):
        self.req("DELETE", path, params={"gracePeriodSeconds": "0"})
        for _ in range(100):
            if self.req("GET", path).status_code == 404:
                return
            time.sleep(0.2)
        raise AssertionError(f"{path} not gone")

    def kubectl(self, *args, stdin=None):
        env = dict(os.environ, KUBECONFIG=self.kubeconfig)
        return subprocess.run(["kubectl", *args], input=stdin, capture_output=True, text=True, env=env, timeout=120)


class HealthSampler:
    """GETs /healthz every 50 ms on its own connection while a block runs."""

    def __init__(self, c: Cluster) -> None:
        self.c, self.lat, self.stop = c, [], False

    def _run(self):
        s = self.c.session()
        while not self.stop:
            t = time.monotonic()
            r = s.get(self.c.server + "/healthz", timeout=60)
            self.lat.append(time.monotonic() - t)
            assert r.status_code == 200
            time.sleep(0.05)

    def __enter__(self):
        self.th = threading.Thread(target=self._run, daemon=True)
        self.th.start()
        return self

    def __exit__(self, *exc):
        self.stop = True
        self.th.join()

    @property
    def worst(self):
        return max(self.lat) if self.lat else 0.0


@pytest.fixture(scope="module")
def c(tmp_path_factory):
    from tests.conftest import start_control_plane
    cp = start_control_plane(tmp_path_factory.mktemp("applyatsize") / "cp", "--no-kubelet")
    try:
        yield Cluster(str(cp.data_dir))
    finally:
        cp.proc.stop()


def _wait_established(c, name):
    for _ in range(100):
        r = c.req("GET", f"{CRDS}/{name}")
        if r.status_code == 200 and any(
            x["type"] == "Established" and x["status"] == "True"
            for x in r.json().get("status", {}).get("conditions", [])
        ):
            time.sleep(0.5)
            return
        time.sleep(0.2)
    raise AssertionError(f"CRD {name} not established")


def _crd(plural: str, kind: str, spec: dict, status: dict) -> dict:
    """A namespaced CRD of GROUP/v1 with a status subresource, its spec's and status's properties."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{GROUP}"},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {"plural": plural, "singular": kind.lower(), "kind": kind},
            "versions": [{
                "name": "v1", "served": True, "storage": True, "subresources": {"status": {}},
                "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                    "spec": {"type": "object", "properties": spec},
                    "status": {"type": "object", "properties": status},
                }}},
            }],
        },
    }


def _map_list(keys: list[str], properties: dict) -> dict:
    """An array of objects, a map list keyed by ``keys`` (each required)."""
    return {"type": "array", "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": keys,
            "items": {"type": "object", "required": keys, "properties": properties}}


def _big_crd():
    s = {"type": "string"}
    spec = {
        "m1": _map_list(["name"], {"name": s, "v": s, "w": s}),
        "m2": _map_list(["a", "b"], {"a": s, "b": {"type": "integer"}, "v": s}),
        "m3": _map_list(["a", "b", "c"], {"a": s, "b": s, "c": s, "v": s}),
        "s": {"type": "array", "x-kubernetes-list-type": "set", "items": s},
        "si": {"type": "array", "x-kubernetes-list-type": "set", "items": {"type": "integer"}},
        "at": {"type": "array", "items": s},
        "mp": {"type": "object", "additionalProperties": s},
        "n": _map_list(["name"], {"name": s, "sub": _map_list(["k"], {"k": s, "v": s})}),
        "deep": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
        "replicas": {"type": "integer"},
        "color": s,
    }
    status = {
        "phase": s,
        "ready": {"type": "integer"},
        "conds": _map_list(["type"], {"type": s, "status": s}),
    }
    return _crd("bigs", "Big", spec, status)


@pytest.fixture(scope="module")
def bigs(c):
    r = c.req("POST", CRDS, _big_crd())
    assert r.status_code in (201, 409), r.text
    _wait_established(c, f"bigs.{GROUP}")
    return BIGS


def big(name, spec=None, status=None):
    o = {"apiVersion": f"{GROUP}/v1", "kind": "Big", "metadata": {"name": name}}
    if spec is not None:
        o["spec"] = spec
    if status is not None:
        o["status"] = status
    return o


def managers(o):
    return [(m["manager"], m["operation"], m.get("subresource", "")) for m in o["metadata"].get("managedFields", [])]


# list generators: (lo, hi, value) -> list (or map) of hi-lo items
GENS = {
    "m1": lambda lo, hi, v: [{"name": f"i{i}", "v": v} for i in range(lo, hi)],
    "m2": lambda lo, hi, v: [{"a": f"x{i % 10}", "b": i, "v": v} for i in range(lo, hi)],
    "m3": lambda lo, hi, v: [{"a": f"x{i % 7}", "b": f"y{i % 11}", "c": f"z{i}", "v": v} for i in range(lo, hi)],
    "s": lambda lo, hi, v: [f"s{i}" for i in range(lo, hi)],
    "si": lambda lo, hi, v: list(range(lo, hi)),
    "at": lambda lo, hi, v: [f"{v}{i}" for i in range(lo, hi)],
    "mp": lambda lo, hi, v: {f"k{i}": v for i in range(lo, hi)},
    "n": lambda lo, hi, v: [
        {"name": f"n{i}", "sub": [{"k": f"k{j}", "v": v} for j in range(10)]} for i in range(lo // 10, hi // 10)
    ],
}


# --------------------------------------------------------------------------- 1. cost


@pytest.mark.parametrize("field", list(GENS))
def test_ssa_long_lists_cost(c, bigs, field):
    """5,000-item lists (map lists on 1, 2 and 3 keys, sets of strings and integers, an
    atomic list, a granular map, a map list of map lists) written by three appliers
    (overlapping, conflicting, forced, dropped) then by a PUT and a merge patch.
    Kubernetes: each write is tens of milliseconds per 1,000 items and the API server
    keeps answering /healthz. Kube32 (when written): 0.05-1.1 s per write of 5,000-7,500
    items, /healthz worst ~0.2 s; ownership as Kubernetes computes it."""
    N = 5000
    g = GENS[field]
    name = f"cost-{field}"
    p = f"{bigs}/{name}"
    c.delete_and_wait(p)
    times = []

    def w(r, items, ok=(200, 201)):
        assert r.status_code in ok, r.text[:300]
        times.append((r.elapsed_s, items, r.request.method))
        return r

    with HealthSampler(c) as hs:
        w(c.apply(p, big(name, {field: g(0, N, "a")}), "mgr-a"), N)
        w(c.apply(p, big(name, {field: g(0, N, "a")}), "mgr-a"), N)  # no-op re-apply
        w(
            c.apply(p, big(name, {field: g(N // 2, N + N // 2, "a")}), "mgr-b"),
            N,
            ok=(409,) if field == "at" else (200,),
        )
        conflicting = field not in ("s", "si")
        w(c.apply(p, big(name, {field: g(0, N, "c")}), "mgr-c"), N, ok=(409,) if conflicting else (200,))
        w(c.apply(p, big(name, {field: g(0, N, "c")}), "mgr-c", force=True), N)
        w(c.apply(p, big(name, {}), "mgr-a"), 0)  # drop everything mgr-a had
        o = c.req("GET", p).json()
        if field not in ("at",):
            size = len(o["spec"][field]) if field != "n" else len(o["spec"][field]) * 10
            assert size == N + N // 2, (field, size)  # mgr-b's and mgr-c's items stay
        del o["metadata"]["managedFields"]
        o["spec"][field] = g(0, N, "p")
        w(c.req("PUT", p, o, params={"fieldManager": "putter"}), N)
        w(c.merge(p, {"spec": {field: g(0, N, "q")}}, "merger"), N)
        w(c.apply(p, big(name, {field: g(N // 2, N + N // 2, "b")}), "mgr-b", force=True), N)
    # Bounds that a quadratic cost breaks by far (it took 10-24 s at 2,000 items, ~150 s
    # would be 5,000) and a loaded 2-core CI machine does not: the figures are bench's.
    slow = [(round(t, 2), n, m) for t, n, m in times if t > SLACK + 2.0 * max(n, 1000) / 1000]
    assert not slow, f"writes over 2 s per 1,000 items: {slow}"
    assert hs.worst < STALL, f"/healthz took {hs.worst:.2f} s during the writes"


def test_ssa_deep_nesting_and_fifty_managers(c, bigs):
    """A preserve-unknown-fields object 97 levels deep (the 100-level body bound leaves
    that much) applied, conflicting and forced; then 50 appliers on one object, each
    co-owning `.spec.color` and 100 shared map-list items and owning one of its own, and
    a newcomer's conflict against all 50. Kubernetes: fast, one cause per (manager, path).
    Kube32 (when written): each write under 0.2 s, 50 and 100 causes."""
    d = {"leaf": 1}
    for i in range(97):
        d = {f"l{i}": d}
    d2 = json.loads(json.dumps(d).replace('"leaf": 1', '"leaf": 2'))
    p = f"{bigs}/deep"
    c.delete_and_wait(p)
    assert c.apply(p, big("deep", {"deep": d}), "mgr-a").status_code == 201
    r = c.apply(p, big("deep", {"deep": d2}), "mgr-b")
    assert r.status_code == 409 and r.json()["message"].startswith(
        'Apply failed with 1 conflict: conflict with "mgr-a": .spec.deep.l96.l95.'
    )
    assert r.json()["message"].endswith(".l1.l0.leaf")
    assert c.apply(p, big("deep", {"deep": d2}), "mgr-b", force=True).status_code == 200

    p = f"{bigs}/many"
    c.delete_and_wait(p)
    worst = 0.0
    with HealthSampler(c) as hs:
        for i in range(50):
            spec = {
                "color": "red",
                "m1": [{"name": f"i{j}", "v": "x"} for j in range(100)] + [{"name": f"own{i}", "v": "y"}],
            }
            r = c.apply(p, big("many", spec), f"mgr-{i:02d}")
            assert r.status_code in (200, 201), r.text[:300]
            worst = max(worst, r.elapsed_s)
        o = c.req("GET", p).json()
        assert len(o["metadata"]["managedFields"]) == 50 and len(o["spec"]["m1"]) == 150
        r = c.apply(p, big("many", {"color": "blue", "m1": [{"name": "i5", "v": "z"}]}), "newcomer")
        assert r.status_code == 409
        assert r.json()["message"].startswith(
            'Apply failed with 100 conflicts: conflicts with "mgr-00":\n- .spec.color\n- .spec.m1[name="i5"].v\nconflicts with "mgr-01":'
        )
        assert len(r.json()["details"]["causes"]) == 100
        r = c.apply(p, big("many", {"color": "blue", "m1": [{"name": "i5", "v": "z"}]}), "newcomer", force=True)
        assert r.status_code == 200
        worst = max(worst, r.elapsed_s)
        o = r.json()
        assert o["spec"]["color"] == "blue" and len(o["metadata"]["managedFields"]) == 51
    assert worst < STALL and hs.worst < STALL, (worst, hs.worst)


def test_ssa_concurrent_heavy_writers_keep_healthz_and_leases(c, bigs):
    """Three clients apply 6,000-item objects (a 2-key map list and a set) as fast as they
    can for 25 s, rotating forced managers. Kubernetes: /healthz answers at once and node
    Leases renew every 10 s throughout. Kube32 (when written): /healthz worst ~0.3 s,
    Lease gaps ~10 s, each write ~3 s under the three-way contention on 2 cores."""
    stop = False
    renew: dict[str, set] = {}
    errors: list[str] = []
    counts = []

    def leases():
        s = c.session()
        while not stop:
            for lease in s.get(c.server + "/apis/coordination.k8s.io/v1/leases", timeout=60).json()["items"]:
                k = lease["metadata"]["namespace"] + "/" + lease["metadata"]["name"]
                renew.setdefault(k, set()).add(lease["spec"].get("renewTime"))
            time.sleep(0.5)

    def writer(n):
        s = c.session()
        i = 0
        while not stop:
            body = big(f"st{n}", {"m2": GENS["m2"](0, 3000, f"{n}-{i}"), "s": GENS["s"](0, 3000, "")})
            r = c.req(
                "PATCH",
                f"{bigs}/st{n}",
                body,
                "application/apply-patch+yaml",
                params={"fieldManager": f"w{i % 3}", "force": "true"},
                s=s,
            )
            if r.status_code >= 300:
                errors.append(r.text[:200])
            i += 1
        counts.append(i)

    ths = [threading.Thread(target=leases, daemon=True)] + [
        threading.Thread(target=writer, args=(n,), daemon=True) for n in range(3)
    ]
    with HealthSampler(c) as hs:
        for t in ths:
            t.start()
        time.sleep(25)
        stop = True
        for t in ths:
            t.join()
    assert not errors, errors[:3]
    # A bound a quadratic apply breaks (3,000 items: seconds each), not a loaded CI machine:
    # with both suites' legs on 2 cores the three writers did 14 in 25 s (15 was the bound).
    assert min(counts) >= 2 and sum(counts) >= 9, counts
    assert hs.worst < STALL, f"/healthz took {hs.worst:.2f} s"
    for k, v in renew.items():
        if not k.startswith("kube-node-lease/"):
            continue
        ts = sorted(datetime.fromisoformat(x.replace("Z", "+00:00")).timestamp() for x in v if x)
        gaps = [b - a for a, b in zip(ts, ts[1:], strict=False)]
        assert len(ts) >= 2 and max(gaps) < 10 + STALL, (k, gaps)


def test_update_managers_are_capped_at_ten(c, bigs):
    """30 merge patches, each with a fieldManager of its own, on one object.
    Kubernetes (capmanagers.go, DefaultMaxUpdateManagers = 10): at most 10 Update entries
    are kept; the oldest are merged into one named "ancient-changes", so no client grows
    managedFields (and every later write's cost) by inventing manager names.
    Kube32 (when written): all 30 Update entries kept (400 patches: 400 entries)."""
    p = f"{bigs}/upd"
    c.delete_and_wait(p)
    assert c.req("POST", bigs, big("upd", {"mp": {}})).status_code == 201
    for i in range(30):
        assert c.merge(p, {"spec": {"mp": {f"k{i}": "v"}}}, f"upd-{i:02d}").status_code == 200
    o = c.req("GET", p).json()
    upd = [m for m in o["metadata"]["managedFields"] if m["operation"] == "Update"]
    names = [m["manager"] for m in upd]
    assert len(upd) <= 10, f"{len(upd)} Update managers kept: {names[:12]}..."
    assert "ancient-changes" in names


# --------------------------------------------------------------------------- 2. status


def test_create_by_apply_owns_no_status(c, bigs):
    """`kubectl apply --server-side` that creates a custom resource (status subresource on)
    from a manifest holding a status. Kubernetes: the status is dropped and the main
    manager owns no status field (the strategy's reset fields), so a later
    `--subresource=status` apply succeeds without conflict.
    Kube32 (when written): the status is dropped but the creating manager records
    `f:status.f:phase`/`f:ready`, and the first status apply fails with `Apply failed
    with 2 conflicts: conflicts with "main-mgr": - .status.phase - .status.ready` (a
    second main apply clears it)."""
    c.delete_and_wait(f"{bigs}/st-create")
    y = f"apiVersion: {GROUP}/v1\nkind: Big\nmetadata: {{name: st-create}}\nspec: {{color: red}}\nstatus: {{phase: FromMain, ready: 9}}\n"
    r = c.kubectl("apply", "--server-side", "--field-manager=main-mgr", "-f", "-", stdin=y)
    assert r.returncode == 0, r.stderr
    o = c.req("GET", f"{bigs}/st-create").json()
    assert "status" not in o or not o["status"]
    main = [m for m in o["metadata"]["managedFields"] if m["manager"] == "main-mgr"][0]
    assert "f:status" not in main["fieldsV1"], f"main apply owns status: {main['fieldsV1']}"
    ys = f"apiVersion: {GROUP}/v1\nkind: Big\nmetadata: {{name: st-create}}\nstatus: {{phase: Running, ready: 1}}\n"
    r = c.kubectl("apply", "--server-side", "--subresource=status", "--field-manager=status-a", "-f", "-", stdin=ys)
    assert r.returncode == 0, r.stderr


def test_status_apply_with_kubectl(c, bigs):
    """`kubectl apply --server-side --subresource=status` by two status appliers.
    Kubernetes: each is recorded with subresource status; the second conflicts with
    `conflicts with "status-a" with subresource "status"`; --force-conflicts moves only
    the contested fields; spec in a status apply is ignored and not owned; a main apply
    that carries status neither changes nor owns it. Kube32 (when written): all of this
    holds (but the path order inside the message, see test_conflict_paths_in_kubernetes_order)."""
    n = "st-kubectl"
    c.delete_and_wait(f"{bigs}/{n}")
    assert c.apply(f"{bigs}/{n}", big(n, {"color": "red", "replicas": 1}), "main-mgr").status_code == 201
    y2 = (
        f"apiVersion: {GROUP}/v1\nkind: Big\nmetadata: {{name: {n}}}\nspec: {{color: blue, replicas: 7}}\n"
        "status: {phase: Running, ready: 1, conds: [{type: Ready, status: 'True'}]}\n"
    )
    r = c.kubectl("apply", "--server-side", "--subresource=status", "--field-manager=status-a", "-f", "-", stdin=y2)
    assert r.returncode == 0, r.stderr
    o = c.req("GET", f"{bigs}/{n}").json()
    assert o["spec"] == {"color": "red", "replicas": 1}
    assert o["status"] == {"phase": "Running", "ready": 1, "conds": [{"type": "Ready", "status": "True"}]}
    sa = [m for m in o["metadata"]["managedFields"] if m["manager"] == "status-a"][0]
    assert sa["operation"] == "Apply" and sa.get("subresource") == "status" and "f:spec" not in sa["fieldsV1"]
    y3 = f"apiVersion: {GROUP}/v1\nkind: Big\nmetadata: {{name: {n}}}\nstatus: {{phase: Failed, conds: [{{type: Ready, status: 'False'}}]}}\n"
    r = c.kubectl("apply", "--server-side", "--subresource=status", "--field-manager=status-b", "-f", "-", stdin=y3)
    assert r.returncode != 0
    assert 'Apply failed with 2 conflicts: conflicts with "status-a" with subresource "status":' in r.stderr
    r = c.kubectl(
        "apply",
        "--server-side",
        "--subresource=status",
        "--field-manager=status-b",
        "--force-conflicts",
        "-f",
        "-",
        stdin=y3,
    )
    assert r.returncode == 0, r.stderr
    o = c.req("GET", f"{bigs}/{n}").json()
    assert o["status"] == {"phase": "Failed", "ready": 1, "conds": [{"type": "Ready", "status": "False"}]}
    fs = {m["manager"]: m["fieldsV1"] for m in o["metadata"]["managedFields"]}
    assert fs["status-a"] == {"f:status": {"f:conds": {'k:{"type":"Ready"}': {".": {}, "f:type": {}}}, "f:ready": {}}}
    # a main apply that carries status changes and owns none of it
    r = c.apply(f"{bigs}/{n}", big(n, {"color": "red", "replicas": 1}, {"phase": "MAIN", "ready": 99}), "main-mgr")
    assert r.status_code == 200
    o = r.json()
    assert o["status"]["phase"] == "Failed"
    assert "f:status" not in {m["manager"]: m["fieldsV1"] for m in o["metadata"]["managedFields"]}["main-mgr"]


def test_status_apply_with_python_dynamic_client(c, bigs):
    """The kubernetes Python client's DynamicClient: `resource.subresources["status"]
    .server_side_apply(...)`. Kubernetes: an apply to /status of a missing object is a
    404; a second status applier conflicts until forced; spec untouched.
    Kube32 (when written): as Kubernetes."""
    from kubernetes import config, dynamic
    from kubernetes.dynamic.exceptions import ApiException, NotFoundError

    api = config.new_client_from_config(c.kubeconfig)
    api.configuration.ssl_ca_cert = c.ca
    dc = dynamic.DynamicClient(api)
    res = dc.resources.get(api_version=f"{GROUP}/v1", kind="Big")
    st = res.subresources["status"]
    c.delete_and_wait(f"{bigs}/py1")
    with pytest.raises(NotFoundError):
        st.server_side_apply(
            body=big("py-missing", status={"phase": "x"}), name="py-missing", namespace="default", field_manager="py"
        )
    res.server_side_apply(body=big("py1", {"color": "red"}), namespace="default", field_manager="py-main")
    r = st.server_side_apply(
        body=big("py1", {"color": "green"}, {"phase": "P1"}), name="py1", namespace="default", field_manager="py-status"
    )
    assert r.spec.color == "red" and r.status.phase == "P1"
    assert ("py-status", "Apply", "status") in [
        (m.manager, m.operation, m.get("subresource")) for m in r.metadata.managedFields
    ]
    with pytest.raises(ApiException) as e:
        st.server_side_apply(
            body=big("py1", status={"phase": "P2"}), name="py1", namespace="default", field_manager="py-status2"
        )
    assert e.value.status == 409
    assert (
        json.loads(e.value.body)["message"]
        == 'Apply failed with 1 conflict: conflict with "py-status" with subresource "status": .status.phase'
    )
    r = st.server_side_apply(
        body=big("py1", status={"phase": "P2"}),
        name="py1",
        namespace="default",
        field_manager="py-status2",
        force_conflicts=True,
    )
    assert r.status.phase == "P2"
    assert [m.manager for m in r.metadata.managedFields] == ["py-main", "py-status2"]


def _dep(name, status=None):
    d = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": 0,
            "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}}, "spec": {"containers": [{"name": "c", "image": IMG}]}},
        },
    }
    if status is not None:
        d["status"] = status
    return d


def test_deployment_create_by_apply_owns_no_status(c):
    """A server-side apply that creates a Deployment from a manifest holding
    `status: {replicas: 5}`. Kubernetes: status is reset on create and the applier owns
    no status field (deployment strategy's GetResetFields). Kube32 (when written): the
    create's answer records `f:status: {f:replicas: {}}` under the applier (until the
    controller's first status write takes the field over)."""
    p = "/apis/apps/v1/namespaces/default/deployments/atk-dcreate"
    c.delete_and_wait(p)
    r = c.apply(p, _dep("atk-dcreate", {"replicas": 5}), "dep-main")
    c.req("DELETE", p)
    assert r.status_code == 201
    mine = [m for m in r.json()["metadata"]["managedFields"] if m["manager"] == "dep-main"][0]
    assert "f:status" not in mine["fieldsV1"], mine["fieldsV1"]


def test_deployment_status_condition_applied_survives_controller(c):
    """A status applier adds its own condition to a Deployment
    (`apply --subresource=status`, `conditions: [{type: Fancy, ...}]`). Kubernetes: the
    apply is recorded (subresource status) and the Deployment controller keeps conditions
    it does not manage (calculateStatus copies the existing ones), so `Fancy` stays.
    Kube32 (when written): the apply answers 200 with Fancy, then the controller's next
    status write drops it and the applier's managedFields entry vanishes."""
    p = "/apis/apps/v1/namespaces/default/deployments/atk-dst"
    c.delete_and_wait(p)
    dep = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "atk-dst"},
        "spec": {
            "replicas": 0,
            "selector": {"matchLabels": {"app": "atk-dst"}},
            "template": {
                "metadata": {"labels": {"app": "atk-dst"}},
                "spec": {"containers": [{"name": "c", "image": IMG}]},
            },
        },
        "status": {"replicas": 5},
    }
    r = c.apply(p, dep, "dep-main")
    assert r.status_code == 201
    time.sleep(2)
    r = c.apply(
        p + "/status",
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "atk-dst"},
            "spec": {"replicas": 3},
            "status": {"conditions": [{"type": "Fancy", "status": "True", "reason": "Tested"}]},
        },
        "dep-status",
    )
    assert r.status_code == 200, r.text
    assert r.json()["spec"]["replicas"] == 0
    assert ("dep-status", "Apply", "status") in managers(r.json())
    time.sleep(3)
    o = c.req("GET", p).json()
    assert "Fancy" in [x["type"] for x in o["status"].get("conditions", [])], o["status"]
    assert ("dep-status", "Apply", "status") in managers(o)
    c.req("DELETE", p)


# --------------------------------------------------------------------------- 3. ratcheting


def _rat_crd(typed: bool):
    tags = {"type": "array", "items": {"type": "string"}}
    ports = {
        "type": "array",
        "items": {
            "type": "object",
            "required": ["name"],
            "properties": {"name": {"type": "string"}, "port": {"type": "integer"}},
        },
    }
    stags = {"type": "array", "items": {"type": "string"}}
    if typed:
        tags["x-kubernetes-list-type"] = "set"
        stags["x-kubernetes-list-type"] = "set"
        ports["x-kubernetes-list-type"] = "map"
        ports["x-kubernetes-list-map-keys"] = ["name"]
    return _crd("rats", "Rat", {"tags": tags, "ports": ports, "other": {"type": "string"}},
                {"tags": stags, "phase": {"type": "string"}})


def _rat_names(c):
    r = c.req("GET", RATS)
    return [i["metadata"]["name"] for i in r.json().get("items", [])] if r.status_code == 200 else []


def _wipe_rats(c):
    """Deletes the Rat objects one by one, then the CRD (see
    test_crd_replaced_without_finalizer_still_deletes_its_objects for why)."""
    if c.req("GET", f"{CRDS}/rats.{GROUP}").status_code == 404:
        assert c.req("POST", CRDS, _rat_crd(False)).status_code == 201
        _wait_established(c, f"rats.{GROUP}")
    for n in _rat_names(c):
        c.delete_and_wait(f"{RATS}/{n}")
    c.delete_and_wait(f"{CRDS}/rats.{GROUP}")


def test_crd_replaced_without_finalizer_still_deletes_its_objects(c):
    """A CRD updated by a PUT whose metadata holds no finalizers (`kubectl replace -f
    crd.yaml`, or any client that PUTs the manifest), then deleted and created again.
    Kubernetes adds `customresourcecleanup.apiextensions.k8s.io` when the delete arrives
    (customresourcedefinition REST.Delete), so the CRD waits while every object of it is
    deleted, and the re-created CRD starts empty. Kube32 (when written): the finalizer is
    set only at creation and the PUT drops it; the delete removes the CRD at once, its
    objects stay in the store and reappear (same uids) under the re-created CRD."""
    _wipe_rats(c)
    assert c.req("POST", CRDS, _rat_crd(False)).status_code == 201
    _wait_established(c, f"rats.{GROUP}")
    for i in range(3):
        r = c.req("POST", RATS, {"apiVersion": f"{GROUP}/v1", "kind": "Rat", "metadata": {"name": f"x{i}"}, "spec": {}})
        assert r.status_code == 201
    cur = c.req("GET", f"{CRDS}/rats.{GROUP}").json()
    new = _rat_crd(False)
    new["metadata"]["resourceVersion"] = cur["metadata"]["resourceVersion"]
    assert c.req("PUT", f"{CRDS}/rats.{GROUP}", new).status_code == 200
    assert c.req("DELETE", f"{CRDS}/rats.{GROUP}").status_code == 200
    c.delete_and_wait(f"{CRDS}/rats.{GROUP}")
    assert c.req("POST", CRDS, _rat_crd(False)).status_code == 201
    _wait_established(c, f"rats.{GROUP}")
    time.sleep(3)
    left = _rat_names(c)
    _wipe_rats(c)
    assert left == [], f"objects of the deleted CRD came back: {left}"


@pytest.fixture(scope="module")
def rats(c):
    """A CRD with plain lists, objects holding duplicates, then the lists made set/map."""
    _wipe_rats(c)
    assert c.req("POST", CRDS, _rat_crd(False)).status_code == 201
    _wait_established(c, f"rats.{GROUP}")
    r = c.req(
        "POST",
        RATS,
        {
            "apiVersion": f"{GROUP}/v1",
            "kind": "Rat",
            "metadata": {"name": "old"},
            "spec": {"tags": ["a", "a", "b"], "ports": [{"name": "x", "port": 1}, {"name": "x", "port": 2}]},
        },
    )
    assert r.status_code == 201, r.text
    r = c.req("PUT", f"{RATS}/old/status", {**r.json(), "status": {"tags": ["s", "s"], "phase": "p"}})
    assert r.status_code == 200, r.text
    r = c.req(
        "POST",
        RATS,
        {"apiVersion": f"{GROUP}/v1", "kind": "Rat", "metadata": {"name": "olds"}, "spec": {"tags": ["a"]}},
    )
    assert r.status_code == 201, r.text
    r = c.req("PUT", f"{RATS}/olds/status", {**r.json(), "status": {"tags": ["s", "s"], "phase": "p"}})
    assert r.status_code == 200, r.text
    cur = c.req("GET", f"{CRDS}/rats.{GROUP}").json()
    new = _rat_crd(True)
    new["metadata"]["resourceVersion"] = cur["metadata"]["resourceVersion"]
    r = c.req("PUT", f"{CRDS}/rats.{GROUP}", new)
    assert r.status_code == 200, r.text
    time.sleep(2)
    return RATS


def test_list_type_ratchet_keeps_old_objects_writable(c, rats):
    """After the lists become set/map, an object stored with duplicates. Kubernetes
    (customResourceStrategy.ValidateUpdate: list-type validation only when the old object
    passes it): GET, merge patch, PUT, json patch adding a further duplicate, label and
    apply all succeed. Kube32 (when written): as Kubernetes."""
    r = c.req("GET", f"{rats}/old")
    assert r.status_code == 200 and r.json()["spec"]["tags"] == ["a", "a", "b"]
    assert c.merge(f"{rats}/old", {"spec": {"other": "x"}}, "m").status_code == 200
    o = c.req("GET", f"{rats}/old").json()
    o["metadata"]["labels"] = {"l": "1"}
    assert c.req("PUT", f"{rats}/old", o).status_code == 200
    r = c.req(
        "PATCH", f"{rats}/old", [{"op": "add", "path": "/spec/tags/-", "value": "b"}], "application/json-patch+json"
    )
    assert r.status_code == 200, r.text
    r = c.apply(
        f"{rats}/old",
        {"apiVersion": f"{GROUP}/v1", "kind": "Rat", "metadata": {"name": "old"}, "spec": {"other": "x"}},
        "ssa",
    )
    assert r.status_code == 200, r.text


def test_list_type_ratchet_status_subresource(c, rats):
    """A /status write of an object whose stored status.tags (now a set) holds a
    duplicate. Kubernetes (statusStrategy.ValidateUpdate ratchets list-type validation as
    the main strategy does: errors only when the old object had none): a merge patch of
    status.phase succeeds. Kube32 (when written): 422 `Rat "olds" is invalid:
    status.tags[1]: Duplicate value: "s"` - the object's status can no longer be written
    by its controller."""
    r = c.merge(f"{rats}/olds/status", {"status": {"phase": "q"}}, "ctl")
    assert r.status_code == 200, r.text[:300]


def test_list_type_new_duplicates_refused(c, rats):
    """A new object with duplicates in the set and map lists. Kubernetes: 422,
    causes `spec.tags[1]: Duplicate value: "a"` and `spec.ports[1]: Duplicate value:
    map[string]interface {}{"name":"x"}`, message `Rat.atk23f.example.com "new" is invalid:
    [...]` (NewInvalid prints the qualified GroupKind). Kube32 (when written): the
    causes as Kubernetes; the message says `Rat "new" is invalid`."""
    c.delete_and_wait(f"{rats}/new")
    r = c.req(
        "POST",
        rats,
        {
            "apiVersion": f"{GROUP}/v1",
            "kind": "Rat",
            "metadata": {"name": "new"},
            "spec": {"tags": ["a", "a"], "ports": [{"name": "x"}, {"name": "x"}]},
        },
    )
    assert r.status_code == 422
    causes = [(x["field"], x["message"]) for x in r.json()["details"]["causes"]]
    assert ("spec.tags[1]", 'Duplicate value: "a"') in causes
    assert ("spec.ports[1]", 'Duplicate value: map[string]interface {}{"name":"x"}') in causes
    r2 = c.apply(
        f"{rats}/new2",
        {"apiVersion": f"{GROUP}/v1", "kind": "Rat", "metadata": {"name": "new2"}, "spec": {"tags": ["a", "a"]}},
        "ssa",
    )
    assert r2.status_code in (400, 422) and c.req("GET", f"{rats}/new2").status_code == 404
    assert r.json()["message"] == (
        f'Rat.{GROUP} "new" is invalid: [spec.tags[1]: Duplicate value: "a", '
        'spec.ports[1]: Duplicate value: map[string]interface {}{"name":"x"}]'
    )


# --------------------------------------------------------------------------- 4. bindings


def _pending_pod(c, name, ns="default"):
    c.delete_and_wait(f"/api/v1/namespaces/{ns}/pods/{name}")
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "schedulerName": "nobody",
            "nodeSelector": {"atk23f": "nowhere"},
            "containers": [{"name": "c", "image": IMG}],
        },
    }
    r = c.req("POST", f"/api/v1/namespaces/{ns}/pods", pod)
    assert r.status_code == 201, r.text
    return r.json()


def test_binding_preconditions_annotations_and_dry_run(c):
    """POST /bindings and pods/<name>/binding on an unscheduled pod. Kubernetes: a wrong
    uid or resourceVersion is 409 `Precondition failed: UID in precondition: ...`; a
    dryRun changes nothing; a URL name different from the Binding's is 400 `name in URL
    does not match name in Binding object`; the body namespace must match (400); a pod
    in another namespace is 404; the good binding sets nodeName, copies the annotations
    and sets PodScheduled True; binding again is 409 `pod b is already assigned to node`.
    Kube32 (when written): as Kubernetes."""
    p = _pending_pod(c, "atk-b1")
    B = "/api/v1/namespaces/default/bindings"
    tgt = {"kind": "Node", "name": "sim-1"}

    def bind(meta, url=B, **params):
        return c.req(
            "POST", url, {"apiVersion": "v1", "kind": "Binding", "metadata": meta, "target": tgt}, params=params or None
        )

    r = bind({"name": "atk-b1", "uid": "nope"})
    assert r.status_code == 409 and "Precondition failed: UID in precondition: nope" in r.json()["message"]
    r = bind({"name": "atk-b1", "resourceVersion": "1"})
    assert r.status_code == 409 and "Precondition failed: ResourceVersion in precondition: 1" in r.json()["message"]
    assert bind({"name": "atk-b1", "namespace": "kube-system"}).status_code == 400
    assert bind({"name": "atk-b1"}, url="/api/v1/namespaces/kube-system/bindings").status_code == 404
    r = bind({"name": "other"}, url="/api/v1/namespaces/default/pods/atk-b1/binding")
    assert r.status_code == 400 and r.json()["message"] == "name in URL does not match name in Binding object"
    assert bind({"name": "atk-b1", "annotations": {"dry": "run"}}, dryRun="All").status_code == 201
    g = c.req("GET", "/api/v1/namespaces/default/pods/atk-b1").json()
    assert not g["spec"].get("nodeName") and "dry" not in (g["metadata"].get("annotations") or {})
    r = c.req(
        "POST",
        "/api/v1/namespaces/default/pods/atk-b1/binding",
        {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {
                "name": "atk-b1",
                "uid": p["metadata"]["uid"],
                "resourceVersion": g["metadata"]["resourceVersion"],
                "annotations": {"a.example.com/x": "1"},
            },
            "target": {"name": "devkit"},
        },
    )
    assert r.status_code == 201, r.text
    assert r.json()["kind"] == "Status" and r.json()["status"] == "Success"
    g = c.req("GET", "/api/v1/namespaces/default/pods/atk-b1").json()
    assert g["spec"]["nodeName"] == "devkit"
    assert g["metadata"]["annotations"]["a.example.com/x"] == "1"
    assert {"type": "PodScheduled", "status": "True"}.items() <= [
        x for x in g["status"]["conditions"] if x["type"] == "PodScheduled"
    ][0].items()
    r = bind({"name": "atk-b1"})
    assert r.status_code == 409 and 'pod atk-b1 is already assigned to node "devkit"' in r.json()["message"]
    c.req("DELETE", "/api/v1/namespaces/default/pods/atk-b1", params={"gracePeriodSeconds": "0"})


def test_binding_huge_annotations_refused_whole(c):
    """A Binding whose annotations total 300 KB. Kube32 refuses it (422 `Too long: must
    have at most 262144 bytes`) and leaves the pod unbound - nothing half-applied.
    (Kubernetes copies Binding annotations unvalidated; the size bound is Kube32's,
    documented for objects.) Kube32 (when written): as described, quickly."""
    _pending_pod(c, "atk-b2")
    ann = {f"example.com/k{i}": "v" * 100 for i in range(3000)}
    r = c.req(
        "POST",
        "/api/v1/namespaces/default/bindings",
        {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": "atk-b2", "annotations": ann},
            "target": {"kind": "Node", "name": "sim-1"},
        },
    )
    assert r.status_code in (400, 413, 422) and r.elapsed_s < STALL
    g = c.req("GET", "/api/v1/namespaces/default/pods/atk-b2").json()
    assert not g["spec"].get("nodeName") and len(g["metadata"].get("annotations") or {}) == 0
    c.req("DELETE", "/api/v1/namespaces/default/pods/atk-b2", params={"gracePeriodSeconds": "0"})


def test_binding_malformed_bodies_are_400(c):
    """Binding bodies whose fields have the wrong JSON type (`target: ["x"]`,
    `metadata: "b"`) and a body that is not JSON. Kubernetes: the typed decoder fails,
    400 BadRequest (`Binding in version "v1" cannot be handled as a Binding: json: cannot
    unmarshal array into Go struct field Binding.target of type v1.ObjectReference`);
    nothing is bound. Kube32 (when written): not-JSON is 400, but the wrongly typed
    bodies are 422 `target.name: Required value` / `metadata.name: Required value`."""
    _pending_pod(c, "atk-b3")
    B = "/api/v1/namespaces/default/bindings"
    assert c.req("POST", B, "{nope").status_code == 400
    r1 = c.req("POST", B, {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": "atk-b3"}, "target": ["x"]})
    r2 = c.req(
        "POST",
        B,
        {"apiVersion": "v1", "kind": "Binding", "metadata": "atk-b3", "target": {"kind": "Node", "name": "sim-1"}},
    )
    g = c.req("GET", "/api/v1/namespaces/default/pods/atk-b3").json()
    c.req("DELETE", "/api/v1/namespaces/default/pods/atk-b3", params={"gracePeriodSeconds": "0"})
    assert not g["spec"].get("nodeName")
    assert (r1.status_code, r2.status_code) == (400, 400), (r1.text[:200], r2.text[:200])


# --------------------------------------------------------------------------- 5. wording, metrics


def test_conflict_paths_in_kubernetes_order(c, bigs):
    """One manager's conflicts on `.spec.replicas`, `.spec.color`, map-list items (one
    keyed by integers 2 and 10) and a map entry. Kubernetes lists a manager's paths in
    fieldpath.Set order (getConflictMessage keeps Set.Iterate's order: a node's leaf
    members before its children, children sorted by element, integer keys numerically):
    `.spec.color`, `.spec.replicas`, `.spec.m1[name="a"].v`, `.spec.m1[name="b"].v`,
    `.spec.m2[a="x",b=2].v`, `.spec.m2[a="x",b=10].v`, `.spec.mp.z` (causes in the same
    order). Kube32 (when written): sorted as strings - `.spec.color`, `.spec.m1...`,
    `.spec.m2[a="x",b=10].v` before `b=2`, `.spec.mp.z`, `.spec.replicas` last."""
    p = f"{bigs}/ord"
    c.delete_and_wait(p)
    assert (
        c.apply(
            p,
            big(
                "ord",
                {
                    "replicas": 1,
                    "color": "red",
                    "m1": [{"name": "b", "v": "1"}, {"name": "a", "v": "1"}],
                    "mp": {"z": "1"},
                    "m2": [{"a": "x", "b": 10, "v": "1"}, {"a": "x", "b": 2, "v": "1"}],
                },
            ),
            "owner",
        ).status_code
        == 201
    )
    r = c.apply(
        p,
        big(
            "ord",
            {
                "replicas": 2,
                "color": "blue",
                "m1": [{"name": "b", "v": "2"}, {"name": "a", "v": "2"}],
                "mp": {"z": "2"},
                "m2": [{"a": "x", "b": 10, "v": "2"}, {"a": "x", "b": 2, "v": "2"}],
            },
        ),
        "other",
    )
    assert r.status_code == 409
    want = [
        ".spec.color",
        ".spec.replicas",
        '.spec.m1[name="a"].v',
        '.spec.m1[name="b"].v',
        '.spec.m2[a="x",b=2].v',
        '.spec.m2[a="x",b=10].v',
        ".spec.mp.z",
    ]
    assert r.json()["message"] == 'Apply failed with 7 conflicts: conflicts with "owner":\n' + "\n".join(
        f"- {x}" for x in want
    )
    assert [x["field"] for x in r.json()["details"]["causes"]] == want


def test_conflict_manager_order_and_wording(c, bigs):
    """Conflicts with four managers: Apply "a", Apply "a!", Update "a" and Update "a<b".
    Kubernetes sorts the managers by their JSON identifiers (`{"manager":"a!",...` before
    `{"manager":"a","operation":"Apply"}` before `...,"operation":"Update",...`), prints an
    Update manager as `"a" using <apiVersion>` (no time), an Apply one bare.
    Kube32 (when written): exactly this."""
    p = f"{bigs}/ord2"
    c.delete_and_wait(p)
    assert c.apply(p, big("ord2", {"color": "red"}), "a").status_code == 201
    assert c.apply(p, big("ord2", {"color": "red"}), "a!").status_code == 200
    assert c.merge(p, {"spec": {"replicas": 3}}, "a").status_code == 200
    assert c.merge(p, {"spec": {"mp": {"k": "v"}}}, "a<b").status_code == 200
    r = c.apply(p, big("ord2", {"color": "blue", "replicas": 4, "mp": {"k": "w"}}), "new")
    assert r.status_code == 409
    assert r.json()["message"] == (
        'Apply failed with 4 conflicts: conflicts with "a!":\n- .spec.color\n'
        'conflicts with "a":\n- .spec.color\n'
        f'conflicts with "a" using {GROUP}/v1:\n- .spec.replicas\n'
        f'conflicts with "a<b" using {GROUP}/v1:\n- .spec.mp.k'
    )


def test_conflict_manager_name_quoted_as_go_does(c, bigs):
    """A conflict with the manager `ü"x`. Kubernetes prints the name with Go's %q
    (strconv.Quote keeps printable Unicode): `conflict with "ü\\"x": .spec.color`.
    Kube32 (when written): `conflict with "\\u00fc\\"x": .spec.color` (a JSON escape)."""
    p = f"{bigs}/ord3"
    c.delete_and_wait(p)
    assert c.apply(p, big("ord3", {"color": "red"}), 'ü"x').status_code == 201
    r = c.apply(p, big("ord3", {"color": "blue"}), "new")
    assert r.status_code == 409
    assert r.json()["message"] == 'Apply failed with 1 conflict: conflict with "ü\\"x": .spec.color'


def test_conflict_status_details_hold_only_causes(c, bigs):
    """The 409 body of an apply conflict. Kubernetes (errors.NewApplyConflict):
    `details` holds only `causes` (`{"reason": "FieldManagerConflict", "message":
    "conflict with \\"owner\\"", "field": ".spec.color"}`), no name/group/kind.
    Kube32 (when written): details also carry `name`, `group` and `kind: bigs` (a
    resource where the field says kind)."""
    p = f"{bigs}/det"
    c.delete_and_wait(p)
    assert c.apply(p, big("det", {"color": "red"}), "owner").status_code == 201
    r = c.apply(p, big("det", {"color": "blue"}), "other")
    assert r.status_code == 409
    body = r.json()
    assert body["reason"] == "Conflict" and body["code"] == 409
    assert body["details"] == {
        "causes": [{"reason": "FieldManagerConflict", "message": 'conflict with "owner"', "field": ".spec.color"}]
    }


def test_apply_field_manager_validation_wording(c, bigs):
    """An apply without fieldManager, with one of 129 characters, with a tab in it.
    Kubernetes (ValidatePatchOptions, answered as errors.NewInvalid of PatchOptions):
    422 `PatchOptions.meta.k8s.io "" is invalid: fieldManager: Required value: is required
    for apply patch` (and `fieldManager: Too long...`, `fieldManager: Invalid value:
    "a\\tb": invalid character U+0009 (at position 1)`). Kube32 (when written): 400
    `PATCH of type apply requires the fieldManager parameter` and 400 `fieldManager must be
    at most 128 printable characters`."""
    p = f"{bigs}/fm"
    r = c.req("PATCH", p, big("fm", {"color": "red"}), "application/apply-patch+yaml")
    assert (r.status_code, r.json()["message"]) == (
        422,
        'PatchOptions.meta.k8s.io "" is invalid: fieldManager: Required value: is required for apply patch',
    )
    r = c.apply(p, big("fm", {"color": "red"}), "x" * 129)
    assert r.status_code == 422 and r.json()["message"].startswith(
        'PatchOptions.meta.k8s.io "" is invalid: fieldManager: Too long'
    )
    r = c.apply(p, big("fm", {"color": "red"}), "a\tb")
    assert r.status_code == 422 and r.json()["message"].endswith("invalid character U+0009 (at position 1)")


def _metrics(c):
    r = c.req("GET", "/metrics")
    assert r.status_code == 200
    return r.text.splitlines()


def test_metrics_custom_resource_labels_and_bound(c, bigs):
    """apiserver_request_total for a custom resource's apply and /status apply, then 3,000
    requests to made-up resources, groups and subresources. Kubernetes labels the CR
    requests verb=APPLY, group, resource=bigs, subresource=status; made-up paths add no
    label sets. Kube32 (when written): the labels as Kubernetes; the counters' label sets
    grew by 2 (bounded), in ~7 s."""
    c.delete_and_wait(f"{bigs}/met")
    assert c.apply(f"{bigs}/met", big("met", {"color": "red"}), "m").status_code == 201
    assert c.apply(f"{bigs}/met/status", big("met", status={"phase": "x"}), "m").status_code == 200
    lines = _metrics(c)
    assert any(
        ln.startswith(
            f'apiserver_request_total{{verb="APPLY",group="{GROUP}",resource="bigs",subresource="",code="201"}}'
        )
        for ln in lines
    )
    assert any(
        ln.startswith(
            f'apiserver_request_total{{verb="APPLY",group="{GROUP}",resource="bigs",subresource="status",code="200"}}'
        )
        for ln in lines
    )
    before = len([ln for ln in lines if ln.startswith("apiserver_request_total")])
    s = c.session()
    for i in range(1000):
        c.req("GET", f"/apis/{GROUP}/v1/namespaces/default/made{i}", s=s)
        c.req("GET", f"/apis/made{i}.example.com/v1/things{i}", s=s)
        c.req("GET", f"{bigs}/met/sub{i}", s=s)
    lines = _metrics(c)
    counters = [ln for ln in lines if ln.startswith("apiserver_request_total")]
    assert not [ln for ln in counters if "made" in ln or 'subresource="sub' in ln]
    assert len(counters) - before < 20, len(counters) - before
    assert len([ln for ln in lines if ln.startswith("apiserver_request_duration_seconds_bucket")]) < 30000
