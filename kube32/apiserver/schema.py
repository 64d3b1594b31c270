"""The OpenAPI schema of kube32.io/v1 Checkpoint, as the spec describes its fields.

Written in OpenAPI v2's form (refs to ``#/definitions/``), the form of the vendored
Kubernetes definitions (kube32.apiserver.openapi), under the names kube-apiserver gives
a custom resource's schemas (``io.kube32.v1.Checkpoint``).  The descriptions are the
spec's ("Checkpoint objects and data"), so ``kubectl explain checkpoint.spec`` tells what
the spec tells; the phases and actions are kube32.terms', the one place they are named.
"""
from __future__ import annotations

from typing import Any

from ..terms import API_VERSION, GROUP, VERSION, CheckpointAction, CheckpointPhase

KIND = "Checkpoint"
NAME = "io.kube32.v1.Checkpoint"
LIST_NAME = "io.kube32.v1.CheckpointList"
_META = "#/definitions/io.k8s.apimachinery.pkg.apis.meta.v1."


def _s(description: str, type_: str = "string", **more: Any) -> dict[str, Any]:
    return {"description": description, "type": type_, **more}


def _ref(name: str, description: str) -> dict[str, Any]:
    return {"$ref": f"#/definitions/{name}", "description": description}


_TYPE_META = {
    "apiVersion": _s("APIVersion defines the versioned schema of this representation of an object: "
                     f"{API_VERSION}."),
    "kind": _s("Kind is a string value representing the REST resource this object represents: Checkpoint."),
}

SPEC = {
    "description": "What to checkpoint and what to do with the snapshot.",
    "type": "object",
    "required": ["podName"],
    "properties": {
        "podName": _s("The pod, required."),
        "containerName": _s("Its container. Default: the only container."),
        "action": _s(f"`{CheckpointAction.SAVE}` (the default) or `{CheckpointAction.MOVE}`. Save stores the "
                     "pod's state and keeps it running; Move moves the pod, with its state, to another node.",
                     enum=list(CheckpointAction.ALL), default=CheckpointAction.SAVE),
        "target": {
            "description": "For `Move`: `nodeName` or `nodeSelector`. Without either the scheduler picks the "
                           "node. It is never the node the pod runs on, nor one cordoned or not Ready.",
            "type": "object",
            "properties": {
                "nodeName": _s("The node to move the pod to."),
                "nodeSelector": _s("Labels the target node must have, added to the pod's own node selector.",
                                   "object", additionalProperties={"type": "string"}),
            },
        },
    },
}

STATUS = {
    "description": "Where the checkpoint stands, the facts of its stored snapshot and the outcome of a move. "
                   "Written by the Checkpoint controller through the status subresource only.",
    "type": "object",
    "properties": {
        "phase": _s(", ".join(f"`{p}`" for p in CheckpointPhase.ALL[:-1]) + f" or `{CheckpointPhase.FAILED}`. "
                    "Pending: created, not started. Saving: the node freezes the pod and sends its state. "
                    "Saved: a Save checkpoint is stored. Moving: the replacement is restoring on the target. "
                    "Completed: the replacement runs on the target. Failed: refused or rolled back, see "
                    "message and blockers.", enum=list(CheckpointPhase.ALL)),
        "nodeName": _s("Where the snapshot was taken."),
        "takenAt": _s("When the snapshot was taken.", format="date-time"),
        "sizeBytes": _s("The size of the stored snapshot, in bytes.", "integer", format="int64"),
        "snapshotSha256": _s("The stored snapshot's trailer: the SHA-256 of the bytes before it."),
        "imageSha256": _s("The SHA-256 of the module the snapshot was taken from."),
        "podTimeMs": _s("The pod's clock at the snapshot, in milliseconds.", "integer", format="int64"),
        "targetNode": _s("The outcome of a move: the node the pod moves to."),
        "newPodName": _s("The outcome of a move: the replacement pod's name."),
        "message": _s("The outcome of a move: why it failed or what it did."),
        "blockers": _s("The outcome of a move: every reason the pod cannot move.", "array",
                       items={"type": "string"}),
        "conditions": _s("The checkpoint's conditions; `DataStored` is `False` while its data is gone "
                         "(dropped for room, or lost with a control plane restart).", "array",
                         items={"$ref": _META + "Condition"}),
    },
    # The controller keeps a few more facts of a move in progress (its pods' uids, times).
    "x-kubernetes-preserve-unknown-fields": True,
}

CHECKPOINT = {
    "description": "A Checkpoint saves a pod's state (Save) or moves the pod with its state to another node "
                   "(Move). Its snapshot is the Checkpoint's data subresource.",
    "type": "object",
    "required": ["spec"],
    "properties": {
        **_TYPE_META,
        "metadata": _ref("io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta", "Standard object's metadata."),
        "spec": SPEC,
        "status": STATUS,
    },
    "x-kubernetes-group-version-kind": [{"group": GROUP, "kind": KIND, "version": VERSION}],
}

CHECKPOINT_LIST = {
    "description": "A list of Checkpoints.",
    "type": "object",
    "required": ["items"],
    "properties": {
        **_TYPE_META,
        "items": {"description": "The Checkpoints.", "type": "array", "items": {"$ref": f"#/definitions/{NAME}"}},
        "metadata": _ref("io.k8s.apimachinery.pkg.apis.meta.v1.ListMeta", "Standard list metadata."),
    },
    "x-kubernetes-group-version-kind": [{"group": GROUP, "kind": f"{KIND}List", "version": VERSION}],
}

DEFINITIONS: dict[str, dict[str, Any]] = {NAME: CHECKPOINT, LIST_NAME: CHECKPOINT_LIST}
