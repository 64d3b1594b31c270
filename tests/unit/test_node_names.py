"""Which node names a kubelet may join under (kube32.kubelet.join.node_name_problem)."""
from __future__ import annotations

import pytest

from kube32.kubelet.join import MAX_CERTIFIED_NAME, make_csr, node_name_problem


@pytest.mark.parametrize("name", ["sim-1", "fleet-1000", "a.b-c", "x" * MAX_CERTIFIED_NAME])
def test_a_valid_name_with_a_certificate_passes_and_its_csr_can_be_made(name: str) -> None:
    assert node_name_problem(name) is None
    make_csr(name, ["127.0.0.1"])


@pytest.mark.parametrize("name", ["", "Sim-1", "-a", "a-", "a..b", "a_b", "x" * 64 + ".y", "a" * 254])
def test_an_invalid_name_is_refused_with_or_without_a_certificate(name: str) -> None:
    for cert in (True, False):
        why = node_name_problem(name, cert)
        assert why is not None and "not a valid node name" in why


def test_a_long_name_needs_plain_http() -> None:
    name = "x" * (MAX_CERTIFIED_NAME + 1)
    why = node_name_problem(name)
    assert why is not None and f"at most {MAX_CERTIFIED_NAME}" in why
    assert node_name_problem(name, serving_cert=False) is None
    with pytest.raises(ValueError):
        make_csr(name, ["127.0.0.1"])   # what the check saves the user from: cryptography's refusal at join
