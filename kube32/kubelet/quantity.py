"""Kubernetes quantities and durations as the kubelet reads them from pod specs.

``parse_bytes`` takes memory quantities (``512Ki``, ``8Mi``, ``1G``, ``128974848``,
``1.5Gi``, ``129e6``); ``parse_duration_ms`` takes ``500ms``, ``2s``, ``1m`` or a
plain number of milliseconds.  Both raise ValueError naming the bad text.
"""
from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

_SUFFIX = {"": 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18,
           "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_QTY = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+)?\s*(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?\s*$")
_DUR = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?)\s*(ms|s|m|h)?\s*$")
_DUR_MS = {"ms": 1, None: 1, "s": 1000, "m": 60_000, "h": 3_600_000}


def parse_bytes(text: str | int) -> int:
    if isinstance(text, int):
        return text
    m = _QTY.match(str(text))
    if not m:
        raise ValueError(f'"{text}" is not a memory quantity (e.g. 512Ki, 8Mi, 1G, 65536)')
    try:
        value = Decimal(m.group(1) + (m.group(2) or "")) * _SUFFIX[m.group(3) or ""]
    except InvalidOperation:
        raise ValueError(f'"{text}" is not a memory quantity') from None
    return int(value.to_integral_value(rounding="ROUND_CEILING"))


def parse_duration_ms(text: str | int) -> int:
    if isinstance(text, int):
        return text
    m = _DUR.match(str(text))
    if not m:
        raise ValueError(f'"{text}" is not a duration (e.g. 500ms, 2s, 1m)')
    return int(Decimal(m.group(1)) * _DUR_MS[m.group(2)])


def format_bytes(n: int) -> str:
    """The shortest exact binary quantity (8Mi, 320Ki, 12345)."""
    for suffix in ("Gi", "Mi", "Ki"):
        if n and n % _SUFFIX[suffix] == 0:
            return f"{n // _SUFFIX[suffix]}{suffix}"
    return str(n)
