"""Strings as Go's strconv.Quote writes them (``%q``), for messages that must read as
kube-apiserver's: a printable character as itself, ``"`` and ``\\`` escaped, the usual C
escapes, and every other character as ``\\xNN``, ``\\uNNNN`` or ``\\UNNNNNNNN``."""
from __future__ import annotations

_ESCAPES = {"\a": "\\a", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t", "\v": "\\v",
            '"': '\\"', "\\": "\\\\"}


def quote(text: str) -> str:
    """``text`` quoted as Go's strconv.Quote (Python's isprintable is Go's unicode.IsPrint)."""
    out = ['"']
    for c in text:
        code = ord(c)
        if c in _ESCAPES:
            out.append(_ESCAPES[c])
        elif c.isprintable():
            out.append(c)
        elif code < 0x20 or code == 0x7F:
            out.append(f"\\x{code:02x}")
        elif code < 0x10000:
            out.append(f"\\u{code:04x}")
        else:
            out.append(f"\\U{code:08x}")
    out.append('"')
    return "".join(out)
