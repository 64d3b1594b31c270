"""Figures of this process in the Prometheus text format (version 0.0.4), for ``/metrics``.

A metric is made once, where what it counts happens (``REGISTRY.counter(...)`` at a
module's top), and offers ``inc``/``set``/``observe`` with its label values; the API
server renders the registry at a scrape.  A process has one registry (as Kubernetes'
components and prometheus_client do): the control plane's controllers and its API
server run in one process, and a scrape of that process sees both.

Invariants:
- a metric's name, help, type and label names are fixed when it is made; a second
  ``counter(name, ...)`` of the same name and shape returns the first (a module loaded
  twice counts once), of another shape is a ValueError;
- label values come from the caller: each metric keeps at most ``MAX_SERIES`` label
  sets; further ones are counted under one series whose every label is ``"other"``,
  so no client can grow the registry by sending many different values;
- histograms are cumulative with a ``+Inf`` bucket, ``_sum`` and ``_count``, as the
  format says; label values and help are escaped as it says;
- a gauge holds what was last ``set``; a figure read at the scrape is set by the
  scrape's handler just before it renders (kube32.apiserver.apimetrics.data_space).

Nothing here blocks or does I/O; rendering is linear in the number of series.
"""
from __future__ import annotations

import math
import threading
from typing import Iterable, Mapping, Sequence

MAX_SERIES = 1000
OTHER = "other"
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
# Seconds, as kube-apiserver's request latency buckets (apiserver_request_duration_seconds), trimmed.
LATENCY_BUCKETS = (0.005, 0.025, 0.05, 0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 1.5, 2.0, 5.0, 10.0, 30.0, 60.0)
Labels = tuple[str, ...]


class _Metric:
    kind = ""

    def __init__(self, name: str, help: str, labels: Sequence[str]) -> None:
        self.name, self.help, self.labels = name, help, tuple(labels)
        self._lock = threading.Lock()   # kubelets' threads and the loop may both count

    def _key(self, values: Sequence[str], series: Mapping[Labels, object]) -> Labels:
        key = tuple(str(v) for v in values)
        if len(key) != len(self.labels):
            raise ValueError(f"{self.name} takes labels {self.labels}, not {key}")
        if key not in series and len(series) >= MAX_SERIES:
            return tuple(OTHER for _ in self.labels)
        return key

    def same_shape(self, kind: str, labels: Sequence[str]) -> bool:
        return self.kind == kind and self.labels == tuple(labels)

    def header(self) -> list[str]:
        return [f"# HELP {self.name} {_escape_help(self.help)}", f"# TYPE {self.name} {self.kind}"]

    def lines(self) -> list[str]:
        raise NotImplementedError


class Counter(_Metric):
    kind = "counter"

    def __init__(self, name: str, help: str, labels: Sequence[str]) -> None:
        super().__init__(name, help, labels)
        self._values: dict[Labels, float] = {}

    def inc(self, *values: str, amount: float = 1.0) -> None:
        if amount < 0:
            raise ValueError("a counter only goes up")
        with self._lock:
            key = self._key(values, self._values)
            self._values[key] = self._values.get(key, 0.0) + amount

    def value(self, *values: str) -> float:
        return self._values.get(tuple(values), 0.0)

    def lines(self) -> list[str]:
        with self._lock:
            items = sorted(self._values.items())
        return [f"{self.name}{_labels(self.labels, k)} {_number(v)}" for k, v in items]


class Gauge(_Metric):
    kind = "gauge"

    def __init__(self, name: str, help: str, labels: Sequence[str]) -> None:
        super().__init__(name, help, labels)
        self._values: dict[Labels, float] = {}

    def set(self, value: float, *values: str) -> None:
        with self._lock:
            self._values[self._key(values, self._values)] = value

    def lines(self) -> list[str]:
        with self._lock:
            items = sorted(self._values.items())
        return [f"{self.name}{_labels(self.labels, k)} {_number(v)}" for k, v in items]


class Histogram(_Metric):
    kind = "histogram"

    def __init__(self, name: str, help: str, labels: Sequence[str], buckets: Iterable[float]) -> None:
        super().__init__(name, help, labels)
        self.buckets = tuple(sorted(buckets))
        self._series: dict[Labels, tuple[list[int], list[float]]] = {}   # counts per bucket (+Inf last), [sum]

    def observe(self, value: float, *values: str) -> None:
        with self._lock:
            key = self._key(values, self._series)
            counts, total = self._series.setdefault(key, ([0] * (len(self.buckets) + 1), [0.0]))
            for i, bound in enumerate(self.buckets):
                if value <= bound:
                    counts[i] += 1
            counts[-1] += 1
            total[0] += value

    def count(self, *values: str) -> int:
        series = self._series.get(tuple(values))
        return series[0][-1] if series else 0

    def lines(self) -> list[str]:
        out: list[str] = []
        with self._lock:
            items = sorted((k, (list(c), t[0])) for k, (c, t) in self._series.items())
        for key, (counts, total) in items:
            for bound, n in zip((*self.buckets, math.inf), counts, strict=True):
                le = "+Inf" if bound == math.inf else _number(bound)
                out.append(f"{self.name}_bucket{_labels((*self.labels, 'le'), (*key, le))} {n}")
            out.append(f"{self.name}_sum{_labels(self.labels, key)} {_number(total)}")
            out.append(f"{self.name}_count{_labels(self.labels, key)} {counts[-1]}")
        return out


class Registry:
    def __init__(self) -> None:
        self._metrics: dict[str, _Metric] = {}
        self._lock = threading.Lock()

    def counter(self, name: str, help: str, labels: Sequence[str] = ()) -> Counter:
        return self._add(Counter(name, help, labels))  # type: ignore[return-value]

    def gauge(self, name: str, help: str, labels: Sequence[str] = ()) -> Gauge:
        return self._add(Gauge(name, help, labels))  # type: ignore[return-value]

    def histogram(self, name: str, help: str, labels: Sequence[str] = (),
                  buckets: Iterable[float] = LATENCY_BUCKETS) -> Histogram:
        return self._add(Histogram(name, help, labels, buckets))  # type: ignore[return-value]

    def _add(self, metric: _Metric) -> _Metric:
        with self._lock:
            have = self._metrics.get(metric.name)
            if have is None:
                self._metrics[metric.name] = metric
                return metric
        if not have.same_shape(metric.kind, metric.labels):
            raise ValueError(f"metric {metric.name} exists as a {have.kind} with labels {have.labels}")
        return have

    def render(self) -> str:
        with self._lock:
            metrics = sorted(self._metrics.values(), key=lambda m: m.name)
        out: list[str] = []
        for metric in metrics:
            out += metric.header() + metric.lines()
        return "\n".join(out) + "\n"


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _escape_value(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(names: Sequence[str], values: Sequence[str]) -> str:
    if not names:
        return ""
    return "{" + ",".join(f'{n}="{_escape_value(v)}"' for n, v in zip(names, values, strict=True)) + "}"


def _number(value: float) -> str:
    if value == math.inf:
        return "+Inf"
    if value == -math.inf:
        return "-Inf"
    if math.isnan(value):
        return "NaN"
    return str(int(value)) if float(value).is_integer() and abs(value) < 2**53 else repr(float(value))


REGISTRY = Registry()
