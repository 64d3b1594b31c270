"""Kubernetes quantities and durations, one reading for every layer: the API server
validates pod specs with it, the scheduler counts requests with it, the kubelet sizes
pods with it.

``parse_quantity`` gives any quantity exactly (``64Ki``, ``1.5Mi``, ``100m``, ``1e3``,
``3``) and refuses anything else with Kubernetes' wording; a quantity larger than
``MAX_QUANTITY`` (2^63-1, the largest Kubernetes holds: its resource.Quantity caps
binary-suffixed values there and overflows int64 past it) raises
:class:`QuantityTooLarge` instead of standing for an amount no node has, and is found
from the digits before any power is computed, so ``1e999999999`` costs nothing.  A
non-zero amount below 1n is 1n, as Kubernetes rounds it up.  ``parse_bytes`` rounds a
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
_DECIMAL: dict[str, Fraction | int] = {"n": Fraction(1, 10**9), "u": Fraction(1, 10**6), "m": Fraction(1, 1000),
                                      "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18}
QUANTITY_RULE = "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"
MAX_QUANTITY = 2**63 - 1
_NANO = Fraction(1, 10**9)
_DECIMAL_EXPONENT = {"n": -9, "u": -6, "m": -3, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_BINARY_EXPONENT = {"Ki": 3, "Mi": 6, "Gi": 9, "Ti": 12, "Pi": 15, "Ei": 18}   # at least 10^n
_DUR = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?)\s*(ms|s|m|h)?\s*$")
_DUR_MS = {"ms": 1, None: 1, "s": 1000, "m": 60_000, "h": 3_600_000}


class QuantityTooLarge(ValueError):
    """A well-formed quantity beyond ``MAX_QUANTITY``; ``str(err)`` says the bound."""


def _too_large() -> QuantityTooLarge:
    return QuantityTooLarge(f"must be no more than {MAX_QUANTITY} (2^63-1, the largest quantity "
                            "Kubernetes holds)")


def _bounded(n: Fraction) -> Fraction:
    if abs(n) > MAX_QUANTITY:
        raise _too_large()
    if n and abs(n) < _NANO:
        return _NANO if n > 0 else -_NANO
    return n


def _magnitude(number: str) -> int | None:
    """The power of ten of the number's first significant digit (None: it is zero)."""
    whole, _, fraction = number.lstrip("+-").partition(".")
    whole = whole.lstrip("0")
    if whole:
        return len(whole) - 1
    significant = fraction.lstrip("0")
    return -(len(fraction) - len(significant)) - 1 if significant else None


def parse_quantity(value: Any) -> Fraction:
    """A Kubernetes quantity ("64Ki", "1.5Mi", "100m", "1e3", 3) as an exact number.

    Raises ValueError naming the value when it is not a quantity, QuantityTooLarge
    when it is beyond ``MAX_QUANTITY``."""
    if isinstance(value, bool):
        raise ValueError(f"quantity {value!r} is not a number")
    if isinstance(value, (int, float)):
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"quantity {value!r} is not a number")
        return _bounded(Fraction(value))
    m = _QUANTITY.match(str(value).strip())
    if not m:
        raise ValueError(f"{QUANTITY_RULE}: {value!r}")
    number, binary, exponent, decimal = m.groups()
    try:
        n = Fraction(number)
    except ValueError:   # more digits than Python converts (4300): no quantity is that long
        raise ValueError(f"{QUANTITY_RULE}: {str(value)[:40]!r}...") from None
    power = int(exponent[1:]) if exponent else _DECIMAL_EXPONENT.get(decimal or "", 0)
    lead = _magnitude(number)
    if lead is None:
        return Fraction(0)
    # 2^63 < 10^19: a first digit at 10^19 or above is too large, whatever follows; one
    # below 10^-10 is less than 1n.  Either way no power of ten is computed.
    order = lead + (_BINARY_EXPONENT[binary] if binary else power)
    if order >= 19:
        raise _too_large()
    if order < -10:
        return _NANO if n > 0 else -_NANO
    if binary:
        return _bounded(n * _BINARY[binary])
    if exponent:
        return _bounded(n * (Fraction(10 ** power) if power >= 0 else Fraction(1, 10 ** -power)))
    if decimal:
        return _bounded(n * _DECIMAL[decimal])
    return _bounded(n)


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
