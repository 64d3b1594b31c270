"""What a CRD's CEL rules see and may call beyond standard CEL: custom resources as CEL
values, and the Kubernetes extension functions Kube32 supports (k8s.io/apiserver's CEL
``library`` packages: strings, lists, regex, quantity; the optional type of
``optionalOldSelf``), for :mod:`.celrules`.

Values: :func:`to_cel` turns a JSON value into cel-python's types along its schema, as
apiextensions-apiserver's ``UnstructuredToVal``: the properties of an object are named
by their escaped names (``namespace`` is ``__namespace__``, ``a-b`` is ``a__dash__b``;
names that cannot be escaped are left out), a resource root shows ``apiVersion``,
``kind`` and only ``metadata.name`` / ``metadata.generateName``, strings of format
``date-time`` are timestamps and of format ``duration`` durations.  Every converted value
is charged to the caller's :class:`Meter`-like ``charge`` so a huge object costs what it
weighs.

Functions: :data:`FUNCTIONS` maps a name to a Python function taking the receiver
first (cel-python calls ``x.f(y)`` as ``f(x, y)``).  A function that could build a value
much larger than its inputs (``replace``, ``join``, ``split``) refuses past
:data:`MAX_STRING` characters or :data:`MAX_LIST` items instead of filling memory.
Errors are :class:`~celpy.evaluation.CELEvalError`, which CEL propagates as values.
"""
from __future__ import annotations

import re
from fractions import Fraction
from typing import Any, Callable

import re2  # google-re2, a dependency of cel-python: RE2, as Kubernetes
from celpy import celtypes
from celpy.evaluation import CELEvalError

from ..quantity import parse_quantity

Schema = dict[str, Any]
MAX_STRING = 3 * 1024 * 1024     # the largest request body Kubernetes takes: no CEL string outgrows it
MAX_LIST = 1024 * 1024
CEL_RESERVED = {"true", "false", "null", "in", "as", "break", "const", "continue", "else", "for", "function",
                "if", "import", "let", "loop", "package", "namespace", "return", "var", "void", "while"}
_IDENT = re.compile(r"^[_a-zA-Z][_a-zA-Z0-9]*\Z")
_ESCAPES = (("__", "__underscores__"), (".", "__dot__"), ("-", "__dash__"), ("/", "__slash__"))


def escape(name: str) -> str | None:
    """A property's name as CEL names it (Kubernetes' ``cel.Escape``); None: it has none."""
    if name in CEL_RESERVED:
        return f"__{name}__"
    out = name
    for raw, escaped in _ESCAPES:
        out = out.replace(raw, escaped)
    return out if _IDENT.match(out) else None


def error(message: str) -> CELEvalError:
    return CELEvalError(message)


# --- values ------------------------------------------------------------------------
class Optional_:
    """CEL's optional type, for ``oldSelf`` of a rule with ``optionalOldSelf: true``."""

    def __init__(self, value: Any = None, present: bool = False) -> None:
        self.value, self.present = value, present

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Optional_) and (self.present, self.value) == (other.present, other.value)

    def __hash__(self) -> int:
        return hash(self.present)

    def __repr__(self) -> str:
        return f"optional.of({self.value!r})" if self.present else "optional.none()"


class Quantity:
    """A Kubernetes resource.Quantity (``quantity('1.5Gi')``), exact."""

    def __init__(self, amount: Fraction) -> None:
        self.amount = amount

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Quantity) and self.amount == other.amount

    def __hash__(self) -> int:
        return hash(self.amount)

    def __repr__(self) -> str:
        return f"Quantity({self.amount})"


def _charge_none(_n: int) -> None:
    return None


def to_cel(value: Any, schema: Schema | None, root: bool = False,
           charge: Callable[[int], None] = _charge_none, cache: dict[int, Any] | None = None) -> Any:
    """``value`` as CEL sees it along ``schema`` (None: no schema, every value as itself)."""
    if cache is not None and isinstance(value, (dict, list)) and id(value) in cache:
        return cache[id(value)]
    charge(1)
    out = _convert(value, schema or {}, root, charge, cache)
    if cache is not None and isinstance(value, (dict, list)):
        cache[id(value)] = out
    return out


def _convert(value: Any, s: Schema, root: bool, charge: Callable[[int], None], cache: dict[int, Any] | None) -> Any:
    if value is None:
        return None
    if isinstance(value, bool):
        return celtypes.BoolType(value)
    if isinstance(value, int):
        return celtypes.IntType(value)
    if isinstance(value, float):
        return celtypes.DoubleType(value)
    if isinstance(value, str):
        return _string(value, s)
    if isinstance(value, list):
        items = s.get("items") if isinstance(s.get("items"), dict) else None
        return celtypes.ListType([to_cel(v, items, bool(items and items.get("x-kubernetes-embedded-resource")),
                                         charge, cache) for v in value])
    if isinstance(value, dict):
        return _object(value, s, root, charge, cache)
    raise TypeError(f"not a JSON value: {type(value).__name__}")


def _string(value: str, s: Schema) -> Any:
    fmt = s.get("format")
    try:
        if fmt == "date-time":
            return celtypes.TimestampType(value)
        if fmt == "duration":
            return celtypes.DurationType(value)
    except (ValueError, TypeError, OverflowError):
        pass   # not of its format (the schema checks formats loosely): a string
    return celtypes.StringType(value)


def _object(value: dict[str, Any], s: Schema, root: bool, charge: Callable[[int], None],
            cache: dict[int, Any] | None) -> Any:
    props = properties(s)
    extra = s.get("additionalProperties")
    out = celtypes.MapType()
    for key, item in value.items():
        if root and key in ("apiVersion", "kind") and key not in props:
            out[celtypes.StringType(key)] = _convert(item, {}, False, charge, cache)
        elif root and key == "metadata" and key not in props:
            md = item if isinstance(item, dict) else {}
            out[celtypes.StringType("metadata")] = celtypes.MapType(
                {celtypes.StringType(k): celtypes.StringType(md[k]) for k in ("name", "generateName")
                 if isinstance(md.get(k), str)})
        elif key in props:
            name = escape(key)
            if name is not None:
                out[celtypes.StringType(name)] = to_cel(item, props[key], _embedded(props[key]), charge, cache)
        elif isinstance(extra, dict):
            out[celtypes.StringType(key)] = to_cel(item, extra, _embedded(extra), charge, cache)
        elif not props:       # x-kubernetes-preserve-unknown-fields, or a schema-less value
            out[celtypes.StringType(key)] = to_cel(item, None, False, charge, cache)
    return out


def properties(s: Schema) -> dict[str, Any]:
    props = s.get("properties")
    return props if isinstance(props, dict) else {}


def _embedded(s: Any) -> bool:
    return isinstance(s, dict) and s.get("x-kubernetes-embedded-resource") is True


# --- the strings library -------------------------------------------------------------
def _str(x: Any, what: str) -> str:
    if not isinstance(x, str):
        raise TypeError(f"{what} takes a string")
    return x


def _bounded_string(text: str) -> Any:
    if len(text) > MAX_STRING:
        return error(f"string too long: more than {MAX_STRING} characters")
    return celtypes.StringType(text)


def lower_ascii(s: Any) -> Any:
    return celtypes.StringType("".join(c.lower() if c.isascii() else c for c in _str(s, "lowerAscii")))


def upper_ascii(s: Any) -> Any:
    return celtypes.StringType("".join(c.upper() if c.isascii() else c for c in _str(s, "upperAscii")))


def trim(s: Any) -> Any:
    return celtypes.StringType(_str(s, "trim").strip())


def replace(s: Any, old: Any, new: Any, n: Any = -1) -> Any:
    text, old, new = _str(s, "replace"), _str(old, "replace"), _str(new, "replace")
    count = text.count(old) if old else len(text) + 1
    count = count if int(n) < 0 else min(count, int(n))
    if len(text) + count * (len(new) - len(old)) > MAX_STRING:
        return error(f"string too long: replace would make more than {MAX_STRING} characters")
    return celtypes.StringType(text.replace(old, new, -1 if int(n) < 0 else int(n)))


def split(s: Any, sep: Any, n: Any = -1) -> Any:
    text, sep = _str(s, "split"), _str(sep, "split")
    limit = int(n)
    if limit == 0:
        return celtypes.ListType()
    if sep == "":
        parts = list(text) if limit < 0 else [*text[:limit - 1], text[limit - 1:]] if text else []
    else:
        parts = text.split(sep, limit - 1 if limit > 0 else -1)
    if len(parts) > MAX_LIST:
        return error(f"list too long: more than {MAX_LIST} items")
    return celtypes.ListType(celtypes.StringType(p) for p in parts)


def substring(s: Any, start: Any, end: Any = None) -> Any:
    text = _str(s, "substring")
    lo, hi = int(start), len(text) if end is None else int(end)
    if lo < 0 or hi > len(text) or lo > hi:
        return error(f"index out of range: substring({lo}, {hi}) of a string of length {len(text)}")
    return celtypes.StringType(text[lo:hi])


def char_at(s: Any, i: Any) -> Any:
    text, at = _str(s, "charAt"), int(i)
    if at < 0 or at > len(text):
        return error(f"index out of range: {at}")
    return celtypes.StringType(text[at:at + 1])


def index_of(x: Any, what: Any, start: Any = 0) -> Any:
    if isinstance(x, list):
        return celtypes.IntType(next((i for i, v in enumerate(x) if v == what), -1))
    text, sub, at = _str(x, "indexOf"), _str(what, "indexOf"), int(start)
    if at < 0 or at > len(text):
        return error(f"index out of range: {at}")
    return celtypes.IntType(text.find(sub, at))


def last_index_of(x: Any, what: Any, end: Any = None) -> Any:
    if isinstance(x, list):
        return celtypes.IntType(next((i for i in range(len(x) - 1, -1, -1) if x[i] == what), -1))
    text, sub = _str(x, "lastIndexOf"), _str(what, "lastIndexOf")
    hi = len(text) if end is None else int(end)
    if hi < 0 or hi > len(text):
        return error(f"index out of range: {hi}")
    return celtypes.IntType(text.rfind(sub, 0, hi + len(sub)))


def join(items: Any, sep: Any = "") -> Any:
    if not isinstance(items, list) or not all(isinstance(i, str) for i in items):
        raise TypeError("join takes a list of strings")
    return _bounded_string(_str(sep, "join").join(items))


# --- the lists library ---------------------------------------------------------------
def _list(x: Any, what: str) -> list[Any]:
    if not isinstance(x, list):
        raise TypeError(f"{what} takes a list")
    return x


def is_sorted(x: Any) -> Any:
    items = _list(x, "isSorted")
    return celtypes.BoolType(all(items[i] <= items[i + 1] for i in range(len(items) - 1)))


def list_sum(x: Any) -> Any:
    items = _list(x, "sum")
    if not items:
        return celtypes.IntType(0)
    total = items[0]
    for item in items[1:]:
        total = total + item
    return total


def list_min(x: Any) -> Any:
    items = _list(x, "min")
    return min(items) if items else error("min called on an empty list")


def list_max(x: Any) -> Any:
    items = _list(x, "max")
    return max(items) if items else error("max called on an empty list")


# --- the regex library ---------------------------------------------------------------
def _regex(pattern: Any) -> Any:
    try:
        return re2.compile(_str(pattern, "find"))
    except re2.error as e:
        return error(f"invalid regular expression: {e}")


def find(s: Any, pattern: Any) -> Any:
    compiled = _regex(pattern)
    if isinstance(compiled, CELEvalError):
        return compiled
    m = compiled.search(_str(s, "find"))
    return celtypes.StringType(m.group(0) if m else "")


def find_all(s: Any, pattern: Any, n: Any = -1) -> Any:
    compiled = _regex(pattern)
    if isinstance(compiled, CELEvalError):
        return compiled
    limit = int(n)
    found: list[Any] = []
    for m in compiled.finditer(_str(s, "findAll")):
        if 0 <= limit <= len(found) or len(found) >= MAX_LIST:
            break
        found.append(celtypes.StringType(m.group(0)))
    return celtypes.ListType(found)


# --- the quantity library ------------------------------------------------------------
def quantity(s: Any) -> Any:
    try:
        return Quantity(parse_quantity(_str(s, "quantity")))
    except ValueError as e:
        return error(f"invalid quantity: {e}")


def is_quantity(s: Any) -> Any:
    try:
        parse_quantity(_str(s, "isQuantity"))
        return celtypes.BoolType(True)
    except ValueError:
        return celtypes.BoolType(False)


def _q(x: Any, what: str) -> Fraction:
    if isinstance(x, Quantity):
        return x.amount
    if isinstance(x, int) and not isinstance(x, bool):
        return Fraction(x)
    raise TypeError(f"{what} takes a quantity")


def q_is_integer(q: Any) -> Any:
    return celtypes.BoolType(_q(q, "isInteger").denominator == 1)


def q_as_integer(q: Any) -> Any:
    amount = _q(q, "asInteger")
    if amount.denominator != 1:
        return error("cannot convert value to integer: the quantity is not an integer")
    return celtypes.IntType(int(amount))


def q_as_float(q: Any) -> Any:
    return celtypes.DoubleType(float(_q(q, "asApproximateFloat")))


def q_sign(q: Any) -> Any:
    amount = _q(q, "sign")
    return celtypes.IntType((amount > 0) - (amount < 0))


def q_add(q: Any, other: Any) -> Any:
    return Quantity(_q(q, "add") + _q(other, "add"))


def q_sub(q: Any, other: Any) -> Any:
    return Quantity(_q(q, "sub") - _q(other, "sub"))


def q_compare(q: Any, other: Any) -> Any:
    a, b = _q(q, "compareTo"), _q(other, "compareTo")
    return celtypes.IntType((a > b) - (a < b))


def q_greater(q: Any, other: Any) -> Any:
    return celtypes.BoolType(_q(q, "isGreaterThan") > _q(other, "isGreaterThan"))


def q_less(q: Any, other: Any) -> Any:
    return celtypes.BoolType(_q(q, "isLessThan") < _q(other, "isLessThan"))


# --- the optional type ---------------------------------------------------------------
def _opt(o: Any, what: str) -> Optional_:
    if not isinstance(o, Optional_):
        raise TypeError(f"{what} takes an optional")
    return o


def has_value(o: Any) -> Any:
    return celtypes.BoolType(_opt(o, "hasValue").present)


def opt_value(o: Any) -> Any:
    opt = _opt(o, "value")
    return opt.value if opt.present else error("optional.none() dereference")


def or_value(o: Any, default: Any) -> Any:
    opt = _opt(o, "orValue")
    return opt.value if opt.present else default


FUNCTIONS: dict[str, Callable[..., Any]] = {
    "lowerAscii": lower_ascii, "upperAscii": upper_ascii, "trim": trim, "replace": replace, "split": split,
    "substring": substring, "charAt": char_at, "indexOf": index_of, "lastIndexOf": last_index_of, "join": join,
    "isSorted": is_sorted, "sum": list_sum, "min": list_min, "max": list_max,
    "find": find, "findAll": find_all,
    "quantity": quantity, "isQuantity": is_quantity, "isInteger": q_is_integer, "asInteger": q_as_integer,
    "asApproximateFloat": q_as_float, "sign": q_sign, "add": q_add, "sub": q_sub, "compareTo": q_compare,
    "isGreaterThan": q_greater, "isLessThan": q_less,
    "hasValue": has_value, "value": opt_value, "orValue": or_value,
}
