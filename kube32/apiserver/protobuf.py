"""Kubernetes protobuf request bodies, decoded into the JSON objects the JSON path produces.

kubectl's typed clients (``create namespace|configmap|secret|deployment|service|...``,
``run``, access reviews, TokenRequest) send ``application/vnd.kubernetes.protobuf``:
the magic ``k8s\\x00`` followed by a ``runtime.Unknown`` message
``{1: typeMeta {1: apiVersion, 2: kind}, 2: raw, 3: contentEncoding, 4: contentType}``
whose ``raw`` is the object's own message.  kubectl never falls back to JSON after a
415, so these bodies must be understood.

Design:

* :func:`fields` is the bare wire-format reader (field number -> values, varints as
  ints, length-delimited as bytes); the access reviews and TokenRequest use it directly.
* :data:`SCHEMA` is a table, message name -> {field number: (json name, kind)}, with the
  field numbers of the real ``generated.proto`` files (k8s.io/api core/v1, apps/v1,
  rbac/v1, policy/v1, batch/v1; k8s.io/apimachinery meta/v1, intstr, resource).  Kinds:
  ``str`` ``bytes`` (base64 in JSON) ``int`` ``bool`` ``time`` (meta/v1 Time -> RFC 3339)
  ``qty`` (resource.Quantity -> string) ``intstr`` (IntOrString -> int or string)
  ``msg:<Name>``, ``inline:<Name>`` (a Go embedded struct: its fields land in the parent),
  ``[]<kind>`` (repeated) and ``map:<value kind>`` (string keys).
* Presence: proto2 as gogo-protobuf writes it sends every non-pointer field, zero or
  not, while the JSON path omits them (``omitempty``).  So a zero scalar, an empty
  string and an empty non-pointer message are dropped.  A kind ending in ``*`` is a Go
  pointer field: it is only sent when set, so it is kept even when zero or empty
  (``replicas: 0``, ``minAvailable: 0``, ``emptyDir: {}``, ``immutable: false``).
  Inside a repeated field every element is kept (``apiGroups: [""]``).
* Unknown field numbers are skipped (a newer client's fields); a known field with the
  wrong wire type, truncated data, bad UTF-8 or nesting deeper than :data:`MAX_DEPTH`
  raises :class:`ProtobufError` naming the field path; nothing here crashes on input.
* A kind without a schema raises :class:`UnknownKind` (the caller answers 415).
"""
from __future__ import annotations

import base64
import datetime as dt
from typing import Any

MAGIC = b"k8s\x00"
MAX_DEPTH = 48

Schema = dict[int, tuple[str, str]]


class ProtobufError(ValueError):
    """The body is not a well-formed Kubernetes protobuf message (the client's error)."""


class UnknownKind(ProtobufError):
    """A well-formed envelope naming a kind this server has no protobuf schema for."""


# --- wire format -----------------------------------------------------------------------
def _varint(data: bytes, i: int) -> tuple[int, int]:
    shift = value = 0
    while True:
        if i >= len(data) or shift > 63:
            raise ProtobufError("truncated varint")
        b = data[i]
        i += 1
        value |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return value, i


def iter_fields(data: bytes) -> list[tuple[int, int, Any]]:
    """(field number, wire type, value) in order; varints as int, length-delimited as bytes."""
    out: list[tuple[int, int, Any]] = []
    i = 0
    while i < len(data):
        key, i = _varint(data, i)
        field, wire = key >> 3, key & 7
        if field == 0:
            raise ProtobufError("field number 0")
        if wire == 0:
            val: Any
            val, i = _varint(data, i)
        elif wire == 2:
            n, i = _varint(data, i)
            if i + n > len(data):
                raise ProtobufError("truncated field")
            val, i = data[i:i + n], i + n
        elif wire in (1, 5):
            n = 8 if wire == 1 else 4
            if i + n > len(data):
                raise ProtobufError("truncated fixed-width field")
            val, i = data[i:i + n], i + n
        else:
            raise ProtobufError(f"unsupported wire type {wire}")
        out.append((field, wire, val))
    return out


def fields(data: bytes) -> dict[int, list[Any]]:
    """Field number -> its values in order (the bare reader the reviews use)."""
    out: dict[int, list[Any]] = {}
    for field, _, val in iter_fields(data):
        out.setdefault(field, []).append(val)
    return out


def unwrap(raw: bytes) -> tuple[str, str, bytes]:
    """The runtime.Unknown envelope: (apiVersion, kind, the object's own message)."""
    if not raw.startswith(MAGIC):
        raise ProtobufError('the body does not start with the Kubernetes protobuf magic "k8s\\x00"')
    envelope = fields(raw[len(MAGIC):])
    if any(not isinstance(v, bytes) for n in (1, 2, 3) for v in envelope.get(n, [])):
        raise ProtobufError("the runtime.Unknown envelope has a field of the wrong type")
    encoding = envelope.get(3, [b""])[-1]
    if encoding:
        raise ProtobufError(f"unsupported contentEncoding {encoding.decode(errors='replace')!r}")
    type_meta = fields(envelope.get(1, [b""])[-1])
    try:
        api_version = type_meta.get(1, [b""])[-1].decode()
        kind = type_meta.get(2, [b""])[-1].decode()
    except (UnicodeDecodeError, AttributeError):
        raise ProtobufError("the typeMeta of the runtime.Unknown envelope is not text") from None
    return api_version, kind, envelope.get(2, [b""])[-1]


# --- schema ----------------------------------------------------------------------------
_OBJECT_META: Schema = {
    1: ("name", "str"), 2: ("generateName", "str"), 3: ("namespace", "str"), 4: ("selfLink", "str"),
    5: ("uid", "str"), 6: ("resourceVersion", "str"), 7: ("generation", "int"),
    8: ("creationTimestamp", "time"), 9: ("deletionTimestamp", "time"),
    10: ("deletionGracePeriodSeconds", "int*"), 11: ("labels", "map:str"), 12: ("annotations", "map:str"),
    13: ("ownerReferences", "[]msg:OwnerReference"), 14: ("finalizers", "[]str"),
}

_HANDLER: Schema = {1: ("exec", "msg*:ExecAction"), 2: ("httpGet", "msg*:HTTPGetAction"),
                    3: ("tcpSocket", "msg*:TCPSocketAction")}

_CONTAINER: Schema = {
    1: ("name", "str"), 2: ("image", "str"), 3: ("command", "[]str"), 4: ("args", "[]str"),
    5: ("workingDir", "str"), 6: ("ports", "[]msg:ContainerPort"), 19: ("envFrom", "[]msg:EnvFromSource"),
    7: ("env", "[]msg:EnvVar"), 8: ("resources", "msg:ResourceRequirements"),
    9: ("volumeMounts", "[]msg:VolumeMount"), 10: ("livenessProbe", "msg*:Probe"),
    11: ("readinessProbe", "msg*:Probe"), 22: ("startupProbe", "msg*:Probe"),
    12: ("lifecycle", "msg*:Lifecycle"), 13: ("terminationMessagePath", "str"),
    20: ("terminationMessagePolicy", "str"), 14: ("imagePullPolicy", "str"),
    15: ("securityContext", "msg*:SecurityContext"), 16: ("stdin", "bool"), 17: ("stdinOnce", "bool"),
    18: ("tty", "bool"),
}

_RBAC_BINDING: Schema = {1: ("metadata", "msg:ObjectMeta"), 2: ("subjects", "[]msg:Subject"),
                         3: ("roleRef", "msg:RoleRef")}
_LOCAL_REF_INLINE = ("", "inline:LocalObjectReference")

SCHEMA: dict[str, Schema] = {
    # k8s.io/apimachinery pkg/apis/meta/v1
    "ObjectMeta": _OBJECT_META,
    "OwnerReference": {5: ("apiVersion", "str"), 1: ("kind", "str"), 3: ("name", "str"), 4: ("uid", "str"),
                       6: ("controller", "bool*"), 7: ("blockOwnerDeletion", "bool*")},
    "LabelSelector": {1: ("matchLabels", "map:str"), 2: ("matchExpressions", "[]msg:LabelSelectorRequirement")},
    "LabelSelectorRequirement": {1: ("key", "str"), 2: ("operator", "str"), 3: ("values", "[]str")},
    "DeleteOptions": {1: ("gracePeriodSeconds", "int*"), 2: ("preconditions", "msg*:Preconditions"),
                      3: ("orphanDependents", "bool*"), 4: ("propagationPolicy", "str*"), 5: ("dryRun", "[]str")},
    "Preconditions": {1: ("uid", "str*"), 2: ("resourceVersion", "str*")},
    # k8s.io/api core/v1
    "Namespace": {1: ("metadata", "msg:ObjectMeta"), 2: ("spec", "msg:NamespaceSpec"),
                  3: ("status", "msg:NamespaceStatus")},
    "NamespaceSpec": {1: ("finalizers", "[]str")},
    "NamespaceStatus": {1: ("phase", "str")},
    "ConfigMap": {1: ("metadata", "msg:ObjectMeta"), 4: ("immutable", "bool*"), 2: ("data", "map:str"),
                  3: ("binaryData", "map:bytes")},
    "Secret": {1: ("metadata", "msg:ObjectMeta"), 5: ("immutable", "bool*"), 2: ("data", "map:bytes"),
               4: ("stringData", "map:str"), 3: ("type", "str")},
    "ServiceAccount": {1: ("metadata", "msg:ObjectMeta"), 2: ("secrets", "[]msg:ObjectReference"),
                       3: ("imagePullSecrets", "[]msg:LocalObjectReference"),
                       4: ("automountServiceAccountToken", "bool*")},
    "ObjectReference": {1: ("kind", "str"), 2: ("namespace", "str"), 3: ("name", "str"), 4: ("uid", "str"),
                        5: ("apiVersion", "str"), 6: ("resourceVersion", "str"), 7: ("fieldPath", "str")},
    "LocalObjectReference": {1: ("name", "str")},
    "Service": {1: ("metadata", "msg:ObjectMeta"), 2: ("spec", "msg:ServiceSpec")},
    "ServiceSpec": {
        1: ("ports", "[]msg:ServicePort"), 2: ("selector", "map:str"), 3: ("clusterIP", "str"),
        18: ("clusterIPs", "[]str"), 4: ("type", "str"), 5: ("externalIPs", "[]str"),
        7: ("sessionAffinity", "str"), 8: ("loadBalancerIP", "str"), 9: ("loadBalancerSourceRanges", "[]str"),
        10: ("externalName", "str"), 11: ("externalTrafficPolicy", "str"), 12: ("healthCheckNodePort", "int"),
        13: ("publishNotReadyAddresses", "bool"), 19: ("ipFamilies", "[]str"), 17: ("ipFamilyPolicy", "str*"),
        20: ("allocateLoadBalancerNodePorts", "bool*"), 21: ("loadBalancerClass", "str*"),
        22: ("internalTrafficPolicy", "str*"),
    },
    "ServicePort": {1: ("name", "str"), 2: ("protocol", "str"), 6: ("appProtocol", "str*"), 3: ("port", "int"),
                    4: ("targetPort", "intstr"), 5: ("nodePort", "int")},
    "Pod": {1: ("metadata", "msg:ObjectMeta"), 2: ("spec", "msg:PodSpec")},
    "PodTemplateSpec": {1: ("metadata", "msg:ObjectMeta"), 2: ("spec", "msg:PodSpec")},
    "PodSpec": {
        1: ("volumes", "[]msg:Volume"), 20: ("initContainers", "[]msg:Container"),
        2: ("containers", "[]msg:Container"), 3: ("restartPolicy", "str"),
        4: ("terminationGracePeriodSeconds", "int*"), 5: ("activeDeadlineSeconds", "int*"),
        6: ("dnsPolicy", "str"), 7: ("nodeSelector", "map:str"), 8: ("serviceAccountName", "str"),
        9: ("serviceAccount", "str"), 21: ("automountServiceAccountToken", "bool*"), 10: ("nodeName", "str"),
        11: ("hostNetwork", "bool"), 12: ("hostPID", "bool"), 13: ("hostIPC", "bool"),
        27: ("shareProcessNamespace", "bool*"), 14: ("securityContext", "msg*:PodSecurityContext"),
        15: ("imagePullSecrets", "[]msg:LocalObjectReference"), 16: ("hostname", "str"),
        17: ("subdomain", "str"), 18: ("affinity", "msg*:Affinity"), 19: ("schedulerName", "str"),
        22: ("tolerations", "[]msg:Toleration"), 23: ("hostAliases", "[]msg:HostAlias"),
        24: ("priorityClassName", "str"), 25: ("priority", "int*"), 29: ("runtimeClassName", "str*"),
        30: ("enableServiceLinks", "bool*"), 31: ("preemptionPolicy", "str*"),
        33: ("topologySpreadConstraints", "[]msg:TopologySpreadConstraint"),
        35: ("setHostnameAsFQDN", "bool*"),
    },
    "Container": _CONTAINER,
    "ContainerPort": {1: ("name", "str"), 2: ("hostPort", "int"), 3: ("containerPort", "int"),
                      4: ("protocol", "str"), 5: ("hostIP", "str")},
    "EnvVar": {1: ("name", "str"), 2: ("value", "str"), 3: ("valueFrom", "msg*:EnvVarSource")},
    "EnvVarSource": {1: ("fieldRef", "msg*:ObjectFieldSelector"),
                     2: ("resourceFieldRef", "msg*:ResourceFieldSelector"),
                     3: ("configMapKeyRef", "msg*:ConfigMapKeySelector"),
                     4: ("secretKeyRef", "msg*:SecretKeySelector")},
    "ObjectFieldSelector": {1: ("apiVersion", "str"), 2: ("fieldPath", "str")},
    "ResourceFieldSelector": {1: ("containerName", "str"), 2: ("resource", "str"), 3: ("divisor", "qty")},
    "ConfigMapKeySelector": {1: _LOCAL_REF_INLINE, 2: ("key", "str"), 3: ("optional", "bool*")},
    "SecretKeySelector": {1: _LOCAL_REF_INLINE, 2: ("key", "str"), 3: ("optional", "bool*")},
    "EnvFromSource": {1: ("prefix", "str"), 2: ("configMapRef", "msg*:ConfigMapEnvSource"),
                      3: ("secretRef", "msg*:SecretEnvSource")},
    "ConfigMapEnvSource": {1: _LOCAL_REF_INLINE, 2: ("optional", "bool*")},
    "SecretEnvSource": {1: _LOCAL_REF_INLINE, 2: ("optional", "bool*")},
    "ResourceRequirements": {1: ("limits", "map:qty"), 2: ("requests", "map:qty")},
    "VolumeMount": {1: ("name", "str"), 2: ("readOnly", "bool"), 3: ("mountPath", "str"), 4: ("subPath", "str"),
                    5: ("mountPropagation", "str*"), 6: ("subPathExpr", "str")},
    "Probe": {1: ("", "inline:ProbeHandler"), 2: ("initialDelaySeconds", "int"), 3: ("timeoutSeconds", "int"),
              4: ("periodSeconds", "int"), 5: ("successThreshold", "int"), 6: ("failureThreshold", "int"),
              7: ("terminationGracePeriodSeconds", "int*")},
    "ProbeHandler": _HANDLER,
    "LifecycleHandler": _HANDLER,
    "Lifecycle": {1: ("postStart", "msg*:LifecycleHandler"), 2: ("preStop", "msg*:LifecycleHandler")},
    "ExecAction": {1: ("command", "[]str")},
    "HTTPGetAction": {1: ("path", "str"), 2: ("port", "intstr"), 3: ("host", "str"), 4: ("scheme", "str"),
                      5: ("httpHeaders", "[]msg:HTTPHeader")},
    "HTTPHeader": {1: ("name", "str"), 2: ("value", "str")},
    "TCPSocketAction": {1: ("port", "intstr"), 2: ("host", "str")},
    "SecurityContext": {1: ("capabilities", "msg*:Capabilities"), 2: ("privileged", "bool*"),
                        3: ("seLinuxOptions", "msg*:SELinuxOptions"), 4: ("runAsUser", "int*"),
                        8: ("runAsGroup", "int*"), 5: ("runAsNonRoot", "bool*"),
                        6: ("readOnlyRootFilesystem", "bool*"), 7: ("allowPrivilegeEscalation", "bool*"),
                        9: ("procMount", "str*"), 11: ("seccompProfile", "msg*:SeccompProfile")},
    "PodSecurityContext": {1: ("seLinuxOptions", "msg*:SELinuxOptions"), 2: ("runAsUser", "int*"),
                           6: ("runAsGroup", "int*"), 3: ("runAsNonRoot", "bool*"),
                           4: ("supplementalGroups", "[]int"), 5: ("fsGroup", "int*"),
                           7: ("sysctls", "[]msg:Sysctl"), 9: ("fsGroupChangePolicy", "str*"),
                           10: ("seccompProfile", "msg*:SeccompProfile")},
    "Capabilities": {1: ("add", "[]str"), 2: ("drop", "[]str")},
    "SELinuxOptions": {1: ("user", "str"), 2: ("role", "str"), 3: ("type", "str"), 4: ("level", "str")},
    "SeccompProfile": {1: ("type", "str"), 2: ("localhostProfile", "str*")},
    "Sysctl": {1: ("name", "str"), 2: ("value", "str")},
    "Toleration": {1: ("key", "str"), 2: ("operator", "str"), 3: ("value", "str"), 4: ("effect", "str"),
                   5: ("tolerationSeconds", "int*")},
    "HostAlias": {1: ("ip", "str"), 2: ("hostnames", "[]str")},
    "TopologySpreadConstraint": {1: ("maxSkew", "int"), 2: ("topologyKey", "str"),
                                 3: ("whenUnsatisfiable", "str"), 4: ("labelSelector", "msg*:LabelSelector")},
    "Affinity": {1: ("nodeAffinity", "msg*:NodeAffinity"), 2: ("podAffinity", "msg*:PodAffinity"),
                 3: ("podAntiAffinity", "msg*:PodAffinity")},
    "NodeAffinity": {1: ("requiredDuringSchedulingIgnoredDuringExecution", "msg*:NodeSelector"),
                     2: ("preferredDuringSchedulingIgnoredDuringExecution", "[]msg:PreferredSchedulingTerm")},
    "NodeSelector": {1: ("nodeSelectorTerms", "[]msg:NodeSelectorTerm")},
    "NodeSelectorTerm": {1: ("matchExpressions", "[]msg:NodeSelectorRequirement"),
                         2: ("matchFields", "[]msg:NodeSelectorRequirement")},
    "NodeSelectorRequirement": {1: ("key", "str"), 2: ("operator", "str"), 3: ("values", "[]str")},
    "PreferredSchedulingTerm": {1: ("weight", "int"), 2: ("preference", "msg:NodeSelectorTerm")},
    "PodAffinity": {1: ("requiredDuringSchedulingIgnoredDuringExecution", "[]msg:PodAffinityTerm"),
                    2: ("preferredDuringSchedulingIgnoredDuringExecution", "[]msg:WeightedPodAffinityTerm")},
    "PodAffinityTerm": {1: ("labelSelector", "msg*:LabelSelector"), 2: ("namespaces", "[]str"),
                        3: ("topologyKey", "str"), 4: ("namespaceSelector", "msg*:LabelSelector")},
    "WeightedPodAffinityTerm": {1: ("weight", "int"), 2: ("podAffinityTerm", "msg:PodAffinityTerm")},
    "Volume": {1: ("name", "str"), 2: ("", "inline:VolumeSource")},
    "VolumeSource": {1: ("hostPath", "msg*:HostPathVolumeSource"), 2: ("emptyDir", "msg*:EmptyDirVolumeSource"),
                     6: ("secret", "msg*:SecretVolumeSource"),
                     10: ("persistentVolumeClaim", "msg*:PersistentVolumeClaimVolumeSource"),
                     16: ("downwardAPI", "msg*:DownwardAPIVolumeSource"),
                     19: ("configMap", "msg*:ConfigMapVolumeSource"),
                     26: ("projected", "msg*:ProjectedVolumeSource")},
    "HostPathVolumeSource": {1: ("path", "str"), 2: ("type", "str*")},
    "EmptyDirVolumeSource": {1: ("medium", "str"), 2: ("sizeLimit", "qty")},
    "SecretVolumeSource": {1: ("secretName", "str"), 2: ("items", "[]msg:KeyToPath"), 3: ("defaultMode", "int*"),
                           4: ("optional", "bool*")},
    "ConfigMapVolumeSource": {1: _LOCAL_REF_INLINE, 2: ("items", "[]msg:KeyToPath"), 3: ("defaultMode", "int*"),
                              4: ("optional", "bool*")},
    "PersistentVolumeClaimVolumeSource": {1: ("claimName", "str"), 2: ("readOnly", "bool")},
    "DownwardAPIVolumeSource": {1: ("items", "[]msg:DownwardAPIVolumeFile"), 2: ("defaultMode", "int*")},
    "DownwardAPIVolumeFile": {1: ("path", "str"), 2: ("fieldRef", "msg*:ObjectFieldSelector"),
                              3: ("resourceFieldRef", "msg*:ResourceFieldSelector"), 4: ("mode", "int*")},
    "ProjectedVolumeSource": {1: ("sources", "[]msg:VolumeProjection"), 2: ("defaultMode", "int*")},
    "VolumeProjection": {1: ("secret", "msg*:SecretProjection"), 2: ("downwardAPI", "msg*:DownwardAPIProjection"),
                         3: ("configMap", "msg*:ConfigMapProjection"),
                         4: ("serviceAccountToken", "msg*:ServiceAccountTokenProjection")},
    "SecretProjection": {1: _LOCAL_REF_INLINE, 2: ("items", "[]msg:KeyToPath"), 4: ("optional", "bool*")},
    "ConfigMapProjection": {1: _LOCAL_REF_INLINE, 2: ("items", "[]msg:KeyToPath"), 4: ("optional", "bool*")},
    "DownwardAPIProjection": {1: ("items", "[]msg:DownwardAPIVolumeFile")},
    "ServiceAccountTokenProjection": {1: ("audience", "str"), 2: ("expirationSeconds", "int*"), 3: ("path", "str")},
    "KeyToPath": {1: ("key", "str"), 2: ("path", "str"), 3: ("mode", "int*")},
    # k8s.io/api apps/v1
    "Deployment": {1: ("metadata", "msg:ObjectMeta"), 2: ("spec", "msg:DeploymentSpec")},
    "DeploymentSpec": {1: ("replicas", "int*"), 2: ("selector", "msg*:LabelSelector"),
                       3: ("template", "msg:PodTemplateSpec"), 4: ("strategy", "msg:DeploymentStrategy"),
                       5: ("minReadySeconds", "int"), 6: ("revisionHistoryLimit", "int*"), 7: ("paused", "bool"),
                       9: ("progressDeadlineSeconds", "int*")},
    "DeploymentStrategy": {1: ("type", "str"), 2: ("rollingUpdate", "msg*:RollingUpdateDeployment")},
    "RollingUpdateDeployment": {1: ("maxUnavailable", "intstr*"), 2: ("maxSurge", "intstr*")},
    # k8s.io/api batch/v1 (kubectl create job|cronjob, create job --from=cronjob/x)
    "Job": {1: ("metadata", "msg:ObjectMeta"), 2: ("spec", "msg:JobSpec")},
    "JobSpec": {1: ("parallelism", "int*"), 2: ("completions", "int*"), 3: ("activeDeadlineSeconds", "int*"),
                7: ("backoffLimit", "int*"), 12: ("backoffLimitPerIndex", "int*"), 13: ("maxFailedIndexes", "int*"),
                4: ("selector", "msg*:LabelSelector"), 5: ("manualSelector", "bool*"),
                6: ("template", "msg:PodTemplateSpec"), 8: ("ttlSecondsAfterFinished", "int*"),
                9: ("completionMode", "str*"), 10: ("suspend", "bool*"), 14: ("podReplacementPolicy", "str*"),
                15: ("managedBy", "str*")},
    "CronJob": {1: ("metadata", "msg:ObjectMeta"), 2: ("spec", "msg:CronJobSpec")},
    "CronJobSpec": {1: ("schedule", "str"), 8: ("timeZone", "str*"), 2: ("startingDeadlineSeconds", "int*"),
                    3: ("concurrencyPolicy", "str"), 4: ("suspend", "bool*"), 5: ("jobTemplate", "msg:JobTemplateSpec"),
                    6: ("successfulJobsHistoryLimit", "int*"), 7: ("failedJobsHistoryLimit", "int*")},
    "JobTemplateSpec": {1: ("metadata", "msg:ObjectMeta"), 2: ("spec", "msg:JobSpec")},
    # k8s.io/api rbac/v1
    "Role": {1: ("metadata", "msg:ObjectMeta"), 2: ("rules", "[]msg:PolicyRule")},
    "ClusterRole": {1: ("metadata", "msg:ObjectMeta"), 2: ("rules", "[]msg:PolicyRule"),
                    3: ("aggregationRule", "msg*:AggregationRule")},
    "AggregationRule": {1: ("clusterRoleSelectors", "[]msg:LabelSelector")},
    "PolicyRule": {1: ("verbs", "[]str"), 2: ("apiGroups", "[]str"), 3: ("resources", "[]str"),
                   4: ("resourceNames", "[]str"), 5: ("nonResourceURLs", "[]str")},
    "RoleBinding": _RBAC_BINDING,
    "ClusterRoleBinding": _RBAC_BINDING,
    "Subject": {1: ("kind", "str"), 2: ("apiGroup", "str"), 3: ("name", "str"), 4: ("namespace", "str")},
    "RoleRef": {1: ("apiGroup", "str"), 2: ("kind", "str"), 3: ("name", "str")},
    # k8s.io/api policy/v1
    "PodDisruptionBudget": {1: ("metadata", "msg:ObjectMeta"), 2: ("spec", "msg:PodDisruptionBudgetSpec")},
    "PodDisruptionBudgetSpec": {1: ("minAvailable", "intstr*"), 2: ("selector", "msg*:LabelSelector"),
                                3: ("maxUnavailable", "intstr*"), 4: ("unhealthyPodEvictionPolicy", "str*")},
}

# (apiVersion, kind) of a top-level body -> its message.  Status stanzas are not decoded:
# a create never carries a meaningful one.
KINDS: dict[tuple[str, str], str] = {
    ("v1", "Namespace"): "Namespace", ("v1", "ConfigMap"): "ConfigMap", ("v1", "Secret"): "Secret",
    ("v1", "ServiceAccount"): "ServiceAccount", ("v1", "Service"): "Service", ("v1", "Pod"): "Pod",
    ("v1", "DeleteOptions"): "DeleteOptions", ("meta.k8s.io/v1", "DeleteOptions"): "DeleteOptions",
    ("apps/v1", "Deployment"): "Deployment",
    ("batch/v1", "Job"): "Job", ("batch/v1", "CronJob"): "CronJob",
    ("rbac.authorization.k8s.io/v1", "Role"): "Role",
    ("rbac.authorization.k8s.io/v1", "ClusterRole"): "ClusterRole",
    ("rbac.authorization.k8s.io/v1", "RoleBinding"): "RoleBinding",
    ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding"): "ClusterRoleBinding",
    ("policy/v1", "PodDisruptionBudget"): "PodDisruptionBudget",
}


# --- decoding --------------------------------------------------------------------------
def _signed(value: int) -> int:
    # int32/int64 negatives travel as 64-bit two's complement varints.
    return value - (1 << 64) if value >= 1 << 63 else value


def _text(value: bytes, path: str) -> str:
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        raise ProtobufError(f"{path}: not valid UTF-8") from None


def _time(value: bytes, path: str) -> str | None:
    f = fields(value)
    seconds = _signed(f.get(1, [0])[-1]) if isinstance(f.get(1, [0])[-1], int) else None
    if seconds is None:
        raise ProtobufError(f"{path}: seconds is not a varint")
    if seconds == 0 and not f.get(2, [0])[-1]:
        return None  # the zero Time is sent as an empty message; JSON writes null
    try:
        when = dt.datetime.fromtimestamp(seconds, dt.timezone.utc)
    except (OverflowError, OSError, ValueError):
        raise ProtobufError(f"{path}: time out of range") from None
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")  # metav1.Time drops the fraction in JSON


def _quantity(value: bytes, path: str) -> str:
    f = fields(value)
    raw = f.get(1, [b""])[-1]
    if not isinstance(raw, bytes):
        raise ProtobufError(f"{path}: a Quantity's string has the wrong wire type")
    return _text(raw, path)


def _int_or_string(value: bytes, path: str) -> int | str:
    f = fields(value)
    if any(not isinstance(f.get(n, [0])[-1], int) for n in (1, 2)) or not isinstance(f.get(3, [b""])[-1], bytes):
        raise ProtobufError(f"{path}: an IntOrString field has the wrong wire type")
    if f.get(1, [0])[-1] == 1:
        return _text(f.get(3, [b""])[-1], path)
    return _signed(f.get(2, [0])[-1])


_ZERO: tuple[Any, ...] = (None, "", 0, False, {}, [])


def _scalar(kind: str, wire: int, value: Any, path: str, depth: int) -> Any:
    """One value of a non-repeated kind (without its ``*``)."""
    if kind in ("int", "bool"):
        if wire != 0:
            raise ProtobufError(f"{path}: expected a varint, got wire type {wire}")
        return _signed(value) if kind == "int" else value != 0
    if wire != 2:
        raise ProtobufError(f"{path}: expected a length-delimited field, got wire type {wire}")
    if kind == "str":
        return _text(value, path)
    if kind == "bytes":
        return base64.b64encode(value).decode("ascii")
    if kind == "time":
        return _time(value, path)
    if kind == "qty":
        return _quantity(value, path)
    if kind == "intstr":
        return _int_or_string(value, path)
    if kind.startswith(("msg:", "inline:")):
        return decode_message(kind.split(":", 1)[1], value, path, depth + 1)
    raise ProtobufError(f"{path}: schema kind {kind!r} is not supported")  # a bug in SCHEMA


def _repeated(kind: str, wire: int, value: Any, path: str, depth: int) -> list[Any]:
    if kind == "int" and wire == 2:  # packed
        out: list[Any] = []
        i = 0
        while i < len(value):
            v, i = _varint(value, i)
            out.append(_signed(v))
        return out
    return [_scalar(kind, wire, value, path, depth)]


def _map_entry(kind: str, wire: int, value: Any, path: str, depth: int) -> tuple[str, Any]:
    if wire != 2:
        raise ProtobufError(f"{path}: a map entry must be length-delimited")
    key = ""
    val: Any = None
    for n, w, v in iter_fields(value):
        if n == 1:
            key = _scalar("str", w, v, f"{path}.key", depth)
        elif n == 2:
            val = _scalar(kind, w, v, f"{path}[{key}]", depth)
    if val is None:  # an absent value is its zero value
        val = {"str": "", "bytes": "", "qty": "0"}.get(kind, {})
    return key, val


def decode_message(name: str, data: bytes, path: str = "", depth: int = 0) -> dict[str, Any]:
    """One message of :data:`SCHEMA` as the JSON the API's JSON path would give."""
    if depth > MAX_DEPTH:
        raise ProtobufError(f"{path or name}: nested more than {MAX_DEPTH} levels deep")
    schema = SCHEMA[name]
    out: dict[str, Any] = {}
    keep: set[str] = set()
    for number, wire, value in iter_fields(data):
        spec = schema.get(number)
        if spec is None:
            continue  # a field this server does not know (a newer client's): skipped
        json_name, kind = spec
        where = f"{path}.{json_name}" if path and json_name else (json_name or path)
        if kind.startswith("[]"):
            out.setdefault(json_name, []).extend(_repeated(kind[2:], wire, value, where, depth))
        elif kind.startswith("map:"):
            key, val = _map_entry(kind[4:], wire, value, where, depth)
            out.setdefault(json_name, {})[key] = val
        elif kind.startswith("inline:"):
            inlined = _scalar(kind, wire, value, where, depth)
            out.update(inlined)
            keep.update(inlined)  # already judged by the inlined message's own presence rules
        else:
            pointer = kind.endswith("*") or kind.startswith("msg*:")
            base = kind.rstrip("*").replace("msg*:", "msg:")
            out[json_name] = _scalar(base, wire, value, where, depth)
            if pointer and out[json_name] is not None:
                keep.add(json_name)
            else:
                keep.discard(json_name)
    return {k: v for k, v in out.items() if k in keep or not _is_zero(v)}


def _is_zero(value: Any) -> bool:
    return any(value is z or (type(value) is type(z) and value == z) for z in _ZERO)


def decode_object(raw: bytes) -> dict[str, Any]:
    """A whole ``k8s\\x00`` body -> ``{"apiVersion", "kind", ...the object's fields}``."""
    api_version, kind, body = unwrap(raw)
    name = KINDS.get((api_version, kind))
    if name is None:
        raise UnknownKind(f'no protobuf decoding for kind "{kind}" in version "{api_version}"; '
                          f"send it as application/json")
    return {"apiVersion": api_version, "kind": kind, **decode_message(name, body, "", 0)}
