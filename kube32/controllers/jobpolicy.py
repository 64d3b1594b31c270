"""A Job's failure and success rules, pure: Kubernetes v1.32's ``pod_failure_policy.go``,
``success_policy.go`` and the per-index parts of ``indexed_job_utils.go``.

* :func:`match_pod_failure_policy` decides what one Failed pod means under
  ``spec.podFailurePolicy``: its rules in order, the first that matches wins.  A rule
  ``onExitCodes`` matches a container (of ``containerName``, or any) whose
  ``state.terminated.exitCode`` is not 0 and is ``In`` (or ``NotIn``) its values; a rule
  ``onPodConditions`` matches a pod condition of that type and status.  Its action:
  ``FailJob`` (the Job fails, reason PodFailurePolicy, with a message naming the pod,
  the container or condition and the rule's index), ``Ignore`` (the failure is not
  counted: neither ``status.failed`` nor ``backoffLimit`` nor the index's back-off),
  ``Count`` (counted, as with no rule) or ``FailIndex`` (the pod's index fails at once;
  Indexed Jobs with ``backoffLimitPerIndex``).
* :func:`match_success_policy`: the first ``successPolicy`` rule whose
  ``succeededIndexes`` all succeeded (or ``succeededCount`` of them), or, without
  indexes, whose ``succeededCount`` indexes succeeded.
* Indexes are written as Kubernetes writes them (:func:`format_indexes`: "0,1,3-5", a
  run of two is two numbers) and read leniently (:func:`parse_indexes`: a malformed part
  is skipped, an index at or above ``completions`` dropped).
* Per index (``backoffLimitPerIndex``), a pod carries how many times its index failed
  before it (annotation ``batch.kubernetes.io/job-index-failure-count``, and ignored
  failures in ``...-ignored-failure-count``); a Failed pod whose count is already
  ``backoffLimitPerIndex`` fails its index (:func:`index_failed`), else its replacement
  counts one more (:func:`next_failure_counts`).  Annotations a user wrote that are not
  numbers in 0..2^31-1 count as 0, as Kubernetes reads them.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .. import objects
from ..terms import JobAnnotation, PodPhase

Obj = dict[str, Any]

FAIL_JOB = "FailJob"
FAIL_INDEX = "FailIndex"
IGNORE = "Ignore"
COUNT = "Count"
MAX_INT32 = 2**31 - 1


@dataclass(frozen=True)
class Match:
    """What a Failed pod means under a pod failure policy."""
    counted: bool = True             # counts toward status.failed and the back-off limits
    action: str | None = None        # the matching rule's action, None when no rule matched
    message: str | None = None       # FailJob's message


NO_RULE = Match()


def _terminated(cs: Obj) -> Obj | None:
    t = (cs.get("state") or {}).get("terminated") if isinstance(cs, dict) else None
    return t if isinstance(t, dict) else None


def _exit_code(t: Obj) -> int:
    code = t.get("exitCode")
    return code if isinstance(code, int) and not isinstance(code, bool) else 0


def matching_container(pod: Obj, requirement: Obj) -> Obj | None:
    """The first terminated container (then init container) whose non-zero exit code meets
    ``requirement`` (``operator`` In/NotIn, ``values``, optional ``containerName``)."""
    st = objects.status(pod)
    name = requirement.get("containerName")
    values = requirement.get("values") or []
    operator = requirement.get("operator")
    for key in ("containerStatuses", "initContainerStatuses"):
        for cs in st.get(key) or []:
            t = _terminated(cs)
            if t is None or (name is not None and cs.get("name") != name):
                continue
            code = _exit_code(t)
            if code != 0 and ((operator == "In" and code in values) or (operator == "NotIn" and code not in values)):
                return cs
    return None


def matching_condition(pod: Obj, patterns: list[Obj]) -> Obj | None:
    """The first pod condition of a type and status one of ``patterns`` names."""
    for cond in objects.status(pod).get("conditions") or []:
        if not isinstance(cond, dict):
            continue
        for pat in patterns:
            if isinstance(pat, dict) and (cond.get("type"), cond.get("status")) == (pat.get("type"), pat.get("status")):
                return cond
    return None


def _rule_match(rule: Obj, index: int, pod: Obj) -> Match | None:
    action = rule.get("action")
    md = objects.meta(pod)
    who = f"{md.get('namespace')}/{md.get('name')}"
    if rule.get("onExitCodes") is not None:
        cs = matching_container(pod, rule["onExitCodes"])
        if cs is None:
            return None
        message = (f"Container {cs.get('name')} for pod {who} failed with exit code "
                   f"{_exit_code(_terminated(cs) or {})} matching {action} rule at index {index}")
    elif rule.get("onPodConditions") is not None:
        cond = matching_condition(pod, rule["onPodConditions"])
        if cond is None:
            return None
        message = f"Pod {who} has condition {cond.get('type')} matching {action} rule at index {index}"
    else:
        return None
    if action == IGNORE:
        return Match(counted=False, action=IGNORE)
    if action == FAIL_JOB:
        return Match(action=FAIL_JOB, message=message)
    if action in (COUNT, FAIL_INDEX):
        return Match(action=action)
    return None   # an action this version does not know: the next rule, as Kubernetes


def match_pod_failure_policy(policy: Any, pod: Obj) -> Match:
    """What the Failed ``pod`` means under ``policy`` (``spec.podFailurePolicy``, or None)."""
    if not isinstance(policy, dict):
        return NO_RULE
    for index, rule in enumerate(policy.get("rules") or []):
        if isinstance(rule, dict) and (m := _rule_match(rule, index, pod)) is not None:
            return m
    return NO_RULE


# --- indexes -------------------------------------------------------------------------
def parse_indexes(text: Any, limit: int) -> set[int]:
    """Indexes written as "1,3-5" as a set of those below ``limit`` (the Job's completions:
    a status or rule written by hand never makes a range larger than the Job); a malformed
    part is skipped."""
    out: set[int] = set()
    if not isinstance(text, str):
        return out
    for part in text.split(",")[:max(limit, 0)]:
        a, _, b = part.partition("-")
        if a.isdigit() and (not b or b.isdigit()):
            out.update(range(min(int(a), limit), min(int(b or a) + 1, limit)))
    return out


def format_indexes(indexes: set[int]) -> str:
    """A set of indexes as Kubernetes writes them: sorted, a run of three or more as a range
    ("0,1,3-5")."""
    parts: list[str] = []
    run: list[int] = []

    def flush() -> None:
        if len(run) > 2:
            parts.append(f"{run[0]}-{run[-1]}")
        else:
            parts.extend(str(i) for i in run)
    for i in sorted(indexes):
        if run and i == run[-1] + 1:
            run.append(i)
            continue
        flush()
        run = [i]
    flush()
    return ",".join(parts)


def match_success_policy(policy: Any, completions: int, succeeded: set[int]) -> str | None:
    """The SuccessCriteriaMet message ("Matched rules at index N") when a rule of
    ``policy`` (``spec.successPolicy``) is met by the ``succeeded`` indexes, else None."""
    if not isinstance(policy, dict) or not succeeded:
        return None
    for index, rule in enumerate(policy.get("rules") or []):
        if not isinstance(rule, dict):
            continue
        count = rule.get("succeededCount")
        count = count if isinstance(count, int) and not isinstance(count, bool) else None
        if rule.get("succeededIndexes") is not None:
            wanted = parse_indexes(rule["succeededIndexes"], completions)
            if not wanted:
                continue
            done = len(wanted & succeeded)
            if done == len(wanted) or (count is not None and done >= count):
                return f"Matched rules at index {index}"
        elif count is not None and len(succeeded) >= count:
            return f"Matched rules at index {index}"
    return None


# --- per index (backoffLimitPerIndex) -------------------------------------------------------
def _count(pod: Obj, annotation: str) -> int:
    text = objects.annotations(pod).get(annotation)
    if not isinstance(text, str) or not text.isdigit() or len(text) > 10 or int(text) > MAX_INT32:
        return 0
    return int(text)


def failure_count(pod: Obj) -> int:
    """The failures of the pod's index before it (its annotation; 0 when unreadable)."""
    return _count(pod, JobAnnotation.INDEX_FAILURE_COUNT)


def absolute_failure_count(pod: Obj) -> int:
    """Failures and ignored failures of the pod's index before it."""
    return failure_count(pod) + _count(pod, JobAnnotation.INDEX_IGNORED_FAILURE_COUNT)


def index_failed(job: Obj, pod: Obj, match: Match) -> bool:
    """Whether the Failed ``pod`` (matched ``match``) fails its index: FailIndex, or a
    counted failure when its index already failed ``backoffLimitPerIndex`` times."""
    if objects.phase(pod) != PodPhase.FAILED:
        return False
    if match.action == FAIL_INDEX:
        return True
    limit = objects.spec(job).get("backoffLimitPerIndex")
    return match.counted and isinstance(limit, int) and failure_count(pod) >= limit


def next_failure_counts(pod: Obj | None, match: Match) -> tuple[int, int]:
    """(failures, ignored failures) of an index for the pod that replaces the Failed ``pod``
    (None: the index's first pod)."""
    if pod is None:
        return 0, 0
    failures, ignored = failure_count(pod), _count(pod, JobAnnotation.INDEX_IGNORED_FAILURE_COUNT)
    return (failures + 1, ignored) if match.counted else (failures, ignored + 1)
