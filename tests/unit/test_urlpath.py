"""kube32.urlpath: what it lets through never resolves out of its object, under any reading
a server or client on the way might make; and it reaches the next server unchanged."""
from __future__ import annotations

import posixpath
import unicodedata
from urllib.parse import unquote

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kube32 import urlpath
from kube32.client import CHECKPOINTS

PIECES = [".", "..", "%2e", "%2E", "%252e", "%25", "25", "2e", "%2f", "%2F", "%252f", "%5c", "\\", ";", "%3b",
          "x=1", "a", "b", "%20", ":", "@", "\uff0e", "%ef%bc%8e", "\u2025", "%00", "%"]
segments = st.lists(st.lists(st.sampled_from(PIECES), max_size=5).map("".join), min_size=1, max_size=6)


def _readings(path: str):
    """Every way a server or client on the way might read a path's segments."""
    for _ in range(4):
        for form in (path, path.replace("\\", "/"), unicodedata.normalize("NFKC", path)):
            yield [s.split(";", 1)[0] for s in form.replace("\\", "/").split("/")]
        path = unquote(path)


@settings(max_examples=600, deadline=None)
@given(segments)
def test_what_passes_never_climbs_under_any_reading(segs: list[str]) -> None:
    try:
        path = urlpath.confined(segs)
    except urlpath.PathRefused:
        return
    for reading in _readings(path):
        assert not {".", ".."} & set(reading), (segs, path, reading)
    # And the way a resolving client would see it stays under the prefix.
    assert posixpath.normpath("/pods/ns/pod/http/" + path).startswith("/pods/ns/pod/http")


@settings(max_examples=300, deadline=None)
@given(segments)
def test_the_next_server_decodes_exactly_the_segments_checked(segs: list[str]) -> None:
    try:
        path = urlpath.confined(segs)
    except urlpath.PathRefused:
        return
    url = urlpath.encoded_url("http://127.0.0.1:1", "/base/" + path, "q=%26&r=%23")
    assert url.raw_path == "/base/" + path            # sent as is: no dot segments resolved, no requoting
    assert url.raw_query_string == "q=%26&r=%23"
    assert [unquote(s) for s in path.split("/")] == segs


@pytest.mark.parametrize("segment", ["..", ".", "%2e%2e", "%2E%2e", ".%2e", "%252e%252E", "%25252e.", "..;x=1",
                                     "..%3b", "a\\b", "a%5cb", "a%255cb", "..%2f", "%ef%bc%8e%ef%bc%8e", "\u2025",
                                     "%00", "a\tb", "%" + "25" * 9 + "2e"])
def test_refused(segment: str) -> None:
    why = urlpath.refusal(["ok", segment])
    assert why is not None and why.endswith("a proxied path may not leave the object it names")
    with pytest.raises(urlpath.PathRefused):
        urlpath.confined([segment])


@pytest.mark.parametrize("segment", ["", "...", "a.b", "..a", "a..", "%2e%2e%2e", "100%", "a;b", "x:y@z", "a b",
                                     "a/b", "%2F", "%41"])
def test_passed(segment: str) -> None:
    assert urlpath.refusal([segment]) is None
    assert unquote(urlpath.confined([segment])) == segment


# --- the API clients' one path builder (issue 19: restore-from "../../.." read a Secret) -------
@pytest.mark.parametrize("name", ["..", ".", "%2e%2e", "..;x", "a/b", "x\n", "%5c", "\u2025"])
def test_an_api_path_names_each_object_by_one_segment(name: str) -> None:
    with pytest.raises(urlpath.PathRefused, match="an API path names each object by one segment"):
        urlpath.api_path("apis", "kube32.io", "v1", "namespaces", "other", "checkpoints", name, "data")
    with pytest.raises(urlpath.PathRefused):
        CHECKPOINTS.path("other", name, "data")


def test_an_api_path_has_no_empty_segment() -> None:
    with pytest.raises(urlpath.PathRefused, match="the path segment is empty"):
        urlpath.api_path("api", "v1", "nodes", "", "proxy")


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(PIECES), min_size=1, max_size=5).map("".join))
def test_an_api_path_reaches_the_server_as_the_names_it_was_built_of(name: str) -> None:
    try:
        path = CHECKPOINTS.path("other", name, "data")
    except urlpath.PathRefused:
        return
    url = urlpath.encoded_url("http://127.0.0.1:1", path)
    assert url.raw_path == path and [unquote(s) for s in path.split("/")[1:]] == [
        "apis", "kube32.io", "v1", "namespaces", "other", "checkpoints", name, "data"]
    for reading in _readings(path):
        assert reading[:8] == ["", "apis", "kube32.io", "v1", "namespaces", "other", "checkpoints", reading[7]]
        assert not {".", ".."} & set(reading), (name, path, reading)
