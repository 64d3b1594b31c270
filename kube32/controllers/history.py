"""ControllerRevisions: the recorded templates of a DaemonSet, as Kubernetes'
``controller_history.go`` and the DaemonSet controller's ``constructHistory``.

A revision is an ``apps/v1`` ControllerRevision controlled by its DaemonSet, named
``<daemonset>-<hash>`` with the label ``controller-revision-hash: <hash>`` (the hash
the DaemonSet's pods carry: :func:`~.podutil.template_hash` of the template), the
template's labels (so the DaemonSet's selector finds it, as ``kubectl rollout history``
looks), the DaemonSet's annotations (``kubernetes.io/change-cause``), and as ``data`` the
strategic merge patch that brings the template back::

    {"spec": {"template": {..., "$patch": "replace"}}}

which ``kubectl rollout undo`` sends as it is.  Invariants :func:`plan` keeps:

* exactly one revision has the current template's hash, and it has the highest
  ``revision`` number (a template coming back, by an undo, renumbers its old revision
  to the top rather than recording it twice);
* at most ``revisionHistoryLimit`` (default 10) old revisions stay; the oldest go first,
  never one that live pods still run (their ``controller-revision-hash``).

Pure functions on plain dicts; the DaemonSet controller does the writes.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any, Iterable

from .. import objects
from ..terms import Label
from . import podutil as pu

Obj = dict[str, Any]
REVISION_LABEL = Label.CONTROLLER_REVISION_HASH
DEFAULT_HISTORY_LIMIT = 10


def revision_data(template: Obj) -> Obj:
    """The patch that restores ``template`` (Kubernetes' DaemonSet getPatch)."""
    t = copy.deepcopy(template)
    t["$patch"] = "replace"
    return {"spec": {"template": t}}


def revision_name(owner: Obj, h: str) -> str:
    return f"{objects.name(owner)}-{h}"


def new_revision(owner: Obj, api_version: str, kind: str, template: Obj, h: str, number: int) -> Obj:
    labels = dict(objects.labels(template))
    labels[REVISION_LABEL] = h
    md: Obj = {"name": revision_name(owner, h), "namespace": objects.meta(owner).get("namespace"),
               "labels": labels, "ownerReferences": [pu.owner_reference(owner, api_version, kind)]}
    annotations = dict(objects.annotations(owner))
    if annotations:
        md["annotations"] = annotations
    return {"apiVersion": "apps/v1", "kind": "ControllerRevision", "metadata": md,
            "data": revision_data(template), "revision": number}


def revision_number(rev: Obj) -> int:
    n = rev.get("revision")
    return n if isinstance(n, int) and not isinstance(n, bool) else 0


@dataclass
class Plan:
    create: int | None = None                            # a new revision of this number
    renumber: tuple[Obj, int] | None = None              # (revision, its new number)
    delete: list[Obj] = field(default_factory=list)


def _matches(rev: Obj, h: str, data: Obj) -> bool:
    return objects.labels(rev).get(REVISION_LABEL) == h or rev.get("data") == data


def plan(owner: Obj, revisions: list[Obj], template: Obj, h: str, live_hashes: Iterable[str]) -> Plan:
    """What to write so the history holds the current template on top, within its limit."""
    out = Plan()
    data = revision_data(template)
    top = max((revision_number(r) for r in revisions), default=0)
    current = sorted((r for r in revisions if _matches(r, h, data)), key=revision_number)
    if current:
        keep = current[-1]
        out.delete += current[:-1]                       # duplicates of the current template
        if revision_number(keep) < top:
            out.renumber = (keep, top + 1)
    else:
        keep = None
        out.create = top + 1
    limit = objects.spec(owner).get("revisionHistoryLimit", DEFAULT_HISTORY_LIMIT)
    limit = DEFAULT_HISTORY_LIMIT if not isinstance(limit, int) or isinstance(limit, bool) else max(limit, 0)
    live = set(live_hashes)
    old = sorted((r for r in revisions if r is not keep and r not in out.delete), key=revision_number)
    removable = [r for r in old if objects.labels(r).get(REVISION_LABEL) not in live]
    out.delete += removable[:max(len(old) - limit, 0)]
    return out
