"""The one matcher for label selectors, node selection and tolerations.

Every component that asks "does this select that" asks here: the API server (list and
watch ``labelSelector``, a workload's selector against its template, a budget's pods),
the workload controllers, the scheduler, the DaemonSet controller and the node
lifecycle controller.  Pure functions over plain dicts; imports nothing of Kube32.
``tests/unit/test_matching.py`` pins each rule below to Kubernetes' documented behaviour
in one table.

Label selectors (``k8s.io/apimachinery/pkg/labels``, ``metav1.LabelSelectorAsSelector``):

* a requirement is ``key`` with ``In``, ``NotIn``, ``Exists``, ``DoesNotExist``, ``Gt`` or
  ``Lt``; the string forms (``labels.Parse``, kube32.apiserver.selectors) ``k=v`` and
  ``k==v`` are ``In (v)``, ``k!=v`` is ``NotIn (v)``, ``k>n`` / ``k<n`` are ``Gt`` / ``Lt``,
  and ``k in ()`` is ``In ("")`` (an empty place in a set is the empty value);
  ``NotIn`` and ``DoesNotExist`` match an object without the label;
* ``Gt``/``Lt`` take exactly one value; label and value both parse as (64-bit) decimal
  integers, or the requirement does not match;
* a selector matches when every requirement does (AND); one without requirements matches
  everything (``labels.Everything()``).  A *missing* ``metav1.LabelSelector`` is
  ``labels.Nothing()``, and an operator Kubernetes does not know makes the selector fail
  to convert: it selects nothing (:func:`label_selector`).

Node selection (``k8s.io/component-helpers/scheduling/corev1/nodeaffinity``):

* ``nodeSelectorTerms`` are ORed; within a term ``matchExpressions`` (over the node's
  labels) and ``matchFields`` (over ``metadata.name``, the one node field, with ``In`` or
  ``NotIn`` and exactly one value) are ANDed;
* a term with neither matches nothing, and so does a term with a requirement that does
  not parse (an unknown operator, a field requirement of another shape);
* a pod's required node affinity is its ``nodeSelector`` (every label equal) AND, when
  ``requiredDuringSchedulingIgnoredDuringExecution`` is set, one of its terms: set with no
  term, it matches no node.

Tolerations (``v1.Toleration.ToleratesTaint``):

* an empty ``effect`` matches every effect, else the effects are equal;
* an empty ``key`` matches every key, else the keys are equal;
* ``Exists`` matches any value, ``Equal`` (the default operator) an equal value; an
  empty key goes only with ``Exists``: the API server refuses it with ``Equal``, as
  Kubernetes' validation does (kube32.apiserver.strategies.pod.toleration_errors), so no
  stored pod has one, and here it tolerates nothing; any other operator (refused too)
  tolerates nothing.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from . import objects

Obj = dict[str, Any]

IN, NOT_IN, EXISTS, DOES_NOT_EXIST, GT, LT = "In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"
OPERATORS = (IN, NOT_IN, EXISTS, DOES_NOT_EXIST, GT, LT)
LABEL_OPERATORS = (IN, NOT_IN, EXISTS, DOES_NOT_EXIST)   # metav1.LabelSelectorRequirement's
NODE_NAME_FIELD = "metadata.name"
_INT64 = re.compile(r"[+-]?[0-9]+")


def parse_int64(text: Any) -> int | None:
    """Go's strconv.ParseInt(text, 10, 64), or None."""
    if not isinstance(text, str) or not _INT64.fullmatch(text):
        return None
    n = int(text)
    return n if -(1 << 63) <= n < (1 << 63) else None


@dataclass(frozen=True)
class Requirement:
    key: str
    op: str  # one of OPERATORS
    values: tuple[str, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        present = self.key in labels
        if self.op == IN:
            return present and labels[self.key] in self.values
        if self.op == NOT_IN:
            return not present or labels[self.key] not in self.values
        if self.op == EXISTS:
            return present
        if self.op == DOES_NOT_EXIST:
            return not present
        if self.op in (GT, LT) and present and len(self.values) == 1:
            have, want = parse_int64(labels[self.key]), parse_int64(self.values[0])
            if have is None or want is None:
                return False
            return have > want if self.op == GT else have < want
        return False


@dataclass(frozen=True)
class LabelSelector:
    requirements: tuple[Requirement, ...] = ()
    nothing: bool = False   # labels.Nothing(): a missing or unusable selector

    def matches(self, labels: Mapping[str, str] | None) -> bool:
        if self.nothing:
            return False
        labels = labels or {}
        return all(r.matches(labels) for r in self.requirements)

    @property
    def empty(self) -> bool:
        """Selects everything: no requirement (a missing selector selects nothing)."""
        return not self.requirements and not self.nothing


EVERYTHING = LabelSelector()
NOTHING = LabelSelector(nothing=True)


class SelectorError(ValueError):
    """A selector that does not convert (Kubernetes: LabelSelectorAsSelector's error)."""


def _requirement(expr: Any, operators: tuple[str, ...]) -> Requirement:
    """A ``{key, operator, values}`` expression, checked as labels.NewRequirement checks
    it: a key; In and NotIn with values, Exists and DoesNotExist without, Gt and Lt with
    one integer."""
    if not isinstance(expr, Mapping):
        raise SelectorError("a requirement must be an object")
    key, op, values = expr.get("key"), expr.get("operator"), expr.get("values") or []
    if not key or not isinstance(key, str):
        raise SelectorError("a requirement needs a key")
    if op not in operators:
        raise SelectorError(f"{op!r} is not a valid operator (valid: {', '.join(operators)})")
    if not isinstance(values, (list, tuple)):
        raise SelectorError(f"the values of {key} must be a list")
    if op in (IN, NOT_IN) and not values:
        raise SelectorError(f"{key} {op}: the values can't be empty")
    if op in (EXISTS, DOES_NOT_EXIST) and values:
        raise SelectorError(f"{key} {op}: the values must be empty")
    if op in (GT, LT) and (len(values) != 1 or parse_int64(str(values[0])) is None):
        raise SelectorError(f"{key} {op}: exactly one integer value")
    return Requirement(key, op, tuple(str(v) for v in values))


def parse_label_selector(spec: Mapping[str, Any]) -> LabelSelector:
    """A ``metav1.LabelSelector`` (``matchLabels`` + ``matchExpressions``); raises
    SelectorError when it does not convert.  No requirement: everything."""
    if not isinstance(spec, Mapping):
        raise SelectorError("a label selector must be an object")
    match_labels = spec.get("matchLabels") or {}
    exprs = spec.get("matchExpressions") or []
    if not isinstance(match_labels, Mapping) or not isinstance(exprs, list):
        raise SelectorError("matchLabels must be a map and matchExpressions a list")
    reqs = [Requirement(str(k), IN, (str(v),)) for k, v in match_labels.items()]
    return LabelSelector(tuple(reqs) + tuple(_requirement(e, LABEL_OPERATORS) for e in exprs))


def label_selector(spec: Mapping[str, Any] | None) -> LabelSelector:
    """As :func:`parse_label_selector`, as Kubernetes' controllers use it: a missing
    selector, or one that does not convert, selects nothing."""
    if spec is None:
        return NOTHING
    try:
        return parse_label_selector(spec)
    except SelectorError:
        return NOTHING


def selects(spec: Mapping[str, Any] | None, labels: Mapping[str, str] | None) -> bool:
    """``label_selector(spec)`` matches ``labels``."""
    return label_selector(spec).matches(labels)


def workload_selects(spec: Mapping[str, Any] | None, labels: Mapping[str, str] | None) -> bool:
    """A workload controller's selector (ReplicaSet, Deployment, DaemonSet): as
    :func:`selects`, but an empty one selects nothing - the API server refuses it, and a
    controller must never adopt every pod of a namespace for want of one."""
    if not spec or not (spec.get("matchLabels") or spec.get("matchExpressions")):
        return False
    return selects(spec, labels)


def map_selects(selector: Mapping[str, str] | None, labels: Mapping[str, str] | None) -> bool:
    """A plain equality map (a pod's ``nodeSelector``, a Service's ``spec.selector``):
    every key equal.  An empty map selects everything."""
    labels = labels or {}
    return all(labels.get(k) == v for k, v in (selector or {}).items())


def service_selects(selector: Mapping[str, str] | None, labels: Mapping[str, str] | None) -> bool:
    """A Service's ``spec.selector``: every key equal; an empty one selects no pod (the
    Service's endpoints are its user's to manage)."""
    return bool(selector) and map_selects(selector, labels)


# --- node selection ----------------------------------------------------------------
def _term_requirements(term: Mapping[str, Any]) -> tuple[list[Requirement], list[Requirement]] | None:
    """A term's label and field requirements, or None when the term matches nothing
    (empty, or a requirement that does not parse: fields take In or NotIn, one value)."""
    exprs, fields = term.get("matchExpressions") or [], term.get("matchFields") or []
    if not exprs and not fields:
        return None
    try:
        labels = [_requirement(e, OPERATORS) for e in exprs]
        by_field = [_requirement(e, (IN, NOT_IN)) for e in fields]
    except SelectorError:
        return None
    if any(len(r.values) != 1 for r in by_field):
        return None
    return labels, by_field


def node_selector_term_matches(term: Mapping[str, Any], node: Obj) -> bool:
    """A ``nodeSelectorTerm``: all its ``matchExpressions`` (labels) and ``matchFields``
    (``metadata.name``); an empty term, or one that does not parse, matches nothing."""
    reqs = _term_requirements(term)
    if reqs is None:
        return False
    md = objects.meta(node)
    labels = md.get("labels") or {}
    fields = {NODE_NAME_FIELD: str(md.get("name") or "")}
    # A field the node does not have reads as "" (fields.Set.Get), so In never matches it.
    return all(r.matches(labels) for r in reqs[0]) and \
        all(r.matches({r.key: fields.get(r.key, "")}) for r in reqs[1])


def node_selector_matches(selector: Mapping[str, Any] | None, node: Obj) -> bool:
    """A ``NodeSelector`` (its terms ORed); one without terms matches no node."""
    terms = (selector or {}).get("nodeSelectorTerms") or []
    return any(isinstance(t, Mapping) and node_selector_term_matches(t, node) for t in terms)


def required_affinity(pod_spec: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """``affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution``, if set."""
    affinity = pod_spec.get("affinity") or {}
    return (affinity.get("nodeAffinity") or {}).get("requiredDuringSchedulingIgnoredDuringExecution")


def node_affinity_matches(pod_spec: Mapping[str, Any], node: Obj,
                          extra_node_selector: Mapping[str, str] | None = None) -> bool:
    """Kubernetes' RequiredNodeAffinity: the pod's ``nodeSelector`` (with
    ``extra_node_selector`` over it) and, when set, its required node affinity."""
    labels = objects.labels(node)
    if not map_selects({**(pod_spec.get("nodeSelector") or {}), **(extra_node_selector or {})}, labels):
        return False
    required = required_affinity(pod_spec)
    return required is None or node_selector_matches(required, node)


# --- tolerations ---------------------------------------------------------------------
def tolerates(toleration: Mapping[str, Any], taint: Mapping[str, Any]) -> bool:
    """One toleration tolerates the taint (``v1.Toleration.ToleratesTaint``)."""
    effect = toleration.get("effect") or ""
    if effect and effect != taint.get("effect"):
        return False
    key = toleration.get("key") or ""
    if key and key != taint.get("key"):
        return False
    op = toleration.get("operator") or "Equal"
    if op == "Exists":
        return True
    if op == "Equal":
        return bool(key) and (toleration.get("value") or "") == (taint.get("value") or "")
    return False


def tolerated(tolerations: Iterable[Any] | None, taint: Mapping[str, Any]) -> bool:
    """Some toleration of the list tolerates the taint."""
    return any(isinstance(t, Mapping) and tolerates(t, taint) for t in tolerations or ())
