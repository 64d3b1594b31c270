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
annotation ``kube32.io/hold-requests`` (:data:`kube32.terms.Annotation.HOLD_REQUESTS`)
sets its own bound, ``"0"`` none.  A client says how long it wants to wait with
RFC 7240's ``Prefer: wait=<seconds>``: the pod proxy holds only when asked so, and
a Service's bound is never raised by it.

One parser reads every hold value (:func:`parse_hold`), bounded: at most
:data:`MAX_HOLD_TEXT` characters, 12 digits before the point and 9 after, in exact
decimal arithmetic, so no value, however long, raises anything but ValueError.

The held requests the API server sends one pod carry :data:`ORDER` (``<stream>:<n>``):
its kubelet lets them into the pod in that order (kube32.kubelet.ordering), however
their connections race.  Only the API server sets it: it drops the header from what a
client sends.

Imports nothing of Kube32 but the annotation names.
"""
from __future__ import annotations

import re
from decimal import Decimal
from typing import Any, Iterable, Mapping

from .terms import Annotation, Header

NOT_STARTED = Header.NOT_STARTED
# Its values: why the pod did not take the request.
FROZEN, MOVED_AWAY, NOT_RUNNING = "frozen", "moved-away", "not-running"
UNCHECKED = "token-unchecked"   # the kubelet could not check the caller's token: no handler ran
ORDER = Header.HOLD_ORDER   # "<stream>:<n>": the n-th held request the API server sent a pod on that stream
MAX_ORDER_TEXT = 64             # characters of an ORDER value: a longer one is ignored
_ORDER = re.compile(r"^([0-9a-f]{1,32}):([0-9]{1,12})$")

MAX_HELD_BODY = 64 << 10      # a body up to this is read whole, and may be held and sent again
DEFAULT_HOLD_SECONDS = 10.0   # a Service's bound without the annotation
MAX_HOLD_SECONDS = 60.0       # no bound above this, from an annotation or a client
PREFER = "Prefer"
MAX_HOLD_TEXT = 32            # characters of a hold value: longer ones are refused unread
_SECONDS = re.compile(r"^[0-9]{1,9}(\.[0-9]{0,9})?$")   # a bare number is seconds
_HOLD = re.compile(r"^([0-9]{1,12}(?:\.[0-9]{0,9})?)\s*(ms|s|m|h)?$")
_UNIT_SECONDS = {"ms": Decimal("0.001"), None: Decimal(1), "s": Decimal(1), "m": Decimal(60), "h": Decimal(3600)}


def not_started(headers: Mapping[str, str]) -> str | None:
    """Why the kubelet refused a request its pod never began, or None (the pod's own answer)."""
    return headers.get(NOT_STARTED) or None


def order_value(stream: str, n: int) -> str:
    return f"{stream}:{n}"


def parse_order(text: str | None) -> tuple[str, int] | None:
    """(stream, n) of an :data:`ORDER` value; None for none, or one that does not parse."""
    if text is None or len(text) > MAX_ORDER_TEXT:
        return None
    m = _ORDER.match(text)
    return (m.group(1), int(m.group(2))) if m else None


def parse_hold(text: Any) -> float:
    """The value of ``kube32.io/hold-requests`` in seconds: a duration (``500ms``, ``10s``,
    ``1m``) or a bare number of seconds, at most :data:`MAX_HOLD_SECONDS`; ValueError (and
    nothing else, whatever the value) says why not."""
    raw = str(text)
    if len(raw) > MAX_HOLD_TEXT:
        raise ValueError(f'"{raw[:12]}..." ({len(raw)} characters) is not a duration: at most '
                         f"{MAX_HOLD_TEXT} characters")
    text = raw.strip()
    m = _HOLD.match(text)
    if not m:
        raise ValueError(f'"{text}" is not a duration (e.g. 500ms, 10s, 1m) or a number of seconds')
    seconds = Decimal(m.group(1)) * _UNIT_SECONDS[m.group(2)]
    if seconds > Decimal(str(MAX_HOLD_SECONDS)):
        raise ValueError(f'"{text}" is more than the longest hold, {MAX_HOLD_SECONDS:g}s')
    return float(seconds)


def hold_seconds(annotations: Mapping[str, Any] | None) -> float:
    """A Service's bound (its annotation is checked when the Service is written; a value
    stored before that holds for the default)."""
    raw = (annotations or {}).get(Annotation.HOLD_REQUESTS)
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
