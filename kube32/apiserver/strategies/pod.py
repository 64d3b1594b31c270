"""Pods: defaults, spec immutability, status phase, and kubectl's pod columns."""
from __future__ import annotations

from fractions import Fraction
from typing import Any

from ... import movability, objects
from ...quantity import QUANTITY_RULE, QuantityTooLarge, parse_quantity
from ...terms import FASTEST, Annotation, Effect, PodPhase, Policy
from .. import meta
from ..strategy import AGE_COLUMN, NAME_COLUMN, Column, Strategy, get_path

CONTAINER_FIELDS = {"name", "image", "command", "args", "workingDir", "ports", "envFrom", "env",
                    "resources", "volumeMounts", "volumeDevices", "livenessProbe", "readinessProbe",
                    "startupProbe", "lifecycle", "terminationMessagePath", "terminationMessagePolicy",
                    "imagePullPolicy", "securityContext", "stdin", "stdinOnce", "tty", "resizePolicy",
                    "restartPolicy"}
POD_SPEC_FIELDS = {"volumes", "initContainers", "containers", "ephemeralContainers", "restartPolicy",
                   "terminationGracePeriodSeconds", "activeDeadlineSeconds", "dnsPolicy",
                   "nodeSelector", "serviceAccountName", "serviceAccount",
                   "automountServiceAccountToken", "nodeName", "hostNetwork", "hostPID", "hostIPC",
                   "shareProcessNamespace", "securityContext", "imagePullSecrets", "hostname",
                   "subdomain", "affinity", "schedulerName", "tolerations", "hostAliases",
                   "priorityClassName", "priority", "dnsConfig", "readinessGates", "runtimeClassName",
                   "enableServiceLinks", "preemptionPolicy", "overhead",
                   "topologySpreadConstraints", "setHostnameAsFQDN", "os", "hostUsers",
                   "schedulingGates", "resourceClaims"}

# Fields of a pod spec that an update may change (as ValidatePodUpdate allows).
MUTABLE_SPEC = {"activeDeadlineSeconds", "tolerations", "schedulingGates"}


def unknown_pod_spec_fields(spec: Any, prefix: str) -> list[str]:
    if not isinstance(spec, dict):
        return []
    bad = [f"{prefix}.{k}" for k in spec if k not in POD_SPEC_FIELDS]
    for list_name in ("containers", "initContainers"):
        for i, c in enumerate(spec.get(list_name) or []):
            if isinstance(c, dict):
                bad += [f"{prefix}.{list_name}[{i}].{k}" for k in c if k not in CONTAINER_FIELDS]
    return bad


def default_pod_spec(spec: dict[str, Any]) -> None:
    spec.setdefault("restartPolicy", "Always")
    spec.setdefault("terminationGracePeriodSeconds", 30)
    spec.setdefault("dnsPolicy", "ClusterFirst")
    spec.setdefault("schedulerName", "default-scheduler")
    spec.setdefault("securityContext", {})
    for c in (spec.get("containers") or []) + (spec.get("initContainers") or []):
        if isinstance(c, dict):
            c.setdefault("imagePullPolicy", "IfNotPresent")
            c.setdefault("terminationMessagePath", "/dev/termination-log")
            c.setdefault("terminationMessagePolicy", "File")
            c.setdefault("resources", {})
            for port in c.get("ports") or []:
                if isinstance(port, dict):
                    port.setdefault("protocol", "TCP")


ENV_NAME_MSG = "a valid environment variable name must consist only of printable ASCII characters other than '='"


def _env_name_ok(name: Any) -> bool:
    return isinstance(name, str) and all(" " <= ch <= "~" and ch != "=" for ch in name)


def _resource_errors(resources: Any, field: str) -> list[tuple[str, str]]:
    """Limits and requests are quantities, not below zero, and no request above its limit
    (as Kubernetes, before anything reaches a node)."""
    if resources is None:
        return []
    if not isinstance(resources, dict):
        return [(field, "Invalid value: must be an object")]
    errs: list[tuple[str, str]] = []
    parsed: dict[str, dict[str, Fraction]] = {}
    for kind in ("limits", "requests"):
        values = resources.get(kind) or {}
        if not isinstance(values, dict):
            errs.append((f"{field}.{kind}", "Invalid value: must be a map of quantities"))
            continue
        for name, raw in values.items():
            try:
                q = parse_quantity(raw)
            except QuantityTooLarge as e:
                errs.append((f"{field}.{kind}[{name}]", f'Invalid value: "{raw}": {e}'))
                continue
            except ValueError:
                errs.append((f"{field}.{kind}[{name}]", f'Invalid value: "{raw}": {QUANTITY_RULE}'))
                continue
            if q < 0:
                errs.append((f"{field}.{kind}[{name}]", f'Invalid value: "{raw}": must be greater than or equal to 0'))
                continue
            parsed.setdefault(kind, {})[name] = q
    for name, request in (parsed.get("requests") or {}).items():
        limit = (parsed.get("limits") or {}).get(name)
        if limit is not None and request > limit:
            errs.append((f"{field}.requests", f'Invalid value: "{resources["requests"][name]}": must be less '
                         f'than or equal to {name} limit of {resources["limits"][name]}'))
    return errs


def validate_pod_spec(spec: Any, prefix: str) -> list[tuple[str, str]]:
    if not isinstance(spec, dict):
        return [(prefix, "Required value")]
    errs: list[tuple[str, str]] = []
    containers = spec.get("containers")
    if not isinstance(containers, list) or not containers:
        return [(f"{prefix}.containers", "Required value")]
    seen: set[str] = set()
    for i, c in enumerate(containers):
        field = f"{prefix}.containers[{i}]"
        if not isinstance(c, dict):
            errs.append((field, "Invalid value: must be an object"))
            continue
        name = c.get("name")
        if not name:
            errs.append((f"{field}.name", "Required value"))
        elif not isinstance(name, str) or not meta.DNS1123_LABEL.match(name) or len(name) > 63:
            errs.append((f"{field}.name", f'Invalid value: "{name}": {meta.LABEL_MSG}'))
        elif name in seen:
            errs.append((f"{field}.name", f'Duplicate value: "{name}"'))
        else:
            seen.add(name)
        if not c.get("image"):
            errs.append((f"{field}.image", "Required value"))
        for j, e in enumerate(c.get("env") or []):
            if not isinstance(e, dict) or not e.get("name"):
                errs.append((f"{field}.env[{j}].name", "Required value"))
            elif not _env_name_ok(e["name"]):
                errs.append((f"{field}.env[{j}].name", f'Invalid value: "{e["name"]}": {ENV_NAME_MSG}'))
        errs += _resource_errors(c.get("resources"), f"{field}.resources")
    grace = spec.get("terminationGracePeriodSeconds")
    if grace is not None and (isinstance(grace, bool) or not isinstance(grace, int) or grace < 0):
        errs.append((f"{prefix}.terminationGracePeriodSeconds",
                     f"Invalid value: {grace}: must be greater than or equal to 0"))
    node = spec.get("nodeName")
    if node not in (None, "") and (why := meta.subdomain_problem(node)):
        # A node's name goes into the paths of the kubelet's and controllers' requests.
        errs.append((f"{prefix}.nodeName", why))
    policy = spec.get("restartPolicy", "Always")
    if policy not in ("Always", "OnFailure", "Never"):
        errs.append((f"{prefix}.restartPolicy", f'Unsupported value: "{policy}": supported values: '
                     '"Always", "OnFailure", "Never"'))
    errs += toleration_errors(spec.get("tolerations"), f"{prefix}.tolerations")
    return errs


TOLERATION_OPERATORS = ("Equal", "Exists")
TAINT_EFFECTS = (Effect.NO_SCHEDULE, Effect.PREFER_NO_SCHEDULE, Effect.NO_EXECUTE)


def _supported(value: Any, allowed: tuple[str, ...]) -> str:
    return f'Unsupported value: "{value}": supported values: ' + ", ".join(f'"{a}"' for a in allowed)


def toleration_errors(tolerations: Any, field: str) -> list[tuple[str, str]]:
    """kube-apiserver's ValidateTolerations, in its words: what kube32.matching.tolerates
    relies on (an empty key goes only with Exists) holds for every stored pod."""
    if tolerations is None:
        return []
    if not isinstance(tolerations, list):
        return [(field, "Invalid value: must be a list")]
    errs: list[tuple[str, str]] = []
    for i, t in enumerate(tolerations):
        at = f"{field}[{i}]"
        if not isinstance(t, dict):
            errs.append((at, "Invalid value: must be an object"))
            continue
        errs += _toleration_errors(t, at)
    return errs


def _toleration_errors(t: dict[str, Any], at: str) -> list[tuple[str, str]]:
    errs: list[tuple[str, str]] = []
    key, op = t.get("key") or "", t.get("operator") or ""
    value, effect = t.get("value") or "", t.get("effect") or ""
    if key:
        errs += meta.validate_qualified_key(key, f"{at}.key")
    if not key and op != "Exists":
        errs.append((f"{at}.operator", f'Invalid value: "{op}": operator must be Exists when `key` is empty, '
                     'which means "match all values and all keys"'))
    if t.get("tolerationSeconds") is not None and effect != Effect.NO_EXECUTE:
        errs.append((f"{at}.effect", f'Invalid value: "{effect}": '
                     "effect must be 'NoExecute' when `tolerationSeconds` is set"))
    if op in ("", "Equal"):
        if not isinstance(value, str) or len(value) > 63 or not meta.LABEL_VALUE.match(value):
            errs.append((f"{at}.operator", f'Invalid value: "{value}": {meta.LABEL_VALUE_MSG}'))
    elif op == "Exists":
        if value:
            errs.append((f"{at}.operator", f'Invalid value: "{value}": '
                         "value must be empty when `operator` is 'Exists'"))
    else:
        errs.append((f"{at}.operator", _supported(op, TOLERATION_OPERATORS)))
    if effect and effect not in TAINT_EFFECTS:
        errs.append((f"{at}.effect", _supported(effect, TAINT_EFFECTS)))
    return errs


def pod_spec_warnings(spec: Any, prefix: str) -> list[str]:
    """What a pod spec asks that Kube32 does not do yet, said to the client on each write."""
    containers = spec.get("containers") if isinstance(spec, dict) else None
    if not isinstance(containers, list) or len(containers) < 2:
        return []
    names = [c.get("name", "?") if isinstance(c, dict) else "?" for c in containers]
    return [f"{prefix}.containers: Kube32 runs only the first container of a pod ({names[0]}); "
            f"{', '.join(names[1:])} will not run"]


def validate_migration_annotations(pod: dict[str, Any]) -> list[tuple[str, str]]:
    """The migration annotations users write (spec: "Policies", "Periodic checkpoints")."""
    ann = objects.annotations(pod)
    field = "metadata.annotations[{}]"
    errs = []
    value = ann.get(Annotation.MIGRATION)
    if value is not None and value not in Policy.ALL:
        errs.append((field.format(Annotation.MIGRATION),
                     f'Unsupported value: "{value}": supported values: "OnDrain", "Never", "Auto"'))
    value = ann.get(Annotation.CHECKPOINT_INTERVAL)
    if value is not None:
        try:
            movability.parse_interval(str(value))
        except ValueError as e:
            errs.append((field.format(Annotation.CHECKPOINT_INTERVAL), f"Invalid value: {e}"))
    value = ann.get(Annotation.RESTORE_FROM)
    if value is not None and (why := meta.subdomain_problem(value)):
        # The kubelet fetches .../checkpoints/<this>/data with the node's credentials.
        errs.append((field.format(Annotation.RESTORE_FROM),
                     f"{why}: it must be the name of a Checkpoint in the pod's namespace"))
    value = ann.get(Annotation.PLACEMENT)
    if value is not None and value != FASTEST:
        errs.append((field.format(Annotation.PLACEMENT), f'Unsupported value: "{value}": supported values: "fastest"'))
    return errs


def pod_status_text(pod: dict[str, Any]) -> str:
    """The STATUS column, after kubectl's printPod."""
    status = objects.status(pod)
    reason = status.get("reason") or status.get("phase") or PodPhase.PENDING
    for cs in status.get("containerStatuses") or []:
        state = cs.get("state") or {}
        if state.get("waiting", {}).get("reason"):
            reason = state["waiting"]["reason"]
        elif "terminated" in state:
            t = state["terminated"]
            reason = t.get("reason") or (f"Signal:{t['signal']}" if t.get("signal")
                                         else f"ExitCode:{t.get('exitCode', 0)}")
    if objects.meta(pod).get("deletionTimestamp"):
        reason = "Terminating"
    return reason


class PodStrategy(Strategy):
    kind = "Pod"
    top_fields = {"spec", "status"}
    columns = [NAME_COLUMN,
               Column("Ready", description="The aggregate readiness state of this pod for accepting traffic."),
               Column("Status", description="The aggregate status of the containers in this pod."),
               Column("Restarts", type="string",
                      description="The number of times the containers in this pod have been restarted."),
               AGE_COLUMN,
               Column("IP", priority=1, description="The IP address assigned to the pod"),
               Column("Node", priority=1, description="The name of the node the pod is scheduled on"),
               Column("Nominated Node", priority=1, description="The node the pod is nominated on"),
               Column("Readiness Gates", priority=1, description="The readiness gates of the pod")]
    selectable_fields = {"metadata.name", "metadata.namespace", "spec.nodeName", "spec.restartPolicy",
                         "spec.schedulerName", "spec.serviceAccountName", "status.phase",
                         "status.podIP", "status.nominatedNodeName", "spec.hostNetwork"}

    def default_status(self, obj: dict[str, Any]) -> dict[str, Any]:
        return {"phase": PodPhase.PENDING, "qosClass": "BestEffort"}

    def default(self, obj: dict[str, Any]) -> None:
        spec = obj.get("spec")
        if isinstance(spec, dict):
            default_pod_spec(spec)

    def unknown_nested(self, obj: dict[str, Any]) -> list[str]:
        return unknown_pod_spec_fields(obj.get("spec"), "spec")

    def validate(self, obj: dict[str, Any]) -> list[tuple[str, str]]:
        return validate_pod_spec(obj.get("spec"), "spec") + validate_migration_annotations(obj)

    def warnings(self, obj: dict[str, Any]) -> list[str]:
        return pod_spec_warnings(obj.get("spec"), "spec")

    def validate_update(self, new: dict[str, Any], old: dict[str, Any]) -> list[tuple[str, str]]:
        errs = self.validate(new)
        if errs:
            return errs
        ns, os_ = dict(objects.spec(new)), dict(objects.spec(old))
        for f in MUTABLE_SPEC:
            ns.pop(f, None)
            os_.pop(f, None)
        # Images may change (kubectl set image); compare the rest of the containers.

        def strip(containers: list | None) -> list:
            return [{k: v for k, v in c.items() if k != "image"} for c in containers or []]
        ns["containers"], os_["containers"] = strip(ns.get("containers")), strip(os_.get("containers"))
        if ns != os_:
            return [("spec", "Forbidden: pod updates may not change fields other than "
                     "`spec.containers[*].image`, `spec.initContainers[*].image`, "
                     "`spec.activeDeadlineSeconds`, `spec.tolerations` (only additions to existing "
                     "tolerations), `spec.terminationGracePeriodSeconds` (allow it to be set to 1 "
                     "if it was previously negative)")]
        return []

    def extra_fields(self, obj: dict[str, Any]) -> dict[str, str]:
        spec, status = objects.spec(obj), objects.status(obj)
        return {"spec.nodeName": spec.get("nodeName", ""),
                "spec.restartPolicy": spec.get("restartPolicy", ""),
                "spec.schedulerName": spec.get("schedulerName", ""),
                "spec.serviceAccountName": spec.get("serviceAccountName", ""),
                "spec.hostNetwork": str(bool(spec.get("hostNetwork"))).lower(),
                "status.phase": status.get("phase", ""),
                "status.podIP": status.get("podIP", ""),
                "status.nominatedNodeName": status.get("nominatedNodeName", "")}

    def row(self, obj: dict[str, Any]) -> list[Any]:
        containers = get_path(obj, "spec", "containers", default=[]) or []
        statuses = get_path(obj, "status", "containerStatuses", default=[]) or []
        ready = sum(1 for s in statuses if s.get("ready"))
        restarts = sum(int(s.get("restartCount", 0)) for s in statuses)
        status = objects.status(obj)
        return [objects.name(obj), f"{ready}/{len(containers)}", pod_status_text(obj), str(restarts),
                meta.age(obj), status.get("podIP") or "<none>",
                objects.spec(obj).get("nodeName") or "<none>",
                status.get("nominatedNodeName") or "<none>", "<none>"]
