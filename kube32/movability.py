"""What keeps a pod from moving, as the control plane sees it from the pod spec.

The spec's table ("What keeps a pod from moving"), word for word.  Pure functions
over plain pod dicts: the API server (evictions) and the controllers (moves,
checkpoints) both ask here, so both refuse for the same reasons.  The node finds
the rest (open files, a call that outlasts the freeze, entry points of images the
control plane does not hold).

Imports only the terms and accessors (kube32.terms, kube32.objects).
"""
from __future__ import annotations

from typing import Any, Iterable

from . import objects
from .terms import (IMAGE_REFERENCE_PREFIX, SD_VOLUME, Annotation, CheckpointAction, CheckpointPhase, Condition,
                    Policy, Resource)

# The facts of a stored snapshot in a Checkpoint's status (spec: "Checkpoint objects and data").
SNAPSHOT_FACTS = ("sizeBytes", "snapshotSha256", "imageSha256", "podTimeMs")
BLOCKING_CAPABILITIES = ("DISPLAY", "KEYBOARD", "SPEAKER", "SD", "CHIP_TEMP")
ENTRY_POINTS = ("_start", "app_main", "main")


def data_gone(ck: dict[str, Any] | None) -> dict[str, Any] | None:
    """The ``DataStored=False`` condition of a Checkpoint whose data is gone (dropped to
    make room, or lost with a control plane restart), else None."""
    for c in objects.status(ck).get("conditions") or []:
        if isinstance(c, dict) and c.get("type") == Condition.DATA_STORED and c.get("status") == "False":
            return c
    return None


def rolled_back(ck: dict[str, Any] | None) -> bool:
    """``ck`` is a move that failed after its replacement: the pod went back (to its source,
    or to the scheduler) as ``status.rollbackPodUID``, instead of moving."""
    st = objects.status(ck)
    return st.get("phase") == CheckpointPhase.FAILED and bool(st.get("rollbackPodUID"))


def rolled_back_to_source(ck: dict[str, Any] | None) -> bool:
    """``ck`` rolled back (:func:`rolled_back`) and the pod went back to the node it was to
    leave (``status.rollbackNode`` is its ``status.nodeName``), not to another node or the
    scheduler."""
    st = objects.status(ck)
    return rolled_back(ck) and bool(st.get("nodeName")) and st.get("rollbackNode") == st.get("nodeName")


def restore_from(pod: dict[str, Any]) -> str | None:
    """The Checkpoint a pod restores from (``kube32.io/restore-from``), if any."""
    return objects.annotations(pod).get(Annotation.RESTORE_FROM) or None


def replacement_of_move(ck: dict[str, Any] | None, pod: dict[str, Any]) -> bool:
    """``pod`` is the replacement of ``ck``, a move under way: the Checkpoint controller
    alone decides what becomes of it (it completes, or rolls back to its source from the
    same Checkpoint); deleting it would lose the pod's state.  Still ``Saving`` counts: the
    Moving status follows the replacement by a moment, and a small pod may run, or fail
    to restore, before it."""
    st = objects.status(ck)
    uid = objects.meta(pod).get("uid")
    if not uid or restore_from(pod) != objects.meta(ck).get("name"):
        return False
    if st.get("phase") == CheckpointPhase.MOVING:
        return st.get("newPodUID") == uid
    return st.get("phase") == CheckpointPhase.SAVING and objects.spec(ck).get("action") == CheckpointAction.MOVE \
        and st.get("targetNode") == objects.spec(pod).get("nodeName") and st.get("podUID") not in (None, uid)


def policy(pod: dict[str, Any]) -> str:
    value = objects.annotations(pod).get(Annotation.MIGRATION, Policy.ON_DRAIN)
    return value if value in Policy.ALL else Policy.ON_DRAIN


def _containers(pod: dict[str, Any]) -> list[dict[str, Any]]:
    spec = objects.spec(pod)
    return list(spec.get("containers") or []) + list(spec.get("initContainers") or [])


def _hardware_resources(pod: dict[str, Any]) -> list[str]:
    found: list[str] = []
    for c in _containers(pod):
        res = c.get("resources") or {}
        for section in ("requests", "limits"):
            for name in (res.get(section) or {}):
                blocking = name.startswith(Resource.EXTENDED_PREFIXES) and name != Resource.IPC
                if blocking and name not in found:
                    found.append(name)
    return found


def _capabilities(pod: dict[str, Any]) -> list[str]:
    found: list[str] = []
    for c in _containers(pod):
        added = (((c.get("securityContext") or {}).get("capabilities") or {}).get("add") or [])
        for cap in added:
            name = str(cap).upper().removeprefix("CAP_")
            if name in BLOCKING_CAPABILITIES and name not in found:
                found.append(name)
    return found


def _has_i2c_grant(pod: dict[str, Any]) -> bool:
    annotations = objects.annotations(pod)
    if any(k == Annotation.I2C_GRANT or k.startswith(Annotation.I2C_GRANT + "/") for k in annotations):
        return True
    return any(Annotation.I2C_GRANT in ((c.get("resources") or {}).get(s) or {})
               for c in _containers(pod) for s in ("requests", "limits"))


def _node_storage_claims(pod: dict[str, Any]) -> list[str]:
    claims: list[str] = []
    for v in objects.spec(pod).get("volumes") or []:
        if v.get("persistentVolumeClaim"):
            claims.append(v["persistentVolumeClaim"].get("claimName") or v.get("name", ""))
        elif v.get(SD_VOLUME) is not None or (v.get("csi") or {}).get("driver") == SD_VOLUME:
            claims.append(v.get("name", ""))
    return claims


def spec_blockers(pod: dict[str, Any], image_exports: Iterable[str] | None = None) -> list[str]:
    """Every reason the control plane finds, in the spec's words and order.

    ``image_exports``: the exports of the pod's embedded image when the control plane
    holds it (None for ``wasm://`` images, whose exports only the node sees).
    """
    blockers = [f"grant {r}" for r in _hardware_resources(pod)]
    blockers += [f"grant capability {c}" for c in _capabilities(pod)]
    if _has_i2c_grant(pod):
        blockers.append(f"grant {Annotation.I2C_GRANT}")
    blockers += [f"volume claim {c} on node storage" for c in _node_storage_claims(pod)]
    if policy(pod) == Policy.NEVER:
        blockers.append(f"annotation {Annotation.MIGRATION}: Never")
    if image_exports is not None:
        exports = set(image_exports)
        entry = next((e for e in ENTRY_POINTS if e in exports), None)
        if entry is not None:
            blockers.append(f"entry point {entry} runs on its own thread")
    return blockers


def topics(pod: dict[str, Any]) -> tuple[str, ...]:
    """The event topics of the pod spec (annotation ``kube32.io/events``), in its order:
    what the kubelet subscribes the pod to, and what the control plane holds for it
    during a move."""
    value = objects.annotations(pod).get(Annotation.TOPICS, "")
    return tuple(dict.fromkeys(t.strip() for t in str(value).split(",") if t.strip()))


def embedded_digest(image: str) -> str | None:
    """The digest of an embedded image reference ``kube32.io/wasm-sha256:<hex>``."""
    prefix = IMAGE_REFERENCE_PREFIX
    return image[len(prefix):].lower() if image.startswith(prefix) else None


MIN_CHECKPOINT_INTERVAL = 10.0


def parse_interval(text: str) -> float:
    """A checkpoint interval ("60s", "2m", "1h30m", "500ms", or plain seconds) in seconds.

    Raises ValueError with the message users see; intervals under 10 s are refused."""
    import re
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|h|m|s)", text.strip())
    units = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}
    try:
        if not parts:
            seconds = float(text)
        elif "".join(n + u for n, u in parts) != text.strip():
            raise ValueError
        else:
            seconds = sum(float(n) * units[u] for n, u in parts)
    except ValueError:
        raise ValueError(f'"{text}" is not a duration (use e.g. "60s", "5m")') from None
    if seconds < MIN_CHECKPOINT_INTERVAL:
        raise ValueError(f'"{text}": the checkpoint interval must be at least 10s')
    return seconds
