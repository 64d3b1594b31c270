"""What a pod asks of a node, and whether the node has it: one reading for the
scheduler's filter and the kubelet's admission (Kubernetes' kubelet admits with the
scheduler's own NodeResourcesFit, so the two never disagree).

* ``pod_requests``: per resource, the sum over containers of the request (the limit
  where no request is set), at least the largest init container's; memory and the
  extended resources (``hardware.kube32.io/*``, ``esp32.io/*``).  A quantity that
  does not parse counts 0 (the API server refused it on the way in).
* ``allocatable``: a Node's capacity/allocatable map as numbers, ``pods`` defaulting
  to 110.
* ``shortfalls``: the resources a pod would push past allocatable, given what the
  node's active pods already request, "pods" (their count) first.
"""
from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from . import objects
from .quantity import parse_quantity
from .terms import PodPhase, Resource

Obj = dict[str, Any]
DEFAULT_MAX_PODS = 110
EXTENDED_PREFIXES = Resource.EXTENDED_PREFIXES


def _quantity_or_zero(value: Any) -> Fraction:
    try:
        return parse_quantity(value)
    except ValueError:
        return Fraction(0)


def is_scheduled_resource(name: str) -> bool:
    return name in ("memory", "pods") or name.startswith(EXTENDED_PREFIXES)


def pod_requests(pod: Obj) -> dict[str, Fraction]:
    """What the pod asks of a node: sum over containers (request, else limit), at least
    the largest init container's, for memory and the extended resources."""
    spec = objects.spec(pod)

    def of(container: Obj) -> dict[str, Fraction]:
        res = container.get("resources") or {}
        merged = {**(res.get("limits") or {}), **(res.get("requests") or {})}
        return {k: _quantity_or_zero(v) for k, v in merged.items() if is_scheduled_resource(k) and k != "pods"}

    total: dict[str, Fraction] = {}
    for c in spec.get("containers") or []:
        if isinstance(c, dict):
            for k, v in of(c).items():
                total[k] = total.get(k, Fraction(0)) + v
    for c in spec.get("initContainers") or []:
        if isinstance(c, dict):
            for k, v in of(c).items():
                total[k] = max(total.get(k, Fraction(0)), v)
    return total


def allocatable(resources: dict[str, Any]) -> dict[str, Fraction]:
    """A Node's resource map (``status.allocatable``) as numbers."""
    out = {k: _quantity_or_zero(v) for k, v in resources.items() if is_scheduled_resource(k)}
    out.setdefault("pods", Fraction(DEFAULT_MAX_PODS))
    return out


def node_allocatable(node: Obj) -> dict[str, Fraction]:
    """:func:`allocatable` of a Node, parsed once for each version of it (by uid and
    resourceVersion): the scheduler asks three times for every node for each pod it places,
    and parsing a thousand nodes' quantities for each of a lost node's pods was an eighth
    of the control plane (issue 25).  The answer is shared: read it, never change it."""
    md = objects.meta(node)
    version = (md.get("uid"), md.get("resourceVersion"))
    if version[1] is not None:
        cached = _ALLOCATABLE.get(version)
        if cached is not None:
            return cached
    status = objects.status(node)
    out = allocatable({**(status.get("capacity") or {}), **(status.get("allocatable") or {})})
    if version[1] is not None:
        if len(_ALLOCATABLE) >= _ALLOCATABLE_KEPT:
            _ALLOCATABLE.clear()   # versions of nodes long gone: parsed again when asked
        _ALLOCATABLE[version] = out
    return out


_ALLOCATABLE: dict[tuple[Any, Any], dict[str, Fraction]] = {}
_ALLOCATABLE_KEPT = 8192


def pod_is_active(pod: Obj) -> bool:
    """Holds resources on its node: not Succeeded/Failed (terminating pods still count)."""
    return objects.phase(pod) not in PodPhase.TERMINAL


@dataclass(frozen=True)
class Shortfall:
    resource: str
    requested: Fraction
    used: Fraction
    capacity: Fraction


def shortfalls(pod: Obj, alloc: dict[str, Fraction], used: dict[str, Fraction],
               pods: int) -> list[Shortfall]:
    """What ``pod`` would push past ``alloc`` on a node whose ``pods`` active pods
    request ``used`` (empty: it fits)."""
    out = []
    if pods + 1 > alloc["pods"]:
        out.append(Shortfall("pods", Fraction(1), Fraction(pods), alloc["pods"]))
    for name, amount in sorted(pod_requests(pod).items()):
        if amount <= 0:
            continue
        have = used.get(name, Fraction(0))
        if have + amount > alloc.get(name, Fraction(0)):
            out.append(Shortfall(name, amount, have, alloc.get(name, Fraction(0))))
    return out
