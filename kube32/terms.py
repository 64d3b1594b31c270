"""The API's terms: one name for each phase, action, annotation, label, taint and
condition that Kube32's components write or read.

A component that writes ``"Saving"`` and one that reads it must mean one thing; so each
such string is spelt once, here, and every module names it by its constant.  Kubernetes'
own terms are here too where Kube32 uses them (pod phases, node conditions, the taints
of a node's state), spelt as Kubernetes spells them.  Values are plain ``str`` (they go
into JSON and YAML as they are); the classes are namespaces, never instantiated.

Imports nothing: any layer may use it.
"""
from __future__ import annotations

from typing import Final

GROUP: Final = "kube32.io"          # the API group of Kube32's own kinds and paths
VERSION: Final = "v1"
API_VERSION: Final = f"{GROUP}/{VERSION}"   # Checkpoints
# Every path of Kube32's own API starts so; kube32.urlpath.group_path builds one from names.
GROUP_PATH: Final = f"/apis/{GROUP}/{VERSION}"
# kube-system's Lease the control planes elect their controllers' leader on (written by
# the control planes' own identity, system:kube-apiserver, alone).
CONTROLLER_MANAGER_LEASE: Final = "kube32-controller-manager"
NODE_LEASE_NAMESPACE: Final = "kube-node-lease"   # each node's Lease, named as the node
# An image in the control plane's module store: this prefix and the module's sha256 (hex).
IMAGE_REFERENCE_PREFIX: Final = "kube32.io/wasm-sha256:"


class CheckpointPhase:
    """``status.phase`` of a Checkpoint (spec: "Checkpoint objects and data")."""
    PENDING: Final = "Pending"
    SAVING: Final = "Saving"        # its snapshot is on the way (a Save, or a move before its replacement)
    SAVED: Final = "Saved"
    MOVING: Final = "Moving"        # a move's replacement exists and restores
    COMPLETED: Final = "Completed"
    FAILED: Final = "Failed"
    ALL: Final = (PENDING, SAVING, SAVED, MOVING, COMPLETED, FAILED)
    FINISHED: Final = (SAVED, COMPLETED, FAILED)
    IN_FLIGHT: Final = (SAVING, MOVING)   # its data may still be written or read for it


class CheckpointAction:
    """``spec.action`` of a Checkpoint."""
    SAVE: Final = "Save"
    MOVE: Final = "Move"
    ALL: Final = (SAVE, MOVE)


class PodPhase:
    """``status.phase`` of a Pod (Kubernetes')."""
    PENDING: Final = "Pending"
    RUNNING: Final = "Running"
    SUCCEEDED: Final = "Succeeded"
    FAILED: Final = "Failed"
    UNKNOWN: Final = "Unknown"
    TERMINAL: Final = (SUCCEEDED, FAILED)


class PodReason:
    """``status.reason`` of a Pod, as Kubernetes' kubelet writes it."""
    # + the resource short (OutOfmemory, OutOfpods): the kubelet's admission refused the pod,
    # which never ran there (Failed, no container status).
    OUT_OF: Final = "OutOf"


class ContainerReason:
    """``reason`` of a container's terminated state (and of its Events), as Kubernetes'."""
    ERROR: Final = "Error"              # it ran and failed (a trap, a call past its timeout)
    # It never started: the start function or k32_init did not return in time
    # (containerd's StartError); its Event is Failed, "Error: ...", as the kubelet's.
    START_ERROR: Final = "StartError"
    FAILED_EVENT: Final = "Failed"
    COMPLETED: Final = "Completed"      # it returned (exit 0)
    RESTORE_ERROR: Final = "RestoreError"   # its snapshot could not be restored (also its Event)
    # ``reason`` of a container's waiting state, as Kubernetes' kubelet writes it; the
    # kubelet's own answers (logs, attach) say which.
    CONTAINER_CREATING: Final = "ContainerCreating"
    ERR_IMAGE_PULL: Final = "ErrImagePull"          # the first pull failed
    IMAGE_PULL_BACK_OFF: Final = "ImagePullBackOff"  # ... and the next ones


class StatusReason:
    """``reason`` of a Status a node answers the control plane's move with (the kubelet
    writes it, the Checkpoint controller reads it)."""
    NOT_MOVABLE: Final = "NotMovable"   # a blocker keeps the pod where it is (409)
    TIMEOUT: Final = "Timeout"          # the freeze did not finish in time (504; Kubernetes' StatusReasonTimeout)
    ERR_IMAGE_PULL: Final = ContainerReason.ERR_IMAGE_PULL   # a pre-pull failed (502)
    INVALID_IMAGE: Final = "InvalidImage"   # ... its module is not a valid one (422)


class Header:
    """Kube32's own HTTP headers, between its components."""
    PREFIX: Final = "X-Kube32-"   # each starts so (an API server passes a node's on as they came)
    # A snapshot's facts, from the kubelet that took it (kube32.kubelet.migration) to the
    # API server that stores it (kube32.apiserver.checkpointdata) and the controller.
    IMAGE_SHA256: Final = "X-Kube32-Image-Sha256"
    SNAPSHOT_SHA256: Final = "X-Kube32-Snapshot-Sha256"
    POD_TIME_MS: Final = "X-Kube32-Pod-Time-Ms"
    FROZEN_AT_MS: Final = "X-Kube32-Frozen-At-Ms"
    HELD_EVENTS: Final = "X-Kube32-Held-Events"
    # The API server passes on a node's refusal of a snapshot as it came, marked so.
    FROM_NODE: Final = "X-Kube32-From-Node"
    PEER: Final = "X-Kube32-Peer"                 # a request between HA API servers
    NOT_STARTED: Final = "X-Kube32-Not-Started"   # the kubelet: the pod did not take it (kube32.holding)
    HOLD_ORDER: Final = "X-Kube32-Hold-Order"     # "<stream>:<n>": the n-th held request sent a pod (kube32.holding)


# TokenReview's user.extra keys naming the node a token is bound to (Kubernetes' own, as on
# node-bound ServiceAccount tokens): the API server writes them, kubelets read them.
NODE_NAME_EXTRA: Final = "authentication.kubernetes.io/node-name"
NODE_UID_EXTRA: Final = "authentication.kubernetes.io/node-uid"


class Condition:
    """Condition types (``status.conditions[].type``)."""
    READY: Final = "Ready"                        # pods and nodes
    POD_SCHEDULED: Final = "PodScheduled"
    POD_READY_TO_START_CONTAINERS: Final = "PodReadyToStartContainers"
    INITIALIZED: Final = "Initialized"
    CONTAINERS_READY: Final = "ContainersReady"
    MEMORY_PRESSURE: Final = "MemoryPressure"     # nodes
    DISK_PRESSURE: Final = "DiskPressure"
    PID_PRESSURE: Final = "PIDPressure"
    # A node's conditions its kubelet owns (what the node lifecycle marks Unknown; others,
    # node-problem-detector's, are left to their owner, as Kubernetes' nodeConditionTypes).
    KUBELET_NODE: Final = (READY, MEMORY_PRESSURE, DISK_PRESSURE, PID_PRESSURE)
    DISRUPTION_ALLOWED: Final = "DisruptionAllowed"   # PodDisruptionBudgets
    DATA_STORED: Final = "DataStored"             # Checkpoints: False while the data is gone
    JOB_COMPLETE: Final = "Complete"              # Jobs (batch/v1): finished, every completion made
    JOB_FAILED: Final = "Failed"                  # Jobs: finished without them
    JOB_SUSPENDED: Final = "Suspended"
    # Interim (Kubernetes 1.31+): set when the Job's fate is known, Failed/Complete follow
    # (same reason and message) once none of its pods is left running or terminating.
    JOB_FAILURE_TARGET: Final = "FailureTarget"
    JOB_SUCCESS_CRITERIA_MET: Final = "SuccessCriteriaMet"
    DEPLOYMENT_AVAILABLE: Final = "Available"     # Deployments (apps/v1)
    DEPLOYMENT_PROGRESSING: Final = "Progressing"
    CRD_ESTABLISHED: Final = "Established"        # CustomResourceDefinitions
    CRD_NAMES_ACCEPTED: Final = "NamesAccepted"
    CRD_TERMINATING: Final = "Terminating"


class DeploymentReason:
    """``reason`` of a Deployment's conditions, as Kubernetes' deployment controller writes
    it (the controller reads its own last one back to tell progress from a deadline)."""
    MINIMUM_REPLICAS_AVAILABLE: Final = "MinimumReplicasAvailable"
    MINIMUM_REPLICAS_UNAVAILABLE: Final = "MinimumReplicasUnavailable"
    PAUSED: Final = "DeploymentPaused"
    NEW_REPLICA_SET_AVAILABLE: Final = "NewReplicaSetAvailable"
    NEW_REPLICA_SET_CREATED: Final = "NewReplicaSetCreated"
    PROGRESS_DEADLINE_EXCEEDED: Final = "ProgressDeadlineExceeded"
    REPLICA_SET_UPDATED: Final = "ReplicaSetUpdated"


class NamespacePhase:
    """``status.phase`` of a Namespace (Kubernetes')."""
    ACTIVE: Final = "Active"
    TERMINATING: Final = "Terminating"


class JobReason:
    """``reason`` of a Job's finishing conditions, as Kubernetes' job controller writes it."""
    BACKOFF_LIMIT_EXCEEDED: Final = "BackoffLimitExceeded"
    DEADLINE_EXCEEDED: Final = "DeadlineExceeded"
    POD_FAILURE_POLICY: Final = "PodFailurePolicy"       # a FailJob rule matched
    FAILED_INDEXES: Final = "FailedIndexes"              # backoffLimitPerIndex: every index done, some failed
    MAX_FAILED_INDEXES_EXCEEDED: Final = "MaxFailedIndexesExceeded"
    COMPLETIONS_REACHED: Final = "CompletionsReached"   # the Complete condition's
    SUCCESS_POLICY: Final = "SuccessPolicy"             # ... when a successPolicy rule was met


class Cause:
    """``details.causes[].reason`` of a Status Kube32 answers (Kubernetes' StatusCause)."""
    # A checkpoint data 429: the snapshot waited in line for room that moves in flight
    # hold, and may wait again (kube32.apiserver.dataspace.Room).
    WAITING_FOR_ROOM: Final = "WaitingForRoom"


class Annotation:
    """Annotation keys."""
    MIGRATION: Final = "kube32.io/migration"          # pod: OnDrain, Never or Auto
    # the BOOKMARK that ends a watch's initial events (sendInitialEvents=true; Kubernetes'
    # metav1.InitialEventsAnnotationKey, what client-go's WatchList waits for)
    INITIAL_EVENTS_END: Final = "k8s.io/initial-events-end"
    RESTORE_FROM: Final = "kube32.io/restore-from"    # pod: the Checkpoint it restores from
    CHECKPOINT_INTERVAL: Final = "kube32.io/checkpoint-interval"   # pod: periodic Save Checkpoints
    PLACEMENT: Final = "kube32.io/placement"          # pod: "fastest" (the Auto policy)
    TOPICS: Final = "kube32.io/events"                # pod: the topics it hears, "a,b"
    TICK_INTERVAL: Final = "kube32.io/tick-interval"  # pod: how often k32_tick runs
    # Service: how long its proxies hold a request its moving pod could not take ("10s";
    # "0" holds none).  Read by kube32.holding.
    HOLD_REQUESTS: Final = "kube32.io/hold-requests"
    WASM_PIN: Final = "kube32.io/wasm-sha256"         # pod: the digest a wasm:// image must have
    I2C_GRANT: Final = "kube32.io/i2c-device"         # pod: a granted I2C device (keeps it from moving)
    INTERP_MOPS: Final = "kube32.io/interp-mops"      # node: its measured speed
    INTERP_MOPS_MEASURED_ON: Final = "kube32.io/interp-mops-measured-on"   # node: machine and engine of it
    FREE_HEAP: Final = "kube32.io/free-heap"          # node
    KUBELET_SCHEME: Final = "kube32.io/kubelet-scheme"   # node: http or https
    KUBELET_ENDPOINT: Final = "kube32.io/kubelet-endpoint"   # node's Lease: its kubelet's "ip:port"
    LEFT: Final = "kube32.io/left"                    # node: its kubelet left the cluster
    LEFT_CORDONED: Final = "kube32.io/left-cordoned"  # node: the leaving drain cordoned it itself
    # Checkpoint: an eviction answered that its pod left while this, its move, was still
    # under way; a rollback never takes the pod back to a cordoned source then.
    EVICTION_ANSWERED: Final = "kube32.io/eviction-answered"
    # A watch's DELETED event of an object replaced under its name (a moved pod): the
    # uid of what replaced it, which the next event (ADDED) carries.  Only in watch events.
    REPLACED_BY: Final = "kube32.io/replaced-by"


class JobAnnotation:
    """Annotations of Jobs and their pods (Kubernetes')."""
    COMPLETION_INDEX: Final = "batch.kubernetes.io/job-completion-index"
    # backoffLimitPerIndex: how often the pod's index failed (and was ignored) before it.
    INDEX_FAILURE_COUNT: Final = "batch.kubernetes.io/job-index-failure-count"
    INDEX_IGNORED_FAILURE_COUNT: Final = "batch.kubernetes.io/job-index-ignored-failure-count"
    CRONJOB_SCHEDULED_TIMESTAMP: Final = "batch.kubernetes.io/cronjob-scheduled-timestamp"
    # `kubectl create job --from=cronjob/x` marks the Job so.
    CRONJOB_INSTANTIATE: Final = "cronjob.kubernetes.io/instantiate"
    CHANGE_CAUSE: Final = "kubernetes.io/change-cause"   # workloads and their ControllerRevisions


class DeploymentAnnotation:
    """Annotations of Deployments and their ReplicaSets (Kubernetes' deployment controller's;
    ``kubectl rollout`` reads the revision)."""
    REVISION: Final = "deployment.kubernetes.io/revision"
    DESIRED_REPLICAS: Final = "deployment.kubernetes.io/desired-replicas"
    MAX_REPLICAS: Final = "deployment.kubernetes.io/max-replicas"


class Finalizer:
    """Finalizers Kube32 writes (Kubernetes' ``kubernetes.io/pvc-protection`` is the model)."""
    # Checkpoint: set at its creation; the Checkpoint controller removes it from a Checkpoint
    # being deleted once no move of it is under way and no pod's kube32.io/restore-from
    # names it (spec: "A Checkpoint stays while a pod's kube32.io/restore-from names it").
    CHECKPOINT_PROTECTION: Final = "kube32.io/checkpoint-protection"


class Policy:
    """Values of the pod annotation ``kube32.io/migration``."""
    ON_DRAIN: Final = "OnDrain"     # the default
    NEVER: Final = "Never"
    AUTO: Final = "Auto"
    ALL: Final = (ON_DRAIN, NEVER, AUTO)


FASTEST: Final = "fastest"   # the one value of the pod annotation kube32.io/placement


class Label:
    """Label keys."""
    TRIGGER: Final = "kube32.io/trigger"              # Checkpoint: what made it (Trigger)
    TEST_FAULT: Final = "kube32.io/test-fault"        # Checkpoint, CronJob: a test's fault (kube32.testing)
    PROFILE: Final = "kube32.io/profile"              # node: its board profile
    ENGINE: Final = "kube32.io/engine"                # node: its Wasm engine
    POD_TEMPLATE_HASH: Final = "pod-template-hash"
    CONTROLLER_REVISION_HASH: Final = "controller-revision-hash"
    POD_TEMPLATE_GENERATION: Final = "pod-template-generation"
    SERVICE_NAME: Final = "kubernetes.io/service-name"   # EndpointSlice: its Service
    # A Job's pods (and its selector), as Kubernetes' job controller labels them: the
    # batch.kubernetes.io/ keys and the legacy ones both.
    JOB_CONTROLLER_UID: Final = "batch.kubernetes.io/controller-uid"
    JOB_NAME: Final = "batch.kubernetes.io/job-name"
    LEGACY_CONTROLLER_UID: Final = "controller-uid"
    LEGACY_JOB_NAME: Final = "job-name"
    JOB_COMPLETION_INDEX: Final = "batch.kubernetes.io/job-completion-index"   # Indexed Jobs (also an annotation)
    APISERVER: Final = "kube32.io/apiserver"          # Lease: an HA API server's (kube32.apiserver.peers)
    NODE_TOKEN: Final = "kube32.io/node-token"        # Secret: a node's bootstrap token
    FLEET_NODE: Final = "kube32.io/fleet-node"        # Pod: the fleet simulator's node of it
    # A node's well-known labels, as Kubernetes' kubelet sets them.
    HOSTNAME: Final = "kubernetes.io/hostname"
    OS: Final = "kubernetes.io/os"
    ARCH: Final = "kubernetes.io/arch"
    BETA_OS: Final = "beta.kubernetes.io/os"
    BETA_ARCH: Final = "beta.kubernetes.io/arch"
    NODE_ROLE_PREFIX: Final = "node-role.kubernetes.io/"   # + the role (kubectl's ROLES column)
    NODE_ROLE_CONTROL_PLANE: Final = NODE_ROLE_PREFIX + "control-plane"
    ENDPOINTSLICE_MANAGED_BY: Final = "endpointslice.kubernetes.io/managed-by"
    NAMESPACE_NAME: Final = "kubernetes.io/metadata.name"   # Namespace: its own name
    BOOTSTRAPPING: Final = "kubernetes.io/bootstrapping"    # default RBAC objects ("rbac-defaults")


class Resource:
    """Names of the resources a node offers and a pod asks for (extended resources)."""
    HARDWARE_PREFIX: Final = "hardware.kube32.io/"   # + a device of the board; it keeps a pod from moving
    IPC: Final = HARDWARE_PREFIX + "ipc"             # ... except this one, which every node has
    ESP32_PREFIX: Final = "esp32.io/"                # a board's own device; it keeps a pod too
    EXTENDED_PREFIXES: Final = (HARDWARE_PREFIX, ESP32_PREFIX)


NODE_TOKEN_SECRET_TYPE: Final = "kube32.io/node-token"   # a Secret's type: a node's bootstrap token
SD_VOLUME: Final = "kube32.io/sd"   # a pod's volume on a board's SD card (its key, or a csi driver)
# A kubeconfig cluster's extension listing every API server of an HA control plane.
KUBECONFIG_SERVERS_EXTENSION: Final = "kube32.io/servers"
# An annotation of Kubernetes' default RBAC objects: updated on start ("true").
RBAC_AUTOUPDATE: Final = "rbac.authorization.kubernetes.io/autoupdate"


class KubeletScheme:
    """Values of the Node annotation ``kube32.io/kubelet-scheme`` (the node writes it)."""
    HTTP: Final = "http"     # --kubelet-insecure-http: the API server sends a token bound to the node
    HTTPS: Final = "https"   # the API server verifies the kubelet for the node's name
    ALL: Final = (HTTP, HTTPS)


class Trigger:
    """Values of the Checkpoint label ``kube32.io/trigger``."""
    PERIODIC: Final = "periodic"
    EVICTION: Final = "eviction"
    MEMORY_PRESSURE: Final = "memory-pressure"
    PLACEMENT: Final = "placement"


class Taint:
    """Taint keys of a node's state (Kubernetes' ``node.kubernetes.io/...``)."""
    NOT_READY: Final = "node.kubernetes.io/not-ready"
    UNREACHABLE: Final = "node.kubernetes.io/unreachable"
    UNSCHEDULABLE: Final = "node.kubernetes.io/unschedulable"
    DISK_PRESSURE: Final = "node.kubernetes.io/disk-pressure"
    MEMORY_PRESSURE: Final = "node.kubernetes.io/memory-pressure"
    PID_PRESSURE: Final = "node.kubernetes.io/pid-pressure"


class Effect:
    """Taint effects."""
    NO_SCHEDULE: Final = "NoSchedule"
    PREFER_NO_SCHEDULE: Final = "PreferNoSchedule"
    NO_EXECUTE: Final = "NoExecute"
    SCHEDULING: Final = (NO_SCHEDULE, NO_EXECUTE)   # the effects that keep a pod off a node
