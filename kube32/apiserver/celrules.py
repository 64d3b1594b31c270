"""CustomResourceDefinitions' ``x-kubernetes-validations``: CEL rules checked when a CRD is
written and evaluated on every write of its objects, as apiextensions-apiserver's
``schema/cel`` does, with cel-python (pure Python) as the CEL engine.

At CRD write time :func:`check` (on a CEL thread: :func:`check_off_loop`) walks a structural schema (one that passed
:func:`.schemavalidation.check_schema`) and refuses, naming the rule by its path
(``...properties[spec].x-kubernetes-validations[0].rule``):

* a rule that does not parse, or names a field its schema node does not have
  (``undefined field 'foo'``), an identifier other than ``self``, ``oldSelf`` and its
  macros' variables, or a function Kube32 does not support (:data:`MEMBER_FUNCTIONS`,
  :data:`GLOBAL_FUNCTIONS`: standard CEL and the Kubernetes extensions of
  :mod:`.cellib`); a rule whose type is known not to be bool;
* a bad ``reason``, ``fieldPath``, ``message`` (line breaks) or ``messageExpression``,
  ``optionalOldSelf`` on a rule without ``oldSelf``, ``oldSelf`` under a list whose
  items cannot be matched to the old ones (not ``x-kubernetes-list-type: map``);
* a rule whose estimated cost is over :data:`RULE_COST_LIMIT`, or rules whose cost
  times how often they run (the lists and maps above them) add up past
  :data:`CRD_COST_LIMIT`: Kubernetes' limits and words ("estimated rule cost exceeds
  budget by factor of ..."), with Kube32's own estimate: each step costs 1, a macro
  over a list or map costs its size times its body, a string function a tenth of the
  string's length; sizes come from ``maxItems``/``maxProperties``/``maxLength``, and an
  unbounded one is as large as a 3 MiB request could make it.

On a write of an object :func:`evaluate` runs the rules of every node holding a value
(null values are not checked), ``self`` bound to it and, for a transition rule (one
naming ``oldSelf``), ``oldSelf`` to the old value, when there is one (an object's
properties, a map's keys and a map-list's keyed items match old to new); with
``optionalOldSelf: true`` the rule runs on create too, ``oldSelf`` an optional.  A rule
that does not name ``oldSelf`` and fails on a value equal to the old one is let pass
(Kubernetes' validation ratcheting).  A failure is a field error worded as Kubernetes
words it: ``spec: Invalid value: "object": <message>`` (``reason`` Forbidden, Required or
Duplicate changes the wording, ``fieldPath`` the field; the root is ``<nil>``).

Bound (security by default): every evaluation step and every value converted costs from
one budget of :data:`REQUEST_BUDGET` per request, and values charge their size when read
or built, so no object and no rule can make the server work or allocate without bound;
a request also stops after :data:`~kube32.timing.CEL_REQUEST_SECONDS`.  Running out is a
422 saying so.  cel-python is slow (a few microseconds a step), so the budget is far
smaller than Kubernetes' runtime budget: a rule Kubernetes would finish on a very large
object may be refused here.  :func:`evaluate_off_loop` runs the evaluation on a thread
of its own, so the event loop keeps serving meanwhile.

Where cel-python cannot be installed (its google-re2 has no wheel for 32-bit ARM, which
runs workers, not API servers), :data:`ENGINE_MISSING` says so and every rule is refused
at CRD write time and fails every write of an object: never accepted unevaluated.

Invariants: a compiled schema (:func:`compiled`) is cached by its digest and never
changed; parsed rules are shared by threads only to be read (cel-python's evaluator
does not change its tree); a rule that stopped compiling (stored before a check, or by
hand) is reported on every write of an object as ``rule compile error``, as Kubernetes
does, and never evaluated.
"""
from __future__ import annotations

import asyncio
import hashlib
import json
import re
import time
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import platform
import sys
import threading

from .. import timing

try:
    import celpy
    import lark
    from celpy import celtypes
    from celpy.celparser import CELParseError
    from celpy.evaluation import CELEvalError, Evaluator

    from . import cellib
    ENGINE_MISSING: str | None = None
except ImportError as e:   # cel-python's google-re2 has no wheel for this CPU: no rule runs here
    ENGINE_MISSING = (f"this API server has no CEL engine (cel-python does not install on {platform.machine()}: "
                      f"{e}): a CRD with x-kubernetes-validations needs an API server on x86_64 or arm64")
    Evaluator = object  # type: ignore[misc,assignment]

Schema = dict[str, Any]
Errors = list[tuple[str, str]]

RULE_COST_LIMIT = 10_000_000     # Kubernetes' StaticEstimatedCostLimit: one rule's estimated cost
CRD_COST_LIMIT = 100_000_000     # Kubernetes' StaticEstimatedCRDCostLimit: all rules of a schema
# What one request's rules may cost when they run: a step of cel-python's evaluator is a
# few microseconds, so this is well under a second of work on this machine's cores.
REQUEST_BUDGET = 100_000
MAX_REQUEST_BYTES = 3 * 1024 * 1024
MAX_RULE_CHARS = 8 * 1024
MAX_NESTING = 32                 # brackets deep in a rule: the parser and evaluator recurse
MAX_RULES = 512                  # rules in one schema
MAX_MESSAGE_BYTES = 5 * 1024     # Kubernetes' MaxEvaluatedMessageExpressionSizeBytes
CEL_THREADS = 2
REASONS = ("FieldValueDuplicate", "FieldValueForbidden", "FieldValueInvalid", "FieldValueRequired")
RULE_FIELDS = {"rule", "message", "messageExpression", "reason", "fieldPath", "optionalOldSelf"}
MACROS = {"all", "exists", "exists_one", "map", "filter"}
BOOL, INT, STRING, DOUBLE, DYN = "bool", "int", "string", "double", "dyn"
# name -> the kind of what it gives (None: the receiver's element kind, "same": the receiver's)
MEMBER_FUNCTIONS: dict[str, str | None] = {
    "size": INT, "contains": BOOL, "startsWith": BOOL, "endsWith": BOOL, "matches": BOOL,
    "lowerAscii": "same", "upperAscii": "same", "trim": "same", "replace": "same", "substring": "same",
    "charAt": STRING, "indexOf": INT, "lastIndexOf": INT, "join": STRING, "split": "list", "find": STRING,
    "findAll": "list", "isSorted": BOOL, "sum": None, "min": None, "max": None,
    "getDate": INT, "getDayOfMonth": INT, "getDayOfWeek": INT, "getDayOfYear": INT, "getFullYear": INT,
    "getMonth": INT, "getHours": INT, "getMilliseconds": INT, "getMinutes": INT, "getSeconds": INT,
    "isInteger": BOOL, "asInteger": INT, "asApproximateFloat": DOUBLE, "sign": INT, "add": "quantity",
    "sub": "quantity", "compareTo": INT, "isGreaterThan": BOOL, "isLessThan": BOOL,
    "hasValue": BOOL, "value": DYN, "orValue": DYN,
}
GLOBAL_FUNCTIONS: dict[str, str] = {
    "size": INT, "int": INT, "uint": "uint", "double": DOUBLE, "string": STRING, "bool": BOOL, "bytes": "bytes",
    "duration": "duration", "timestamp": "timestamp", "dyn": DYN, "type": "type", "matches": BOOL,
    "quantity": "quantity", "isQuantity": BOOL, "has": BOOL,
}
TYPE_NAMES = {"int", "uint", "double", "string", "bool", "bytes", "list", "map", "null_type", "type"}
_TRAVERSING = {"contains", "matches", "find", "findAll", "lowerAscii", "upperAscii", "trim", "replace", "split",
               "substring", "indexOf", "lastIndexOf", "quantity", "isQuantity"}
_LIST_WALKING = {"isSorted", "sum", "min", "max", "join"}

def _environment() -> Any:
    limit = sys.getrecursionlimit()
    env = celpy.Environment()
    sys.setrecursionlimit(limit)   # cel-python raises the process's limit; rules are nested 32 deep at most
    return env


_ENV: Any = _environment() if ENGINE_MISSING is None else None
_EXECUTOR = ThreadPoolExecutor(max_workers=CEL_THREADS, thread_name_prefix="cel")


# --- types, as far as a schema tells them ----------------------------------------------
@dataclass(frozen=True)
class CelType:
    kind: str                      # object, map, list, string, int, double, bool, dyn, optional, ...
    schema: Schema | None = None
    size: float = 1.0              # the most items, properties or characters it may have
    root: bool = False             # a resource's root: apiVersion, kind, metadata besides


DYN_TYPE = CelType(DYN, size=MAX_REQUEST_BYTES)
_MIN_BYTES = {"string": 2, "integer": 1, "number": 1, "boolean": 4, "object": 2, "array": 2}


def _unbounded(item: Schema | None) -> float:
    """How many items a 3 MiB request could hold, each at least ``item``'s JSON size."""
    smallest = _MIN_BYTES.get((item or {}).get("type", ""), 1) + 1
    return float(MAX_REQUEST_BYTES // smallest)


def type_of(s: Schema, root: bool = False) -> CelType:
    t = s.get("type")
    if s.get("x-kubernetes-int-or-string") is True or t is None:
        return CelType(DYN, s, float(s.get("maxLength") or MAX_REQUEST_BYTES))
    if t == "object":
        extra = s.get("additionalProperties")
        if s.get("properties") or root or s.get("x-kubernetes-embedded-resource") is True:
            return CelType("object", s, root=root or s.get("x-kubernetes-embedded-resource") is True)
        if isinstance(extra, dict):
            return CelType("map", s, float(s.get("maxProperties") or _unbounded(extra) / 2))
        return CelType(DYN if s.get("x-kubernetes-preserve-unknown-fields") else "object", s)
    if t == "array":
        items = s.get("items")
        bound = s.get("maxItems")
        return CelType("list", s, float(bound) if isinstance(bound, int) else
                       _unbounded(items if isinstance(items, dict) else {}))
    if t == "string":
        kind = {"date-time": "timestamp", "duration": "duration"}.get(s.get("format", ""), STRING)
        length = s.get("maxLength")
        return CelType(kind, s, float(length) if isinstance(length, int) else float(MAX_REQUEST_BYTES))
    return CelType({"integer": INT, "number": DOUBLE, "boolean": BOOL}.get(t, DYN), s)


def _field(t: CelType, name: str, meta: Any) -> CelType:
    if t.kind in (DYN, "map"):
        extra = (t.schema or {}).get("additionalProperties")
        return type_of(extra) if t.kind == "map" and isinstance(extra, dict) else DYN_TYPE
    if t.kind == "meta":
        if name in ("name", "generateName"):
            return CelType(STRING, size=253)
        raise _CompileError(f"undefined field '{name}'", meta)
    if t.kind != "object":
        raise _CompileError(f"type '{t.kind}' does not support field selection", meta)
    s = t.schema or {}
    props = cellib.properties(s)
    for raw, sub in props.items():
        if cellib.escape(raw) == name and isinstance(sub, dict):
            return type_of(sub)
    if t.root and name in ("apiVersion", "kind"):
        return CelType(STRING, size=253)
    if t.root and name == "metadata":
        return CelType("meta")
    if not props and s.get("x-kubernetes-preserve-unknown-fields") is True:
        return DYN_TYPE
    raise _CompileError(f"undefined field '{name}'", meta)


def _element(t: CelType) -> CelType:
    s = t.schema or {}
    if t.kind == "list" and isinstance(s.get("items"), dict):
        return type_of(s["items"])
    if t.kind == "map":
        return CelType(STRING, size=MAX_REQUEST_BYTES)     # a macro over a map binds its keys
    return DYN_TYPE


# --- compiling one expression -----------------------------------------------------------
class _CompileError(Exception):
    def __init__(self, message: str, meta: Any = None) -> None:
        super().__init__(message)
        self.line = getattr(meta, "line", 1) if meta is not None and not getattr(meta, "empty", False) else 1
        self.column = getattr(meta, "column", 1) if meta is not None and not getattr(meta, "empty", False) else 1

    def text(self) -> str:
        return f"ERROR: <input>:{self.line}:{self.column}: {self.args[0]}"


class _Checker:
    """Types and estimated cost of a parsed expression, refusing what Kube32 cannot run."""

    def __init__(self, self_type: CelType, old_type: CelType) -> None:
        self.scope: dict[str, CelType] = {"self": self_type, "oldSelf": old_type}
        self.uses_old_self = False

    def walk(self, tree: Any) -> tuple[CelType, float]:
        if isinstance(tree, lark.Token):
            return DYN_TYPE, 0.0
        handler = getattr(self, "_" + tree.data, None)
        if handler is None:
            raise _CompileError(f"unsupported expression ({tree.data})", tree.meta)
        return handler(tree)

    def _subtrees(self, tree: lark.Tree) -> list[Any]:
        return [c for c in tree.children if isinstance(c, lark.Tree)]

    def _pass(self, tree: lark.Tree) -> tuple[CelType, float]:
        kids = self._subtrees(tree)
        if len(kids) == 1:
            return self.walk(kids[0])
        cost = 1.0
        for kid in kids:
            cost += self.walk(kid)[1]
        return CelType(BOOL), cost

    _conditionalor = _conditionaland = _member = _primary = _paren_expr = _pass

    def _expr(self, tree: lark.Tree) -> tuple[CelType, float]:
        kids = self._subtrees(tree)
        if len(kids) == 1:
            return self.walk(kids[0])
        (_, c0), (t1, c1), (t2, c2) = (self.walk(k) for k in kids)
        return (t1 if t1.kind == t2.kind else DYN_TYPE), 1 + c0 + max(c1, c2)

    def _binary(self, tree: lark.Tree) -> tuple[str, tuple[CelType, float], tuple[CelType, float]] | None:
        """A binary node's operator and its two sides walked; None when it has one child
        (the grammar's pass-through level), which the caller walks instead."""
        kids = self._subtrees(tree)
        if len(kids) == 1:
            return None
        op, rhs = kids
        return op.data, self.walk(op.children[0]), self.walk(rhs)

    def _relation(self, tree: lark.Tree) -> tuple[CelType, float]:
        binary = self._binary(tree)
        if binary is None:
            return self.walk(self._subtrees(tree)[0])
        data, (lt, lc), (rt, rc) = binary
        cost = 1 + lc + rc
        if data == "relation_in" and rt.kind in ("list", DYN):
            cost += rt.size
        elif data in ("relation_eq", "relation_ne") and lt.kind in ("list", "map", STRING, DYN):
            cost += min(lt.size, rt.size) * (0.1 if lt.kind == STRING else 1)
        return CelType(BOOL), cost

    def _arith(self, tree: lark.Tree) -> tuple[CelType, float]:
        binary = self._binary(tree)
        if binary is None:
            return self.walk(self._subtrees(tree)[0])
        _, (lt, lc), (rt, rc) = binary
        if lt.kind in (STRING, "list", "bytes") and rt.kind == lt.kind:
            return CelType(lt.kind, lt.schema, lt.size + rt.size), 1 + lc + rc + (lt.size + rt.size) * 0.1
        return (lt if lt.kind != DYN else rt), 1 + lc + rc

    _addition = _multiplication = _arith

    def _unary(self, tree: lark.Tree) -> tuple[CelType, float]:
        kids = self._subtrees(tree)
        t, cost = self.walk(kids[-1])
        if len(kids) == 2 and kids[0].data == "unary_not":
            return CelType(BOOL), cost + 1
        return t, cost + (1 if len(kids) == 2 else 0)

    def _member_dot(self, tree: lark.Tree) -> tuple[CelType, float]:
        t, cost = self.walk(tree.children[0])
        return _field(t, str(tree.children[1]), _token_pos(tree.children[1], tree.meta)), cost + 1

    def _member_index(self, tree: lark.Tree) -> tuple[CelType, float]:
        t, cost = self.walk(tree.children[0])
        _, ic = self.walk(tree.children[1])
        if t.kind == "map":
            return _field(t, "", tree.meta), cost + ic + 1
        return (_element(t) if t.kind == "list" else DYN_TYPE), cost + ic + 1

    def _member_object(self, tree: lark.Tree) -> tuple[CelType, float]:
        raise _CompileError("message construction is not supported", tree.meta)

    def _args(self, tree: lark.Tree) -> list[Any]:
        lists = [c for c in tree.children if isinstance(c, lark.Tree) and c.data == "exprlist"]
        return self._subtrees(lists[0]) if lists else []

    def _member_dot_arg(self, tree: lark.Tree) -> tuple[CelType, float]:
        name = str(tree.children[1])
        target, tc = self.walk(tree.children[0])
        args = self._args(tree)
        if name in MACROS:
            return self._macro(name, target, tc, args, tree)
        if name not in MEMBER_FUNCTIONS:
            raise _CompileError(f"undeclared reference to '{name}' (Kube32 supports {_listing(MEMBER_FUNCTIONS)} "
                                "as methods)", _token_pos(tree.children[1], tree.meta))
        walked = [self.walk(a) for a in args]
        cost = tc + 1 + sum(c for _, c in walked)
        if name in _TRAVERSING:
            # RE2 is linear in the string; contains and find compare against every position
            arg_size = walked[0][0].size if walked and name in ("contains", "find", "findAll") else 1
            cost += 0.1 * target.size * max(1.0, arg_size)
        elif name in ("startsWith", "endsWith"):
            cost += 0.1 * (walked[0][0].size if walked else 1)
        elif name in _LIST_WALKING:
            cost += target.size * (0.1 * _element(target).size if name == "join" else 1)
        return _result(MEMBER_FUNCTIONS[name], target), cost

    def _macro(self, name: str, target: CelType, cost: float, args: list[Any],
               tree: lark.Tree) -> tuple[CelType, float]:
        if len(args) != 2:
            raise _CompileError(f"macro {name} takes 2 arguments: a variable and an expression", tree.meta)
        var = _ident_of(args[0])
        if var is None:
            raise _CompileError(f"the first argument of {name} must be a variable name", tree.meta)
        if target.kind not in ("list", "map", DYN):
            raise _CompileError(f"macro {name} applies to a list or a map, not to {target.kind}", tree.meta)
        saved = self.scope.get(var)
        self.scope[var] = _element(target)
        try:
            body, bc = self.walk(args[1])
        finally:
            if saved is None:
                self.scope.pop(var, None)
            else:
                self.scope[var] = saved
        total = cost + 1 + target.size * (bc + 1)
        if name == "map":
            return CelType("list", None, target.size), total
        if name == "filter":
            return CelType("list", target.schema, target.size), total
        return CelType(BOOL), total

    def _ident(self, tree: lark.Tree) -> tuple[CelType, float]:
        name = str(tree.children[0])
        if name in self.scope:
            if name == "oldSelf":
                self.uses_old_self = True
            return self.scope[name], 1.0
        if name in TYPE_NAMES:
            return CelType("type"), 1.0
        raise _CompileError(f"undeclared reference to '{name}'", tree.meta)

    def _ident_arg(self, tree: lark.Tree) -> tuple[CelType, float]:
        name = str(tree.children[0])
        args = self._args(tree)
        if name not in GLOBAL_FUNCTIONS:
            raise _CompileError(f"undeclared reference to '{name}' (Kube32 supports {_listing(GLOBAL_FUNCTIONS)} "
                                "as functions)", tree.meta)
        walked = [self.walk(a) for a in args]
        if name == "has" and (len(args) != 1 or not _is_selection(args[0])):
            raise _CompileError("invalid argument to has() macro", tree.meta)
        cost = 1 + sum(c for _, c in walked)
        if name == "dyn" and walked:
            return walked[0][0], cost
        if name in ("matches", "quantity", "isQuantity") and walked:
            cost += 0.1 * walked[0][0].size
        return CelType(GLOBAL_FUNCTIONS[name]), cost

    def _dot_ident(self, tree: lark.Tree) -> tuple[CelType, float]:
        raise _CompileError(f"undeclared reference to '.{tree.children[0]}'", tree.meta)

    _dot_ident_arg = _dot_ident

    def _list_lit(self, tree: lark.Tree) -> tuple[CelType, float]:
        walked = [self.walk(a) for a in self._args(tree)]
        item_kind = walked[0][0].kind if walked and all(t.kind == walked[0][0].kind for t, _ in walked) else DYN
        return CelType("list", {"type": "array", "items": _schema_of(item_kind)}, float(len(walked))), \
            1 + sum(c for _, c in walked)

    def _map_lit(self, tree: lark.Tree) -> tuple[CelType, float]:
        inits = [c for c in tree.children if isinstance(c, lark.Tree)]
        walked = [self.walk(a) for a in (self._subtrees(inits[0]) if inits else [])]
        return CelType("map", {"type": "object", "additionalProperties": {}}, float(len(walked) // 2)), \
            1 + sum(c for _, c in walked)

    def _literal(self, tree: lark.Tree) -> tuple[CelType, float]:
        token = tree.children[0]
        kind = {"INT_LIT": INT, "UINT_LIT": "uint", "FLOAT_LIT": DOUBLE, "STRING_LIT": STRING,
                "MLSTRING_LIT": STRING, "BYTES_LIT": "bytes", "BOOL_LIT": BOOL, "NULL_LIT": "null"}
        return CelType(kind.get(getattr(token, "type", ""), DYN), size=float(len(str(token)))), 1.0


def _token_pos(token: Any, meta: Any) -> Any:
    """Where cel-go points for a selection: the dot before the name."""
    line, column = getattr(token, "line", None), getattr(token, "column", None)
    return _Pos(line, max(1, column - 1)) if line is not None and column is not None else meta


def _schema_of(kind: str) -> Schema:
    return {INT: {"type": "integer"}, STRING: {"type": "string"}, DOUBLE: {"type": "number"},
            BOOL: {"type": "boolean"}}.get(kind, {})


def _result(kind: str | None, target: CelType) -> CelType:
    if kind is None:
        return _element(target)
    if kind == "same":
        return CelType(target.kind if target.kind in (STRING, DYN) else STRING, size=target.size)
    if kind == "list":
        return CelType("list", {"type": "array", "items": {"type": "string"}}, target.size)
    if kind == DYN and target.kind == "optional":
        return type_of(target.schema or {})
    return CelType(kind)


def _listing(names: dict[str, Any]) -> str:
    return ", ".join(sorted(names))


def _descend(tree: Any, names: tuple[str, ...]) -> Any:
    """The single subtree under ``tree`` through wrapper nodes named ``names``."""
    while isinstance(tree, lark.Tree) and tree.data in names:
        kids = [c for c in tree.children if isinstance(c, lark.Tree)]
        if len(kids) != 1:
            return tree
        tree = kids[0]
    return tree


_WRAPPERS = ("expr", "conditionalor", "conditionaland", "relation", "addition", "multiplication", "unary",
             "member", "primary")


def _ident_of(expr: Any) -> str | None:
    node = _descend(expr, _WRAPPERS)
    if isinstance(node, lark.Tree) and node.data == "ident":
        return str(node.children[0])
    return None


def _is_selection(expr: Any) -> bool:
    node = _descend(expr, _WRAPPERS)
    return isinstance(node, lark.Tree) and node.data in ("member_dot", "member_index")


def _nesting(text: str) -> int:
    depth = deepest = 0
    for ch in text:
        if ch in "([{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in ")]}":
            depth -= 1
    return deepest


@dataclass
class Expression:
    """One compiled CEL expression: its tree, runner, type, cost, whether it names oldSelf."""
    text: str
    tree: Any
    runner: Any
    kind: str
    cost: float
    uses_old_self: bool


def compile_expression(text: str, self_type: CelType, optional_old_self: bool = False) -> Expression:
    """Parse and check ``text`` with ``self`` of ``self_type``; _CompileError names why not."""
    if len(text) > MAX_RULE_CHARS:
        raise _CompileError(f"the expression is {len(text)} characters, more than the limit of {MAX_RULE_CHARS}")
    if _nesting(text) > MAX_NESTING:
        raise _CompileError(f"the expression nests brackets more than {MAX_NESTING} deep")
    try:
        tree = _ENV.compile(text)
    except CELParseError as e:
        hint = " (Kube32's CEL has no optional field selection: use has())" if ".?" in text or "[?" in text else ""
        raise _CompileError(f"Syntax error: {_unexpected(text, e.line or 1, e.column or 1)}{hint}",
                            _Pos(e.line or 1, e.column or 1)) from None
    except (RecursionError, lark.exceptions.LarkError) as e:
        raise _CompileError(f"Syntax error: {type(e).__name__}") from None
    old_type = CelType("optional", self_type.schema, root=self_type.root) if optional_old_self else self_type
    checker = _Checker(self_type, old_type)
    try:
        t, cost = checker.walk(tree)
    except RecursionError:
        raise _CompileError("the expression is too deeply nested") from None
    runner = _ENV.program(tree, functions=cellib.FUNCTIONS)
    return Expression(text, tree, runner, t.kind, cost, checker.uses_old_self)


def _unexpected(text: str, line: int, column: int) -> str:
    lines = text.splitlines() or [""]
    rest = lines[min(line, len(lines)) - 1][column - 1:].strip() if line <= len(lines) else ""
    return f"unexpected input {json.dumps(rest[:16])}" if rest else "unexpected end of input"


@dataclass
class _Pos:
    line: int
    column: int


# --- a schema's rules ---------------------------------------------------------------------
@dataclass
class Rule:
    index: int
    text: str
    message: str
    reason: str | None
    field_path: str
    optional_old_self: bool
    expression: Expression | None = None
    message_expression: Expression | None = None
    error: str | None = None          # why it does not compile (it is then never evaluated)

    @property
    def transition(self) -> bool:
        return bool(self.expression and self.expression.uses_old_self)

    def shown(self) -> str:
        """The rule as Kubernetes names it in errors: its message, else its text."""
        return self.message.strip() or self.text.strip()


@dataclass
class Node:
    """The rules of one schema node and of the nodes under it that have any."""
    schema: Schema
    root: bool
    rules: list[Rule] = field(default_factory=list)
    properties: dict[str, Node] = field(default_factory=dict)
    additional: Node | None = None
    items: Node | None = None


@dataclass
class _Walk:
    path: str
    errors: Errors = field(default_factory=list)
    costs: list[tuple[str, float]] = field(default_factory=list)   # (rule path, cost x cardinality)
    count: int = 0


def check(schema: Schema, path: str) -> Errors:
    """Why the x-kubernetes-validations of ``schema`` (at ``path``) are refused; [] if not."""
    walk = _Walk(path)
    _compile_node(schema, path, 1.0, True, True, walk)
    if not walk.errors:
        total = sum(c for _, c in walk.costs)
        if total > CRD_COST_LIMIT:
            for rule_path, cost in walk.costs:
                if cost > CRD_COST_LIMIT / 100:
                    walk.errors.append((rule_path, "Forbidden: contributed to estimated rule & messageExpression "
                                                   "cost total exceeding cost limit"))
            walk.errors.append((path, "Forbidden: x-kubernetes-validations estimated rule cost total for entire "
                                      f"OpenAPIv3 schema exceeds budget by factor of {_factor(total, CRD_COST_LIMIT)}"))
    return walk.errors


_COMPILED: OrderedDict[str, Node | None] = OrderedDict()
_COMPILED_LOCK = threading.Lock()    # compiled() runs on the CEL threads
MAX_COMPILED = 512     # schemas kept compiled (the catalog rebuilds every CRD's strategy on each CRD event)


def compiled(schema: Schema) -> Node | None:
    """The rules of ``schema`` ready to evaluate (None: it has none); cached by its digest."""
    text = json.dumps(schema, sort_keys=True)
    if "x-kubernetes-validations" not in text:
        return None
    digest = hashlib.sha256(text.encode()).hexdigest()
    with _COMPILED_LOCK:
        if digest in _COMPILED:
            _COMPILED.move_to_end(digest)
            return _COMPILED[digest]
    node = _compile_node(json.loads(text), "", 1.0, True, True, _Walk(""))   # two threads may both: same result
    with _COMPILED_LOCK:
        _COMPILED[digest] = node
        if len(_COMPILED) > MAX_COMPILED:
            _COMPILED.popitem(last=False)
    return node


async def check_off_loop(schema: Schema, path: str) -> Errors:
    """:func:`check` on a CEL thread: parsing is slow (up to a second or so for a big schema's rules)."""
    return await asyncio.get_running_loop().run_in_executor(_EXECUTOR, check, schema, path)


def _compile_node(s: Any, path: str, cardinality: float, correlatable: bool, root: bool, walk: _Walk) -> Node | None:
    if not isinstance(s, dict):
        return None
    node = Node(s, root)
    rules = s.get("x-kubernetes-validations")
    if rules is not None:
        node.rules = _compile_rules(rules, s, f"{path}.x-kubernetes-validations", cardinality, correlatable, root, walk)
    for key in ("allOf", "anyOf", "oneOf", "not"):
        if key in s and "x-kubernetes-validations" in json.dumps(s[key]):
            walk.errors.append((f"{path}.{key}", "Forbidden: Kube32 does not evaluate x-kubernetes-validations "
                                                 f"inside {key}: put the rules on the schema itself"))
    props = cellib.properties(s)
    for name, sub in props.items():
        child = _compile_node(sub, f"{path}.properties[{name}]", cardinality, correlatable, _embedded(sub), walk)
        if child is not None:
            node.properties[name] = child
    extra = s.get("additionalProperties")
    if isinstance(extra, dict):
        size = type_of(s).size if s.get("type") == "object" else 1.0
        node.additional = _compile_node(extra, f"{path}.additionalProperties", cardinality * size, correlatable,
                                        _embedded(extra), walk)
    items = s.get("items")
    if isinstance(items, dict):
        keyed = s.get("x-kubernetes-list-type") == "map" and bool(s.get("x-kubernetes-list-map-keys"))
        node.items = _compile_node(items, f"{path}.items", cardinality * type_of(s).size, correlatable and keyed,
                                   _embedded(items), walk)
    if node.rules or node.properties or node.additional or node.items:
        return node
    return None


def _embedded(s: Any) -> bool:
    return isinstance(s, dict) and s.get("x-kubernetes-embedded-resource") is True


def _compile_rules(rules: Any, s: Schema, path: str, cardinality: float, correlatable: bool, root: bool,
                   walk: _Walk) -> list[Rule]:
    if not isinstance(rules, list):
        walk.errors.append((path, "Invalid value: must be a list of rules"))
        return []
    walk.count += len(rules)
    if walk.count > MAX_RULES:
        walk.errors.append((path, f"Too many: more than {MAX_RULES} rules in one schema"))
        return []
    out = []
    for i, spec in enumerate(rules):
        rule = _compile_rule(spec, i, s, f"{path}[{i}]", correlatable, root, walk)
        if rule is not None:
            out.append(rule)
            if rule.expression is not None:
                cost = rule.expression.cost + (rule.message_expression.cost if rule.message_expression else 0)
                walk.costs.append((f"{path}[{i}].rule", cost * cardinality))
    return out


def _compile_rule(spec: Any, i: int, s: Schema, path: str, correlatable: bool, root: bool,
                  walk: _Walk) -> Rule | None:
    if not isinstance(spec, dict):
        walk.errors.append((path, "Invalid value: a rule must be an object"))
        return None
    errs = walk.errors
    for key in spec:
        if key not in RULE_FIELDS:
            errs.append((f"{path}.{key}", "Forbidden: unknown field"))
    text, message = spec.get("rule"), spec.get("message", "")
    if not isinstance(text, str) or not text.strip():
        errs.append((f"{path}.rule", "Required value: rule is not specified"))
        return None
    if not isinstance(message, str):
        errs.append((f"{path}.message", "Invalid value: must be a string"))
        message = ""
    _check_message(text, message, path, errs)
    reason = spec.get("reason")
    if reason is not None and reason not in REASONS:
        errs.append((f"{path}.reason", f"Unsupported value: {json.dumps(reason)}: supported values: "
                                       + ", ".join(f'"{r}"' for r in REASONS)))
    optional = spec.get("optionalOldSelf") is True
    rule = Rule(i, text, message, reason if isinstance(reason, str) else None, "", optional)
    if ENGINE_MISSING is not None:     # refused, never accepted unevaluated
        rule.error = ENGINE_MISSING
        errs.append((f"{path}.rule", f"Forbidden: {ENGINE_MISSING}"))
        return rule
    self_type = type_of(s, root)
    try:
        rule.expression = compile_expression(text, self_type, optional)
    except _CompileError as e:
        rule.error = f"compilation failed: {e.text()}"
        errs.append((f"{path}.rule", f"Invalid value: {_shown(text)}: {rule.error}"))
        return rule
    _check_expression(rule, spec, self_type, path, correlatable, errs)
    return rule


def _shown(text: str) -> str:
    """A rule quoted in an error: whole up to 256 characters (rules may be 8 KiB)."""
    return json.dumps(text if len(text) <= 256 else text[:253] + "...")


def _check_message(text: str, message: str, path: str, errs: Errors) -> None:
    if "\n" in message or "\r" in message:
        errs.append((f"{path}.message", f"Invalid value: {json.dumps(message)}: message must not contain line breaks"))
    elif not message.strip() and ("\n" in text.strip() or "\r" in text.strip()):
        errs.append((f"{path}.message", "Required value: message must be specified if rule contains line breaks"))
    if len(message) > MAX_MESSAGE_BYTES:
        errs.append((f"{path}.message", f"Too long: may not be longer than {MAX_MESSAGE_BYTES}"))


def _check_expression(rule: Rule, spec: Schema, self_type: CelType, path: str, correlatable: bool,
                      errs: Errors) -> None:
    expr = rule.expression
    assert expr is not None
    if expr.kind not in (BOOL, DYN):
        rule.error = "cel expression must evaluate to a bool"
        errs.append((f"{path}.rule", f"Invalid value: {_shown(rule.text)}: {rule.error}"))
    if expr.uses_old_self and not correlatable:
        errs.append((f"{path}.rule", f"Invalid value: {_shown(rule.text)}: oldSelf cannot be used on the "
                                     "uncorrelatable portion of the schema (the items of a list that is not "
                                     "x-kubernetes-list-type: map)"))
    if rule.optional_old_self and not expr.uses_old_self:
        errs.append((f"{path}.optionalOldSelf", "Invalid value: true: may not be set if rule does not use oldSelf"))
    if expr.cost > RULE_COST_LIMIT:
        errs.append((f"{path}.rule", f"Forbidden: estimated rule cost exceeds budget by factor of "
                                     f"{_factor(expr.cost, RULE_COST_LIMIT)} (try simplifying the rule, or adding "
                                     "maxItems, maxProperties, and maxLength where arrays, maps, and strings are "
                                     "declared)"))
    message_expression = spec.get("messageExpression")
    if message_expression is not None:
        _compile_message_expression(rule, message_expression, self_type, path, errs)
    field_path = spec.get("fieldPath")
    if field_path is not None:
        steps = _field_steps(field_path, self_type.schema or {})
        if steps is None:
            errs.append((f"{path}.fieldPath", f"Invalid value: {json.dumps(field_path)}: fieldPath must be a "
                                              "relative path such as .spec.replicas that refers to an existing "
                                              "field"))
        else:
            rule.field_path = steps


def _compile_message_expression(rule: Rule, text: Any, self_type: CelType, path: str, errs: Errors) -> None:
    if not isinstance(text, str) or not text.strip():
        errs.append((f"{path}.messageExpression", "Required value: must be non-empty if specified"))
        return
    try:
        expr = compile_expression(text, self_type, rule.optional_old_self)
    except _CompileError as e:
        errs.append((f"{path}.messageExpression", f"Invalid value: {json.dumps(text)}: messageExpression "
                                                  f"compilation failed: {e.text()}"))
        return
    if expr.kind not in (STRING, DYN):
        errs.append((f"{path}.messageExpression", f"Invalid value: {json.dumps(text)}: must evaluate to a string"))
    elif expr.uses_old_self and not rule.transition:
        errs.append((f"{path}.messageExpression", f"Invalid value: {json.dumps(text)}: may not use oldSelf "
                                                  "when the rule does not"))
    else:
        rule.message_expression = expr


_PATH_STEP = re.compile(r"\.([A-Za-z0-9_\-$]+)|\['((?:[^'\\]|\\.)*)'\]")


def _field_steps(text: Any, s: Schema) -> str | None:
    """``fieldPath`` (``.spec.replicas``, ``.labels['a.b']``) as an error path, if it names a field."""
    if not isinstance(text, str) or not text:
        return None
    out: list[str] = []
    pos = 0
    while pos < len(text):
        m = _PATH_STEP.match(text, pos)
        if m is None:
            return None
        name = m.group(1) if m.group(1) is not None else m.group(2).replace("\\'", "'")
        props = cellib.properties(s)
        extra = s.get("additionalProperties")
        if name in props:
            s = props[name]
            out.append(("." if out else "") + name)
        elif isinstance(extra, dict):
            s = extra
            out.append(f"[{name}]")
        else:
            return None
        pos = m.end()
    return "".join(out)


def _factor(cost: float, limit: int) -> str:
    factor = cost / limit
    if factor > 100:
        return "more than 100x"
    if factor < 1.5:
        return f"{factor:f}x"
    return f"{factor:.1f}x"


# --- evaluation ----------------------------------------------------------------------------
class _OutOfBudget(BaseException):
    """Raised through cel-python (BaseException: its evaluator catches Exceptions)."""


class Meter:
    """What one request's rules have spent, of ``budget`` steps and ``seconds``."""

    def __init__(self, budget: int = REQUEST_BUDGET, seconds: float = timing.CEL_REQUEST_SECONDS) -> None:
        self.budget, self.left, self.seconds = budget, budget, seconds
        self.deadline = time.monotonic() + seconds
        self.steps = 0
        self.timed_out = False

    def charge(self, n: int) -> None:
        self.left -= n
        if self.left < 0:
            raise _OutOfBudget()

    def step(self) -> None:
        self.steps += 1
        self.left -= 1
        if self.left < 0:
            raise _OutOfBudget()
        if not self.steps & 127 and time.monotonic() > self.deadline:
            self.timed_out = True
            raise _OutOfBudget()


_CHARGED = frozenset({"primary", "member_dot", "member_index", "member_dot_arg"})


def _weight(value: Any) -> int:
    if isinstance(value, (str, bytes)):
        return len(value) // 16
    if isinstance(value, (list, dict)):
        return len(value)
    return 0


class _Metered(Evaluator):
    """cel-python's evaluator, every step of it (and of its macros' bodies) charged."""

    def __init__(self, ast: Any, activation: Any, meter: Meter) -> None:
        super().__init__(ast, activation)
        self.meter = meter

    def sub_evaluator(self, ast: Any) -> Evaluator:
        return _Metered(ast, self.activation, self.meter)

    def _visit_tree(self, tree: Any) -> Any:
        self.meter.step()
        out = super()._visit_tree(tree)
        if tree.data in _CHARGED or (tree.data == "addition" and len(tree.children) > 1):
            self.meter.charge(_weight(out))
        return out


def _run(expr: Expression, values: dict[str, Any], meter: Meter) -> Any:
    before = meter.steps
    evaluator = _Metered(expr.tree, expr.runner.new_activation(), meter)
    try:
        return evaluator.evaluate(values)
    finally:
        if meter.steps == before:    # the meter saw nothing: cel-python changed under it; fail closed
            raise RuntimeError("the CEL evaluator ran unmetered")


@dataclass
class _Request:
    meter: Meter
    errors: Errors = field(default_factory=list)
    cache: dict[int, Any] = field(default_factory=dict)
    old_cache: dict[int, Any] = field(default_factory=dict)
    out_of_budget: bool = False


ABSENT = object()


def evaluate(node: Node | None, obj: Any, old: Any = ABSENT, meter: Meter | None = None) -> Errors:
    """Every rule under ``node`` that ``obj`` fails (``old``: the stored object, on an update)."""
    if node is None:
        return []
    req = _Request(meter or Meter())
    try:
        _validate(node, obj, old, "", False, req)
    except _OutOfBudget:
        req.errors.append(_budget_error(req))
    return req.errors


def _budget_error(req: _Request) -> tuple[str, str]:
    m = req.meter
    why = (f"it took more than {m.seconds:g}s" if m.timed_out else
           f"Kube32's budget is {m.budget} CEL steps per request")
    return ("<nil>", f'Invalid value: "object": validation failed due to running out of cost budget, no further '
                     f"validation rules will be run ({why})")


async def evaluate_off_loop(schema: Schema, obj: Any, old: Any = ABSENT) -> Errors:
    """The rules of ``schema`` (compiled on first use) evaluated on a CEL thread: cel-python is
    slow, so neither its parsing nor its evaluation runs on the event loop."""
    def run() -> Errors:
        return evaluate(compiled(schema), obj, old)
    return await asyncio.get_running_loop().run_in_executor(_EXECUTOR, run)


def _validate(node: Node, value: Any, old: Any, path: str, ratchet: bool, req: _Request) -> None:
    if value is None:
        return     # only values are checked: a rule on a nullable field sees no null
    if old is not ABSENT:
        ratchet = value == old
    if node.rules:
        _run_rules(node, value, old, path, ratchet, req)
    if isinstance(value, dict):
        old_map = old if isinstance(old, dict) else {}
        for key, item in value.items():
            sub = node.properties.get(key) or (node.additional if key not in (node.schema.get("properties") or {})
                                               else None)
            if sub is None:
                continue
            where = _join(path, key) if key in node.properties else f"{path}[{key}]"
            _validate(sub, item, old_map.get(key, ABSENT) if old is not ABSENT else ABSENT, where, ratchet, req)
    elif isinstance(value, list) and node.items is not None:
        olds = _keyed_old(node.schema, value, old)
        for i, item in enumerate(value):
            _validate(node.items, item, olds[i], f"{path}[{i}]", ratchet, req)


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _keyed_old(s: Schema, value: list[Any], old: Any) -> list[Any]:
    """The old item of each new one, matched by x-kubernetes-list-map-keys (else none)."""
    keys = s.get("x-kubernetes-list-map-keys")
    if s.get("x-kubernetes-list-type") != "map" or not isinstance(keys, list) or not isinstance(old, list):
        return [ABSENT] * len(value)

    def key_of(item: Any) -> str:
        return json.dumps([item.get(k) for k in keys] if isinstance(item, dict) else None, sort_keys=True)
    by_key = {key_of(o): o for o in old}
    return [by_key.get(key_of(v), ABSENT) for v in value]


def _run_rules(node: Node, value: Any, old: Any, path: str, ratchet: bool, req: _Request) -> None:
    charge = req.meter.charge
    self_value = cellib.to_cel(value, node.schema, node.root, charge, req.cache)
    old_value: Any = ABSENT
    for rule in node.rules:
        field_path = path or "<nil>"
        if rule.error is not None or rule.expression is None:
            req.errors.append((field_path, f'Invalid value: {_type(node)}: rule compile error: '
                                           f"{rule.error or 'not compiled'}"))
            continue
        if rule.transition and old is ABSENT and not rule.optional_old_self:
            continue       # a transition rule runs only where there is an old value
        values = {"self": self_value}
        if rule.transition:
            if old_value is ABSENT and old is not ABSENT:
                old_value = cellib.to_cel(old, node.schema, node.root, charge, req.old_cache)
            present = old is not ABSENT
            values["oldSelf"] = (cellib.Optional_(old_value if present else None, present)
                                 if rule.optional_old_self else old_value)
        failure = _outcome(rule, values, req.meter)
        if failure is None or (ratchet and not rule.transition):
            continue
        req.errors.append(_field_error(node, rule, path, failure))


def _type(node: Node) -> str:
    return json.dumps(node.schema.get("type", ""))


def _outcome(rule: Rule, values: dict[str, Any], meter: Meter) -> str | None:
    """None when the rule holds; else its message (or why it could not be evaluated)."""
    assert rule.expression is not None
    try:
        result = _run(rule.expression, values, meter)
    except CELEvalError as e:
        return "error:" + f"{_eval_error(e)} evaluating rule: {rule.shown()}"
    except (RecursionError, MemoryError, OverflowError, ValueError, TypeError, ZeroDivisionError) as e:
        return "error:" + f"{type(e).__name__} evaluating rule: {rule.shown()}"
    if not isinstance(result, (bool, celtypes.BoolType)):
        return "error:" + f"the rule gave {type(result).__name__}, not a bool, evaluating rule: {rule.shown()}"
    return None if bool(result) else _message(rule, values, meter)


def _message(rule: Rule, values: dict[str, Any], meter: Meter) -> str:
    if rule.message_expression is not None:
        try:
            text = _run(rule.message_expression, values, meter)
        except (CELEvalError, RecursionError, ValueError, TypeError):
            text = None
        if isinstance(text, str) and text.strip() and len(text.strip()) <= MAX_MESSAGE_BYTES and "\n" not in text:
            return text.strip()
    return rule.message.strip() if rule.message.strip() else f"failed rule: {rule.text.strip()}"


def _eval_error(e: CELEvalError) -> str:
    """cel-python's error in cel-go's words where Kubernetes users know them."""
    kind = e.args[1] if len(e.args) > 1 else None
    detail = e.args[2] if len(e.args) > 2 else None
    text = str(e.args[0]) if e.args else "error"
    if kind is KeyError or text.startswith("no such member"):
        key = text.split("'")[1] if text.count("'") >= 2 else (detail[0] if detail else "")
        return f"no such key: {key}"
    if kind is IndexError:
        return "index out of bounds"
    if kind is ZeroDivisionError:
        return "division by zero"
    if "overflow" in text:
        return "integer overflow"
    if "no such overload" in text or "found no matching overload" in text:
        return "no such overload"
    return text


def _field_error(node: Node, rule: Rule, path: str, failure: str) -> tuple[str, str]:
    if failure.startswith("error:"):
        detail = failure[len("error:"):]
        if detail.startswith("no such overload"):
            detail = (f"'no such overload': call arguments did not match a supported operator, function or "
                      f"macro signature for rule: {rule.shown()}")
        return (path or "<nil>", f"Invalid value: {_type(node)}: {detail}")
    where = path
    if rule.field_path:
        where = (f"{path}.{rule.field_path}" if not rule.field_path.startswith("[") else f"{path}{rule.field_path}") \
            if path else rule.field_path
    where = where or "<nil>"
    if rule.reason == "FieldValueForbidden":
        return (where, f"Forbidden: {failure}")
    if rule.reason == "FieldValueRequired":
        return (where, f"Required value: {failure}")
    if rule.reason == "FieldValueDuplicate":
        return (where, f"Duplicate value: {_type(node)}")
    return (where, f"Invalid value: {_type(node)}: {failure}")
