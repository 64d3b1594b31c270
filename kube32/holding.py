"""Held requests: what a kubelet and the proxies in front of it agree on (issue 24).

A pod that is frozen (a snapshot, a move), between nodes or not running gets no call:
its kubelet answers 503 with ``Retry-After: 1`` (spec: "A frozen pod answers 503 with
Retry-After: 1") and marks that answer with the header :data:`NOT_STARTED`.  A marked
refusal, or a connection to the kubelet that could not be made, is the one proof a
proxy has that the pod never began the request, so only then may a proxy hold the
request and send it again, to the pod's replacement or another Ready pod.  A pod's
own 503 never carries the mark: the kubelet drops the header from every answer of a
pod, so no pod can make a proxy send a request twice.

The Service proxy holds by default for :data:`DEFAULT_HOLD_SECONDS`; a Service's
annotation ``kube32.io/hold-requests`` (:data:`~kube32.movability.HOLD_REQUESTS`)
sets its own bound, ``"0"`` none.  A client says how long it wants to wait with
RFC 7240's ``Prefer: wait=<seconds>``: the pod proxy holds only when asked so, and
a Service's bound is never raised by it.

Imports nothing of Kube32 but the annotation names and the duration parser.
"""
from __future__ import annotations

import re
from typing import Any, Iterable, Mapping

from .movability import HOLD_REQUESTS
from .quantity import parse_duration_ms

NOT_STARTED = "X-Kube32-Not-Started"
# Its values: why the pod did not take the request.
FROZEN, MOVED_AWAY, NOT_RUNNING = "frozen", "moved-away", "not-running"

DEFAULT_HOLD_SECONDS = 10.0   # a Service's bound without the annotation
MAX_HOLD_SECONDS = 60.0       # no bound above this, from an annotation or a client
PREFER = "Prefer"
_SECONDS = re.compile(r"^[0-9]{1,9}(\.[0-9]{0,9})?$")   # a bare number is seconds


def not_started(headers: Mapping[str, str]) -> str | None:
    """Why the kubelet refused a request its pod never began, or None (the pod's own answer)."""
    return headers.get(NOT_STARTED) or None


def parse_hold(text: str) -> float:
    """The value of ``kube32.io/hold-requests`` in seconds: a duration (``500ms``, ``10s``,
    ``1m``) or a bare number of seconds, at most :data:`MAX_HOLD_SECONDS`; ValueError says why not."""
    text = str(text).strip()
    seconds = float(text) if _SECONDS.match(text) else parse_duration_ms(text) / 1000
    if seconds > MAX_HOLD_SECONDS:
        raise ValueError(f'"{text}" is more than the longest hold, {MAX_HOLD_SECONDS:g}s')
    return seconds


def hold_seconds(annotations: Mapping[str, Any] | None) -> float:
    """A Service's bound (its annotation is checked when the Service is written; a value
    stored before that holds for the default)."""
    raw = (annotations or {}).get(HOLD_REQUESTS)
    if raw is None:
        return DEFAULT_HOLD_SECONDS
    try:
        return parse_hold(raw)
    except ValueError:
        return DEFAULT_HOLD_SECONDS


def prefer_wait(values: Iterable[str]) -> float | None:
    """The ``wait`` preference (seconds) of a request's ``Prefer`` headers, bounded by
    :data:`MAX_HOLD_SECONDS`; None when there is none or it is not a number."""
    for value in values:
        for pref in value.split(","):
            name, _, arg = pref.split(";", 1)[0].strip().partition("=")
            if name.strip().lower() != "wait":
                continue
            arg = arg.strip().strip('"')
            if not _SECONDS.match(arg):
                return None
            return min(float(arg), MAX_HOLD_SECONDS)
    return None
