"""kube32.apiserver.kubeletcredentials and proxy.kubelet_endpoint: what the API server
sends a kubelet is worthless at any other (issue 19), and a Node's endpoint is an IP
address, a port and http/https, nothing else."""
from __future__ import annotations

import asyncio
import ssl
from pathlib import Path
from typing import Any

import pytest

from kube32.apiserver import errors
from kube32.apiserver.auth import (KUBELET_CLIENT, NODE_NAME_EXTRA, NODE_UID_EXTRA, ServiceAccountTokens,
                                   TokenAuthenticator)
from kube32.apiserver.kubeletcredentials import KubeletCredentials, KubeletEndpoint, still_valid
from kube32.apiserver.proxy import kubelet_endpoint
from kube32.apiserver.registry import Registry
from kube32.apiserver.resources import by_plural
from kube32.store import SQLiteStore

KEY = ServiceAccountTokens(b"k" * 32)


def node(name: str = "n1", uid: str = "u1", ip: Any = "127.0.0.2", port: Any = 10250,
         scheme: Any = None) -> dict[str, Any]:
    md: dict[str, Any] = {"name": name, "uid": uid}
    if scheme is not None:
        md["annotations"] = {"kube32.io/kubelet-scheme": scheme}
    return {"metadata": md, "status": {"addresses": [{"type": "InternalIP", "address": ip}],
                                       "daemonEndpoints": {"kubeletEndpoint": {"Port": port}}}}


def test_an_https_kubelet_gets_no_token_and_is_verified_for_its_nodes_name() -> None:
    made: list[ssl.SSLContext] = []

    def context() -> ssl.SSLContext:
        made.append(ssl.create_default_context())
        return made[-1]
    creds = KubeletCredentials(KEY, context)
    a = creds.dial(kubelet_endpoint(node("a", scheme="https")))
    b = creds.dial(kubelet_endpoint(node("b", scheme="https")))
    assert a.headers == {} and a.server_hostname == "a" and b.server_hostname == "b"
    # One TLS context per node: no pooled connection is shared between two nodes.
    assert a.ssl is not b.ssl and creds.dial(kubelet_endpoint(node("a", scheme="https"))).ssl is a.ssl
    assert len(made) == 2


def test_a_plain_http_kubelet_gets_a_token_bound_to_its_node_alone() -> None:
    creds = KubeletCredentials(KEY, None)
    dial = creds.dial(kubelet_endpoint(node("evil", uid="u-evil")))
    assert dial.server_hostname is None and dial.ssl is False
    token = dial.headers["Authorization"].split(" ", 1)[1]
    user = TokenAuthenticator({}, KEY).authenticate(f"Bearer {token}")
    assert user is not None and user.name == KUBELET_CLIENT and user.groups == ()
    assert user.as_user_info()["extra"] == {NODE_NAME_EXTRA: ["evil"], NODE_UID_EXTRA: ["u-evil"]}
    # Another key's signature, or a tampered payload, is no token.
    assert TokenAuthenticator({}, ServiceAccountTokens(b"x" * 32)).authenticate(f"Bearer {token}") is None
    assert TokenAuthenticator({}, KEY).authenticate(f"Bearer {token[:-2]}xx") is None


def test_a_kubelet_token_lives_as_long_as_its_node(tmp_path: Path) -> None:
    async def go() -> None:
        store = await SQLiteStore.open(tmp_path / "s.db")
        try:
            reg = Registry(store)
            created = await reg.create(by_plural("nodes"), None, {"metadata": {"name": "n1"}})
            auth = TokenAuthenticator({}, KEY)
            creds = KubeletCredentials(KEY, None)

            def user_of(uid: str) -> Any:
                header = creds.dial(kubelet_endpoint(node("n1", uid=uid))).headers["Authorization"]
                return auth.authenticate(header)
            assert await still_valid(reg, user_of(created["metadata"]["uid"]))
            assert not await still_valid(reg, user_of("another-uid"))   # a Node of that name, made again
            await reg.delete(by_plural("nodes"), None, "n1")
            assert not await still_valid(reg, user_of(created["metadata"]["uid"]))
        finally:
            await store.close()
    asyncio.run(go())


@pytest.mark.parametrize("fields,cause", [
    ({"ip": "127.0.0.1:1/#"}, "its InternalIP '127.0.0.1:1/#' is not an IP address"),
    ({"ip": "evil.example"}, "its InternalIP 'evil.example' is not an IP address"),
    ({"ip": ["127.0.0.1"]}, "its InternalIP ['127.0.0.1'] is not an IP address"),
    ({"port": "1@127.0.0.9"}, "its kubelet port '1@127.0.0.9' is not a port number"),
    ({"port": 65536}, "its kubelet port 65536 is not a port number"),
    ({"port": True}, "its kubelet port True is not a port number"),
    ({"scheme": "https://127.0.0.9:1/#"},
     "its annotation kube32.io/kubelet-scheme is 'https://127.0.0.9:1/#', not \"http\" or \"https\""),
])
def test_a_kubelet_endpoint_takes_only_an_address_a_port_and_a_scheme(fields: dict[str, Any], cause: str) -> None:
    with pytest.raises(errors.APIError) as e:
        kubelet_endpoint(node(**fields))
    assert e.value.code == 503 and e.value.message == f'node "n1" has no kubelet endpoint: {cause}'


def test_a_kubelet_endpoint() -> None:
    assert kubelet_endpoint(node(scheme="https")) == KubeletEndpoint("n1", "u1", "https", "127.0.0.2", 10250)
    assert kubelet_endpoint(node(ip="::1")).base == "http://[::1]:10250"
