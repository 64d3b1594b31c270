"""User impersonation (``kubectl --as``, ``--as-group``, ``--as-uid``), as Kubernetes'
WithImpersonation filter does it.

A request with ``Impersonate-User`` (and optionally ``Impersonate-Group``, repeated,
``Impersonate-Uid``, ``Impersonate-Extra-<key>``) is served as that user, once the
authenticated requester passes one check per thing it asks to be, each the ``impersonate``
verb on:

- ``users/<name>`` (core group, cluster scope), or for ``system:serviceaccount:<ns>:<name>``
  ``serviceaccounts/<name>`` in ``<ns>`` (only when ``<ns>`` and ``<name>`` are valid
  names, as Kubernetes' SplitUsername: else the whole string is a user's name);
- ``groups/<name>`` for each group; ``uids/<uid>``; ``userextras/<key>`` in
  ``authentication.k8s.io`` with the value as the name.

A refusal is a 403 worded as Kubernetes words it (``users "bob" is forbidden: User
"alice" cannot impersonate resource "users" in API group "" at the cluster scope``).
Groups, uid or extras without a user are a 400.  The impersonated user has exactly the
groups asked for (a service account also its two service-account groups), plus
``system:authenticated`` as every authenticated user.
"""
from __future__ import annotations

from typing import Any, Mapping

from . import authz, errors, meta
from .auth import SA_GROUP, User
from .rbac import Attributes

USER, GROUP, UID, EXTRA = "Impersonate-User", "Impersonate-Group", "Impersonate-Uid", "Impersonate-Extra-"
SA_PREFIX = "system:serviceaccount:"


def asked(headers: Mapping[str, str]) -> bool:
    return any(k.lower().startswith("impersonate-") for k in headers)


async def impersonated(authorizer: Any, requester: User, headers: Any) -> User:
    """The user the request is served as; raises the 400/403 a refusal is."""
    name = headers.get(USER, "")
    groups = [g for g in headers.getall(GROUP, []) if g]
    uid = headers.get(UID, "")
    extras: dict[str, list[str]] = {}
    for key, value in headers.items():
        if key.lower().startswith(EXTRA.lower()):
            extras.setdefault(key[len(EXTRA):].lower(), []).append(value)
    if not name:
        raise errors.bad_request("requested impersonation of groups, a uid or extras without impersonating a user")
    checks = [_user_check(name)] + [("groups", "", "", g) for g in groups]
    if uid:
        checks.append(("uids", "", "", uid))
    checks += [(f"userextras/{k}", "authentication.k8s.io", "", v) for k, vs in extras.items() for v in vs]
    for resource, group, namespace, target in checks:
        resource, _, sub = resource.partition("/")
        attrs = Attributes(requester.name, authz.groups_of(requester), "impersonate", namespace, group,
                           resource, sub, target, uid=requester.uid)
        allowed, reason = await authorizer.authorize(attrs)
        if not allowed:
            raise authz.forbidden(attrs, reason)
    account = split_service_account(name)
    if account is not None:
        groups += [g for g in (SA_GROUP, f"{SA_GROUP}:{account[0]}") if g not in groups]
    return User(name, tuple(groups), uid, {"impersonated-by": requester.name})


def split_service_account(name: str) -> tuple[str, str] | None:
    """(namespace, name) of a ServiceAccount's user name, or None when ``name`` is not one
    (as Kubernetes' serviceaccount.SplitUsername): exactly ``system:serviceaccount:<ns>:<sa>``
    with a valid namespace (an RFC 1123 label) and a valid ServiceAccount name (an RFC
    1123 subdomain).  Anything else - ``system:serviceaccount:evil:`` among them - is a
    plain user name, which needs ``impersonate`` on ``users``."""
    if not name.startswith(SA_PREFIX):
        return None
    parts = name[len(SA_PREFIX):].split(":")
    if len(parts) != 2:
        return None
    ns, sa = parts
    if len(ns) > 63 or not meta.DNS1123_LABEL.match(ns) or meta.subdomain_problem(sa) is not None:
        return None
    return ns, sa


def _user_check(name: str) -> tuple[str, str, str, str]:
    account = split_service_account(name)
    if account is not None:
        return "serviceaccounts", "", account[0], account[1]
    return "users", "", "", name
