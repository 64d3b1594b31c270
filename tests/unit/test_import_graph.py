"""No two modules of kube32 import each other, directly or in a loop (issue 22).

Every import counts: at the top, inside a function, under ``if TYPE_CHECKING:``, and a
module imported by its name at run time (the engine registry's ``"module:class"``); the walk
and the cycle finder are the kubelet's own import test's (tests/unit/test_kubelet_imports.py),
here over the whole package.

And the API's terms have one home (issue 22): Kube32's group, its paths, its X-Kube32-*
headers and condition types are spelt only in kube32/terms.py.
"""
from __future__ import annotations

import ast
from typing import Iterator

from tests.unit.test_kubelet_imports import ROOT, cycles, import_graph

GRAPH = import_graph(ROOT / "kube32", "kube32")


def test_the_walk_sees_the_whole_package() -> None:
    assert "kube32.apiserver.errors" in GRAPH["kube32.apiserver.server"]
    assert "kube32.objects" in GRAPH["kube32.matching"]
    assert "kube32.apiserver.registry" in GRAPH["kube32.apiserver.checkpointdata"]   # under TYPE_CHECKING
    assert "kube32.wasm.engine_pwasm" in GRAPH["kube32.wasm.engines"]                 # by name, at run time


def test_no_two_modules_import_each_other() -> None:
    found = cycles(GRAPH)
    assert not found, "\n".join(
        "a cycle: " + ", ".join(c) + "\n" + "\n".join(f"  {m} -> {w}" for m in c for w in sorted(GRAPH[m]) if w in c)
        for c in found)


# --- one home for the API's terms (kube32/terms.py) -----------------------------------
# A term is a string without white space: prose (a docstring, a usage text, a message)
# may name one, code never spells one.
CONDITION_BY_OBJECT = {"condition", "condition_status", "is_true", "set_condition"}   # f(obj, type, ...)
CONDITION_FIRST = {"condition_entry", "new_condition", "set_cond", "_condition", "cond"}   # f(type, ...)


def _docstrings(tree: ast.AST) -> set[int]:
    return {id(n.body[0].value) for n in ast.walk(tree)
            if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
            and n.body and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}


def _spelt_terms(tree: ast.AST) -> Iterator[tuple[int, str]]:
    """(line, why) of each term the module spells: Kube32's API group or a name under it,
    a path of its API, an X-Kube32-* header, a condition type written or looked up."""
    docs = _docstrings(tree)
    for n in ast.walk(tree):
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs:
            v = n.value
            if not any(c.isspace() for c in v) and "kube32.io" in v:
                yield n.lineno, f"the API group or a name under it: {v!r}"
            elif v.lower().startswith("x-kube32-"):
                yield n.lineno, f"a header name: {v!r}"
        elif isinstance(n, ast.Call):
            f = n.func
            name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
            at = 1 if name in CONDITION_BY_OBJECT else 0 if name in CONDITION_FIRST else None
            if at is not None and len(n.args) > at and isinstance(n.args[at], ast.Constant) \
                    and isinstance(n.args[at].value, str):
                yield n.lineno, f"a condition type: {name}({n.args[at].value!r}, ...)"
        elif isinstance(n, ast.Dict):
            keys = {k.value: v for k, v in zip(n.keys, n.values, strict=True) if isinstance(k, ast.Constant)}
            if "type" in keys and "status" in keys and isinstance(keys["type"], ast.Constant):
                yield n.lineno, f"a condition type: {{'type': {keys['type'].value!r}, ...}}"


def _spelt_in_package() -> list[str]:
    return [f"{p.relative_to(ROOT)}:{line}: {why}"
            for p in sorted((ROOT / "kube32").rglob("*.py")) if p.name != "terms.py"
            for line, why in _spelt_terms(ast.parse(p.read_text()))]


def test_the_term_check_sees_each_kind_of_spelling() -> None:
    source = '''
"""A docstring may say kube32.io/migration."""
GROUP = "kube32.io"
PATH = "/apis/kube32.io/v1/images"
HEADER = "X-Kube32-Peer"
ready = condition(pod, "Ready")
entry = condition_entry("Established", "True", "", "")
cond = {"type": "Available", "status": "True"}
text = "the pod's annotation kube32.io/migration says Never"
service = {"type": "ClusterIP", "ports": []}
'''
    found = [why for _, why in _spelt_terms(ast.parse(source))]
    assert found == ["the API group or a name under it: 'kube32.io'",
                     "the API group or a name under it: '/apis/kube32.io/v1/images'",
                     "a header name: 'X-Kube32-Peer'", "a condition type: condition('Ready', ...)",
                     "a condition type: condition_entry('Established', ...)",
                     "a condition type: {'type': 'Available', ...}"], found


def test_the_apis_terms_are_spelt_only_in_terms() -> None:
    spelt = _spelt_in_package()
    assert not spelt, "spell these through kube32/terms.py:\n" + "\n".join(spelt)
