"""Opening the store a --store value names (kube32.store.config parses it).

Apart from kube32.store.config because the etcd backend imports the parsing helpers
(endpoints, request size) from there: the module that opens every backend sits above them
all, so none of them imports it back.  Only opening an etcd store imports grpc.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from .base import Store, StoreError
from .config import SQLITE_FILE, StoreSpec, off_loopback

log = logging.getLogger("kube32.store")


async def open_store(spec: StoreSpec, data_dir: Path, **etcd_options: Any) -> Store:
    """The store `spec` names: SQLite under `data_dir`, or a connection to etcd."""
    if not spec.is_etcd:
        from .sqlite import HISTORY_SECONDS, SQLiteStore

        return await SQLiteStore.open(data_dir / SQLITE_FILE, history_seconds=HISTORY_SECONDS)
    try:
        from .etcd import EtcdStore
    except ImportError as err:
        raise StoreError(f"the etcd store needs the etcd extra (pip install 'kube32[etcd]'): {err}") from None
    exposed = off_loopback(spec)
    if exposed:
        log.warning("etcd at %s is not on a loopback address: kube32 talks to etcd without TLS or "
                    "authentication, so whoever reaches it reads and writes every object, Secrets included "
                    "(keep etcd on a private network; docs/security.md)", ", ".join(exposed))
    return await EtcdStore.open(list(spec.etcd), **etcd_options)
