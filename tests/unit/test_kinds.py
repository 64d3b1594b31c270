"""The client's kinds and the API server's stored resources are the same list: the
namespace controller empties a deleted namespace of every namespaced kind the client
knows, and a kind it did not know would outlive its namespace (a RoleBinding coming
back with a namespace of the same name)."""
from __future__ import annotations

from kube32.apiserver.resources import RESOURCES
from kube32.client.kinds import ALL


def test_every_stored_resource_is_a_client_kind() -> None:
    stored = {(r.group, r.version, r.plural, r.kind, r.namespaced) for r in RESOURCES
              if "delete" in r.verbs}
    known = {(k.group, k.version, k.plural, k.kind, k.namespaced) for k in ALL}
    assert stored == known
