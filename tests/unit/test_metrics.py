"""kube32.metrics: the Prometheus text format as prometheus_client's own parser reads it,
bounded label sets, escaping, histograms."""
from __future__ import annotations

import math

import pytest
from prometheus_client.parser import text_string_to_metric_families

from kube32 import metrics


def families(reg: metrics.Registry) -> dict:
    return {f.name: f for f in text_string_to_metric_families(reg.render())}


def test_counters_gauges_and_histograms_parse_as_prometheus_reads_them() -> None:
    reg = metrics.Registry()
    c = reg.counter("k_requests_total", "Requests.\nSecond line \\ too.", ("verb", "code"))
    c.inc("GET", "200")
    c.inc("GET", "200", amount=2)
    c.inc('we"ird\\', "500")
    g = reg.gauge("k_space_bytes", "Space.", ("state",))
    g.set(5, "used")
    g.set(1.5e9, "capacity")
    h = reg.histogram("k_seconds", "Time.", (), buckets=(0.1, 1.0))
    for v in (0.05, 0.5, 3.0):
        h.observe(v)
    got = families(reg)
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value for s in got["k_requests"].samples}
    assert samples[("k_requests_total", (("code", "200"), ("verb", "GET")))] == 3
    assert samples[("k_requests_total", (("code", "500"), ("verb", 'we"ird\\')))] == 1
    assert got["k_requests"].documentation == "Requests.\nSecond line \\ too."
    assert {s.labels["state"]: s.value for s in got["k_space_bytes"].samples} == {"used": 5, "capacity": 1.5e9}
    hs = {(s.name, s.labels.get("le")): s.value for s in got["k_seconds"].samples}
    assert hs[("k_seconds_bucket", "0.1")] == 1 and hs[("k_seconds_bucket", "1")] == 2
    assert hs[("k_seconds_bucket", "+Inf")] == 3 and hs[("k_seconds_count", None)] == 3
    assert math.isclose(hs[("k_seconds_sum", None)], 3.55)


def test_label_sets_are_bounded_whatever_the_values() -> None:
    reg = metrics.Registry()
    c = reg.counter("k_total", "x", ("path",))
    for i in range(metrics.MAX_SERIES + 500):
        c.inc(f"/p{i}")
    samples = families(reg)["k"].samples
    assert len(samples) == metrics.MAX_SERIES + 1
    assert next(s.value for s in samples if s.labels["path"] == metrics.OTHER) == 500


def test_one_name_is_one_metric() -> None:
    reg = metrics.Registry()
    assert reg.counter("k_total", "x", ("a",)) is reg.counter("k_total", "x", ("a",))
    with pytest.raises(ValueError, match="exists as a counter"):
        reg.gauge("k_total", "x", ("a",))
    with pytest.raises(ValueError, match="takes labels"):
        reg.counter("k_total", "x", ("a",)).inc("1", "2")
    with pytest.raises(ValueError, match="only goes up"):
        reg.counter("k_total", "x", ("a",)).inc("1", amount=-1)


def test_a_gauge_says_what_was_set_last() -> None:
    reg = metrics.Registry()
    g = reg.gauge("k_set", "x", ("a",))
    g.set(1, "b")
    g.set(2, "b")
    assert [s.value for s in families(reg)["k_set"].samples] == [2]


def test_a_request_is_counted_under_a_subresource_its_kind_has_and_no_other() -> None:
    from kube32.apiserver.apimetrics import _subresource
    from kube32.apiserver.resources import by_plural
    pods, nodes = by_plural("pods"), by_plural("nodes")
    assert [_subresource(pods, s) for s in ("eviction", "status", "exec", "", "../x", "finalize")] == \
        ["eviction", "status", "exec", "", "", ""]
    assert _subresource(nodes, "proxy") == "proxy" and _subresource(nodes, "eviction") == ""
