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
