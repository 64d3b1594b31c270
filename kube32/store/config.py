"""Which store a control plane runs on: the ``--store`` values, and opening them.

``sqlite`` (the default, as k3s): one file, ``<data-dir>/state.db``, one control plane.
``etcd://HOST:PORT[,HOST:PORT...]``: an etcd v3 cluster that several control planes
share (kube32.store.etcd; opened by kube32.store.opening). Only opening an etcd store imports grpc, so kube32 without
the ``[etcd]`` extra runs as before and says what is missing when etcd is asked for.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from .base import StoreError

SQLITE = "sqlite"
ETCD_SCHEME = "etcd://"
SQLITE_FILE = "state.db"
MAX_REQUEST_BYTES = 4 << 20  # the --max-request-bytes kube32 starts etcd with (its default: 1.5 MiB)


@dataclass(frozen=True)
class StoreSpec:
    """A parsed --store value: SQLite, or etcd at these endpoints."""

    etcd: tuple[tuple[str, int], ...] = ()

    @property
    def is_etcd(self) -> bool:
        return bool(self.etcd)

    def __str__(self) -> str:
        if not self.etcd:
            return SQLITE
        return ETCD_SCHEME + ",".join(format_endpoint(h, p) for h, p in self.etcd)


def format_endpoint(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def parse_store(text: str) -> StoreSpec:
    """``sqlite`` or ``etcd://HOST:PORT[,HOST:PORT...]``; StoreError naming what is wrong."""
    if text == SQLITE:
        return StoreSpec()
    if not text.startswith(ETCD_SCHEME):
        raise StoreError(f"a store is {SQLITE!r} or {ETCD_SCHEME}HOST:PORT[,HOST:PORT...], not {text!r}")
    return StoreSpec(tuple(parse_endpoints(text[len(ETCD_SCHEME):])))


def parse_endpoints(text: str) -> list[tuple[str, int]]:
    """Comma-separated HOST:PORT endpoints; an IPv6 host in brackets."""
    out: list[tuple[str, int]] = []
    for item in (i.strip() for i in text.split(",")):
        host, sep, port = item.rpartition(":")
        if host.startswith("[") and host.endswith("]"):
            host = host[1:-1]
        elif ":" in host:
            host = ""  # an IPv6 address without brackets: its port is ambiguous
        if not sep or not host or "/" in host or not port.isdigit() or not 0 < int(port) < 65536:
            raise StoreError(f"an etcd endpoint must be HOST:PORT (IPv6 as [ADDRESS]:PORT), not {item!r}")
        out.append((host, int(port)))
    return out


def off_loopback(spec: StoreSpec) -> list[str]:
    """The etcd endpoints not on a loopback address (a host name counts: it may resolve
    anywhere).  kube32 talks to etcd without TLS or authentication, so whoever reaches
    such an endpoint reads and writes every object (docs/security.md, *etcd*)."""
    out = []
    for host, port in spec.etcd:
        try:
            loopback = ipaddress.ip_address(host).is_loopback
        except ValueError:
            loopback = host == "localhost"
        if not loopback:
            out.append(format_endpoint(host, port))
    return out


def grpc_target(endpoints: list[tuple[str, int]] | tuple[tuple[str, int], ...]) -> str:
    """A gRPC target naming every endpoint: an ipv4:/ipv6: address list, or one DNS name."""
    kinds = {_ip_version(host) for host, _ in endpoints}
    if kinds == {4}:
        return "ipv4:" + ",".join(f"{h}:{p}" for h, p in endpoints)
    if kinds == {6}:
        return "ipv6:" + ",".join(f"[{h}]:{p}" for h, p in endpoints)
    if len(endpoints) == 1:
        return f"dns:///{format_endpoint(*endpoints[0])}"
    raise StoreError("several etcd endpoints must all be IPv4 or all IPv6 addresses "
                     "(a host name only as the one endpoint)")


def _ip_version(host: str) -> int:
    try:
        return ipaddress.ip_address(host).version
    except ValueError:
        return 0
