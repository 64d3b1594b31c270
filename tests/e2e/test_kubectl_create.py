"""kubectl 1.32's generator commands (``create namespace|configmap|secret|deployment|...``,
``run``) against the API server.  They send Kubernetes protobuf bodies; each command must
create the object kubectl meant, which is the object the same command prints with
``--dry-run=client -o json`` (checked field by field against ``kubectl get -o json``).
"""
from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ControlPlane, start_control_plane

IMAGE = "kube32.io/wasm-sha256:" + "ab" * 32  # kubectl names the container after it: wasm-sha256

GENERATORS: list[tuple[str, list[str]]] = [  # (what to get, the command)
    ("namespace/team-a", ["create", "namespace", "team-a"]),
    ("configmap/cm1", ["create", "configmap", "cm1", "--from-literal=a=b", "--from-literal=c=d"]),
    ("secret/s1", ["create", "secret", "generic", "s1", "--from-literal=k=v",
                   "--type=kubernetes.io/basic-auth"]),
    ("deployment/web", ["create", "deployment", "web", "--image=" + IMAGE,
                        "--replicas=2", "--port=8080"]),
    ("deployment/idle", ["create", "deployment", "idle", "--image=" + IMAGE,
                         "--replicas=0"]),
    ("service/svc1", ["create", "service", "clusterip", "svc1", "--tcp=80:8080"]),
    ("serviceaccount/sa1", ["create", "serviceaccount", "sa1"]),
    ("role/r1", ["create", "role", "r1", "--verb=get", "--verb=list", "--resource=pods"]),
    ("rolebinding/rb1", ["create", "rolebinding", "rb1", "--role=r1", "--user=jane",
                         "--serviceaccount=default:sa1"]),
    ("clusterrole/cr1", ["create", "clusterrole", "cr1", "--verb=get", "--resource=nodes",
                         "--non-resource-url=/logs"]),
    ("clusterrolebinding/crb1", ["create", "clusterrolebinding", "crb1", "--clusterrole=cr1", "--group=devs"]),
    ("poddisruptionbudget/pdb1", ["create", "poddisruptionbudget", "pdb1", "--selector=app=web",
                                  "--min-available=0"]),
    ("poddisruptionbudget/pdb2", ["create", "poddisruptionbudget", "pdb2", "--selector=app=web",
                                  "--max-unavailable=50%"]),
    ("pod/p1", ["run", "p1", "--image=" + IMAGE, "--labels=app=p1", "--env=A=1",
                "--restart=Never"]),
]


@pytest.fixture(scope="module")
def cp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    plane = start_control_plane(Path(tmp_path_factory.mktemp("kubectl-create")) / "cp", "--no-kubelet")
    try:
        yield plane
    finally:
        plane.proc.stop()


def _meant(obj: Any) -> Any:
    """The dry-run object without what the JSON path treats as absent (nulls, {}, status)."""
    if isinstance(obj, dict):
        out = {k: _meant(v) for k, v in obj.items() if k != "status"}
        return {k: v for k, v in out.items() if v is not None and v != {}}
    if isinstance(obj, list):
        return [_meant(v) for v in obj]
    return obj


def _missing(want: Any, got: Any, path: str = "") -> list[str]:
    """Where ``got`` does not contain ``want`` (the server may add defaults, never drop or change)."""
    if isinstance(want, dict):
        if not isinstance(got, dict):
            return [f"{path or '.'}: {got!r} is not an object"]
        return [m for k, v in want.items() for m in _missing(v, got.get(k), f"{path}.{k}")]
    if isinstance(want, list):
        if not isinstance(got, list) or len(got) != len(want):
            return [f"{path}: {got!r} != {want!r}"]
        return [m for i, (w, g) in enumerate(zip(want, got, strict=False)) for m in _missing(w, g, f"{path}[{i}]")]
    return [] if want == got else [f"{path}: {got!r} != {want!r}"]


def test_every_generator_creates_the_object_kubectl_meant(cp: ControlPlane) -> None:
    failures = []
    for target, command in GENERATORS:
        dry = cp.kubectl(*command, "--dry-run=client", "-o", "json")
        meant = _meant(json.loads(dry.stdout))
        made = cp.kubectl(*command, check=False)
        if made.returncode != 0:
            failures.append(f"{' '.join(command)}: {made.stderr.strip()}")
            continue
        stored = json.loads(cp.kubectl("get", target, "-o", "json").stdout)
        failures += [f"{target}{m}" for m in _missing(meant, stored)]
    assert not failures, "\n".join(failures)


def test_created_objects_read_back_as_kubectl_shows_them(cp: ControlPlane) -> None:
    get = lambda target: json.loads(cp.kubectl("get", target, "-o", "json").stdout)  # noqa: E731
    dep = get("deployment/idle")
    assert dep["spec"]["replicas"] == 0  # a pointer field sent as zero stays zero
    container = dep["spec"]["template"]["spec"]["containers"][0]
    assert (container["name"], container["image"]) == ("wasm-sha256", IMAGE)
    assert get("poddisruptionbudget/pdb1")["spec"]["minAvailable"] == 0
    assert get("poddisruptionbudget/pdb2")["spec"]["maxUnavailable"] == "50%"
    assert get("secret/s1")["data"] == {"k": "dg=="}
    assert get("service/svc1")["spec"]["ports"][0]["targetPort"] == 8080
    assert get("role/r1")["rules"] == [{"verbs": ["get", "list"], "apiGroups": [""], "resources": ["pods"]}]
    rb = get("rolebinding/rb1")
    assert [s["kind"] for s in rb["subjects"]] == ["User", "ServiceAccount"]
    assert rb["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "r1"}


def test_generators_in_another_namespace_and_errors_from_the_server(cp: ControlPlane) -> None:
    cp.kubectl("create", "namespace", "team-b")
    cp.kubectl("-n", "team-b", "create", "configmap", "cfg", "--from-literal=x=y")
    assert json.loads(cp.kubectl("-n", "team-b", "get", "configmap", "cfg", "-o", "json").stdout)["data"] == {"x": "y"}
    again = cp.kubectl("-n", "team-b", "create", "configmap", "cfg", "--from-literal=x=z", check=False)
    assert again.returncode == 1 and 'configmaps "cfg" already exists' in again.stderr
    token = cp.kubectl("create", "token", "sa1").stdout.strip()
    assert token  # TokenRequest goes through the same wire reader
