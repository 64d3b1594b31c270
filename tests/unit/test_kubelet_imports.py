"""The kubelet's parts stand on their own (issue 22): no module of kube32/kubelet imports
another in a circle - directly or in a loop, counting imports inside functions, under
``TYPE_CHECKING`` and by name at run time (``importlib``, ``"module:attr"`` strings) - and none touches another object's private members."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = "kube32.kubelet"
DIRECTORY = ROOT / "kube32" / "kubelet"


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imported(module: str, is_package: bool, tree: ast.AST, modules: set[str] | None = None) -> set[str]:
    """Every module ``module`` imports (absolute names), wherever the import statement is.
    ``from P import n`` imports module ``P.n`` when that is one of ``modules``, else ``P``."""
    out: set[str] = set()
    base = module.split(".") if is_package else module.split(".")[:-1]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                anchor = base[:len(base) - node.level + 1]
                source = ".".join(anchor + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            for alias in node.names:
                sub = f"{source}.{alias.name}"
                out.add(sub if modules is not None and sub in modules else source)
        else:
            named = _named_import(node, modules)
            if named:
                out.add(named)
    return out


def _named_import(node: ast.AST, modules: set[str] | None) -> str | None:
    """A module imported by its name at run time: ``importlib.import_module("m")``, or a
    ``"m:attr"`` entry point string (a registry's, as kube32.wasm.engines' ENGINES) whose
    ``m`` is one of ``modules``."""
    if (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
            and ast.unparse(node.func) in ("importlib.import_module", "import_module", "__import__")):
        return node.args[0].value
    if isinstance(node, ast.Constant) and isinstance(node.value, str) and modules is not None:
        module, colon, attr = node.value.partition(":")
        if colon and attr.isidentifier() and module in modules:
            return module
    return None


def import_graph(directory: Path = DIRECTORY, package: str = PACKAGE) -> dict[str, set[str]]:
    """module -> the modules of ``package`` it imports."""
    files = {_module_name(p): p for p in sorted(directory.rglob("*.py"))}
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        tree = ast.parse(path.read_text(), str(path))
        imported = _imported(name, path.name == "__init__.py", tree, set(files))
        graph[name] = {m for m in imported if m in files and m != name and m.startswith(package)}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def foreign_private_uses(directory: Path = DIRECTORY) -> list[str]:
    """``x._name`` where ``x`` is not the object's own ``self`` or ``cls``."""
    out = []
    for path in sorted(directory.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")
                    and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))):
                out.append(f"{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(node)}")
            elif isinstance(node, ast.ImportFrom):
                out.extend(f"{path.relative_to(ROOT)}:{node.lineno}: imports {alias.name} from {node.module}"
                           for alias in node.names if alias.name.startswith("_") and not alias.name.startswith("__"))
    return out


def test_the_cycle_finder_finds_a_circle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert cycles(graph) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_the_graph_sees_imports_in_functions_and_under_type_checking(tmp_path: Path) -> None:
    tree = ast.parse("from typing import TYPE_CHECKING\n"
                     "if TYPE_CHECKING:\n    from .kubelet import Kubelet\n"
                     "def f():\n    from . import migration\n    from ..client import PODS\n")
    assert _imported("kube32.kubelet.pods", False, tree, {"kube32.kubelet.migration"}) == {
        "typing", "kube32.kubelet.kubelet", "kube32.kubelet.migration", "kube32.client"}


def test_the_graph_sees_modules_imported_by_name_at_run_time() -> None:
    tree = ast.parse('import importlib\nENGINES = {"a": "kube32.wasm.engine_x:X", "b": "not a module:Y"}\n'
                     'def load():\n    return importlib.import_module("kube32.wasm.other")\n'
                     'log = "kube32.wasm.engine_x"  # a logger\'s name is no import\n')
    assert _imported("kube32.wasm.engines", False, tree, {"kube32.wasm.engine_x", "kube32.wasm.other"}) == {
        "importlib", "kube32.wasm.engine_x", "kube32.wasm.other"}


def test_no_module_of_the_kubelet_imports_another_in_a_circle() -> None:
    graph = import_graph()
    assert "kube32.kubelet.kubelet" in graph and len(graph) > 10
    assert cycles(graph) == []
    # Only the package's face imports the Kubelet itself.
    assert sorted(m for m, deps in graph.items() if "kube32.kubelet.kubelet" in deps) == ["kube32.kubelet"]


def test_no_module_of_the_kubelet_touches_another_objects_private_members() -> None:
    assert foreign_private_uses() == []
