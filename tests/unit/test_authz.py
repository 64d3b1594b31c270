"""The authorizer chain: request attributes, Kubernetes' 403 wording, the node authorizer,
node-restriction admission, the static token file and node credentials."""
from __future__ import annotations

import asyncio
import functools
from pathlib import Path

import pytest

from kube32.apiserver import authz
from kube32.apiserver.auth import TokenAuthenticator, TokenFileError, User, read_token_file
from kube32.apiserver.errors import APIError
from kube32.apiserver.registry import Registry
from kube32.apiserver.resources import by_plural
from kube32.apiserver.routing import query_flag
from kube32.store import SQLiteStore

JANE = User("jane", ("dev",))
NODE_A = User("system:node:a", ("system:nodes",))


def in_loop(fn):
    @functools.wraps(fn)
    def run(*args, **kwargs):
        return asyncio.run(fn(*args, **kwargs))
    return run


@pytest.mark.parametrize("method,path,query,want", [
    ("GET", "/api/v1/namespaces/default/pods", {}, ("list", "default", "", "pods", "", "")),
    ("GET", "/api/v1/namespaces/default/pods", {"watch": "true"}, ("watch", "default", "", "pods", "", "")),
    ("GET", "/api/v1/namespaces/default/pods/x", {}, ("get", "default", "", "pods", "", "x")),
    ("GET", "/api/v1/namespaces/default/pods/x/log", {}, ("get", "default", "", "pods", "log", "x")),
    ("POST", "/api/v1/namespaces/default/pods/x/eviction", {}, ("create", "default", "", "pods", "eviction", "x")),
    ("PATCH", "/api/v1/nodes/n/status", {}, ("patch", "", "", "nodes", "status", "n")),
    ("GET", "/api/v1/nodes/n/proxy/checkpoint/a/b", {}, ("get", "", "", "nodes", "proxy", "n")),
    ("DELETE", "/api/v1/namespaces/default/pods", {}, ("deletecollection", "default", "", "pods", "", "")),
    ("DELETE", "/api/v1/namespaces/ns1", {}, ("delete", "ns1", "", "namespaces", "", "ns1")),
    ("PUT", "/api/v1/namespaces/ns1/finalize", {}, ("update", "ns1", "", "namespaces", "finalize", "ns1")),
    ("PUT", "/apis/kube32.io/v1/namespaces/d/checkpoints/c/data", {},
     ("update", "d", "kube32.io", "checkpoints", "data", "c")),
    ("POST", "/apis/kube32.io/v1/namespaces/d/topics/a/b", {}, ("create", "d", "kube32.io", "topics", "", "a/b")),
    ("GET", "/apis/kube32.io/v1/topicevents", {"watch": "true"}, ("watch", "", "kube32.io", "topicevents", "", "")),
    ("GET", "/apis/kube32.io/v1/images/abc", {}, ("get", "", "kube32.io", "images", "", "abc")),
    ("POST", "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", {},
     ("create", "", "authorization.k8s.io", "selfsubjectaccessreviews", "", "")),
])
def test_request_attributes_follow_request_info(method, path, query, want) -> None:
    a = authz.request_attributes(JANE, method, path, query)
    assert a.resource_request
    assert (a.verb, a.namespace, a.api_group, a.resource, a.subresource, a.name) == want
    assert a.groups == ("dev", "system:authenticated")


@pytest.mark.parametrize("value,watch", [
    (None, False), ("0", False), ("false", False), ("False", False), ("FALSE", False),
    ("1", True), ("true", True), ("True", True), ("TRUE", True), ("t", True), ("yes", True), ("", True),
    ("no", True),   # kube-apiserver: anything but absent, 0 or false is true
])
def test_the_verb_and_the_handler_read_watch_by_one_function(value, watch) -> None:
    """Issue 19: ``?watch=yes`` was served as a watch and authorised as a list."""
    query = {} if value is None else {"watch": value}
    assert query_flag(query, "watch") is watch
    a = authz.request_attributes(JANE, "GET", "/api/v1/namespaces/default/pods", query)
    assert a.verb == ("watch" if watch else "list")
    # A named GET is served as a get whatever watch says, and authorised as one.
    assert authz.request_attributes(JANE, "GET", "/api/v1/namespaces/default/pods/x", query).verb == "get"


@pytest.mark.parametrize("selector,allowed", [
    ("spec.nodeName=a", True), ("spec.nodeName==a", True), ("spec.nodeName = a", False),
    ("metadata.name=x,spec.nodeName=a", True), ("spec.nodeName=b", False), ("spec.nodeName!=a", False),
    ("spec.nodeName", False), ("", False)])
@in_loop
async def test_the_node_authorizer_reads_a_field_selector_as_the_handler_does(tmp_path: Path, selector,
                                                                             allowed) -> None:
    """The one parse of the list handler (selectors.parse_field_selector) decides."""
    store = await SQLiteStore.open(tmp_path / "s.db")
    try:
        attrs = authz.request_attributes(NODE_A, "GET", "/api/v1/pods", {"fieldSelector": selector, "watch": "1"})
        assert (await authz.Authorizer(Registry(store)).authorize(attrs))[0] is allowed
    finally:
        await store.close()


@pytest.mark.parametrize("path", ["/api", "/apis", "/apis/apps", "/apis/apps/v1", "/api/v1", "/openapi/v3"])
def test_discovery_paths_are_non_resource(path: str) -> None:
    a = authz.request_attributes(JANE, "GET", path, {})
    assert not a.resource_request and a.path == path and a.verb == "get"


def test_forbidden_messages_are_kubernetes_words() -> None:
    e = authz.forbidden(authz.request_attributes(JANE, "GET", "/api/v1/namespaces/default/pods/x", {}))
    assert e.code == 403 and e.reason == "Forbidden"
    assert e.message == ('pods "x" is forbidden: User "jane" cannot get resource "pods" in API group "" '
                         'in the namespace "default"')
    e = authz.forbidden(authz.request_attributes(JANE, "GET", "/api/v1/nodes", {}))
    assert e.message == 'nodes is forbidden: User "jane" cannot list resource "nodes" in API group "" at the cluster scope'
    e = authz.forbidden(authz.request_attributes(JANE, "GET", "/apis/kube32.io/v1/namespaces/d/checkpoints/c/data", {}))
    assert e.message == ('checkpoints.kube32.io "c" is forbidden: User "jane" cannot get resource '
                         '"checkpoints/data" in API group "kube32.io" in the namespace "d"')
    assert e.details == {"kind": "checkpoints", "name": "c", "group": "kube32.io"}
    e = authz.forbidden(authz.request_attributes(JANE, "GET", "/metrics", {}))
    assert e.message == 'forbidden: User "jane" cannot get path "/metrics"'
    e = authz.forbidden(authz.request_attributes(NODE_A, "GET", "/api/v1/namespaces/d/secrets/s", {}), "why")
    assert e.message.endswith('in the namespace "d": why')


def _pod(name: str, node: str, **spec) -> dict:
    ann = spec.pop("annotations", {})
    return {"metadata": {"name": name, "namespace": "default", "annotations": ann},
            "spec": {"nodeName": node, "containers": [{"name": "main", "image": "wasm://x", **spec}],
                     **({"volumes": spec.pop("volumes")} if "volumes" in spec else {})}}


@in_loop
async def test_node_authorizer_reads_only_what_its_pods_use(tmp_path: Path) -> None:
    store = await SQLiteStore.open(tmp_path / "s.db")
    try:
        reg = Registry(store)
        await reg.create(by_plural("namespaces"), None, {"metadata": {"name": "default"}}, check_namespace=False)
        pods = by_plural("pods")
        await reg.create(pods, "default", _pod("mine", "a", env=[
            {"name": "X", "valueFrom": {"secretKeyRef": {"name": "env-secret", "key": "k"}}}],
            envFrom=[{"configMapRef": {"name": "env-cm"}}], annotations={"kube32.io/restore-from": "ck-mine"}))
        vol = _pod("vol", "a")
        vol["spec"]["volumes"] = [{"name": "v", "secret": {"secretName": "vol-secret"}}]
        await reg.create(pods, "default", vol)
        await reg.create(pods, "default", _pod("theirs", "b", envFrom=[{"secretRef": {"name": "their-secret"}}],
                                               annotations={"kube32.io/restore-from": "ck-theirs"}))
        chain = authz.Authorizer(reg)

        async def can(method: str, path: str, query: dict | None = None, user: User = NODE_A) -> bool:
            return (await chain.authorize(authz.request_attributes(user, method, path, query or {})))[0]
        base = "/api/v1/namespaces/default"
        assert await can("GET", f"{base}/pods/mine")
        assert not await can("GET", f"{base}/pods/theirs")
        assert await can("GET", "/api/v1/pods", {"fieldSelector": "spec.nodeName=a"})
        assert await can("GET", "/api/v1/pods", {"fieldSelector": "spec.nodeName=a", "watch": "1"})
        assert not await can("GET", "/api/v1/pods")
        assert not await can("GET", "/api/v1/pods", {"fieldSelector": "spec.nodeName=b"})
        assert await can("PATCH", f"{base}/pods/mine/status")
        assert not await can("PATCH", f"{base}/pods/theirs/status")
        assert not await can("PATCH", f"{base}/pods/mine")
        assert await can("DELETE", f"{base}/pods/mine")
        assert not await can("DELETE", f"{base}/pods/theirs")
        assert await can("GET", f"{base}/secrets/env-secret") and await can("GET", f"{base}/secrets/vol-secret")
        assert await can("GET", f"{base}/configmaps/env-cm")
        assert not await can("GET", f"{base}/secrets/their-secret")
        assert not await can("GET", f"{base}/secrets")
        ck = "/apis/kube32.io/v1/namespaces/default/checkpoints"
        assert await can("GET", f"{ck}/ck-mine/data")
        assert not await can("GET", f"{ck}/ck-theirs/data")
        assert not await can("PUT", f"{ck}/ck-mine/data")
        assert await can("PATCH", "/api/v1/nodes/a/status") and await can("PATCH", "/api/v1/nodes/a")
        assert not await can("PATCH", "/api/v1/nodes/b/status")
        assert not await can("GET", "/api/v1/nodes/a/proxy/healthz")
        lease = "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases"
        assert await can("PATCH", f"{lease}/a") and not await can("PATCH", f"{lease}/b")
        assert await can("POST", f"{base}/events")
        assert await can("POST", "/apis/authentication.k8s.io/v1/tokenreviews")
        assert await can("GET", "/apis/kube32.io/v1/images/abc")
        assert not await can("POST", "/apis/kube32.io/v1/images")
        assert await can("POST", "/apis/kube32.io/v1/namespaces/default/topics/t")
        assert await can("GET", "/apis/kube32.io/v1/topicevents", {"watch": "true"})
        assert not await can("GET", "/api/v1/namespaces")        # RBAC: nothing bound to nodes
        # A user named like a node but without the nodes group is no node.
        assert not await can("GET", f"{base}/pods/mine", user=User("system:node:a"))
        # The reason says why.
        _, why = await chain.authorize(authz.request_attributes(NODE_A, "GET", f"{base}/secrets/their-secret", {}))
        assert why == "no relationship found between node 'a' and this object"
    finally:
        await store.close()


def test_admission_keeps_a_node_to_its_own_node_and_lease() -> None:
    authz.admit(NODE_A, "nodes", None, {"metadata": {"name": "a"}})
    authz.admit(NODE_A, "leases", "kube-node-lease", {"metadata": {"name": "a"}})
    authz.admit(JANE, "nodes", None, {"metadata": {"name": "b"}})
    for plural, ns in (("nodes", None), ("leases", "kube-node-lease")):
        with pytest.raises(APIError) as e:
            authz.admit(NODE_A, plural, ns, {"metadata": {"name": "b"}})
        assert e.value.code == 403 and "node 'a' cannot create" in e.value.message


def test_static_token_file(tmp_path: Path) -> None:
    f = tmp_path / "tokens.csv"
    f.write_text('# comment\nt-jane,jane,u1,"dev,ops"\nt-bob,bob,u2\n')
    users = read_token_file(f)
    assert users["t-jane"] == User("jane", ("dev", "ops"), "u1") and users["t-bob"].groups == ()
    f.write_text("only-a-token\n")
    with pytest.raises(TokenFileError, match="tokens.csv:1"):
        read_token_file(f)
    with pytest.raises(TokenFileError, match="cannot read"):
        read_token_file(tmp_path / "missing.csv")


@in_loop
async def test_node_tokens_are_known_to_every_api_server_of_the_store_and_replace_the_previous_one(
        tmp_path: Path) -> None:
    from kube32.apiserver.auth import NODE_TOKEN_PREFIX, ServiceAccountTokens
    from kube32.apiserver.nodetokens import NodeTokens

    store = await SQLiteStore.open(tmp_path / "s.db")
    try:
        reg = Registry(store)
        await reg.create(by_plural("namespaces"), None, {"metadata": {"name": "kube-system"}},
                         check_namespace=False)
        key = ServiceAccountTokens(b"k" * 32)
        auth = TokenAuthenticator({}, key)
        one, two = NodeTokens(reg), NodeTokens(Registry(store))  # two API servers, one store
        first = await one.issue(key, "a")
        user = auth.authenticate(f"Bearer {first}")
        assert user == NODE_A and await one.still_valid(user) and await two.still_valid(user)
        second = await two.issue(key, "a")
        assert not await two.still_valid(auth.authenticate(f"Bearer {first}")), "revoked"  # type: ignore[arg-type]
        assert await one.still_valid(auth.authenticate(f"Bearer {second}"))  # type: ignore[arg-type]
        assert first not in str(await reg.list(by_plural("secrets"), "kube-system")), "no token is stored"
        forged = ServiceAccountTokens(b"x" * 32).sign(NODE_TOKEN_PREFIX, {"node": "b", "id": "1"})
        assert auth.authenticate(f"Bearer {forged}") is None                  # another key
        assert auth.authenticate(f"Bearer {first[:-3]}abc") is None           # a changed signature
    finally:
        await store.close()


def test_service_account_tokens_are_signed_and_expire() -> None:
    from kube32.apiserver.auth import ServiceAccountRef, ServiceAccountTokens
    sa = ServiceAccountTokens(b"k" * 32)
    token = sa.issue("default", "bot", "uid-1", 2000)
    assert sa.verify(token, 1999) == ServiceAccountRef("default", "bot", "uid-1")
    assert sa.verify(token, 2000) is None                                  # expired
    assert ServiceAccountTokens(b"x" * 32).verify(token, 1) is None        # another key
    head, body, mac = token.split(".")
    forged = ServiceAccountTokens(b"x" * 32).issue("default", "admin", "uid-1", 2000).split(".")[1]
    assert sa.verify(f"{head}.{forged}.{mac}", 1) is None                   # payload swapped
    assert sa.verify("k32sa.garbage", 1) is None and sa.verify("k32sa.a.b", 1) is None
    auth = TokenAuthenticator({}, sa)
    user = auth.authenticate(f"Bearer {sa.issue('ns1', 'bot', 'u', 2**40)}")
    assert user is not None and user.name == "system:serviceaccount:ns1:bot"
    assert user.groups == ("system:serviceaccounts", "system:serviceaccounts:ns1")


@in_loop
async def test_node_reads_checkpoint_data_by_the_checkpoints_pod_or_any_pod_on_it(tmp_path: Path) -> None:
    """The quick check (the Checkpoint's own pod, on this node, restoring from it) and the
    full one (any pod on the node naming it) agree."""
    store = await SQLiteStore.open(tmp_path / "s.db")
    try:
        reg = Registry(store)
        await reg.create(by_plural("namespaces"), None, {"metadata": {"name": "default"}}, check_namespace=False)
        pods, cks = by_plural("pods"), by_plural("checkpoints")
        await reg.create(pods, "default", _pod("mine", "a", annotations={"kube32.io/restore-from": "ck-mine"}))
        await reg.create(pods, "default", _pod("other", "a", annotations={"kube32.io/restore-from": "ck-lent"}))
        await reg.create(pods, "default", _pod("theirs", "b", annotations={"kube32.io/restore-from": "ck-theirs"}))
        for name, pod in (("ck-mine", "mine"), ("ck-theirs", "theirs"), ("ck-lent", "theirs"),
                          ("ck-unused", "mine")):
            await reg.create(cks, "default", {"apiVersion": "kube32.io/v1", "kind": "Checkpoint",
                                              "metadata": {"name": name}, "spec": {"podName": pod}})
        chain = authz.Authorizer(reg)
        base = "/apis/kube32.io/v1/namespaces/default/checkpoints"

        async def can(name: str) -> bool:
            return (await chain.authorize(authz.request_attributes(NODE_A, "GET", f"{base}/{name}/data", {})))[0]
        assert await can("ck-mine")          # its own pod is here and restores from it
        assert await can("ck-lent")          # taken of a pod elsewhere, restored by a pod here
        assert not await can("ck-theirs")
        assert not await can("ck-unused")    # its pod is here but does not restore from it
        assert not await can("ck-missing")
    finally:
        await store.close()


@in_loop
async def test_a_move_target_reads_what_its_restore_needs_while_the_move_is_under_way(tmp_path: Path) -> None:
    """kube32.kubelet.prefetch: the target node watches the moves toward it, and while one is
    Saving or Moving reads its data, the pod being moved and what that pod names."""
    store = await SQLiteStore.open(tmp_path / "s.db")
    try:
        reg = Registry(store)
        await reg.create(by_plural("namespaces"), None, {"metadata": {"name": "default"}}, check_namespace=False)
        pods, cks = by_plural("pods"), by_plural("checkpoints")
        uids = {}
        for name in ("moving", "elsewhere", "done"):
            created = await reg.create(pods, "default", _pod(name, "b", envFrom=[{"configMapRef": {"name": f"{name}-cm"}}]))
            uids[name] = created["metadata"]["uid"]
        for ck, pod, target, phase in (("ck-move", "moving", "a", "Saving"), ("ck-elsewhere", "elsewhere", "c", "Saving"),
                                       ("ck-done", "done", "a", "Completed")):
            await reg.create(cks, "default", {"apiVersion": "kube32.io/v1", "kind": "Checkpoint", "metadata": {"name": ck},
                                              "spec": {"podName": pod, "action": "Move"}})

            def moving(obj: dict, target=target, phase=phase, pod=pod) -> dict:
                obj["status"] = {"phase": phase, "targetNode": target, "nodeName": "b", "podUID": uids[pod]}
                return obj
            await reg.mutate(cks, "default", ck, moving, subresource="status")
        chain = authz.Authorizer(reg)

        async def can(path: str, query: dict | None = None) -> tuple[bool, str]:
            return await chain.authorize(authz.request_attributes(NODE_A, "GET", path, query or {}))
        base, api = "/apis/kube32.io/v1", "/api/v1/namespaces/default"
        assert (await can(f"{base}/checkpoints", {"fieldSelector": "status.targetNode=a"}))[0]
        assert (await can(f"{base}/checkpoints", {"fieldSelector": "status.targetNode=a", "watch": "1"}))[0]
        assert await can(f"{base}/checkpoints", {"fieldSelector": "status.targetNode=c"}) == (
            False, "node 'a' may only list and watch checkpoints with fieldSelector status.targetNode=a")
        assert not (await can(f"{base}/checkpoints"))[0]
        assert (await can(f"{base}/namespaces/default/checkpoints/ck-move/data"))[0]
        assert (await can(f"{api}/pods/moving"))[0] and (await can(f"{api}/configmaps/moving-cm"))[0]
        # Not toward this node, or no longer under way: nothing.
        for ck, pod in (("ck-elsewhere", "elsewhere"), ("ck-done", "done")):
            assert not (await can(f"{base}/namespaces/default/checkpoints/{ck}/data"))[0]
            assert not (await can(f"{api}/pods/{pod}"))[0] and not (await can(f"{api}/configmaps/{pod}-cm"))[0]
        # Reading is all: the pod on its way stays the source node's to write.
        for method, path in (("PATCH", f"{api}/pods/moving/status"), ("DELETE", f"{api}/pods/moving")):
            assert not (await chain.authorize(authz.request_attributes(NODE_A, method, path, {})))[0]
    finally:
        await store.close()
