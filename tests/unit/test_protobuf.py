"""Kubernetes protobuf request bodies (kube32.apiserver.protobuf).

The golden bodies were captured from the real kubectl 1.32.4: a small aiohttp server
answered discovery and logged each ``kubectl create <generator> ... --validate=false``
POST.  Each must decode to the object the same command prints with
``--dry-run=client -o json`` (nulls, empty objects and ``status`` left out: the JSON
path treats them as absent).  Hand-built bodies cover the fields kubectl's generators
never send (volumes, probes, env sources, pointers set to zero, negatives, times).
"""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kube32 import leb128
from kube32.apiserver import bodies, errors
from kube32.apiserver.authz import decode_review_protobuf
from kube32.apiserver.protobuf import (MAGIC, SCHEMA, ProtobufError, UnknownKind, decode_message,
                                       decode_object, fields)

GOLDEN: dict[str, tuple[str, str, dict]] = {
    'namespace': (
        'kubectl create namespace foo',
        '6b3873000a0f0a02763112094e616d657370616365121b0a130a03666f6f12001a0022002a0032003800420012001a02'
        '0a001a002200',
        {'kind': 'Namespace', 'apiVersion': 'v1', 'metadata': {'name': 'foo'}}),
    'configmap': (
        'kubectl create configmap cm1 --from-literal=a=b --from-literal=c=d',
        '6b3873000a0f0a0276311209436f6e6669674d617012250a130a03636d3112001a0022002a0032003800420012060a01'
        '6112016212060a01631201641a002200',
        {'kind': 'ConfigMap', 'apiVersion': 'v1', 'metadata': {'name': 'cm1'}, 'data': {'a': 'b', 'c': 'd'}}),
    'configmap_binary': (
        'kubectl create configmap cm2 --from-literal=a=b --from-file=bin=small.bin  (small.bin ='
        ' 00 ff fe 61 62)',
        '6b3873000a0f0a0276311209436f6e6669674d6170122b0a130a03636d3212001a0022002a0032003800420012060a01'
        '611201621a0c0a0362696e120500fffe61621a002200',
        {'kind': 'ConfigMap',
         'apiVersion': 'v1',
         'metadata': {'name': 'cm2'},
         'data': {'a': 'b'},
         'binaryData': {'bin': 'AP/+YWI='}}),
    'secret': (
        'kubectl create secret generic s1 --from-literal=k=v',
        '6b3873000a0c0a0276311206536563726574121e0a120a02733112001a0022002a0032003800420012060a016b120176'
        '1a001a002200',
        {'kind': 'Secret', 'apiVersion': 'v1', 'metadata': {'name': 's1'}, 'data': {'k': 'dg=='}}),
    'secret_typed': (
        'kubectl create secret generic s2 --from-literal=k=v --type=kubernetes.io/basic-auth',
        '6b3873000a0c0a027631120653656372657412360a120a02733212001a0022002a0032003800420012060a016b120176'
        '1a186b756265726e657465732e696f2f62617369632d617574681a002200',
        {'kind': 'Secret',
         'apiVersion': 'v1',
         'metadata': {'name': 's2'},
         'data': {'k': 'dg=='},
         'type': 'kubernetes.io/basic-auth'}),
    'deployment': (
        'kubectl create deployment web --image=nginx:1 --replicas=2',
        '6b3873000a150a07617070732f7631120a4465706c6f796d656e7412ad010a1f0a0377656212001a0022002a00320038'
        '0042005a0a0a036170701203776562127c0802120c0a0a0a0361707012037765621a620a1c0a0012001a0022002a0032'
        '00380042005a0a0a036170701203776562124212240a056e67696e7812076e67696e783a312a0042006a007200800100'
        '880100900100a201001a00320042004a0052005800600068008201008a01009a0100c2010022020a00280038001a0c08'
        '00100018002000280038001a002200',
        {'kind': 'Deployment',
         'apiVersion': 'apps/v1',
         'metadata': {'name': 'web', 'labels': {'app': 'web'}},
         'spec': {'replicas': 2,
                  'selector': {'matchLabels': {'app': 'web'}},
                  'template': {'metadata': {'labels': {'app': 'web'}},
                               'spec': {'containers': [{'name': 'nginx', 'image': 'nginx:1'}]}}}}),
    'deployment_zero': (
        'kubectl create deployment web0 --image=nginx:1 --replicas=0 --port=8080 -- sleep 10',
        '6b3873000a150a07617070732f7631120a4465706c6f796d656e7412ca010a210a047765623012001a0022002a003200'
        '380042005a0b0a036170701204776562301296010800120d0a0b0a036170701204776562301a7b0a1d0a0012001a0022'
        '002a003200380042005a0b0a03617070120477656230125a123c0a056e67696e7812076e67696e783a311a05736c6565'
        '701a0231302a00320b0a00100018903f22002a0042006a007200800100880100900100a201001a00320042004a005200'
        '5800600068008201008a01009a0100c2010022020a00280038001a0c0800100018002000280038001a002200',
        {'kind': 'Deployment',
         'apiVersion': 'apps/v1',
         'metadata': {'name': 'web0', 'labels': {'app': 'web0'}},
         'spec': {'replicas': 0,
                  'selector': {'matchLabels': {'app': 'web0'}},
                  'template': {'metadata': {'labels': {'app': 'web0'}},
                               'spec': {'containers': [{'name': 'nginx',
                                                        'image': 'nginx:1',
                                                        'command': ['sleep', '10'],
                                                        'ports': [{'containerPort': 8080}]}]}}}}),
    'service': (
        'kubectl create service clusterip svc1 --tcp=80:8080',
        '6b3873000a0d0a027631120753657276696365126c0a210a047376633112001a0022002a003200380042005a0b0a0361'
        '707012047376633112430a1b0a0738302d38303830120354435018502207080010903f1a002800120b0a036170701204'
        '737663311a002209436c757374657249503a00420052005a00600068001a020a001a002200',
        {'kind': 'Service',
         'apiVersion': 'v1',
         'metadata': {'name': 'svc1', 'labels': {'app': 'svc1'}},
         'spec': {'ports': [{'name': '80-8080', 'protocol': 'TCP', 'port': 80, 'targetPort': 8080}],
                  'selector': {'app': 'svc1'},
                  'type': 'ClusterIP'}}),
    'service_nodeport': (
        'kubectl create service nodeport np1 --tcp=80:http',
        '6b3873000a0d0a027631120753657276696365126b0a1f0a036e703112001a0022002a003200380042005a0a0a036170'
        '7012036e703112440a1e0a0738302d6874747012035443501850220a080110001a04687474702800120a0a0361707012'
        '036e70311a0022084e6f6465506f72743a00420052005a00600068001a020a001a002200',
        {'kind': 'Service',
         'apiVersion': 'v1',
         'metadata': {'name': 'np1', 'labels': {'app': 'np1'}},
         'spec': {'ports': [{'name': '80-http', 'protocol': 'TCP', 'port': 80, 'targetPort': 'http'}],
                  'selector': {'app': 'np1'},
                  'type': 'NodePort'}}),
    'serviceaccount': (
        'kubectl create serviceaccount sa1',
        '6b3873000a140a027631120e536572766963654163636f756e7412150a130a0373613112001a0022002a003200380042'
        '001a002200',
        {'kind': 'ServiceAccount', 'apiVersion': 'v1', 'metadata': {'name': 'sa1'}}),
    'role': (
        'kubectl create role r1 --verb=get --verb=list --resource=pods',
        '6b3873000a240a1c726261632e617574686f72697a6174696f6e2e6b38732e696f2f76311204526f6c6512290a120a02'
        '723112001a0022002a0032003800420012130a036765740a046c69737412001a04706f64731a002200',
        {'kind': 'Role',
         'apiVersion': 'rbac.authorization.k8s.io/v1',
         'metadata': {'name': 'r1'},
         'rules': [{'verbs': ['get', 'list'], 'apiGroups': [''], 'resources': ['pods']}]}),
    'rolebinding': (
        'kubectl create rolebinding rb1 --role=r1 --user=jane',
        '6b3873000a2b0a1c726261632e617574686f72697a6174696f6e2e6b38732e696f2f7631120b526f6c6542696e64696e'
        '6712670a130a0372623112001a0022002a0032003800420012290a04557365721219726261632e617574686f72697a61'
        '74696f6e2e6b38732e696f1a046a616e6522001a250a19726261632e617574686f72697a6174696f6e2e6b38732e696f'
        '1204526f6c651a0272311a002200',
        {'kind': 'RoleBinding',
         'apiVersion': 'rbac.authorization.k8s.io/v1',
         'metadata': {'name': 'rb1'},
         'subjects': [{'kind': 'User', 'apiGroup': 'rbac.authorization.k8s.io', 'name': 'jane'}],
         'roleRef': {'apiGroup': 'rbac.authorization.k8s.io', 'kind': 'Role', 'name': 'r1'}}),
    'rolebinding_sa': (
        'kubectl create rolebinding rb2 --clusterrole=view --serviceaccount=default:sa1',
        '6b3873000a2b0a1c726261632e617574686f72697a6174696f6e2e6b38732e696f2f7631120b526f6c6542696e64696e'
        '6712670a130a0372623212001a0022002a0032003800420012200a0e536572766963654163636f756e7412001a037361'
        '31220764656661756c741a2e0a19726261632e617574686f72697a6174696f6e2e6b38732e696f120b436c7573746572'
        '526f6c651a04766965771a002200',
        {'kind': 'RoleBinding',
         'apiVersion': 'rbac.authorization.k8s.io/v1',
         'metadata': {'name': 'rb2'},
         'subjects': [{'kind': 'ServiceAccount', 'name': 'sa1', 'namespace': 'default'}],
         'roleRef': {'apiGroup': 'rbac.authorization.k8s.io', 'kind': 'ClusterRole', 'name': 'view'}}),
    'clusterrole': (
        'kubectl create clusterrole cr1 --verb=get --resource=nodes',
        '6b3873000a2b0a1c726261632e617574686f72697a6174696f6e2e6b38732e696f2f7631120b436c7573746572526f6c'
        '6512250a130a0363723112001a0022002a00320038004200120e0a0367657412001a056e6f6465731a002200',
        {'kind': 'ClusterRole',
         'apiVersion': 'rbac.authorization.k8s.io/v1',
         'metadata': {'name': 'cr1'},
         'rules': [{'verbs': ['get'], 'apiGroups': [''], 'resources': ['nodes']}]}),
    'clusterrole_url': (
        'kubectl create clusterrole cr2 --non-resource-url=/logs --verb=get',
        '6b3873000a2b0a1c726261632e617574686f72697a6174696f6e2e6b38732e696f2f7631120b436c7573746572526f6c'
        '6512230a130a0363723212001a0022002a00320038004200120c0a036765742a052f6c6f67731a002200',
        {'kind': 'ClusterRole',
         'apiVersion': 'rbac.authorization.k8s.io/v1',
         'metadata': {'name': 'cr2'},
         'rules': [{'verbs': ['get'], 'nonResourceURLs': ['/logs']}]}),
    'clusterrolebinding': (
        'kubectl create clusterrolebinding crb1 --clusterrole=cr1 --group=devs',
        '6b3873000a320a1c726261632e617574686f72697a6174696f6e2e6b38732e696f2f76311212436c7573746572526f6c'
        '6542696e64696e6712710a140a046372623112001a0022002a00320038004200122a0a0547726f75701219726261632e'
        '617574686f72697a6174696f6e2e6b38732e696f1a046465767322001a2d0a19726261632e617574686f72697a617469'
        '6f6e2e6b38732e696f120b436c7573746572526f6c651a036372311a002200',
        {'kind': 'ClusterRoleBinding',
         'apiVersion': 'rbac.authorization.k8s.io/v1',
         'metadata': {'name': 'crb1'},
         'subjects': [{'kind': 'Group', 'apiGroup': 'rbac.authorization.k8s.io', 'name': 'devs'}],
         'roleRef': {'apiGroup': 'rbac.authorization.k8s.io', 'kind': 'ClusterRole', 'name': 'cr1'}}),
    'pdb': (
        'kubectl create poddisruptionbudget pdb1 --selector=app=web --min-available=1',
        '6b3873000a200a09706f6c6963792f76311213506f6444697372757074696f6e427564676574123a0a140a0470646231'
        '12001a0022002a0032003800420012160a06080010011a00120c0a0a0a0361707012037765621a0a0800180020002800'
        '30001a002200',
        {'kind': 'PodDisruptionBudget',
         'apiVersion': 'policy/v1',
         'metadata': {'name': 'pdb1'},
         'spec': {'minAvailable': 1, 'selector': {'matchLabels': {'app': 'web'}}}}),
    'pdb_percent': (
        'kubectl create poddisruptionbudget pdb2 --selector=app=web --max-unavailable=50%',
        '6b3873000a200a09706f6c6963792f76311213506f6444697372757074696f6e427564676574123d0a140a0470646232'
        '12001a0022002a003200380042001219120c0a0a0a0361707012037765621a09080110001a033530251a0a0800180020'
        '00280030001a002200',
        {'kind': 'PodDisruptionBudget',
         'apiVersion': 'policy/v1',
         'metadata': {'name': 'pdb2'},
         'spec': {'selector': {'matchLabels': {'app': 'web'}}, 'maxUnavailable': '50%'}}),
}


# --- a tiny encoder for hand-built bodies ------------------------------------------------
def _varint(n: int) -> bytes:   # the product's writer, pinned to documented encodings in test_leb128.py
    return leb128.encode(n & leb128.MASK64)


def f(num: int, value: int | bool | str | bytes) -> bytes:
    """One field: ints/bools as varints, str/bytes (and nested messages) length-delimited."""
    if isinstance(value, (bool, int)):
        return _varint(num << 3) + _varint(int(value))
    data = value.encode() if isinstance(value, str) else value
    return _varint(num << 3 | 2) + _varint(len(data)) + data


def entry(num: int, key: str, value: str | bytes) -> bytes:
    return f(num, f(1, key) + f(2, value))


def envelope(api_version: str, kind: str, obj: bytes) -> bytes:
    return MAGIC + f(1, f(1, api_version) + f(2, kind)) + f(2, obj) + f(3, "") + f(4, "")


# --- golden kubectl bodies ----------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_kubectl_generator_bodies_decode_to_the_dry_run_object(name: str) -> None:
    _, hexed, want = GOLDEN[name]
    assert decode_object(bytes.fromhex(hexed)) == want


def test_bodies_decode_routes_protobuf_by_magic_or_content_type() -> None:
    raw = bytes.fromhex(GOLDEN["namespace"][1])
    assert bodies.decode(raw, "application/vnd.kubernetes.protobuf", "x")["metadata"] == {"name": "foo"}
    assert bodies.decode(raw, "application/json", "x")["kind"] == "Namespace"  # the magic decides
    with pytest.raises(errors.APIError) as e:
        bodies.decode(b'{"kind":"Namespace"}', "application/vnd.kubernetes.protobuf", "cannot create namespaces")
    assert e.value.code == 400 and "magic" in str(e.value)


# --- hand-built bodies --------------------------------------------------------------------
def test_pod_fields_beyond_the_generators() -> None:
    meta = (f(1, "p") + f(3, "ns") + entry(11, "app", "web") + f(8, f(1, 1700000000) + f(2, 5))
            + f(9, b"") + f(13, f(5, "apps/v1") + f(1, "ReplicaSet") + f(3, "rs") + f(4, "u1") + f(6, True)))
    container = (
        f(1, "c") + f(2, "img") + f(3, "run") + f(3, "") + f(5, "")
        + f(6, f(3, 80) + f(2, 0) + f(4, "TCP"))
        + f(7, f(1, "A") + f(2, "1"))
        + f(7, f(1, "B") + f(3, f(4, f(1, f(1, "sec")) + f(2, "key") + f(3, False))))
        + f(8, entry(1, "memory", f(1, "64Mi")) + entry(2, "cpu", f(1, "100m")))
        + f(9, f(1, "data") + f(3, "/data") + f(2, False))
        + f(10, f(1, f(2, f(1, "/healthz") + f(2, f(1, 1) + f(3, "http")))) + f(2, 0) + f(4, 10))
        + f(11, f(1, f(3, f(1, f(1, 0) + f(2, 8080)))))
        + f(15, f(4, 0) + f(5, True))
        + f(99, "a field from a newer kubectl"))
    spec = (f(1, f(1, "data") + f(2, f(2, b"")))
            + f(1, f(1, "cfg") + f(2, f(19, f(1, f(1, "cm")) + f(3, 0o644))))
            + f(2, container) + f(3, "Always") + f(4, 0) + f(6, "") + entry(7, "disk", "ssd")
            + f(10, "node-1") + f(11, False) + f(14, b"")
            + f(22, f(1, "k") + f(2, "Exists") + f(4, "NoExecute") + f(5, -1))
            + f(25, -5))
    pod = decode_object(envelope("v1", "Pod", f(1, meta) + f(2, spec) + f(3, f(1, "Running"))))
    assert pod == {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "p", "namespace": "ns", "labels": {"app": "web"},
                     "creationTimestamp": "2023-11-14T22:13:20Z",
                     "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs",
                                          "uid": "u1", "controller": True}]},
        "spec": {
            "volumes": [{"name": "data", "emptyDir": {}},
                        {"name": "cfg", "configMap": {"name": "cm", "defaultMode": 420}}],
            "containers": [{
                "name": "c", "image": "img", "command": ["run", ""],
                "ports": [{"containerPort": 80, "protocol": "TCP"}],
                "env": [{"name": "A", "value": "1"},
                        {"name": "B", "valueFrom": {"secretKeyRef": {"name": "sec", "key": "key",
                                                                     "optional": False}}}],
                "resources": {"limits": {"memory": "64Mi"}, "requests": {"cpu": "100m"}},
                "volumeMounts": [{"name": "data", "mountPath": "/data"}],
                "livenessProbe": {"httpGet": {"path": "/healthz", "port": "http"}, "periodSeconds": 10},
                "readinessProbe": {"tcpSocket": {"port": 8080}},
                "securityContext": {"runAsUser": 0, "runAsNonRoot": True}}],
            "restartPolicy": "Always", "terminationGracePeriodSeconds": 0, "nodeSelector": {"disk": "ssd"},
            "nodeName": "node-1", "securityContext": {},
            "tolerations": [{"key": "k", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": -1}],
            "priority": -5}}


def test_pointer_fields_keep_their_zero_and_plain_fields_drop_it() -> None:
    spec = f(1, 0) + f(5, 0) + f(7, False) + f(4, f(1, "") + f(2, f(1, f(1, 0) + f(2, 0))))
    dep = decode_object(envelope("apps/v1", "Deployment", f(2, spec)))
    assert dep["spec"] == {"replicas": 0, "strategy": {"rollingUpdate": {"maxUnavailable": 0}}}
    cm = decode_object(envelope("v1", "ConfigMap", f(1, f(1, "c")) + f(4, False) + entry(3, "k", b"")))
    assert cm == {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}, "immutable": False,
                  "binaryData": {"k": ""}}


def test_packed_and_repeated_ints_and_the_last_value_wins() -> None:
    psc = f(4, _varint(1) + _varint(2)) + f(4, 3) + f(2, 5) + f(2, 7)
    assert decode_message("PodSecurityContext", psc) == {"supplementalGroups": [1, 2, 3], "runAsUser": 7}


def test_delete_options() -> None:
    body = envelope("meta.k8s.io/v1", "DeleteOptions", f(1, 0) + f(4, "Background") + f(5, "All"))
    assert decode_object(body) == {"apiVersion": "meta.k8s.io/v1", "kind": "DeleteOptions",
                                   "gracePeriodSeconds": 0, "propagationPolicy": "Background", "dryRun": ["All"]}


# --- refusals ------------------------------------------------------------------------------
@pytest.mark.parametrize("raw, text", [
    (envelope("v1", "ConfigMap", f(1, f(1, 5))), "metadata.name: expected a length-delimited field"),
    (envelope("apps/v1", "Deployment", f(2, f(1, "two"))), "spec.replicas: expected a varint"),
    (envelope("v1", "Secret", f(1, f(1, b"\xff\xfe"))), "metadata.name: not valid UTF-8"),
    (envelope("v1", "Secret", f(1, f(1, "s")))[:-3], "truncated"),
    (envelope("v1", "Secret", b"\x0f"), "unsupported wire type 7"),
    (envelope("v1", "Secret", f(2, f(1, "k")))[:-2] + b"\x80", "truncated"),
    (b"k8s\x00" + f(1, f(1, "v1") + f(2, "Secret")) + f(2, b"") + f(3, "gzip"), "contentEncoding"),
    (b"k8s\x01", "magic"),
])
def test_malformed_bodies_are_refused_with_the_cause(raw: bytes, text: str) -> None:
    with pytest.raises(ProtobufError, match=text.replace(".", r"\.")):
        decode_object(raw)
    with pytest.raises(errors.APIError) as e:
        bodies.decode(raw, "application/vnd.kubernetes.protobuf", "cannot create x")
    assert e.value.code == 400 and "cannot create x" in str(e.value)


def test_a_kind_without_schema_is_415_naming_it() -> None:
    raw = envelope("apps/v1", "StatefulSet", f(1, f(1, "s")))
    with pytest.raises(UnknownKind, match='"StatefulSet" in version "apps/v1"'):
        decode_object(raw)
    with pytest.raises(errors.APIError) as e:
        bodies.decode(raw, "application/vnd.kubernetes.protobuf", "cannot create statefulsets")
    assert e.value.code == 415 and "StatefulSet" in str(e.value)


def test_jobs_and_cronjobs_as_kubectl_create_sends_them() -> None:
    template = f(2, f(2, f(1, "pi") + f(2, "wasm://x/clock.wasm")) + f(3, "Never"))
    job = envelope("batch/v1", "Job", f(1, f(1, "pi")) + f(2, f(6, template) + f(7, 0)))
    assert decode_object(job) == {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "pi"},
                                  "spec": {"backoffLimit": 0, "template": {"spec": {
                                      "restartPolicy": "Never",
                                      "containers": [{"name": "pi", "image": "wasm://x/clock.wasm"}]}}}}
    cron = envelope("batch/v1", "CronJob", f(1, f(1, "tick")) + f(2, f(1, "*/1 * * * *") + f(3, "Forbid")
                                                                   + f(5, f(2, f(6, template)))))
    spec = decode_object(cron)["spec"]
    assert spec["schedule"] == "*/1 * * * *" and spec["concurrencyPolicy"] == "Forbid"
    assert spec["jobTemplate"]["spec"]["template"]["spec"]["restartPolicy"] == "Never"


@settings(max_examples=300, deadline=None)
@given(kind=st.sampled_from(sorted({"Deployment", "Pod", "Secret", "ClusterRoleBinding"})),
       payload=st.binary(max_size=200))
def test_arbitrary_bytes_decode_or_are_refused_never_crash(kind: str, payload: bytes) -> None:
    api = {"Deployment": "apps/v1", "ClusterRoleBinding": "rbac.authorization.k8s.io/v1"}.get(kind, "v1")
    try:
        out = decode_object(envelope(api, kind, payload))
    except ProtobufError:
        return
    assert out["kind"] == kind


def test_every_schema_reference_names_a_message() -> None:
    for name, schema in SCHEMA.items():
        for number, (json_name, kind) in schema.items():
            target = kind.split(":", 1)[1] if ":" in kind and not kind.startswith("map:") else None
            if kind.startswith("map:msg") or (target and kind.lstrip("[]").split(":")[0] in ("msg", "msg*", "inline")):
                assert target in SCHEMA, (name, number, json_name, kind)


def test_shared_reader_serves_the_access_reviews() -> None:
    ra = f(1, "default") + f(2, "get") + f(5, "pods")
    raw = MAGIC + f(1, f(1, "authorization.k8s.io/v1") + f(2, "SelfSubjectAccessReview")) + f(2, f(2, f(1, ra)))
    assert decode_review_protobuf(raw) == {"spec": {"resourceAttributes": {"namespace": "default", "verb": "get",
                                                                           "resource": "pods"}}}
    assert fields(f(1, "a") + f(1, "b") + f(2, 3)) == {1: [b"a", b"b"], 2: [3]}
