"""Helpers shared by the workload controllers: pods, owners, templates, expectations (selectors: kube32.matching).

Everything here works on plain dicts (API objects as the informers cache them)
and never talks to the API server.  Invariants the controllers rely on:

* a pod is identified by ``namespace/name`` (:func:`pod_key`), never by uid: a
  pod may be *replaced* in one write by another component (same name, labels
  and owner, new uid, other node), and that is still one pod;
* :func:`template_hash` depends only on the template's content (and the
  collision count), so the same template always names the same ReplicaSet;
* a pod that failed to restore from a Checkpoint is not finished: the control plane
  replaces it in one write (:func:`awaits_replacement`), so no owner makes up for it;
* :class:`Expectations` remembers writes whose watch events have not arrived
  yet, so a controller reading a stale cache never creates or deletes twice.
"""
from __future__ import annotations

import copy
import datetime as dt
import hashlib
import json
import time
from dataclasses import dataclass, field
from typing import Any, Iterable

from .. import objects
from ..terms import Annotation, Condition, Label, PodPhase, PodReason


Obj = dict[str, Any]

POD_TEMPLATE_HASH = Label.POD_TEMPLATE_HASH
SAFE_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"  # k8s rand.SafeEncodeString: no vowels, no 0/1/3


# --- metadata -------------------------------------------------------------------


def pod_key(obj: Obj) -> str:
    m = objects.meta(obj)
    return f"{m.get('namespace', 'default')}/{m.get('name', '')}"










def owner_reference(owner: Obj, api_version: str, kind: str) -> Obj:
    """The controller reference a child of ``owner`` carries (GC deletes it with the owner)."""
    return {"apiVersion": api_version, "kind": kind, "name": objects.meta(owner)["name"],
            "uid": objects.meta(owner)["uid"], "controller": True, "blockOwnerDeletion": True}


def is_controlled_by(obj: Obj, owner: Obj) -> bool:
    ref = objects.controller_ref(obj)
    return ref is not None and ref.get("uid") == objects.meta(owner).get("uid")


# --- pod state --------------------------------------------------------------------


def is_terminating(pod: Obj) -> bool:
    return bool(objects.meta(pod).get("deletionTimestamp"))


def is_terminal(pod: Obj) -> bool:
    return objects.phase(pod) in PodPhase.TERMINAL


def awaits_replacement(pod: Obj) -> bool:
    """A pod that failed to restore from a Checkpoint (``kube32.io/restore-from``): the
    control plane replaces it under its name in one write - a move's rollback to its
    source, or the same pod started afresh (kube32.controllers.checkpoint, .restore) - so
    it is still the one pod its owner counts, not a finished one to make up for."""
    return objects.phase(pod) == PodPhase.FAILED and \
        Annotation.RESTORE_FROM in objects.annotations(pod)


def is_active(pod: Obj) -> bool:
    """Counts toward a controller's replicas: not being deleted, not finished (a pod that
    failed to restore is not finished: :func:`awaits_replacement`)."""
    return not is_terminating(pod) and (not is_terminal(pod) or awaits_replacement(pod))


def all_running(pod: Obj) -> bool:
    """Phase Running with every container's state ``running`` (and at least one container)."""
    status = objects.status(pod)
    states = [cs.get("state") or {} for cs in status.get("containerStatuses") or []]
    return status.get("phase") == PodPhase.RUNNING and bool(states) and all("running" in s for s in states)


def failure(pod: Obj) -> str | None:
    """Why a pod that has not been seen running failed, or None: the pod is Failed, or a
    container ended, or was restarted after it ended (a crash loop shows the ended try
    only in ``lastState``).  The message is the container's, else the pod's."""
    status = objects.status(pod)
    for cs in status.get("containerStatuses") or []:
        for st in (cs.get("state") or {}, cs.get("lastState") or {}):
            ended = st.get("terminated")
            if isinstance(ended, dict):
                return ended.get("message") or ended.get("reason") or "the container ended"
        if int(cs.get("restartCount") or 0) > 0:
            return ((cs.get("state") or {}).get("waiting") or {}).get("message") or "the container restarted"
    if status.get("phase") == PodPhase.FAILED:
        return status.get("message") or status.get("reason") or "the pod failed"
    return None


def rejected_at_admission(pod: Obj) -> str | None:
    """Why the pod's node refused to run it (the kubelet's admission: Failed with reason
    ``OutOf<resource>``, no container ever made there), or None.  Nothing of the pod ran,
    so a restore it was to make has not been tried: another node can make it."""
    status = objects.status(pod)
    reason = str(status.get("reason") or "")
    if status.get("phase") != PodPhase.FAILED or not reason.startswith(PodReason.OUT_OF) \
            or status.get("containerStatuses"):
        return None
    return status.get("message") or reason


def is_ready(pod: Obj) -> bool:
    c = objects.condition(pod, Condition.READY)
    return c is not None and c.get("status") == "True"


def is_available(pod: Obj, min_ready_seconds: int, at: dt.datetime | None = None) -> bool:
    """Ready for at least ``min_ready_seconds`` (measured from the Ready condition's transition)."""
    if not is_ready(pod):
        return False
    if min_ready_seconds <= 0:
        return True
    since = objects.parse_time((objects.condition(pod, Condition.READY) or {}).get("lastTransitionTime"))
    if since is None:
        return False
    return (at or objects.now()) - since >= dt.timedelta(seconds=min_ready_seconds)


def seconds_until_available(pod: Obj, min_ready_seconds: int) -> float | None:
    """When a Ready pod turns available (None: not Ready, or already available)."""
    if not is_ready(pod) or min_ready_seconds <= 0:
        return None
    since = objects.parse_time((objects.condition(pod, Condition.READY) or {}).get("lastTransitionTime"))
    if since is None:
        return None
    left = (since + dt.timedelta(seconds=min_ready_seconds) - objects.now()).total_seconds()
    return left if left > 0 else None


def deletion_rank(pod: Obj) -> tuple:
    """Sort key: pods to delete first come first (as k8s ActivePods' Less).

    Unscheduled before scheduled, Pending before Unknown before Running,
    not-ready before ready, ready for less time first, more restarts first,
    newer before older; the name breaks ties so the order is deterministic.
    """
    status = objects.status(pod)
    rank_of = {PodPhase.PENDING: 0, PodPhase.UNKNOWN: 1, PodPhase.RUNNING: 2}
    phase_rank = rank_of.get(status.get("phase", PodPhase.PENDING), 0)
    ready_since = objects.parse_time((objects.condition(pod, Condition.READY) or {}).get("lastTransitionTime"))
    restarts = sum(int(c.get("restartCount", 0)) for c in status.get("containerStatuses") or [])
    created = objects.parse_time(objects.meta(pod).get("creationTimestamp"))
    return (1 if objects.spec(pod).get("nodeName") else 0,
            phase_rank,
            1 if is_ready(pod) else 0,
            -(ready_since.timestamp() if ready_since and is_ready(pod) else 0),
            -restarts,
            -(created.timestamp() if created else 0),
            objects.meta(pod).get("name", ""))


# --- templates --------------------------------------------------------------------
def safe_encode(digest: bytes, length: int) -> str:
    n = int.from_bytes(digest, "big")
    out = []
    for _ in range(length):
        n, r = divmod(n, len(SAFE_ALPHABET))
        out.append(SAFE_ALPHABET[r])
    return "".join(out)


def template_hash(template: Obj, collision_count: int = 0) -> str:
    """A short stable hash of a pod template (labels with ``pod-template-hash`` ignored)."""
    t = copy.deepcopy(template or {})
    labels = objects.meta(t).get("labels")
    if isinstance(labels, dict):
        labels.pop(POD_TEMPLATE_HASH, None)
    text = json.dumps(t, sort_keys=True, separators=(",", ":"))
    if collision_count:
        text += f"#{collision_count}"
    return safe_encode(hashlib.sha256(text.encode()).digest(), 10)


def templates_equal_ignoring_hash(a: Obj | None, b: Obj | None) -> bool:
    """Equal pod templates once ``pod-template-hash`` is dropped (k8s EqualIgnoreHash)."""
    def strip(t: Obj | None) -> Obj:
        t = copy.deepcopy(t or {})
        t.setdefault("metadata", {})
        labels = dict(objects.labels(t))
        labels.pop(POD_TEMPLATE_HASH, None)
        t["metadata"]["labels"] = labels
        for k in ("creationTimestamp",):
            t["metadata"].pop(k, None)
        if not t["metadata"].get("annotations"):
            t["metadata"].pop("annotations", None)
        return t
    return strip(a) == strip(b)


def pod_from_template(template: Obj, owner: Obj, api_version: str, kind: str, *,
                      generate_name: str | None = None) -> Obj:
    """A new pod for ``owner``: the template's labels, annotations and spec, owned by it."""
    tmd = objects.meta(template)
    meta: Obj = {"generateName": generate_name or f"{objects.meta(owner)['name']}-",
                 "namespace": objects.meta(owner).get("namespace", "default"),
                 "labels": dict(tmd.get("labels") or {}),
                 "ownerReferences": [owner_reference(owner, api_version, kind)]}
    if tmd.get("annotations"):
        meta["annotations"] = dict(tmd["annotations"])
    if tmd.get("finalizers"):
        meta["finalizers"] = list(tmd["finalizers"])
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta,
            "spec": copy.deepcopy(objects.spec(template))}


# --- expectations -------------------------------------------------------------------
EXPECTATIONS_TIMEOUT = 300.0  # a lost watch event must not block a controller forever


@dataclass
class _Expect:
    adds: int = 0
    deletes: set[str] = field(default_factory=set)  # pod keys (namespace/name)
    stamp: float = field(default_factory=time.monotonic)


class Expectations:
    """Creates and deletes a controller made and has not yet seen in its informer.

    As client-go's UIDTrackingControllerExpectations, but deletions are tracked
    by pod *name*: a pod replaced in one write keeps its name and is never
    "seen deleted" nor "seen created" by that replacement.  A controller whose
    expectations are not satisfied only updates status; it does not create or
    delete until its cache caught up (or the expectations expired).
    """

    def __init__(self, timeout: float = EXPECTATIONS_TIMEOUT) -> None:
        self.timeout = timeout
        self._by_owner: dict[str, _Expect] = {}

    def satisfied(self, owner_key: str) -> bool:
        e = self._by_owner.get(owner_key)
        if e is None:
            return True
        if e.adds <= 0 and not e.deletes:
            return True
        return time.monotonic() - e.stamp > self.timeout

    def expect_creations(self, owner_key: str, count: int) -> None:
        e = self._by_owner.setdefault(owner_key, _Expect())
        e.adds = max(e.adds, 0) + count
        e.stamp = time.monotonic()

    def expect_deletions(self, owner_key: str, pod_keys: Iterable[str]) -> None:
        e = self._by_owner.setdefault(owner_key, _Expect())
        e.deletes.update(pod_keys)
        e.stamp = time.monotonic()

    def creation_observed(self, owner_key: str) -> None:
        e = self._by_owner.get(owner_key)
        if e is not None and e.adds > 0:
            e.adds -= 1

    def deletion_observed(self, owner_key: str, pod_key_: str) -> None:
        e = self._by_owner.get(owner_key)
        if e is not None:
            e.deletes.discard(pod_key_)

    def pending(self, owner_key: str) -> tuple[int, frozenset[str]]:
        e = self._by_owner.get(owner_key)
        return (e.adds, frozenset(e.deletes)) if e else (0, frozenset())

    def forget(self, owner_key: str) -> None:
        self._by_owner.pop(owner_key, None)


def owner_key_of(pod: Obj, kind: str) -> str | None:
    """``namespace/name`` of the pod's controller when it is of ``kind``."""
    ref = objects.controller_ref(pod)
    if ref is None or ref.get("kind") != kind:
        return None
    return f"{objects.meta(pod).get('namespace', 'default')}/{ref.get('name', '')}"


def observe_pod(expectations: "Expectations", etype: str, pod: Obj, old: Obj | None, kind: str) -> set[str]:
    """A pod event as a controller of ``kind`` counts it (replica_set.go's addPod/
    deletePod): the creation or deletion it expected is observed; returns the owners to
    sync (the pod's controller now and, when it changed, before)."""
    what = pod_event_kind(etype, pod, old)
    owner = owner_key_of(pod, kind)
    if what == "added" and owner:
        expectations.creation_observed(owner)
    elif what == "deleted" and owner:
        expectations.deletion_observed(owner, pod_key(pod))
    old_owner = owner_key_of(old, kind) if old else None
    return {k for k in (owner, old_owner) if k}


def pod_event_kind(etype: str, pod: Obj, old: Obj | None) -> str:
    """What an informer event means for a controller counting pods by name.

    ``added`` / ``deleted`` (a new name / a name gone, or marked for deletion),
    ``replaced`` (MODIFIED with a new uid: another component swapped the pod in
    one write — still the same pod for counting), or ``updated``.
    """
    if etype == "ADDED":
        return "deleted" if is_terminating(pod) else "added"
    if etype == "DELETED":
        return "deleted"
    if old is not None and objects.uid(old) and objects.uid(pod) != objects.uid(old):
        return "replaced"
    if is_terminating(pod) and (old is None or not is_terminating(old)):
        return "deleted"
    return "updated"
