"""An informer: a local cache of one kind kept by list + watch.

It lists, then watches from the list's resourceVersion; each event updates
the cache and calls the handlers (which should only enqueue keys).  When the
watch ends, or the server does not answer or answers 429, it resumes from the last
resourceVersion seen (as client-go's reflector); after a 410 or another refusal it
lists again and reports the differences as events, so handlers see every change at
least once (level-triggered code tolerates repeats).

An object replaced under its name (a moved pod) comes from the server as DELETED
(annotated ``kube32.io/replaced-by``, one revision before the write) then ADDED (at
the write's revision); an informer without selectors takes the pair as the one write
it is: one MODIFIED whose uid changed, the cache never without that name in between.
Kube32's controllers count a moving pod as one pod at every step (a ReplicaSet never
sees it gone), and a watch cut between the two resumes at the DELETED's revision,
which still sends the ADDED.  An informer with selectors (the kubelet's
``spec.nodeName``) takes the DELETED as it is: the server sends the ADDED only if the
replacement matches them too (it then comes as an ADDED).
"""
from __future__ import annotations

import asyncio
import logging
import random
from typing import Any, Callable

from .. import objects
from ..terms import Annotation
from .kinds import Kind
from .rest import ApiError, Client

log = logging.getLogger("kube32.informer")
Obj = dict[str, Any]
Handler = Callable[[str, Obj, Obj | None], None]  # (type, obj, old)
WATCH_TIMEOUT_SECONDS = 300   # the shortest timeout of a watch (it is drawn up to twice this)


IndexFunc = Callable[[Obj], "list[str] | tuple[str, ...]"]


def _unfile(index: dict[str, dict[str, Obj]], values: "list[str] | tuple[str, ...]", key: str) -> None:
    for v in values:
        filed = index.get(v)
        if filed is not None:
            filed.pop(key, None)
            if not filed:
                del index[v]


BY_NODE_NAME = "spec.nodeName"   # the usual name of a pods informer's index by by_node_name


class _Cache(dict):
    """An informer's cache: a dict that files each object it takes in the indexes (and
    takes it out of them when it goes)."""

    def __init__(self, indexes: dict[str, tuple[IndexFunc, dict[str, dict[str, Obj]]]]) -> None:
        super().__init__()
        self._indexes = indexes

    def __setitem__(self, key: str, obj: Obj) -> None:
        old = dict.get(self, key)
        dict.__setitem__(self, key, obj)
        for values, index in self._indexes.values():
            if old is not None:
                _unfile(index, values(old), key)
            for v in values(obj):
                index.setdefault(v, {})[key] = obj

    def __delitem__(self, key: str) -> None:
        old = dict.pop(self, key)
        for values, index in self._indexes.values():
            _unfile(index, values(old), key)

    def pop(self, key: str, *default: Any) -> Any:
        if key in self:
            old = self[key]
            del self[key]
            return old
        return dict.pop(self, key, *default)

    def clear(self) -> None:
        dict.clear(self)
        for _, index in self._indexes.values():
            index.clear()


def by_node_name(obj: Obj) -> tuple[str, ...]:
    """A pod's index value: its ``spec.nodeName`` (none while unbound)."""
    node = (obj.get("spec") or {}).get("nodeName")
    return (node,) if isinstance(node, str) and node else ()


def key_of(obj: Obj) -> str:
    md = objects.meta(obj)
    return f"{md['namespace']}/{md['name']}" if md.get("namespace") else md.get("name", "")


class Informer:
    def __init__(self, client: Client, kind: Kind, namespace: str | None = None, *,
                 label_selector: str | None = None, field_selector: str | None = None) -> None:
        self.client = client
        self.kind = kind
        self.namespace = namespace
        self.label_selector = label_selector
        self.field_selector = field_selector
        # name -> (the values an object is filed under, value -> key -> object), as client-go's Indexer
        self._indexes: dict[str, tuple[IndexFunc, dict[str, dict[str, Obj]]]] = {}
        self._cache = _Cache(self._indexes)
        self.handlers: list[Handler] = []
        self.synced = asyncio.Event()
        self._rv = ""
        self._task: asyncio.Task | None = None

    def add_handler(self, handler: Handler) -> None:
        self.handlers.append(handler)

    @property
    def cache(self) -> dict[str, Obj]:
        """The objects by key; every change to it (an assignment too) keeps the indexes."""
        return self._cache

    @cache.setter
    def cache(self, objs: dict[str, Obj]) -> None:
        self._cache = _Cache(self._indexes)
        for key, obj in objs.items():
            self._cache[key] = obj

    def get(self, key: str) -> Obj | None:
        return self.cache.get(key)

    def add_index(self, name: str, values: IndexFunc) -> None:
        """File every cached object under ``values(obj)`` (e.g. a pod under its
        ``spec.nodeName``), kept with the cache at every change, so :meth:`by_index` is
        O(the objects filed there), not O(the cache).  Added again: kept as it is."""
        if name in self._indexes:
            return
        index: dict[str, dict[str, Obj]] = {}
        self._indexes[name] = (values, index)
        for key, obj in self.cache.items():
            for v in values(obj):
                index.setdefault(v, {})[key] = obj

    def by_index(self, name: str, value: str) -> list[Obj]:
        """The cached objects filed under ``value`` in the index ``name`` (:meth:`add_index`)."""
        return list(self._indexes[name][1].get(value, {}).values())

    def index_values(self, name: str) -> list[str]:
        """The values the index ``name`` files objects under now (e.g. the nodes that have
        pods), O(those values)."""
        return list(self._indexes[name][1])

    def _put(self, key: str, obj: Obj) -> None:
        self.cache[key] = obj

    def _drop(self, key: str) -> None:
        self.cache.pop(key, None)

    def list(self) -> list[Obj]:
        return list(self.cache.values())

    def start(self) -> asyncio.Task:
        self._task = asyncio.create_task(self._run(), name=f"informer-{self.kind.plural}")
        return self._task

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):
                pass

    def _emit(self, etype: str, obj: Obj, old: Obj | None) -> None:
        for h in self.handlers:
            try:
                h(etype, obj, old)
            except Exception:  # noqa: BLE001 - a handler bug must not stop the informer
                log.exception("informer handler failed for %s", key_of(obj))

    async def _relist(self) -> None:
        items, rv = await self.client.list(self.kind, self.namespace, label_selector=self.label_selector,
                                           field_selector=self.field_selector)
        fresh = {key_of(o): o for o in items}
        for key, old in list(self.cache.items()):
            if key not in fresh:
                self._drop(key)
                self._emit("DELETED", old, old)
        for key, obj in fresh.items():
            was = self.cache.get(key)
            self._put(key, obj)
            if was is None:
                self._emit("ADDED", obj, None)
            elif was.get("metadata", {}).get("resourceVersion") != obj.get("metadata", {}).get("resourceVersion"):
                self._emit("MODIFIED", obj, was)
        self._rv = rv
        self.synced.set()

    async def _run(self) -> None:
        backoff = 0.05
        need_list = True
        filtered = bool(self.label_selector or self.field_selector)
        while True:
            try:
                if need_list:
                    await self._relist()
                    need_list = False
                # As client-go's reflector: a watch's timeout is 5 to 10 minutes, drawn each
                # time (a thousand nodes' watches opened at once must not all end, and all list
                # again, at once), and bookmarks keep the revision it resumes from fresh (a
                # quiet watch resumed from an old one would be too old, and list again).
                async for etype, obj in self.client.watch(
                        self.kind, self.namespace, label_selector=self.label_selector,
                        field_selector=self.field_selector, resource_version=self._rv,
                        timeout_seconds=int(WATCH_TIMEOUT_SECONDS * (1 + random.random())), bookmarks=True):
                    if etype == "DELETED" and not filtered and Annotation.REPLACED_BY in objects.annotations(obj):
                        continue   # its ADDED follows, at the next revision (see the module doc)
                    self._rv = obj.get("metadata", {}).get("resourceVersion", self._rv)
                    key = key_of(obj)
                    old = self.cache.get(key)
                    if etype == "ADDED" and old is not None:
                        etype = "MODIFIED"   # the replacement of a DELETED taken above
                    if etype == "DELETED":
                        self._drop(key)
                    elif etype in ("ADDED", "MODIFIED"):
                        self._put(key, obj)
                    else:
                        continue
                    self._emit(etype, obj, old)
                backoff = 0.05
            except asyncio.CancelledError:
                raise
            except ApiError as e:
                # As client-go's reflector: a server that did not answer (connection refused
                # or cut) or asked to slow down (429) most likely still has the revision, so
                # the watch resumes from it; only a 410 or another refusal lists again.  A
                # thousand kubelets listing after one hiccup of the API server would hold it
                # far longer than the hiccup did.
                resumable = e.code in _RESUMABLE and bool(self._rv) and not need_list
                need_list = not resumable
                if e.code != 410:
                    log.debug("watch of %s failed (%s): %s", self.kind.plural,
                              "resuming" if resumable else "listing again", e)
                    await asyncio.sleep(backoff * (1 + random.random()))
                    backoff = min(backoff * 2, 2.0)
            except Exception as e:  # noqa: BLE001 - keep the cache alive across any failure
                log.warning("informer for %s: %s", self.kind.plural, e)
                need_list = True
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 2.0)


# ApiError codes after which a watch resumes from its revision: 0 is no answer at all
# (kube32.client.rest's connection errors).
_RESUMABLE = frozenset({0, 429})


def _revision(obj: Obj) -> int | None:
    try:
        return int(objects.meta(obj).get("resourceVersion", ""))
    except ValueError:
        return None


class MutationCache:
    """An informer's cache seen through a controller's own writes (client-go's
    MutationCache): ``get`` answers the newer of the informer's copy and the object the
    controller's last write returned, so a sync that runs before the informer shows that
    write neither acts on the stale copy nor GETs the object to find out.

    Invariant: an own write is remembered only until the informer catches up with it
    (a copy at least as new: Kube32's resourceVersions are one global revision, so they
    compare as integers) or the object is deleted; it never hides a newer copy."""

    def __init__(self, informer: Informer) -> None:
        self.informer = informer
        self._mine: dict[str, Obj] = {}
        informer.add_handler(self._on_event)

    def _on_event(self, etype: str, obj: Obj, old: Obj | None) -> None:
        key = key_of(obj)
        mine = self._mine.get(key)
        if mine is None:
            return
        seen, own = _revision(obj), _revision(mine)
        if etype == "DELETED" or seen is None or own is None or seen >= own \
                or objects.meta(obj).get("uid") != objects.meta(mine).get("uid"):
            del self._mine[key]

    def mutated(self, obj: Obj) -> Obj:
        """Remember ``obj``, a copy the controller got from the API (its write's answer, or a
        GET) that may be newer than the informer's; returns it."""
        key = key_of(obj)
        cached = self.informer.get(key)
        seen, own = (_revision(cached) if cached else None), _revision(obj)
        if own is not None and (seen is None or seen < own):
            self._mine[key] = obj
        return obj

    def get(self, key: str) -> Obj | None:
        return self._mine.get(key) or self.informer.get(key)
