"""Validation of a module as pwasm decoded it: the type check wasmtime does itself.

pwasm decodes and runs; it does not validate.  The pwasm engine runs this first, on
the very instructions pwasm will run, so a module either type-checks or is refused
at load with an ImageError naming the function and the instruction, as it is on
wasmtime.

It is the validation algorithm of the WebAssembly specification (appendix,
"Validation Algorithm"): an operand stack of value types (``None`` is the unknown
type of unreachable code) and a stack of control frames, over the instruction set
pwasm decodes: the MVP, sign extension, saturating truncation, bulk memory,
multi-value block types and reference types.  Numeric instructions are typed from
their names (``i32.add``, ``f32.convert_i64_u``, ``i64.extend32_s``, ...).  Beyond
function bodies it checks what instantiation would otherwise trip over: the
indices exports, element segments and the start function name, that a global's
initial value has its type, and that a ``ref.func`` in a body names a declared
function (one an element segment, an export or a global names), as wasmtime does.
What pwasm does not decode (SIMD, tail calls, exceptions, memory64, GC) is refused
by its decoder: such modules run on wasmtime nodes only.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

NUMERIC = ("i32", "i64", "f32", "f64")
REFS = ("funcref", "externref")
_UNARY = {"clz", "ctz", "popcnt", "abs", "neg", "ceil", "floor", "trunc", "nearest", "sqrt",
          "extend8_s", "extend16_s", "extend32_s"}
_BINARY = {"add", "sub", "mul", "div", "div_s", "div_u", "rem_s", "rem_u", "and", "or", "xor",
           "shl", "shr_s", "shr_u", "rotl", "rotr", "min", "max", "copysign"}
_COMPARE = {"eq", "ne", "lt", "lt_s", "lt_u", "gt", "gt_s", "gt_u", "le", "le_s", "le_u",
            "ge", "ge_s", "ge_u"}
_CONVERT = re.compile(r"^(?:wrap|trunc|trunc_sat|extend|convert|demote|promote|reinterpret)"
                      r"_(i32|i64|f32|f64)(?:_[su])?$")
# The widest alignment (log2 bytes) a load or store may claim: its access width.
_WIDTH = {"load": None, "store": None, "load8_s": 0, "load8_u": 0, "store8": 0, "load16_s": 1,
          "load16_u": 1, "store16": 1, "load32_s": 2, "load32_u": 2, "store32": 2}
_NATURAL = {"i32": 2, "i64": 3, "f32": 2, "f64": 3}


class Invalid(Exception):
    """The module does not validate; str() names where and why."""


@dataclass
class _Frame:
    opcode: str
    params: tuple
    results: tuple
    height: int
    unreachable: bool = False

    def labels(self) -> tuple:
        return self.params if self.opcode == "loop" else self.results


@dataclass
class _Context:
    types: list
    funcs: list                  # FuncType of every function, imports first
    tables: list                 # element type of every table
    memories: int
    globals: list                # GlobalType of every global
    datas: int
    elems: int
    refs: set = field(default_factory=set)


def validate(module: Any) -> None:
    """Invalid naming the first fault, or None when the module validates."""
    ctx = _context(module)
    n_imported = len(ctx.funcs) - len(module.funcs)
    for i, func in enumerate(module.funcs):
        index = n_imported + i
        try:
            _Body(ctx, ctx.funcs[index], func.locals).run(func.body)
        except Invalid as exc:
            raise Invalid(f"function {index}: {exc}") from None
    for export in module.exports:
        limit = {"func": len(ctx.funcs), "table": len(ctx.tables), "memory": ctx.memories,
                 "global": len(ctx.globals)}[export.kind]
        if not 0 <= export.index < limit:
            raise Invalid(f"export {export.name} names {export.kind} {export.index}, which does not exist")
    for n, seg in enumerate(module.elem):
        if seg.mode == "active" and not 0 <= seg.table_idx < len(ctx.tables):
            raise Invalid(f"element segment {n} names table {seg.table_idx}, which does not exist")
        for item in seg.init:
            if isinstance(item, int) and not 0 <= item < len(ctx.funcs):
                raise Invalid(f"element segment {n} names function {item}, which does not exist")
    if module.start is not None:
        if not 0 <= module.start < len(ctx.funcs):
            raise Invalid(f"the start function {module.start} does not exist")
        if ctx.funcs[module.start].params or ctx.funcs[module.start].results:
            raise Invalid("the start function takes or returns values")
    for n, glob in enumerate(module.globals):
        got = _const_type(ctx, glob.init)
        if got is not None and got != glob.type.valtype:
            raise Invalid(f"global {n} is {glob.type.valtype} but starts as {got}")


def _context(module: Any) -> _Context:
    funcs, tables, globals_ = [], [], []
    memories = 0
    for imp in module.imports:
        if imp.kind == "func":
            funcs.append(_type(module.types, imp.desc))
        elif imp.kind == "table":
            tables.append(imp.desc[0])
        elif imp.kind == "memory":
            memories += 1
        elif imp.kind == "global":
            globals_.append(imp.desc)
    funcs += [_type(module.types, f.type_idx) for f in module.funcs]
    tables += [t.element_type for t in module.tables]
    memories += len(module.mems)
    globals_ += [g.type for g in module.globals]
    return _Context(module.types, funcs, tables, memories, globals_, len(module.data), len(module.elem),
                    _declared_refs(module))


def _declared_refs(module: Any) -> set:
    """The functions a body may take a ``ref.func`` of (the specification's C.refs): those
    named outside function bodies, by element segments, global initializers and exports."""
    refs = {e.index for e in module.exports if e.kind == "func"}
    exprs = [g.init for g in module.globals]
    for seg in module.elem:
        for item in seg.init:
            if isinstance(item, int):
                refs.add(item)
            else:
                exprs.append(item)
    for expr in exprs:
        refs.update(i.operand for i in expr or () if i.opcode == "ref.func")
    return refs


def _type(types: list, index: int) -> Any:
    if not 0 <= index < len(types):
        raise Invalid(f"type {index} does not exist")
    return types[index]


def _const_type(ctx: _Context, expr: list) -> str | None:
    if not expr:
        return None
    op = expr[0].opcode
    if op.endswith(".const"):
        return op.split(".")[0]
    if op == "ref.null":
        return expr[0].operand
    if op == "ref.func":
        return "funcref"
    if op == "global.get" and 0 <= expr[0].operand < len(ctx.globals):
        return ctx.globals[expr[0].operand].valtype
    return None


class _Body:
    """One function body through the validation algorithm."""

    def __init__(self, ctx: _Context, ftype: Any, locals_: tuple) -> None:
        self.ctx = ctx
        self.ftype = ftype
        self.locals = tuple(ftype.params) + tuple(locals_)
        self.vals: list = []
        self.ctrls: list[_Frame] = []

    # -- the operand and control stacks (the specification's functions) ------------------
    def push(self, t: str | None) -> None:
        self.vals.append(t)

    def pop(self, expect: str | None = None) -> str | None:
        frame = self.ctrls[-1]
        if len(self.vals) == frame.height:
            if frame.unreachable:
                return expect
            raise Invalid(f"{self.op}: the stack is empty" + (f", {expect} expected" if expect else ""))
        got = self.vals.pop()
        if expect is not None and got is not None and got != expect:
            raise Invalid(f"{self.op}: {expect} expected, {got} found")
        return got if got is not None else expect

    def pop_all(self, types: tuple) -> None:
        for t in reversed(types):
            self.pop(t)

    def push_ctrl(self, opcode: str, params: tuple, results: tuple) -> None:
        self.ctrls.append(_Frame(opcode, params, results, len(self.vals)))
        for t in params:
            self.push(t)

    def pop_ctrl(self) -> _Frame:
        frame = self.ctrls[-1]
        self.pop_all(frame.results)
        if len(self.vals) != frame.height:
            raise Invalid(f"{self.op}: {len(self.vals) - frame.height} values left on the stack at the end of a block")
        self.ctrls.pop()
        return frame

    def unreachable(self) -> None:
        frame = self.ctrls[-1]
        del self.vals[frame.height:]
        frame.unreachable = True

    def label(self, depth: int) -> tuple:
        if not 0 <= depth < len(self.ctrls):
            raise Invalid(f"{self.op}: no label {depth}")
        return self.ctrls[-1 - depth].labels()

    # -- the instructions -------------------------------------------------------------------
    def run(self, body: list) -> None:
        self.op = "function"
        self.push_ctrl("function", (), tuple(self.ftype.results))
        for position, ins in enumerate(body):
            self.op = f"{ins.opcode} (instruction {position})"
            if not self.ctrls:
                raise Invalid(f"{self.op} follows the end of the function")
            self.step(ins.opcode, ins.operand)
        if self.ctrls:
            raise Invalid("the function does not end")

    def blocktype(self, bt: Any) -> tuple[tuple, tuple]:
        if isinstance(bt, tuple):
            return (), bt
        t = _type(self.ctx.types, bt)
        return tuple(t.params), tuple(t.results)

    def local(self, index: int) -> str:
        if not 0 <= index < len(self.locals):
            raise Invalid(f"{self.op}: no local {index}")
        return self.locals[index]

    def glob(self, index: int) -> Any:
        if not 0 <= index < len(self.ctx.globals):
            raise Invalid(f"{self.op}: no global {index}")
        return self.ctx.globals[index]

    def table(self, index: int) -> str:
        if not 0 <= index < len(self.ctx.tables):
            raise Invalid(f"{self.op}: no table {index}")
        return self.ctx.tables[index]

    def func(self, index: int) -> Any:
        if not 0 <= index < len(self.ctx.funcs):
            raise Invalid(f"{self.op}: no function {index}")
        return self.ctx.funcs[index]

    def memory(self) -> None:
        if self.ctx.memories < 1:
            raise Invalid(f"{self.op}: the module has no memory")

    def step(self, op: str, arg: Any) -> None:  # noqa: C901 - one dispatch, as the specification's
        if op in ("nop",):
            return
        if op == "unreachable":
            return self.unreachable()
        if op in ("block", "loop"):
            params, results = self.blocktype(arg)
            self.pop_all(params)
            return self.push_ctrl(op, params, results)
        if op == "if":
            params, results = self.blocktype(arg)
            self.pop("i32")
            self.pop_all(params)
            return self.push_ctrl(op, params, results)
        if op == "else":
            frame = self.pop_ctrl()
            if frame.opcode != "if":
                raise Invalid(f"{self.op} without an if")
            return self.push_ctrl("else", frame.params, frame.results)
        if op == "end":
            frame = self.pop_ctrl()
            if frame.opcode == "if" and frame.params != frame.results:
                raise Invalid(f"{self.op}: an if without else must leave its parameters")
            for t in frame.results:
                self.push(t)
            return
        if op == "br":
            self.pop_all(self.label(arg))
            return self.unreachable()
        if op == "br_if":
            self.pop("i32")
            labels = self.label(arg)
            self.pop_all(labels)
            for t in labels:
                self.push(t)
            return
        if op == "br_table":
            targets, default = arg
            self.pop("i32")
            arity = len(self.label(default))
            for depth in targets:
                labels = self.label(depth)
                if len(labels) != arity:
                    raise Invalid(f"{self.op}: its labels differ in arity")
                popped = [self.pop(t) for t in reversed(labels)]
                for t in reversed(popped):
                    self.push(t)
            self.pop_all(self.label(default))
            return self.unreachable()
        if op == "return":
            self.pop_all(tuple(self.ftype.results))
            return self.unreachable()
        if op == "call":
            t = self.func(arg)
            self.pop_all(tuple(t.params))
            for r in t.results:
                self.push(r)
            return
        if op == "call_indirect":
            type_idx, table_idx = arg
            if self.table(table_idx) != "funcref":
                raise Invalid(f"{self.op}: table {table_idx} does not hold functions")
            t = _type(self.ctx.types, type_idx)
            self.pop("i32")
            self.pop_all(tuple(t.params))
            for r in t.results:
                self.push(r)
            return
        if op == "drop":
            self.pop()
            return
        if op == "select":
            self.pop("i32")
            a = self.pop()
            b = self.pop()
            if a in REFS or b in REFS:
                raise Invalid(f"{self.op}: an untyped select of references")
            if a is not None and b is not None and a != b:
                raise Invalid(f"{self.op}: operands of two types ({b}, {a})")
            return self.push(a if a is not None else b)
        if op == "select_t":
            if len(arg) != 1:
                raise Invalid(f"{self.op}: a typed select has one result type")
            self.pop("i32")
            self.pop(arg[0])
            self.pop(arg[0])
            return self.push(arg[0])
        if op == "local.get":
            return self.push(self.local(arg))
        if op == "local.set":
            self.pop(self.local(arg))
            return
        if op == "local.tee":
            t = self.local(arg)
            self.pop(t)
            return self.push(t)
        if op == "global.get":
            return self.push(self.glob(arg).valtype)
        if op == "global.set":
            g = self.glob(arg)
            if not g.mutable:
                raise Invalid(f"{self.op}: global {arg} is immutable")
            self.pop(g.valtype)
            return
        if op == "table.get":
            t = self.table(arg)
            self.pop("i32")
            return self.push(t)
        if op == "table.set":
            self.pop(self.table(arg))
            self.pop("i32")
            return
        if op in ("memory.size", "memory.grow"):
            self.memory()
            if op == "memory.grow":
                self.pop("i32")
            return self.push("i32")
        if op == "ref.null":
            return self.push(arg)
        if op == "ref.is_null":
            t = self.pop()
            if t is not None and t not in REFS:
                raise Invalid(f"{self.op}: {t} is no reference")
            return self.push("i32")
        if op == "ref.func":
            self.func(arg)
            if arg not in self.ctx.refs:
                raise Invalid(f"{self.op}: undeclared function reference (function {arg} is named by no "
                              "element segment, export or global)")
            return self.push("funcref")
        if op in ("memory.init", "data.drop"):
            if not 0 <= arg < self.ctx.datas:
                raise Invalid(f"{self.op}: no data segment {arg}")
            if op == "memory.init":
                self.memory()
                self.pop_all(("i32", "i32", "i32"))
            return
        if op in ("memory.copy", "memory.fill"):
            self.memory()
            self.pop_all(("i32", "i32", "i32"))
            return
        if op in ("table.init", "elem.drop"):
            elem = arg[0] if op == "table.init" else arg
            if not 0 <= elem < self.ctx.elems:
                raise Invalid(f"{self.op}: no element segment {elem}")
            if op == "table.init":
                self.table(arg[1])
                self.pop_all(("i32", "i32", "i32"))
            return
        if op == "table.copy":
            dst, src = arg
            if self.table(dst) != self.table(src):
                raise Invalid(f"{self.op}: tables of two element types")
            self.pop_all(("i32", "i32", "i32"))
            return
        if op == "table.grow":
            t = self.table(arg)
            self.pop("i32")
            self.pop(t)
            return self.push("i32")
        if op == "table.size":
            self.table(arg)
            return self.push("i32")
        if op == "table.fill":
            t = self.table(arg)
            self.pop("i32")
            self.pop(t)
            self.pop("i32")
            return
        self.numeric(op, arg)

    def numeric(self, op: str, arg: Any) -> None:
        t, _, name = op.partition(".")
        if t not in NUMERIC or not name:
            raise Invalid(f"{self.op}: unknown instruction")
        if name == "const":
            return self.push(t)
        if name.startswith(("load", "store")):
            return self.memory_access(t, name, arg)
        if name == "eqz":
            self.pop(t)
            return self.push("i32")
        if name in _COMPARE:
            self.pop(t)
            self.pop(t)
            return self.push("i32")
        if name in _UNARY:
            self.pop(t)
            return self.push(t)
        if name in _BINARY:
            self.pop(t)
            self.pop(t)
            return self.push(t)
        match = _CONVERT.match(name)
        if match:
            self.pop(match.group(1))
            return self.push(t)
        raise Invalid(f"{self.op}: unknown instruction")

    def memory_access(self, t: str, name: str, arg: Any) -> None:
        self.memory()
        if name not in _WIDTH:
            raise Invalid(f"{self.op}: unknown instruction")
        width = _WIDTH[name]
        natural = _NATURAL[t] if width is None else width
        align = arg[0] if isinstance(arg, tuple) else 0
        if align > natural:
            raise Invalid(f"{self.op}: alignment 2**{align} is wider than the access")
        if name.startswith("store"):
            self.pop(t)
            self.pop("i32")
            return
        self.pop("i32")
        self.push(t)
