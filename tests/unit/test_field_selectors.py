"""Field selectors read as apimachinery's fields.ParseSelector reads them (round 25d)."""
from __future__ import annotations

import pytest

from kube32.apiserver.errors import APIError
from kube32.apiserver.selectors import parse_field_selector


@pytest.mark.parametrize("text,terms", [
    ("spec.nodeName=a,status.phase!=Running", (("spec.nodeName", "=", "a"), ("status.phase", "!=", "Running"))),
    ("spec.nodeName==a", (("spec.nodeName", "=", "a"),)),
    (r"metadata.name=a\,b", (("metadata.name", "=", "a,b"),)),
    (r"metadata.name=a\=b\\c", (("metadata.name", "=", r"a=b\c"),)),
    ("spec.nodeName=inv-1 ", (("spec.nodeName", "=", "inv-1 "),)),   # nothing trimmed
    ("spec.nodeName = a", (("spec.nodeName ", "=", " a"),)),
    ("spec.nodeName=", (("spec.nodeName", "=", ""),)),
    ("a=1,,b=2", (("a", "=", "1"), ("b", "=", "2"))),
])
def test_terms_split_at_unescaped_commas_and_the_first_operator(text: str, terms: tuple) -> None:
    assert parse_field_selector(text).terms == terms


@pytest.mark.parametrize("text,why", [
    (r"spec.nodeName=dev\kit", r"invalid escape sequence: \k"),
    ("spec.nodeName===devkit", "unescaped character in value: ="),
    ("spec.nodeName=a\\", "invalid escape sequence: \\"),
    ("spec.nodeName", "can't understand 'spec.nodeName'"),
])
def test_what_kube_apiserver_refuses_is_a_400_naming_the_cause(text: str, why: str) -> None:
    with pytest.raises(APIError) as e:
        parse_field_selector(text)
    assert e.value.code == 400 and why in e.value.message
