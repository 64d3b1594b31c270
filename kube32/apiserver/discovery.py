"""Discovery documents, built once from the resource table.

kubectl 1.32 reads ``/api``, ``/apis`` and each group version's
APIResourceList (legacy discovery; it caches them).  The OpenAPI documents are
kube32.apiserver.openapi's.
"""
from __future__ import annotations

import json
from functools import lru_cache
from typing import Any

from .resources import GROUP_VERSIONS, GROUPS, RESOURCES, Resource

VERSION_INFO = {"major": "1", "minor": "32", "gitVersion": "v1.32.4-kube32",
                "gitCommit": "kube32", "gitTreeState": "clean", "buildDate": "2026-11-30T00:00:00Z",
                "goVersion": "go1.23.0", "compiler": "gc", "platform": "linux/amd64"}


def api_versions(server_address: str) -> dict[str, Any]:
    return {"kind": "APIVersions", "versions": ["v1"],
            "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}]}


def _group(group: str) -> dict[str, Any]:
    gv = {"groupVersion": f"{group}/{GROUPS[group]}", "version": GROUPS[group]}
    return {"kind": "APIGroup", "apiVersion": "v1", "name": group, "versions": [gv],
            "preferredVersion": gv}


def api_group_list() -> dict[str, Any]:
    groups = [_group(g) for g in GROUPS]
    for g in groups:
        g.pop("kind"), g.pop("apiVersion")
    return {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}


def api_group(group: str) -> dict[str, Any] | None:
    return _group(group) if group in GROUPS else None


def _resource_entries(res: Resource) -> list[dict[str, Any]]:
    entry = {"name": res.plural, "singularName": res.singular, "namespaced": res.namespaced,
             "kind": res.kind, "verbs": list(res.verbs)}
    if res.short_names:
        entry["shortNames"] = list(res.short_names)
    if res.categories:
        entry["categories"] = list(res.categories)
    out = [entry]
    for sub in res.subresources:
        e = {"name": f"{res.plural}/{sub.name}", "singularName": "", "namespaced": res.namespaced,
             "kind": sub.kind, "verbs": list(sub.verbs)}
        if sub.group is not None:
            e["group"], e["version"] = sub.group, sub.version
        out.append(e)
    return out


@lru_cache(maxsize=None)
def _resource_list_json(group_version: str) -> str | None:
    resources = GROUP_VERSIONS.get(group_version)
    if resources is None:
        return None
    entries = [e for r in resources for e in _resource_entries(r)]
    return json.dumps({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": group_version,
                       "resources": entries})


def api_resource_list(group_version: str) -> dict[str, Any] | None:
    text = _resource_list_json(group_version)
    return json.loads(text) if text else None


ALL_RESOURCES = RESOURCES
