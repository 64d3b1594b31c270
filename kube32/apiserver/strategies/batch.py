"""batch/v1 Jobs and CronJobs: defaults, validation and kubectl's columns, as Kubernetes'.

A Job's defaults (``pkg/apis/batch/v1/defaults.go``): ``completions`` and
``parallelism`` 1 when both are unset, else ``parallelism`` 1; ``backoffLimit`` 6;
``completionMode`` NonIndexed; ``suspend`` false; ``podReplacementPolicy``
TerminatingOrFailed; and, unless ``manualSelector`` is true, the selector
``batch.kubernetes.io/controller-uid: <the Job's uid>`` with the template labelled
``controller-uid``, ``batch.kubernetes.io/controller-uid``, ``job-name`` and
``batch.kubernetes.io/job-name`` (the registry gives an object its uid before its
defaults); with ``backoffLimitPerIndex``, ``backoffLimit`` defaults to 2^31-1, and with
``podFailurePolicy``, ``podReplacementPolicy`` to Failed.  A Job's template runs to
completion: ``restartPolicy`` must be ``OnFailure`` or ``Never`` (only ``Never`` with a
``podFailurePolicy``).  ``podFailurePolicy`` (at most 20 rules, each of ``onExitCodes`` or
``onPodConditions``, action FailJob, Ignore, Count or FailIndex, which needs
``backoffLimitPerIndex``), ``successPolicy`` (Indexed; rules of ``succeededIndexes``
and/or ``succeededCount``), ``backoffLimitPerIndex`` and ``maxFailedIndexes`` (Indexed)
are validated as ``pkg/apis/batch/validation`` does, in its words.  The selector,
template, completions, completion mode and those three policies are immutable.

A CronJob's defaults: ``concurrencyPolicy`` Allow, ``suspend`` false, history limits 3
successful and 1 failed.  Its schedule and time zone are parsed by kube32.cron and a
bad one is refused with the parser's message; its name is at most 52 characters (its
Jobs' names add 11).
"""
from __future__ import annotations

import json
import re
from typing import Any, TypeGuard

from ... import cron, objects
from ...terms import Condition, Label
from .. import meta
from ..strategy import AGE_COLUMN, NAME_COLUMN, Column, Strategy, condition, get_path
from .workload import selector_errors, selector_text
from .pod import default_pod_spec, pod_spec_warnings, unknown_pod_spec_fields, validate_pod_spec

JOB_SPEC_FIELDS = {"parallelism", "completions", "activeDeadlineSeconds", "podFailurePolicy", "successPolicy",
                   "backoffLimit", "backoffLimitPerIndex", "maxFailedIndexes", "selector", "manualSelector",
                   "template", "ttlSecondsAfterFinished", "completionMode", "suspend", "podReplacementPolicy",
                   "managedBy"}
CRONJOB_SPEC_FIELDS = {"schedule", "timeZone", "startingDeadlineSeconds", "concurrencyPolicy", "suspend",
                       "jobTemplate", "successfulJobsHistoryLimit", "failedJobsHistoryLimit"}
COMPLETION_MODES = ("NonIndexed", "Indexed")
CONCURRENCY_POLICIES = ("Allow", "Forbid", "Replace")
MAX_CRONJOB_NAME = 52
MAX_INDEXED_COMPLETIONS = 100_000   # as Kubernetes: completedIndexes must stay small
MAX_INT32 = 2**31 - 1
# Kubernetes' bounds on the policies (pkg/apis/batch/validation).
MAX_FAILED_INDEXES = 100_000
MAX_POLICY_RULES = 20
MAX_EXIT_CODE_VALUES = 255
MAX_CONDITION_PATTERNS = 20
MAX_SUCCEEDED_INDEXES_CHARS = 64 * 1024
POLICY_ACTIONS = ("Count", "FailIndex", "FailJob", "Ignore")
EXIT_CODE_OPERATORS = ("In", "NotIn")
CONDITION_STATUSES = ("False", "True", "Unknown")
QUALIFIED_NAME = re.compile(r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
                            r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")


def _quoted(values: tuple[str, ...]) -> str:
    return ", ".join(f'"{v}"' for v in values)


def _go_list(values: tuple[str, ...]) -> str:
    """A list as Go's %q prints it: ["a" "b"]."""
    return "[" + " ".join(f'"{v}"' for v in values) + "]"


def _is_int(v: Any) -> TypeGuard[int]:
    return isinstance(v, int) and not isinstance(v, bool)


def indexes_format_error(text: str, completions: int) -> tuple[int, str | None]:
    """(how many indexes, None) for "1,3-5" within ``completions``, or (0, why not) in
    Kubernetes' words (``validateIndexesFormat``)."""
    if not text:
        return 0, None
    last: int | None = None
    total = 0
    for part in text.split(","):
        bounds = part.split("-")
        if len(bounds) > 2:
            return 0, (f'the fragment "{part}" violates the requirement that an index interval can have '
                       "at most two parts separated by '-'")
        nums: list[int] = []
        for b in bounds:
            if not b.isdigit() or len(b) > 10:
                return 0, f'cannot convert string to integer for index: "{b}"'
            if int(b) >= completions:
                return 0, f'too large index: "{b}"'
            nums.append(int(b))
        x, y = nums[0], nums[-1]
        if len(nums) == 2 and x >= y:
            return 0, f"non-increasing order, previous: {x}, current: {y}"
        if last is not None and last >= x:
            return 0, f"non-increasing order, previous: {last}, current: {x}"
        total += y - x + 1
        last = y
    return total, None


def _int_errors(spec: dict[str, Any], prefix: str, name: str, low: int) -> list[tuple[str, str]]:
    v = spec.get(name)
    if v is None:
        return []
    if isinstance(v, bool) or not isinstance(v, int) or v < low:
        rel = "greater than or equal to 0" if low == 0 else "greater than 0"
        return [(f"{prefix}.{name}", f"Invalid value: {v}: must be {rel}")]
    return []


def _value(v: Any) -> str:
    if isinstance(v, str):
        return json.dumps(v)
    if _is_int(v) or isinstance(v, bool) or v is None:
        return json.dumps(v)
    return json.dumps(v, separators=(",", ":"), sort_keys=True)[:256]


def _invalid(path: str, value: Any, detail: str) -> tuple[str, str]:
    return path, f"Invalid value: {_value(value)}: {detail}"


def _unsupported(path: str, value: Any, allowed: tuple[str, ...]) -> tuple[str, str]:
    return path, f"Unsupported value: {_value(value)}: supported values: {_quoted(allowed)}"


def _per_index_errors(spec: dict[str, Any], prefix: str) -> list[tuple[str, str]]:
    """backoffLimitPerIndex and maxFailedIndexes (Indexed Jobs only)."""
    errs: list[tuple[str, str]] = []
    per, most, completions = spec.get("backoffLimitPerIndex"), spec.get("maxFailedIndexes"), spec.get("completions")
    for name in ("backoffLimitPerIndex", "maxFailedIndexes"):
        errs += _int_errors(spec, prefix, name, 0)
    if most is not None and per is None:
        errs.append((f"{prefix}.backoffLimitPerIndex", "Required value: when maxFailedIndexes is specified"))
    if spec.get("completionMode", "NonIndexed") != "Indexed":
        for name in ("backoffLimitPerIndex", "maxFailedIndexes"):
            if spec.get(name) is not None:
                errs.append(_invalid(f"{prefix}.{name}", spec[name], "requires indexed completion mode"))
        return errs
    if _is_int(most) and _is_int(completions) and most > completions:
        errs.append(_invalid(f"{prefix}.maxFailedIndexes", most, "must be less than or equal to completions"))
    if _is_int(most) and most > MAX_FAILED_INDEXES:
        errs.append(_invalid(f"{prefix}.maxFailedIndexes", most, f"must be less than or equal to {MAX_FAILED_INDEXES}"))
    return errs


def _exit_codes_errors(req: Any, path: str, containers: set[str]) -> list[tuple[str, str]]:
    if not isinstance(req, dict):
        return [(path, "Invalid value: must be an object")]
    errs: list[tuple[str, str]] = []
    op = req.get("operator")
    if not op:
        errs.append((f"{path}.operator", f"Required value: valid values: {_go_list(EXIT_CODE_OPERATORS)}"))
    elif op not in EXIT_CODE_OPERATORS:
        errs.append(_unsupported(f"{path}.operator", op, EXIT_CODE_OPERATORS))
    name = req.get("containerName")
    if name is not None and name not in containers:
        errs.append(_invalid(f"{path}.containerName", name,
                             "must be one of the container or initContainer names in the pod template"))
    values = req.get("values")
    if not isinstance(values, list) or not values:
        errs.append(_invalid(f"{path}.values", values or [], "at least one value is required"))
        return errs
    if len(values) > MAX_EXIT_CODE_VALUES:
        errs.append((f"{path}.values", f"Too many: {len(values)}: must have at most {MAX_EXIT_CODE_VALUES} items"))
    seen: set[int] = set()
    for j, v in enumerate(values[:MAX_EXIT_CODE_VALUES + 1]):
        if not _is_int(v) or not -2**31 <= v <= MAX_INT32:
            errs.append(_invalid(f"{path}.values[{j}]", v, "must be a 32-bit integer"))
            continue
        if op == "In" and v == 0:
            errs.append(_invalid(f"{path}.values[{j}]", v, "must not be 0 for the In operator"))
        if v in seen:
            errs.append((f"{path}.values[{j}]", f"Duplicate value: {v}"))
        seen.add(v)
    ints = [v for v in values if _is_int(v)]
    if ints != sorted(ints):
        errs.append(_invalid(f"{path}.values", values, "must be ordered"))
    return errs


def _conditions_errors(patterns: Any, path: str) -> list[tuple[str, str]]:
    if not isinstance(patterns, list):
        return [(path, "Invalid value: must be a list")]
    errs: list[tuple[str, str]] = []
    if len(patterns) > MAX_CONDITION_PATTERNS:
        errs.append((path, f"Too many: {len(patterns)}: must have at most {MAX_CONDITION_PATTERNS} items"))
    for j, pat in enumerate(patterns[:MAX_CONDITION_PATTERNS + 1]):
        pat = pat if isinstance(pat, dict) else {}
        ctype, status = pat.get("type"), pat.get("status")
        if not isinstance(ctype, str) or not ctype:
            errs.append((f"{path}[{j}].type", "Required value: name part must be non-empty"))
        elif len(ctype) > 316 or not QUALIFIED_NAME.match(ctype):
            errs.append(_invalid(f"{path}[{j}].type", ctype,
                                 "name part must consist of alphanumeric characters, '-', '_' or '.', and must "
                                 "start and end with an alphanumeric character"))
        if not status:
            errs.append((f"{path}[{j}].status", f"Required value: valid values: {_go_list(CONDITION_STATUSES)}"))
        elif status not in CONDITION_STATUSES:
            errs.append(_unsupported(f"{path}[{j}].status", status, CONDITION_STATUSES))
    return errs


def _pod_failure_policy_errors(spec: dict[str, Any], prefix: str) -> list[tuple[str, str]]:
    policy = spec.get("podFailurePolicy")
    path = f"{prefix}.podFailurePolicy"
    if not isinstance(policy, dict):
        return [(path, "Invalid value: must be an object")]
    rules = policy.get("rules") or []
    if not isinstance(rules, list):
        return [(f"{path}.rules", "Invalid value: must be a list")]
    errs: list[tuple[str, str]] = []
    if len(rules) > MAX_POLICY_RULES:
        errs.append((f"{path}.rules", f"Too many: {len(rules)}: must have at most {MAX_POLICY_RULES} items"))
    tspec = get_path(spec, "template", "spec")
    tspec = tspec if isinstance(tspec, dict) else {}
    containers = {c.get("name") for key in ("containers", "initContainers") for c in tspec.get(key) or []
                  if isinstance(c, dict)}
    for i, rule in enumerate(rules[:MAX_POLICY_RULES + 1]):
        errs += _rule_errors(spec, rule if isinstance(rule, dict) else {}, f"{path}.rules[{i}]", containers)
    return errs


def _rule_errors(spec: dict[str, Any], rule: dict[str, Any], path: str, containers: set[Any]) -> list[tuple[str, str]]:
    errs: list[tuple[str, str]] = []
    action = rule.get("action")
    if not action:
        errs.append((f"{path}.action", f"Required value: valid values: {_go_list(POLICY_ACTIONS)}"))
    elif action == "FailIndex":
        if spec.get("backoffLimitPerIndex") is None:
            errs.append(_invalid(f"{path}.action", action, "requires the backoffLimitPerIndex to be set"))
    elif action not in POLICY_ACTIONS:
        errs.append(_unsupported(f"{path}.action", action, POLICY_ACTIONS))
    codes, conds = rule.get("onExitCodes"), rule.get("onPodConditions")
    if codes is not None:
        errs += _exit_codes_errors(codes, f"{path}.onExitCodes", containers)
    if conds:
        errs += _conditions_errors(conds, f"{path}.onPodConditions")
    if codes is not None and conds:
        errs.append((path, "Invalid value: specifying both OnExitCodes and OnPodConditions is not supported"))
    if codes is None and not conds:
        errs.append((path, "Invalid value: specifying one of OnExitCodes and OnPodConditions is required"))
    return errs


def _success_policy_errors(spec: dict[str, Any], prefix: str) -> list[tuple[str, str]]:
    policy = spec.get("successPolicy")
    path = f"{prefix}.successPolicy"
    if spec.get("completionMode", "NonIndexed") != "Indexed":
        return [_invalid(path, policy, "requires indexed completion mode")]
    rules = policy.get("rules") if isinstance(policy, dict) else None
    if not isinstance(rules, list) or not rules:
        return [(f"{path}.rules", "Required value: at least one rules must be specified when the successPolicy "
                 "is specified")]
    errs: list[tuple[str, str]] = []
    if len(rules) > MAX_POLICY_RULES:
        errs.append((f"{path}.rules", f"Too many: {len(rules)}: must have at most {MAX_POLICY_RULES} items"))
    c = spec.get("completions")
    completions = c if _is_int(c) else 0
    for i, rule in enumerate(rules[:MAX_POLICY_RULES + 1]):
        errs += _success_rule_errors(rule if isinstance(rule, dict) else {}, f"{path}.rules[{i}]", completions)
    return errs


def _success_rule_errors(rule: dict[str, Any], path: str, completions: int) -> list[tuple[str, str]]:
    errs: list[tuple[str, str]] = []
    indexes, count = rule.get("succeededIndexes"), rule.get("succeededCount")
    if indexes is None and count is None:
        errs.append((path, "Required value: at least one of succeededCount or succeededIndexes must be specified"))
    total = 0
    if indexes is not None:
        where = f"{path}.succeededIndexes"
        if not isinstance(indexes, str):
            return errs + [_invalid(where, indexes, "must be a string")]
        if len(indexes) > MAX_SUCCEEDED_INDEXES_CHARS:
            errs.append((where, f"Too long: may not be more than {MAX_SUCCEEDED_INDEXES_CHARS} bytes"))
        total, why = indexes_format_error(indexes[:MAX_SUCCEEDED_INDEXES_CHARS], completions)
        if why is not None:
            errs.append(_invalid(where, indexes[:256], f"error parsing succeededIndexes: {why}"))
    if count is not None:
        where = f"{path}.succeededCount"
        if not _is_int(count) or count < 0:
            return errs + [_invalid(where, count, "must be greater than or equal to 0")]
        if count > completions:
            errs.append(_invalid(where, count, f"must be less than or equal to {completions} "
                                 "(the number of specified completions)"))
        if indexes is not None and count > total:
            errs.append(_invalid(where, count, f"must be less than or equal to {total} "
                                 "(the number of indexes in the specified succeededIndexes field)"))
    return errs


def validate_job_spec(spec: Any, prefix: str, *, selector: bool = True) -> list[tuple[str, str]]:
    """A JobSpec's errors (a CronJob's jobTemplate has no selector yet: ``selector=False``)."""
    if not isinstance(spec, dict):
        return [(prefix, "Required value")]
    errs: list[tuple[str, str]] = []
    for name, low in (("parallelism", 0), ("completions", 0), ("backoffLimit", 0),
                      ("activeDeadlineSeconds", 1), ("ttlSecondsAfterFinished", 0)):
        errs += _int_errors(spec, prefix, name, low)
    mode = spec.get("completionMode", "NonIndexed")
    if mode not in COMPLETION_MODES:
        errs.append((f"{prefix}.completionMode", f'Unsupported value: "{mode}": supported values: '
                     '"NonIndexed", "Indexed"'))
    elif mode == "Indexed":
        c = spec.get("completions")
        if c is None:
            errs.append((f"{prefix}.completions", "Required value: when completion mode is Indexed"))
        elif isinstance(c, int) and c > MAX_INDEXED_COMPLETIONS:
            errs.append((f"{prefix}.completions", f"Invalid value: {c}: must be less than or equal to "
                         f"{MAX_INDEXED_COMPLETIONS} when completion mode is Indexed"))
    errs += _per_index_errors(spec, prefix)
    if spec.get("podFailurePolicy") is not None:
        errs += _pod_failure_policy_errors(spec, prefix)
        replacement = spec.get("podReplacementPolicy")
        if replacement is not None and replacement != "Failed":
            errs.append(_unsupported(f"{prefix}.podReplacementPolicy", replacement, ("Failed",)))
    if spec.get("successPolicy") is not None:
        errs += _success_policy_errors(spec, prefix)
    if selector:
        errs += selector_errors(spec, prefix)
    tspec = get_path(spec, "template", "spec")
    errs += validate_pod_spec(tspec, f"{prefix}.template.spec")
    policy = tspec.get("restartPolicy") if isinstance(tspec, dict) else "Never"
    if policy is None:
        errs.append((f"{prefix}.template.spec.restartPolicy", 'Required value: valid values: "OnFailure", "Never"'))
    elif policy not in ("OnFailure", "Never"):
        errs.append((f"{prefix}.template.spec.restartPolicy",
                     f'Unsupported value: "{policy}": supported values: "OnFailure", "Never"'))
    elif spec.get("podFailurePolicy") is not None and policy != "Never":
        errs.append(_invalid(f"{prefix}.template.spec.restartPolicy", policy,
                             'only "Never" is supported when podFailurePolicy is specified'))
    return errs


def _default_job_spec(spec: dict[str, Any]) -> None:
    if spec.get("completions") is None and spec.get("parallelism") is None:
        spec["completions"] = 1
        spec["parallelism"] = 1
    spec.setdefault("parallelism", 1)
    # With a limit per index, the Job's own limit is no limit unless it says one.
    spec.setdefault("backoffLimit", MAX_INT32 if spec.get("backoffLimitPerIndex") is not None else 6)
    spec.setdefault("completionMode", "NonIndexed")
    spec.setdefault("suspend", False)
    spec.setdefault("podReplacementPolicy", "Failed" if spec.get("podFailurePolicy") is not None
                    else "TerminatingOrFailed")
    tspec = get_path(spec, "template", "spec")
    if isinstance(tspec, dict):
        _default_template_spec(tspec)


def _default_template_spec(tspec: dict[str, Any]) -> None:
    """A pod spec's defaults but restartPolicy: a Job's template must say it (Kubernetes
    defaults it to Always, which a Job refuses)."""
    had = "restartPolicy" in tspec
    default_pod_spec(tspec)
    if not had:
        tspec.pop("restartPolicy", None)


def _unknown_spec(spec: Any, allowed: set[str], prefix: str) -> list[str]:
    return [f"{prefix}.{k}" for k in spec if k not in allowed] if isinstance(spec, dict) else []


def _images(tspec: Any) -> tuple[str, str]:
    cs = (tspec or {}).get("containers") or [] if isinstance(tspec, dict) else []
    return (",".join(str(c.get("name", "")) for c in cs if isinstance(c, dict)),
            ",".join(str(c.get("image", "")) for c in cs if isinstance(c, dict)))


def job_status_text(job: dict[str, Any]) -> str:
    """The STATUS column of ``kubectl get jobs`` (kubectl 1.32's printer)."""
    for ctype, text in ((Condition.JOB_COMPLETE, "Complete"), (Condition.JOB_FAILED, "Failed"),
                        (Condition.JOB_FAILURE_TARGET, "FailureTarget"),
                        (Condition.JOB_SUCCESS_CRITERIA_MET, "SuccessCriteriaMet"),
                        (Condition.JOB_SUSPENDED, "Suspended")):
        c = condition(job, ctype)
        if c is not None and c.get("status") == "True":
            return text
    if objects.meta(job).get("deletionTimestamp"):
        return "Terminating"
    return "Running"


def _completions_text(job: dict[str, Any]) -> str:
    spec, st = objects.spec(job), objects.status(job)
    done = st.get("succeeded", 0)
    if spec.get("completions") is not None:
        return f"{done}/{spec['completions']}"
    par = spec.get("parallelism", 1) or 0
    return f"{done}/1 of {par}" if par > 1 else f"{done}/1"


def _duration_text(job: dict[str, Any]) -> str:
    st = objects.status(job)
    start = objects.parse_time(st.get("startTime"))
    if start is None:
        return ""
    end = objects.parse_time(st.get("completionTime")) or objects.now()
    return meta.human_duration((end - start).total_seconds())


class JobStrategy(Strategy):
    kind = "Job"
    columns = [NAME_COLUMN, Column("Status"), Column("Completions"), Column("Duration"), AGE_COLUMN,
               Column("Containers", priority=1), Column("Images", priority=1), Column("Selector", priority=1)]

    def default(self, obj: dict[str, Any]) -> None:
        spec = obj.setdefault("spec", {})
        if not isinstance(spec, dict):
            return
        _default_job_spec(spec)
        md = objects.meta(obj)
        if spec.get("manualSelector") is not True and not spec.get("selector") and md.get("uid"):
            uid = md["uid"]
            spec["selector"] = {"matchLabels": {Label.JOB_CONTROLLER_UID: uid}}
            template = spec.setdefault("template", {})
            if isinstance(template, dict):
                labels = template.setdefault("metadata", {}).setdefault("labels", {})
                labels.update({Label.LEGACY_CONTROLLER_UID: uid, Label.JOB_CONTROLLER_UID: uid,
                               Label.LEGACY_JOB_NAME: md.get("name", ""), Label.JOB_NAME: md.get("name", "")})

    def unknown_nested(self, obj: dict[str, Any]) -> list[str]:
        spec = obj.get("spec")
        return _unknown_spec(spec, JOB_SPEC_FIELDS, "spec") + \
            unknown_pod_spec_fields(get_path(spec, "template", "spec"), "spec.template.spec")

    def validate(self, obj: dict[str, Any]) -> list[tuple[str, str]]:
        return validate_job_spec(obj.get("spec"), "spec")

    def validate_update(self, new: dict[str, Any], old: dict[str, Any]) -> list[tuple[str, str]]:
        errs = self.validate(new)
        for f in ("selector", "template", "completions", "completionMode", "podFailurePolicy",
                  "backoffLimitPerIndex", "successPolicy"):
            if get_path(new, "spec", f) != get_path(old, "spec", f):
                errs.append((f"spec.{f}", "Invalid value: field is immutable"))
        return errs

    def warnings(self, obj: dict[str, Any]) -> list[str]:
        return pod_spec_warnings(get_path(obj, "spec", "template", "spec"), "spec.template.spec")

    def row(self, obj: dict[str, Any]) -> list[Any]:
        names, images = _images(get_path(obj, "spec", "template", "spec"))
        return [objects.name(obj), job_status_text(obj), _completions_text(obj), _duration_text(obj),
                meta.age(obj), names, images, selector_text(get_path(obj, "spec", "selector"))]


class CronJobStrategy(Strategy):
    kind = "CronJob"
    columns = [NAME_COLUMN, Column("Schedule"), Column("Timezone"), Column("Suspend", type="boolean"),
               Column("Active", type="integer"), Column("Last Schedule"), AGE_COLUMN,
               Column("Containers", priority=1), Column("Images", priority=1), Column("Selector", priority=1)]

    def default(self, obj: dict[str, Any]) -> None:
        spec = obj.setdefault("spec", {})
        if not isinstance(spec, dict):
            return
        spec.setdefault("concurrencyPolicy", "Allow")
        spec.setdefault("suspend", False)
        spec.setdefault("successfulJobsHistoryLimit", 3)
        spec.setdefault("failedJobsHistoryLimit", 1)
        jspec = get_path(spec, "jobTemplate", "spec")
        if isinstance(jspec, dict):
            tspec = get_path(jspec, "template", "spec")
            if isinstance(tspec, dict):
                _default_template_spec(tspec)

    def unknown_nested(self, obj: dict[str, Any]) -> list[str]:
        spec = obj.get("spec")
        jspec = get_path(spec, "jobTemplate", "spec")
        return _unknown_spec(spec, CRONJOB_SPEC_FIELDS, "spec") + \
            _unknown_spec(jspec, JOB_SPEC_FIELDS, "spec.jobTemplate.spec") + \
            unknown_pod_spec_fields(get_path(jspec, "template", "spec"), "spec.jobTemplate.spec.template.spec")

    def validate(self, obj: dict[str, Any]) -> list[tuple[str, str]]:
        spec = obj.get("spec")
        if not isinstance(spec, dict):
            return [("spec", "Required value")]
        errs: list[tuple[str, str]] = []
        name = objects.name(obj)
        if len(name) > MAX_CRONJOB_NAME:
            errs.append(("metadata.name", f'Invalid value: "{name}": must be no more than '
                         f"{MAX_CRONJOB_NAME} characters"))
        schedule = spec.get("schedule")
        if not schedule:
            errs.append(("spec.schedule", "Required value"))
        else:
            try:
                cron.parse(schedule)
            except cron.CronError as e:
                errs.append(("spec.schedule", f'Invalid value: "{schedule}": {e}'))
        tz = spec.get("timeZone")
        if tz is not None:
            try:
                if not isinstance(tz, str) or not tz:
                    raise cron.CronError(f"unknown time zone {tz!r}")
                cron.zone(tz)
            except cron.CronError as e:
                errs.append(("spec.timeZone", f'Invalid value: "{tz}": {e}'))
        policy = spec.get("concurrencyPolicy", "Allow")
        if policy not in CONCURRENCY_POLICIES:
            errs.append(("spec.concurrencyPolicy", f'Unsupported value: "{policy}": supported values: '
                         '"Allow", "Forbid", "Replace"'))
        for f in ("startingDeadlineSeconds", "successfulJobsHistoryLimit", "failedJobsHistoryLimit"):
            errs += _int_errors(spec, "spec", f, 0)
        errs += validate_job_spec(get_path(spec, "jobTemplate", "spec"), "spec.jobTemplate.spec", selector=False)
        return errs

    def warnings(self, obj: dict[str, Any]) -> list[str]:
        return pod_spec_warnings(get_path(obj, "spec", "jobTemplate", "spec", "template", "spec"),
                                 "spec.jobTemplate.spec.template.spec")

    def row(self, obj: dict[str, Any]) -> list[Any]:
        spec, st = objects.spec(obj), objects.status(obj)
        last = st.get("lastScheduleTime")
        names, images = _images(get_path(spec, "jobTemplate", "spec", "template", "spec"))
        return [objects.name(obj), spec.get("schedule", ""), spec.get("timeZone") or "<none>",
                "True" if spec.get("suspend") else "False", len(st.get("active") or []),   # printBoolPtr
                meta.age(obj, last) if last else "<none>", meta.age(obj), names, images,
                selector_text(get_path(spec, "jobTemplate", "spec", "selector"))]
