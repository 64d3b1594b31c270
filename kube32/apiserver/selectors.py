"""Label and field selectors, parsed once per request and matched per object.

Label selectors parse as ``k8s.io/apimachinery/pkg/labels.Parse`` reads them: ``a=b``,
``a==b``, ``a!=b``, ``a in (x,y)``, ``a notin (x)``, ``a`` (exists), ``!a``, and ``a>3`` /
``a<3`` (Gt/Lt: an integer value); ``a in ()`` is the set of the empty value, as an empty
place between commas is; keys and values are checked as label keys and values.  They parse
into :mod:`kube32.matching`'s requirements, which match them.  Field
selectors support ``=``, ``==`` and ``!=`` over the flat field map a strategy
exposes for its kind (``metadata.name``, ``spec.nodeName``, ...).  A field
selector naming a field the kind does not expose is a 400, as in Kubernetes.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from ..matching import (DOES_NOT_EXIST, EXISTS, GT, IN, LT, NOT_IN, LabelSelector, Requirement, SelectorError,
                        parse_int64)
from .errors import bad_request
from .meta import LABEL_VALUE, LABEL_VALUE_MSG, validate_qualified_key


_SPECIAL = "=!(),<>"
_BLANK = " \t\r\n"
_TWO_CHARACTER = ("!=", "==")
_EXACT = {"=": IN, "==": IN, "!=": NOT_IN, ">": GT, "<": LT}
_SET = {"in": IN, "notin": NOT_IN}
Token = tuple[str, str]   # (kind, literal): kind "id", "op", "in", "notin" or "end"


def _lex(text: str) -> list[Token]:
    """labels.Lexer: identifiers, the operators (longest first) and the end."""
    out: list[Token] = []
    i = 0
    while True:
        while i < len(text) and text[i] in _BLANK:
            i += 1
        if i == len(text):
            out.append(("end", ""))
            return out
        if text[i] in _SPECIAL:
            lit = text[i:i + 2] if text[i:i + 2] in _TWO_CHARACTER else text[i]
            out.append(("op", lit))
            i += len(lit)
            continue
        j = i
        while j < len(text) and text[j] not in _SPECIAL and text[j] not in _BLANK:
            j += 1
        word = text[i:j]
        out.append((word if word in _SET else "id", word))
        i = j


class _Parser:
    """``labels.Parse``'s recursive descent, token for token (k8s.io/apimachinery
    pkg/labels/selector.go): its grammar, its empty values, its words for what is wrong."""

    def __init__(self, text: str) -> None:
        self.items = _lex(text)
        self.at = 0

    def peek(self, values: bool = True) -> Token:
        kind, lit = self.items[self.at]
        # Where a value may stand, "in" and "notin" are values (`x in (in)`).
        return ("id", lit) if values and kind in _SET else (kind, lit)

    def take(self, values: bool = True) -> Token:
        token = self.peek(values)
        self.at += 1
        return token

    @staticmethod
    def starts_requirement(token: Token) -> bool:
        return token[0] == "id" or token == ("op", "!")

    def parse(self) -> list[Requirement]:
        reqs: list[Requirement] = []
        while True:
            token = self.peek()
            if token[0] == "end":
                return reqs
            if not self.starts_requirement(token):
                raise SelectorError(f"found '{token[1]}', expected: !, identifier, or 'end of string'")
            try:
                reqs.append(self.requirement())
            except SelectorError as e:
                raise SelectorError(f"unable to parse requirement: {e}") from None
            kind, lit = self.take()
            if kind == "end":
                return reqs
            if (kind, lit) != ("op", ","):
                raise SelectorError(f"found '{lit}', expected: ',' or 'end of string'")
            if not self.starts_requirement(self.peek()):
                raise SelectorError(f"found '{self.peek()[1]}', expected: identifier after ','")

    def requirement(self) -> Requirement:
        kind, key = self.take()
        absent = (kind, key) == ("op", "!")
        if absent:
            kind, key = self.take()
        if kind != "id":
            raise SelectorError(f"found '{key}', expected: identifier")
        _check_key(key)
        if absent or self.peek()[0] == "end" or self.peek() == ("op", ","):
            return Requirement(key, DOES_NOT_EXIST if absent else EXISTS)
        kind, lit = self.take(values=False)
        op = _SET.get(kind) if kind in _SET else _EXACT.get(lit) if kind == "op" else None
        if op is None:
            raise SelectorError(f"found '{lit}', expected: '=', '!=', '==', 'in', notin'")
        values = self.value_set() if kind in _SET else self.exact_value()
        if op in (GT, LT) and parse_int64(values[0]) is None:
            raise SelectorError(f'values[0]: Invalid value: "{values[0]}": '
                                "for 'Gt', 'Lt' operators, the value must be an integer")
        for v in values:
            _check_value(key, v)
        return Requirement(key, op, values)

    def exact_value(self) -> tuple[str, ...]:
        kind, lit = self.peek()
        if kind == "end" or (kind, lit) == ("op", ","):
            return ("",)
        kind, lit = self.take()
        if kind != "id":
            raise SelectorError(f"found '{lit}', expected: identifier")
        return (lit,)

    def value_set(self) -> tuple[str, ...]:
        kind, lit = self.take()
        if (kind, lit) != ("op", "("):
            raise SelectorError(f"found '{lit}' expected: '('")
        kind, lit = self.peek()
        if (kind, lit) == ("op", ")"):   # "()" is the set of the empty value
            self.take()
            return ("",)
        if kind != "id" and (kind, lit) != ("op", ","):
            raise SelectorError(f"found '{lit}', expected: ',', ')' or identifier")
        values = self.identifiers()
        if self.take() != ("op", ")"):
            raise SelectorError(f"found '{lit}', expected: ')'")
        return values

    def identifiers(self) -> tuple[str, ...]:
        """``a,b``, where an empty place between commas, or at either end, is the value ""."""
        found: dict[str, None] = {}
        while True:
            kind, lit = self.take()
            if kind == "id":
                found[lit] = None
                after = self.peek()
                if after == ("op", ")"):
                    return tuple(found)
                if after != ("op", ","):
                    raise SelectorError(f"found '{after[1]}', expected: ',' or ')'")
            elif (kind, lit) == ("op", ","):
                if not found:
                    found[""] = None              # "(,"
                if self.peek() == ("op", ")"):
                    found[""] = None              # ",)"
                    return tuple(found)
                if self.peek() == ("op", ","):
                    self.take()
                    found[""] = None              # ",,"
            else:
                raise SelectorError(f"found '{lit}', expected: ',', or identifier")


def _check_key(key: str) -> None:
    errs = validate_qualified_key(key, "key")
    if errs:
        raise SelectorError(errs[0][1])


def _check_value(key: str, value: str) -> None:
    if len(value) > 63 or not LABEL_VALUE.match(value):
        raise SelectorError(f'values[0][{key}]: Invalid value: "{value}": {LABEL_VALUE_MSG}')


def parse_label_selector(text: str | None) -> LabelSelector:
    """A ``labelSelector`` query as Kubernetes' ``labels.Parse`` reads it; a 400 naming
    what is wrong when it does not parse."""
    if not text:
        return LabelSelector()
    try:
        return LabelSelector(tuple(_Parser(text).parse()))
    except SelectorError as e:
        raise bad_request(str(e)) from None


@dataclass(frozen=True)
class FieldSelector:
    terms: tuple[tuple[str, str, str], ...] = ()  # (field, op, value)

    def matches(self, fields: Mapping[str, str]) -> bool:
        for field, op, value in self.terms:
            actual = fields.get(field, "")
            if (actual == value) != (op == "="):
                return False
        return True

    def check_supported(self, kind: str, supported: set[str]) -> None:
        for field, _, _ in self.terms:
            if field not in supported:
                raise bad_request(f'field label not supported: {field}')

    def value_of(self, field: str) -> str | None:
        for f, op, v in self.terms:
            if f == field and op == "=":
                return v
        return None


def parse_field_selector(text: str | None) -> FieldSelector:
    r"""A field selector as apimachinery's ``fields.ParseSelector`` reads it: terms split
    at commas no backslash escapes, each ``field``, the first ``!=``, ``==`` or ``=``, and
    a value whose ``\\``, ``\,`` and ``\=`` are escapes; an unescaped ``,`` or ``=`` in
    a value, another escape or a trailing backslash is a 400 (round 25d: ``dev\kit`` and
    ``===devkit`` matched nothing instead).  Nothing is trimmed: ``x `` is not ``x``."""
    if not text:
        return FieldSelector()
    terms = []
    for term in _split_terms(text):
        if not term:
            continue
        for i in range(len(term)):
            op = next((o for o in _FIELD_OPERATORS if term.startswith(o, i)), None)
            if op is not None:
                terms.append((term[:i], "!=" if op == "!=" else "=", _unescape(term[i + len(op):])))
                break
        else:
            raise bad_request(f"invalid selector: '{text}'; can't understand '{term}'")
    return FieldSelector(tuple(terms))


_FIELD_OPERATORS = ("!=", "==", "=")


def _split_terms(text: str) -> list[str]:
    terms, start, escaped = [], 0, False
    for i, c in enumerate(text):
        if escaped:
            escaped = False
        elif c == "\\":
            escaped = True
        elif c == ",":
            terms.append(text[start:i])
            start = i + 1
    terms.append(text[start:])
    return terms


def _unescape(value: str) -> str:
    if not any(c in value for c in "\\,="):
        return value
    out, escaped = [], False
    for c in value:
        if escaped:
            if c not in "\\,=":
                raise bad_request(f"invalid field selector: invalid escape sequence: \\{c}")
            out.append(c)
            escaped = False
        elif c == "\\":
            escaped = True
        elif c in ",=":
            raise bad_request(f"invalid field selector: unescaped character in value: {c}")
        else:
            out.append(c)
    if escaped:
        raise bad_request("invalid field selector: invalid escape sequence: \\")
    return "".join(out)
