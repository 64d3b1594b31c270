"""ServiceAccounts: every namespace has one named ``default``, as Kubernetes'
``serviceaccounts_controller.go`` keeps it.

A namespace that exists and is not being deleted gets a ServiceAccount ``default``;
one deleted by a user comes back.  A terminating namespace gets none (the namespace
controller is emptying it).  The work-queue key is the namespace's name; ``sync``
reads both caches and creates the account when it is missing (an AlreadyExists means
another writer won the race: nothing to do).
"""
from __future__ import annotations

import logging
from typing import Any

from .. import objects
from ..client import NAMESPACES, SERVICEACCOUNTS, ApiError
from .base import Controller

log = logging.getLogger("kube32.serviceaccounts")
Obj = dict[str, Any]

DEFAULT = "default"


class ServiceAccountsController(Controller):
    name = "serviceaccount-controller"
    workers = 1

    def __init__(self, ctx) -> None:
        super().__init__(ctx)
        self.namespaces = ctx.informers.get(NAMESPACES)
        self.accounts = ctx.informers.get(SERVICEACCOUNTS)

    def setup(self) -> None:
        self.namespaces.add_handler(self._on_namespace)
        self.accounts.add_handler(self._on_account)

    def _on_namespace(self, etype: str, ns: Obj, _old: Obj | None) -> None:
        if etype != "DELETED":
            self.queue.add(ns["metadata"]["name"])

    def _on_account(self, etype: str, sa: Obj, _old: Obj | None) -> None:
        md = objects.meta(sa)
        if etype == "DELETED" and md.get("name") == DEFAULT:
            self.queue.add(md.get("namespace", ""))

    async def resync(self) -> None:
        for ns in self.namespaces.list():
            self.queue.add(ns["metadata"]["name"])

    async def sync(self, key: Any) -> None:
        ns = self.namespaces.get(str(key))
        if ns is None or ns["metadata"].get("deletionTimestamp"):
            return
        if self.accounts.get(f"{key}/{DEFAULT}") is not None:
            return
        try:
            await self.client.create(SERVICEACCOUNTS, {"apiVersion": "v1", "kind": "ServiceAccount",
                                                       "metadata": {"name": DEFAULT}}, str(key))
            log.info("created ServiceAccount %s/%s", key, DEFAULT)
        except ApiError as e:
            # 409: it exists (the cache is behind); 404/403: the namespace went or is going
            if e.code not in (409, 404, 403):
                raise
