"""The stores the store tests run against: SQLite in a temp file, etcd under a fresh prefix.

A `Backend` opens the same store every time it is asked (the same file, the same
etcd prefix), so a test can close it and open it again ("reopen").
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Awaitable, Callable

import pytest

from kube32.store import SQLiteStore, Store
from tests.etcd import etcd_endpoints, new_prefix

BACKENDS = ["sqlite", "etcd"]


@dataclass
class Backend:
    name: str
    opener: Callable[..., Awaitable[Store]]
    options: dict[str, Any] = field(default_factory=dict)

    async def open(self, **options: Any) -> Store:
        return await self.opener(**{**self.options, **options})

    def run(self, test: Callable[[Any], Awaitable[None]], **options: Any) -> None:
        """Run `test(store)` on a fresh event loop; the store is closed afterwards."""
        async def main() -> None:
            store = await self.open(**options)
            try:
                await test(store)
            finally:
                await store.close()

        asyncio.run(main())


def sqlite_backend(path: Path) -> Backend:
    return Backend("sqlite", lambda **o: SQLiteStore.open(path, **o))


def etcd_backend(cluster: Any) -> Backend:
    from kube32.store.etcd import EtcdStore

    prefix = new_prefix()
    return Backend("etcd", lambda **o: EtcdStore.open(etcd_endpoints(cluster), **o),
                   {"prefix": prefix, "compact_interval": None})


def make_backend(name: str, request: pytest.FixtureRequest, path: Path) -> Backend:
    if name == "sqlite":
        return sqlite_backend(path)
    return etcd_backend(request.getfixturevalue("etcd_cluster"))


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    return make_backend(request.param, request, tmp_path / "s.db")
