"""Kubernetes' IntOrString against a total (apimachinery's ``intstr``), shared by the
API server (PodDisruptionBudgets in evictions) and the controllers (rolling updates,
disruption budgets)."""
from __future__ import annotations

from typing import Any


def scaled_value(value: Any, total: int, round_up: bool) -> int:
    """``2`` or ``"25%"`` of ``total`` (``None`` is 0), as intstr.GetScaledValueFromIntOrPercent;
    ValueError for anything else."""
    if value is None:
        return 0
    if isinstance(value, bool):
        raise ValueError(f"invalid value {value!r}: must be an integer or a percentage")
    if isinstance(value, int):
        return value
    text = str(value).strip()
    if text.endswith("%"):
        try:
            pct = int(text[:-1])
        except ValueError:
            raise ValueError(f"invalid value {value!r}: must be an integer or a percentage") from None
        num = pct * total
        return -(-num // 100) if round_up else num // 100
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"invalid value {value!r}: must be an integer or a percentage") from None
