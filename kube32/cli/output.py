"""The CLI's console: rich on a terminal, whole lines when piped.

On a terminal, rich wraps to the terminal's width.  Piped into another program (stdout
not a tty), output is never wrapped nor cut, as kubectl's: a 64-hex digest stays on one
line for ``grep``; rich's default of 80 columns there would fold table cells.  Colour
goes only to a terminal (rich's own rule).
"""
from __future__ import annotations

import sys
from typing import Any, TextIO

from rich.console import Console

PIPED_WIDTH = 100_000   # columns: wider than any line the CLI prints


def console(file: TextIO | None = None, **options: Any) -> Console:
    out = file or sys.stdout
    if not out.isatty():
        options.setdefault("width", PIPED_WIDTH)
        options.setdefault("soft_wrap", True)
    return Console(file=out, **options)
