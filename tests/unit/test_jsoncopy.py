"""copy_json (kube32/apiserver/jsoncopy.py): a deep copy of a JSON value that shares no
dict or list with the original; and a patch decodes the stored version once."""
from __future__ import annotations

import asyncio
import copy
from pathlib import Path

import pytest

from kube32.apiserver import registry as registry_module
from kube32.apiserver.jsoncopy import copy_json
from kube32.apiserver.registry import Registry
from kube32.apiserver.resources import by_plural
from kube32.store import SQLiteStore


def test_copy_equals_and_shares_no_container() -> None:
    value = {"a": [1, 2.5, {"b": None, "c": True}], "d": {"e": "f", "g": [[]]}, "t": (1, [2])}
    out = copy_json(value)
    assert out == value and list(out) == list(value)
    assert out["a"] is not value["a"] and out["a"][2] is not value["a"][2]
    assert out["d"]["g"][0] is not value["d"]["g"][0]
    assert out["t"][1] is not value["t"][1]   # a tuple inside: copied as copy.deepcopy does
    out["a"][2]["b"] = 1
    assert value["a"][2]["b"] is None


@pytest.mark.parametrize("value", [None, 1, "x", [], {}, [{"k": [1]}]])
def test_copy_matches_deepcopy(value: object) -> None:
    assert copy_json(value) == copy.deepcopy(value)


def test_a_patch_decodes_the_stored_version_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cms = by_plural("configmaps")

    async def go() -> int:
        store = await SQLiteStore.open(tmp_path / "s.db")
        try:
            reg = Registry(store)
            await reg.create(by_plural("namespaces"), None, {"metadata": {"name": "default"}}, check_namespace=False)
            await reg.create(cms, "default", {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"},
                                              "data": {"v": "0"}})
            calls = 0
            real = registry_module.decode

            def counted(kv):  # type: ignore[no-untyped-def]
                nonlocal calls
                calls += 1
                return real(kv)
            monkeypatch.setattr(registry_module, "decode", counted)
            out, _ = await reg.patch(cms, "default", "c", "application/merge-patch+json", {"data": {"v": "1"}})
            assert out["data"] == {"v": "1"}
            assert (await reg.get(cms, "default", "c"))["data"] == {"v": "1"}
            return calls - 1   # the get's
        finally:
            await store.close()
    assert asyncio.run(go()) == 1
