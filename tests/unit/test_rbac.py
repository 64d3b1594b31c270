"""RBAC semantics: rule matching, the default roles, bindings, and the kinds' validation."""
from __future__ import annotations

import asyncio
import functools
from pathlib import Path

import pytest

from kube32.apiserver import rbac
from kube32.apiserver.errors import APIError
from kube32.apiserver.rbac import Attributes, RBACAuthorizer, rule_allows
from kube32.apiserver.registry import Registry
from kube32.apiserver.resources import by_plural
from kube32.store import SQLiteStore


def in_loop(fn):
    @functools.wraps(fn)
    def run(*args, **kwargs):
        return asyncio.run(fn(*args, **kwargs))
    return run


def attrs(verb: str, resource: str, sub: str = "", group: str = "", ns: str = "default", name: str = "",
          user: str = "jane", groups: tuple[str, ...] = ("system:authenticated",)) -> Attributes:
    return Attributes(user, groups, verb, ns, group, resource, sub, name)


def allows(role: str, a: Attributes) -> bool:
    return any(rule_allows(r, a) for r in rbac.DEFAULT_CLUSTER_ROLES[role])


def test_rule_wildcards_subresources_and_names() -> None:
    rule = {"apiGroups": [""], "resources": ["pods", "pods/*"], "verbs": ["get"]}
    assert rule_allows(rule, attrs("get", "pods"))
    assert rule_allows(rule, attrs("get", "pods", "log"))
    assert not rule_allows(rule, attrs("list", "pods"))
    assert not rule_allows(rule, attrs("get", "pods", group="apps"))
    only_sub = {"apiGroups": [""], "resources": ["pods/log"], "verbs": ["*"]}
    assert rule_allows(only_sub, attrs("get", "pods", "log")) and not rule_allows(only_sub, attrs("get", "pods"))
    named = {"apiGroups": ["*"], "resources": ["secrets"], "verbs": ["get"], "resourceNames": ["a"]}
    assert rule_allows(named, attrs("get", "secrets", name="a"))
    assert not rule_allows(named, attrs("get", "secrets", name="b"))
    scale = {"apiGroups": ["apps"], "resources": ["*/scale"], "verbs": ["update"]}
    assert rule_allows(scale, attrs("update", "deployments", "scale", "apps"))
    url = {"nonResourceURLs": ["/healthz", "/apis/*"], "verbs": ["get"]}
    assert rule_allows(url, Attributes("u", (), "get", path="/apis/apps", resource_request=False))
    assert not rule_allows(url, Attributes("u", (), "get", path="/metrics", resource_request=False))
    assert not rule_allows(url, attrs("get", "pods"))


def test_checkpoint_data_is_its_own_permission_as_secrets() -> None:
    for verb in ("get", "list", "watch"):
        assert allows("view", attrs(verb, "checkpoints", group="kube32.io"))
        assert not allows("view", attrs(verb, "secrets"))
    assert not allows("view", attrs("get", "checkpoints", "data", "kube32.io"))
    assert allows("edit", attrs("get", "checkpoints", "data", "kube32.io"))
    assert allows("admin", attrs("get", "checkpoints", "data", "kube32.io"))
    assert allows("edit", attrs("get", "secrets")) and allows("admin", attrs("create", "secrets"))
    # A rule for checkpoints does not reach the data.
    assert not rule_allows({"apiGroups": ["kube32.io"], "resources": ["checkpoints"], "verbs": ["*"]},
                           attrs("get", "checkpoints", "data", "kube32.io"))


def test_default_roles_cover_what_users_expect() -> None:
    assert allows("view", attrs("get", "pods", "log"))
    assert not allows("view", attrs("create", "pods"))
    assert not allows("view", attrs("get", "pods", "proxy"))
    assert allows("edit", attrs("create", "deployments", group="apps"))
    assert allows("edit", attrs("update", "deployments", "scale", "apps"))
    assert allows("edit", attrs("create", "pods", "eviction"))
    assert not allows("edit", attrs("create", "rolebindings", group=rbac.GROUP))
    assert allows("admin", attrs("create", "rolebindings", group=rbac.GROUP))
    assert allows("cluster-admin", attrs("delete", "nodes", ns=""))
    assert not allows("admin", attrs("delete", "nodes", ns=""))


@pytest.fixture
def registry(tmp_path: Path):
    async def make():
        store = await SQLiteStore.open(tmp_path / "state.db")
        return store, Registry(store)
    return make


@in_loop
async def test_bindings_grant_in_their_scope_only(registry) -> None:
    store, reg = await registry()
    try:
        await rbac.ensure_defaults(reg)
        await rbac.ensure_defaults(reg)   # idempotent
        ns = by_plural("namespaces")
        for n in ("default", "other"):
            await reg.create(ns, None, {"metadata": {"name": n}}, check_namespace=False)
        await reg.create(by_plural("rolebindings"), "default", {
            "metadata": {"name": "jane-view", "namespace": "default"},
            "roleRef": {"apiGroup": rbac.GROUP, "kind": "ClusterRole", "name": "view"},
            "subjects": [{"kind": "User", "name": "jane"}]})
        await reg.create(by_plural("roles"), "other", {
            "metadata": {"name": "sa-reader", "namespace": "other"},
            "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"]}]})
        await reg.create(by_plural("rolebindings"), "other", {
            "metadata": {"name": "sa", "namespace": "other"},
            "roleRef": {"apiGroup": rbac.GROUP, "kind": "Role", "name": "sa-reader"},
            "subjects": [{"kind": "ServiceAccount", "name": "bot"}, {"kind": "Group", "name": "ops"}]})
        authz = RBACAuthorizer(reg)
        assert (await authz.authorize(attrs("list", "pods")))[0]
        assert not (await authz.authorize(attrs("list", "pods", ns="other")))[0]
        assert not (await authz.authorize(attrs("list", "pods", ns="")))[0]
        assert not (await authz.authorize(attrs("get", "secrets", name="s")))[0]
        bot = attrs("get", "configmaps", ns="other", user="system:serviceaccount:other:bot")
        assert (await authz.authorize(bot))[0]
        assert not (await authz.authorize(attrs("get", "configmaps", ns="other", user="system:serviceaccount:x:bot")))[0]
        assert (await authz.authorize(attrs("get", "configmaps", ns="other", user="eve", groups=("ops",))))[0]
        # The masters group is bound to cluster-admin; every user may discover.
        assert (await authz.authorize(attrs("delete", "nodes", ns="", user="root", groups=("system:masters",))))[0]
        assert (await authz.authorize(Attributes("jane", ("system:authenticated",), "get", path="/apis/apps/v1",
                                                 resource_request=False)))[0]
        # A revoked binding stops granting once the cache is dropped.
        await reg.delete(by_plural("rolebindings"), "default", "jane-view")
        authz.invalidate()
        assert not (await authz.authorize(attrs("list", "pods")))[0]
        # Defaults edited by hand come back unless autoupdate is off.
        view = await reg.get(by_plural("clusterroles"), None, "view")
        view["rules"] = []
        await reg.update(by_plural("clusterroles"), None, "view", view)
        await rbac.ensure_defaults(reg)
        assert (await reg.get(by_plural("clusterroles"), None, "view"))["rules"]
    finally:
        await store.close()


@in_loop
async def test_rbac_kinds_validate_as_kubernetes(registry) -> None:
    store, reg = await registry()
    try:
        await reg.create(by_plural("namespaces"), None, {"metadata": {"name": "default"}}, check_namespace=False)
        with pytest.raises(APIError, match=r"rules\[0\]\.verbs: Required value"):
            await reg.create(by_plural("roles"), "default", {"metadata": {"name": "r"},
                                                             "rules": [{"apiGroups": [""], "resources": ["pods"]}]})
        with pytest.raises(APIError, match="namespaced rules cannot apply to non-resource URLs"):
            await reg.create(by_plural("roles"), "default", {"metadata": {"name": "r"},
                                                             "rules": [{"nonResourceURLs": ["/x"], "verbs": ["get"]}]})
        with pytest.raises(APIError, match=r'roleRef.kind: Unsupported value: "Role"'):
            await reg.create(by_plural("clusterrolebindings"), None, {
                "metadata": {"name": "b"}, "roleRef": {"kind": "Role", "name": "x"}, "subjects": []})
        with pytest.raises(APIError, match=r"subjects\[0\].kind"):
            await reg.create(by_plural("rolebindings"), "default", {
                "metadata": {"name": "b"}, "roleRef": {"kind": "ClusterRole", "name": "view"},
                "subjects": [{"kind": "Robot", "name": "r"}]})
        with pytest.raises(APIError, match="may not contain '/'"):
            await reg.create(by_plural("clusterroles"), None, {"metadata": {"name": "a/b"}, "rules": []})
        b = await reg.create(by_plural("rolebindings"), "default", {
            "metadata": {"name": "system:b"}, "roleRef": {"kind": "ClusterRole", "name": "view"},
            "subjects": [{"kind": "User", "name": "u"}]})
        b["roleRef"] = {"kind": "ClusterRole", "name": "edit"}
        with pytest.raises(APIError, match="cannot change roleRef"):
            await reg.update(by_plural("rolebindings"), "default", "system:b", b)
    finally:
        await store.close()


@in_loop
async def test_no_escalation_through_roles_and_bindings(registry) -> None:
    from kube32.apiserver import authz
    from kube32.apiserver.auth import User
    store, reg = await registry()
    try:
        await rbac.ensure_defaults(reg)
        await reg.create(by_plural("namespaces"), None, {"metadata": {"name": "default"}}, check_namespace=False)
        await reg.create(by_plural("rolebindings"), "default", {
            "metadata": {"name": "ann-admin"}, "roleRef": {"kind": "ClusterRole", "name": "admin"},
            "subjects": [{"kind": "User", "name": "ann"}]})
        chain = authz.Authorizer(reg)
        ann = User("ann")

        def binding(role: str, kind: str = "ClusterRole") -> dict:
            return {"metadata": {"name": f"b-{role}"}, "roleRef": {"kind": kind, "name": role},
                    "subjects": [{"kind": "User", "name": "joe"}]}
        # ann holds everything in view and edit in default: she may hand them out there.
        await authz.check_escalation(chain, ann, "rolebindings", "default", binding("view"))
        await authz.check_escalation(chain, ann, "rolebindings", "default", binding("edit"))
        with pytest.raises(APIError) as e:
            await authz.check_escalation(chain, ann, "rolebindings", "default", binding("cluster-admin"))
        assert e.value.code == 403
        assert 'is attempting to grant RBAC permissions not currently held:\n{APIGroups:["*"], ' \
               'Resources:["*"], Verbs:["*"]}' in e.value.message
        with pytest.raises(APIError):   # not in another namespace, not cluster-wide
            await authz.check_escalation(chain, ann, "rolebindings", "other", binding("view"))
        with pytest.raises(APIError):
            await authz.check_escalation(chain, ann, "clusterrolebindings", None, binding("view"))
        role = {"metadata": {"name": "r"}, "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}]}
        await authz.check_escalation(chain, ann, "roles", "default", role)
        role["rules"].append({"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["update"]})
        with pytest.raises(APIError, match=r'Resources:\["leases"\]'):
            await authz.check_escalation(chain, ann, "roles", "default", role)
        # system:masters may grant anything.
        await authz.check_escalation(chain, User("root", ("system:masters",)), "clusterrolebindings", None,
                                     binding("cluster-admin"))
    finally:
        await store.close()


@in_loop
async def test_escalation_check_leaves_malformed_bodies_to_validation(registry) -> None:
    from kube32.apiserver import authz
    from kube32.apiserver.auth import User
    store, reg = await registry()
    try:
        chain = authz.Authorizer(reg)
        for plural in ("roles", "clusterroles", "rolebindings", "clusterrolebindings"):
            for body in ({"metadata": "x", "rules": True}, {"rules": [True, {"verbs": True, "resources": 3}]},
                         {"roleRef": "x"}, {"roleRef": {"kind": 1, "name": ["a"]}}, [], "text", None):
                try:
                    await authz.check_escalation(chain, User("eve"), plural, "default", body)
                except APIError as e:
                    assert e.code == 403
            with pytest.raises(APIError, match="cannot create a node named ''"):
                authz.admit(User("system:node:a", ("system:nodes",)), "nodes", None, {"metadata": 7})
    finally:
        await store.close()
