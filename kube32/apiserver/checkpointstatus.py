"""What a Checkpoint's status says of its data (spec: "Checkpoint objects and data").

The snapshot facts in status (``movability.SNAPSHOT_FACTS``: ``sizeBytes``,
``snapshotSha256``, ``imageSha256``, ``podTimeMs``) are facts of the *stored* snapshot, so
they are there exactly while the data is.  When the data goes and the Checkpoint stays -
dropped to make room for newer data, or lost with a control plane restart - the API
server removes them and sets the condition ``DataStored`` to ``False``, its reason
``Dropped``, ``ControlPlaneRestarted`` or (several API servers on etcd) ``APIServerLost``
and a message that says so.  The phase keeps
telling what the Checkpoint did (a Save that was stored stays ``Saved``, a move that
completed ``Completed``); ``kubectl get checkpoints`` shows SIZE ``<none>``, and ``-o
wide`` the condition's message when ``status.message`` says nothing else.  Storing data
again (a PUT) writes the facts and removes the condition.  Deleting a Checkpoint takes its
data with it: nothing is left to tell.

Invariants: facts and a ``DataStored=False`` condition are never both in a status; this
module is the one place that writes either state (the data subresource calls
:func:`stored`, :func:`dropped`; the control plane's start :func:`lost_at_start`; an
API server whose peer went, :func:`lost_with_peer`).
"""
from __future__ import annotations

import asyncio
import datetime as dt
import logging
from typing import Any, Awaitable, Callable, Iterable

from .. import movability, objects
from ..terms import CheckpointPhase, Condition
from . import errors
from .registry import Registry
from .resources import Resource, by_plural

log = logging.getLogger("kube32.apiserver.checkpointstatus")
Obj = dict[str, Any]

gone = movability.data_gone
RESTARTED = ("ControlPlaneRestarted", "the checkpoint's data was lost when the control plane restarted "
                                      "(it lives in the control plane's memory)")
PEER_LOST = ("APIServerLost", "the checkpoint's data was lost with the API server that held it (it lives in "
                              "that API server's memory, and that API server's Lease expired)")
DROPPED = ("Dropped", "the checkpoint's data was dropped to make room for newer checkpoint data "
                      "(the control plane's checkpoint space was full)")


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _other_conditions(status: Obj) -> list[Obj]:
    return [c for c in status.get("conditions") or []
            if not (isinstance(c, dict) and c.get("type") == Condition.DATA_STORED)]


def stored(status: Obj, facts: Obj) -> None:
    """``status`` of a Checkpoint whose data was just stored: the facts, no gone condition."""
    status.update(facts)
    rest = _other_conditions(status)
    if rest:
        status["conditions"] = rest
    else:
        status.pop("conditions", None)


def mark_gone(status: Obj, why: tuple[str, str]) -> None:
    """``status`` of a Checkpoint whose data went (``why``: reason, message)."""
    for k in movability.SNAPSHOT_FACTS:
        status.pop(k, None)
    reason, message = why
    status["conditions"] = _other_conditions(status) + [
        {"type": Condition.DATA_STORED, "status": "False", "reason": reason, "message": message,
         "lastTransitionTime": _now()}]


def _had_data(ck: Obj) -> bool:
    """Held data, or may have: its facts are there, or a move was under way."""
    st = objects.status(ck)
    return any(k in st for k in movability.SNAPSHOT_FACTS) or st.get("phase") in CheckpointPhase.IN_FLIGHT


def _checkpoints() -> Resource:
    return by_plural("checkpoints")


async def _mark(registry: Registry, cks: Iterable[Obj], why: tuple[str, str],
                still: Callable[[Obj], bool]) -> None:
    res = _checkpoints()
    for ck in cks:
        md = ck["metadata"]

        def change(obj: Obj, uid: str = md["uid"]) -> Obj | None:
            if obj["metadata"]["uid"] != uid or gone(obj) is not None or not still(obj):
                return None
            mark_gone(obj.setdefault("status", {}), why)
            return obj
        try:
            await registry.mutate(res, md.get("namespace"), md["name"], change, subresource="status")
        except errors.APIError as e:
            if e.code != 404:
                log.warning("cannot mark checkpoint %s/%s without data: %s", md.get("namespace"), md["name"], e)


async def lost_at_start(registry: Registry) -> None:
    """At the control plane's start, with no data held yet: every Checkpoint that held data
    lost it with the restart."""
    items, _ = await registry.list(_checkpoints(), None)
    await _mark(registry, [c for c in items if _had_data(c) and gone(c) is None], RESTARTED, _had_data)


async def dropped(registry: Registry, going: Iterable[tuple[str, str, str]],
                  has_data: Callable[[str], bool]) -> None:
    """The data of these Checkpoints (namespace, name, uid) was dropped to make room; one
    that has data again by the time it is marked (stored anew meanwhile) is left alone."""
    await _mark(registry, [{"metadata": {"namespace": ns, "name": name, "uid": uid}} for ns, name, uid in going],
                DROPPED, lambda ck: not has_data(ck["metadata"]["uid"]))


RECHECK_SECONDS = 1.0  # a second look: facts are written just before the data is kept


def _has_facts(ck: Obj) -> bool:
    st = objects.status(ck)
    return gone(ck) is None and any(k in st for k in movability.SNAPSHOT_FACTS)


async def lost_with_peer(registry: Registry, held: Callable[[Obj], Awaitable[bool]]) -> int:
    """After another API server went (its Lease expired): every Checkpoint that says it
    has data that no API server still running holds (``held``: asked here and at the
    peers, twice, `RECHECK_SECONDS` apart) lost it with that API server.  Returns how many."""
    items, _ = await registry.list(_checkpoints(), None)
    missing = [c for c in items if _has_facts(c) and not await held(c)]
    if missing:
        await asyncio.sleep(RECHECK_SECONDS)
        missing = [c for c in missing if not await held(c)]
    await _mark(registry, missing, PEER_LOST, _has_facts)
    return len(missing)
