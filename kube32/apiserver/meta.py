"""Object metadata helpers shared by the registry and the strategies.

Objects are plain dicts at this layer (the API edge).  These helpers read and
format the fields every kind has, and hold the naming rules of Kubernetes'
``apimachinery/pkg/util/validation``.
"""
from __future__ import annotations

import re
from typing import Any

from .. import objects

# \Z, not $: Python's $ also matches before a final newline ("name\n" would pass).
DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?\Z")
DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*\Z")
LABEL_VALUE_MSG = ("a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or "
                   "'.', and must start and end with an alphanumeric character")
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?\Z")
QUALIFIED_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]\Z")

SUBDOMAIN_MSG = ("a lowercase RFC 1123 subdomain must consist of lower case alphanumeric "
                 "characters, '-' or '.', and must start and end with an alphanumeric character "
                 "(e.g. 'example.com', regex used for validation is "
                 "'[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')")
LABEL_MSG = ("a lowercase RFC 1123 label must consist of lower case alphanumeric characters or "
             "'-', and must start and end with an alphanumeric character (e.g. 'my-name',  or "
             "'123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')")


def subdomain_problem(value: Any) -> str | None:
    """Why ``value`` cannot be the name of an object (a lowercase RFC 1123 subdomain of
    at most 253 characters), in Kubernetes' words; None when it can."""
    if not isinstance(value, str) or len(value) > 253 or not DNS1123_SUBDOMAIN.match(value):
        return f'Invalid value: "{value}": {SUBDOMAIN_MSG}'
    return None


def human_duration(seconds: float) -> str:
    """kubectl's ``duration.HumanDuration`` (the AGE column)."""
    if seconds < -1:
        return "<invalid>"
    s = int(max(seconds, 0))
    if s < 120:
        return f"{s}s"
    m = s // 60
    if m < 10:
        return f"{m}m{s % 60}s" if s % 60 else f"{m}m"
    if m < 180:
        return f"{m}m"
    h = m // 60
    if h < 8:
        return f"{h}h{m % 60}m" if m % 60 else f"{h}h"
    if h < 48:
        return f"{h}h"
    if h < 24 * 8:
        return f"{h // 24}d{h % 24}h" if h % 24 else f"{h // 24}d"
    if h < 24 * 365 * 2:
        return f"{h // 24}d"
    y = h // (24 * 365)
    if y < 8:
        return f"{y}y{(h // 24) % 365}d"
    return f"{y}y"


def age(obj: dict[str, Any], field: str | None = None) -> str:
    stamp = field if field is not None else obj.get("metadata", {}).get("creationTimestamp")
    t = objects.parse_time(stamp)
    if t is None:
        return "<unknown>"
    return human_duration((objects.now() - t).total_seconds())


def nested(obj: Any, *path: str) -> Any:
    """``obj[path[0]][path[1]]...`` of a client's body, None where a step is missing or
    not an object (a body's field of the wrong shape is the client's error, never a 500)."""
    for key in path:
        if not isinstance(obj, dict):
            return None
        obj = obj.get(key)
    return obj


def validate_labels(labels: Any, field: str) -> list[tuple[str, str]]:
    errs: list[tuple[str, str]] = []
    if labels is None:
        return errs
    if not isinstance(labels, dict):
        return [(field, "Invalid value: must be a map of strings")]
    for k, v in labels.items():
        errs += validate_qualified_key(k, field)
        if not isinstance(v, str) or len(v) > 63 or not LABEL_VALUE.match(v):
            errs.append((f"{field}", f'Invalid value: "{v}": {LABEL_VALUE_MSG}'))
    return errs


def validate_qualified_key(key: Any, field: str) -> list[tuple[str, str]]:
    if not isinstance(key, str) or not key:
        return [(field, f'Invalid value: "{key}": name part must be non-empty')]
    prefix, _, name = key.rpartition("/")
    if prefix and (len(prefix) > 253 or not DNS1123_SUBDOMAIN.match(prefix)):
        return [(field, f'Invalid value: "{key}": prefix part {SUBDOMAIN_MSG}')]
    if len(name) > 63 or not QUALIFIED_NAME.match(name):
        return [(field, f'Invalid value: "{key}": name part must consist of alphanumeric characters, '
                 "'-', '_' or '.', and must start and end with an alphanumeric character")]
    return []


def validate_annotations(ann: Any, field: str) -> list[tuple[str, str]]:
    if ann is None:
        return []
    if not isinstance(ann, dict):
        return [(field, "Invalid value: must be a map of strings")]
    errs = []
    total = 0
    for k, v in ann.items():
        errs += validate_qualified_key(k, field)
        if not isinstance(v, str):
            errs.append((field, f'Invalid value: annotation "{k}" must be a string'))
        else:
            total += len(k) + len(v)
    if total > 256 * 1024:
        errs.append((field, "Too long: must have at most 262144 bytes"))
    return errs
