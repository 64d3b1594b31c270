"""Label and field selectors, parsed once per request and matched per object.

Label selectors follow ``k8s.io/apimachinery/pkg/labels``: ``a=b``, ``a==b``,
``a!=b``, ``a in (x,y)``, ``a notin (x)``, ``a`` (exists) and ``!a``.  Field
selectors support ``=``, ``==`` and ``!=`` over the flat field map a strategy
exposes for its kind (``metadata.name``, ``spec.nodeName``, ...).  A field
selector naming a field the kind does not expose is a 400, as in Kubernetes.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Mapping

from .errors import bad_request


@dataclass(frozen=True)
class Requirement:
    key: str
    op: str  # "=", "!=", "in", "notin", "exists", "!exists"
    values: tuple[str, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        present = self.key in labels
        value = labels.get(self.key)
        if self.op == "=":
            return present and value == self.values[0]
        if self.op == "!=":
            return not present or value != self.values[0]
        if self.op == "in":
            return present and value in self.values
        if self.op == "notin":
            return not present or value not in self.values
        if self.op == "exists":
            return present
        return not present


@dataclass(frozen=True)
class LabelSelector:
    requirements: tuple[Requirement, ...] = ()

    def matches(self, labels: Mapping[str, str] | None) -> bool:
        labels = labels or {}
        return all(r.matches(labels) for r in self.requirements)

    @property
    def empty(self) -> bool:
        return not self.requirements


def _split_top_level(text: str) -> list[str]:
    parts, depth, cur = [], 0, []
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    parts.append("".join(cur))
    return [p.strip() for p in parts if p.strip()]


_SET_RE = re.compile(r"^([^\s!=()]+)\s+(in|notin)\s*\(([^)]*)\)$")


def parse_label_selector(text: str | None) -> LabelSelector:
    if not text:
        return LabelSelector()
    reqs = []
    for term in _split_top_level(text):
        m = _SET_RE.match(term)
        if m:
            values = tuple(v.strip() for v in m.group(3).split(",") if v.strip())
            reqs.append(Requirement(m.group(1), m.group(2), values))
        elif "!=" in term:
            k, v = term.split("!=", 1)
            reqs.append(Requirement(k.strip(), "!=", (v.strip(),)))
        elif "==" in term:
            k, v = term.split("==", 1)
            reqs.append(Requirement(k.strip(), "=", (v.strip(),)))
        elif "=" in term:
            k, v = term.split("=", 1)
            reqs.append(Requirement(k.strip(), "=", (v.strip(),)))
        elif term.startswith("!"):
            reqs.append(Requirement(term[1:].strip(), "!exists"))
        elif re.fullmatch(r"[A-Za-z0-9./_-]+", term):
            reqs.append(Requirement(term, "exists"))
        else:
            raise bad_request(f"unable to parse requirement: invalid label selector {text!r}")
    return LabelSelector(tuple(reqs))


def selector_from_match(spec: Mapping | None) -> LabelSelector:
    """A metav1.LabelSelector (matchLabels + matchExpressions) as a LabelSelector."""
    if not spec:
        return LabelSelector()
    reqs = [Requirement(k, "=", (str(v),)) for k, v in (spec.get("matchLabels") or {}).items()]
    ops = {"In": "in", "NotIn": "notin", "Exists": "exists", "DoesNotExist": "!exists"}
    for expr in spec.get("matchExpressions") or []:
        reqs.append(Requirement(expr["key"], ops[expr["operator"]], tuple(expr.get("values") or ())))
    return LabelSelector(tuple(reqs))


@dataclass(frozen=True)
class FieldSelector:
    terms: tuple[tuple[str, str, str], ...] = ()  # (field, op, value)

    def matches(self, fields: Mapping[str, str]) -> bool:
        for field, op, value in self.terms:
            actual = fields.get(field, "")
            if (actual == value) != (op == "="):
                return False
        return True

    def check_supported(self, kind: str, supported: set[str]) -> None:
        for field, _, _ in self.terms:
            if field not in supported:
                raise bad_request(f'field label not supported: {field}')

    def value_of(self, field: str) -> str | None:
        for f, op, v in self.terms:
            if f == field and op == "=":
                return v
        return None


def parse_field_selector(text: str | None) -> FieldSelector:
    if not text:
        return FieldSelector()
    terms = []
    for term in text.split(","):
        term = term.strip()
        if not term:
            continue
        if "!=" in term:
            k, v = term.split("!=", 1)
            terms.append((k.strip(), "!=", v.strip()))
        elif "==" in term:
            k, v = term.split("==", 1)
            terms.append((k.strip(), "=", v.strip()))
        elif "=" in term:
            k, v = term.split("=", 1)
            terms.append((k.strip(), "=", v.strip()))
        else:
            raise bad_request(f"invalid field selector: {term!r}: expected an operator (=, == or !=)")
    return FieldSelector(tuple(terms))
