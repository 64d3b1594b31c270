"""Kubernetes quantities and durations, one reading for every layer: the API server
validates pod specs with it, the scheduler counts requests with it, the kubelet sizes
pods with it.

``parse_quantity`` gives any quantity exactly (``64Ki``, ``1.5Mi``, ``100m``, ``1e3``,
``3``) and refuses anything else with Kubernetes' wording; ``parse_bytes`` rounds a
memory quantity up to whole bytes (``512Ki``, ``8Mi``, ``1G``, ``128974848``,
``1.5Gi``, ``129e6``); ``parse_duration_ms`` takes ``500ms``, ``2s``, ``1m`` or a plain
number of milliseconds.  Each raises ValueError naming the bad text.
"""
from __future__ import annotations

import math
import re
from decimal import Decimal
from fractions import Fraction
from typing import Any

_QUANTITY = re.compile(r"^([+-]?(?:\d+\.?\d*|\.\d+))(?:(Ki|Mi|Gi|Ti|Pi|Ei)|([eE][+-]?\d+)|(n|u|m|k|M|G|T|P|E))?$")
_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {"n": Fraction(1, 10**9), "u": Fraction(1, 10**6), "m": Fraction(1, 1000), "k": 10**3,
            "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18}
QUANTITY_RULE = "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"
_DUR = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?)\s*(ms|s|m|h)?\s*$")
_DUR_MS = {"ms": 1, None: 1, "s": 1000, "m": 60_000, "h": 3_600_000}


def parse_quantity(value: Any) -> Fraction:
    """A Kubernetes quantity ("64Ki", "1.5Mi", "100m", "1e3", 3) as an exact number.

    Raises ValueError naming the value when it is not a quantity."""
    if isinstance(value, bool):
        raise ValueError(f"quantity {value!r} is not a number")
    if isinstance(value, (int, float)):
        return Fraction(value)
    m = _QUANTITY.match(str(value).strip())
    if not m:
        raise ValueError(f"{QUANTITY_RULE}: {value!r}")
    number, binary, exponent, decimal = m.groups()
    n = Fraction(number)
    if binary:
        return n * _BINARY[binary]
    if exponent:
        return n * Fraction(10) ** int(exponent[1:])
    if decimal:
        return n * _DECIMAL[decimal]
    return n


def parse_bytes(text: str | int) -> int:
    """A memory quantity in whole bytes, rounded up."""
    if isinstance(text, int) and not isinstance(text, bool):
        return text
    try:
        value = parse_quantity(text)
    except ValueError:
        raise ValueError(f'"{text}" is not a memory quantity (e.g. 512Ki, 8Mi, 1G, 65536)') from None
    if value < 0:
        raise ValueError(f'"{text}" is not a memory quantity: it is below zero')
    return math.ceil(value)


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
        if n and n % _BINARY[suffix] == 0:
            return f"{n // _BINARY[suffix]}{suffix}"
    return str(n)
