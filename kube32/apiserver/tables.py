"""Server-side printing: ``meta.k8s.io/v1`` Tables, as kubectl asks for them.

kubectl sends ``Accept: application/json;as=Table;v=v1;g=meta.k8s.io,...`` for
human output and prints only what the Table holds, so every kind's columns are
computed here (AGE formatted on the server).  Each row carries the object's
metadata (``includeObject=Metadata``, the default) so ``-A``, ``--show-labels``
and ``-L`` work; ``includeObject=Object`` carries the whole object
(``--sort-by``), ``None`` nothing.
"""
from __future__ import annotations

from typing import Any, Iterable

from .resources import Resource


def wants_table(accept: str) -> bool:
    return any("as=Table" in part for part in accept.split(","))


def _row_object(res: Resource, obj: dict[str, Any], include: str) -> dict[str, Any] | None:
    if include == "None":
        return None
    if include == "Object":
        return obj
    return {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
            "metadata": obj.get("metadata", {})}


def row(res: Resource, obj: dict[str, Any], include: str = "Metadata") -> dict[str, Any]:
    """One object's row of a Table."""
    out: dict[str, Any] = {"cells": res.strategy.row(obj)}
    ro = _row_object(res, obj, include)
    if ro is not None:
        out["object"] = ro
    return out


def head(res: Resource) -> dict[str, Any]:
    """A Table's fields but its rows and metadata (a streamed list writes those after)."""
    return {"kind": "Table", "apiVersion": "meta.k8s.io/v1",
            "columnDefinitions": [c.definition() for c in res.strategy.columns]}


def table(res: Resource, objs: Iterable[dict[str, Any]], resource_version: str,
          include: str = "Metadata") -> dict[str, Any]:
    return {**head(res), "metadata": {"resourceVersion": resource_version},
            "rows": [row(res, obj, include) for obj in objs]}
