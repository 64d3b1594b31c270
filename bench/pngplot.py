"""A tiny log-log line plot written as a PNG with zlib alone (matplotlib is not a
dependency): each series a coloured polyline of its points, on a grid of decades, with
the axes' values in a 3x5 pixel font.  The report says which colour is which figure.

Invariants: pure (no I/O but :func:`write`), deterministic bytes for the same input;
points with a value <= 0 are left out (no logarithm)."""
from __future__ import annotations

import math
import struct
import zlib
from pathlib import Path

RGB = tuple[int, int, int]
COLOURS: list[tuple[str, RGB]] = [
    ("red", (214, 39, 40)), ("blue", (31, 119, 180)), ("green", (44, 160, 44)), ("orange", (255, 127, 14)),
    ("purple", (148, 103, 189)), ("brown", (140, 86, 75)), ("pink", (227, 119, 194)), ("grey", (127, 127, 127)),
    ("olive", (188, 189, 34)), ("cyan", (23, 190, 207)),
]
# 3x5 digits and a few signs, rows top to bottom, 3 bits each (MSB left)
_FONT = {
    "0": (7, 5, 5, 5, 7), "1": (2, 6, 2, 2, 7), "2": (7, 1, 7, 4, 7), "3": (7, 1, 7, 1, 7), "4": (5, 5, 7, 1, 1),
    "5": (7, 4, 7, 1, 7), "6": (7, 4, 7, 5, 7), "7": (7, 1, 1, 1, 1), "8": (7, 5, 7, 5, 7), "9": (7, 5, 7, 1, 7),
    ".": (0, 0, 0, 0, 2), "-": (0, 0, 7, 0, 0), "e": (0, 7, 7, 4, 7), "x": (0, 5, 2, 5, 0),
}


class Canvas:
    def __init__(self, width: int, height: int, background: RGB = (255, 255, 255)) -> None:
        self.width, self.height = width, height
        self.pixels = bytearray(bytes(background) * (width * height))

    def dot(self, x: int, y: int, colour: RGB, size: int = 1) -> None:
        for dx in range(size):
            for dy in range(size):
                px, py = x + dx, y + dy
                if 0 <= px < self.width and 0 <= py < self.height:
                    i = 3 * (py * self.width + px)
                    self.pixels[i:i + 3] = bytes(colour)

    def line(self, x0: int, y0: int, x1: int, y1: int, colour: RGB, size: int = 1) -> None:
        steps = max(abs(x1 - x0), abs(y1 - y0), 1)
        for k in range(steps + 1):
            self.dot(round(x0 + (x1 - x0) * k / steps), round(y0 + (y1 - y0) * k / steps), colour, size)

    def text(self, x: int, y: int, s: str, colour: RGB = (0, 0, 0), scale: int = 2) -> None:
        for ch in s:
            rows = _FONT.get(ch)
            if rows is not None:
                for r, bits in enumerate(rows):
                    for c in range(3):
                        if bits & (4 >> c):
                            self.dot(x + c * scale, y + r * scale, colour, scale)
            x += 4 * scale

    def png(self) -> bytes:
        raw = b"".join(b"\x00" + bytes(self.pixels[3 * y * self.width:3 * (y + 1) * self.width])
                       for y in range(self.height))

        def chunk(kind: bytes, data: bytes) -> bytes:
            return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)
        header = struct.pack(">IIBBBBB", self.width, self.height, 8, 2, 0, 0, 0)
        return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw, 9)) + \
            chunk(b"IEND", b"")


def _label(v: float) -> str:
    return str(int(v)) if v >= 1 else f"{v:g}"


def loglog(series: list[list[tuple[float, float]]], width: int = 720, height: int = 480) -> bytes:
    """Each series (points (x, y)) a line of its colour (COLOURS, in order), on log axes
    spanning every point, with a grey line of slope 1 (linear growth) through the
    first point of the first series for reference."""
    pts = [(x, y) for s in series for x, y in s if x > 0 and y > 0]
    c = Canvas(width, height)
    if not pts:
        return c.png()
    left, right, top, bottom = 70, width - 40, 20, height - 40
    lx0, lx1 = math.floor(math.log10(min(p[0] for p in pts))), math.ceil(math.log10(max(p[0] for p in pts)))
    ly0, ly1 = math.floor(math.log10(min(p[1] for p in pts))), math.ceil(math.log10(max(p[1] for p in pts)))
    lx1, ly1 = max(lx1, lx0 + 1), max(ly1, ly0 + 1)

    def at(x: float, y: float) -> tuple[int, int]:
        return (round(left + (math.log10(x) - lx0) / (lx1 - lx0) * (right - left)),
                round(bottom - (math.log10(y) - ly0) / (ly1 - ly0) * (bottom - top)))
    for d in range(lx0, lx1 + 1):
        x, _ = at(10 ** d, 10 ** ly0)
        c.line(x, top, x, bottom, (225, 225, 225))
        c.text(x - 8, bottom + 10, _label(10 ** d))
    for d in range(ly0, ly1 + 1):
        _, y = at(10 ** lx0, 10 ** d)
        c.line(left, y, right, y, (225, 225, 225))
        lab = _label(10 ** d)
        c.text(left - 10 - 8 * len(lab), y - 5, lab)
    c.line(left, top, left, bottom, (0, 0, 0))
    c.line(left, bottom, right, bottom, (0, 0, 0))
    first = next((s for s in series if s), None)
    if first:
        x0, y0 = first[0]
        if x0 > 0 and y0 > 0:
            a, b = at(x0, y0), at(x0 * 10 ** (lx1 - lx0), y0 * 10 ** (lx1 - lx0))
            c.line(a[0], a[1], b[0], b[1], (190, 190, 190))
    for i, s in enumerate(series):
        colour = COLOURS[i % len(COLOURS)][1]
        good = [at(x, y) for x, y in s if x > 0 and y > 0]
        for p, q in zip(good, good[1:], strict=False):
            c.line(p[0], p[1], q[0], q[1], colour, 2)
        for p in good:
            c.dot(p[0] - 2, p[1] - 2, colour, 5)
    return c.png()


def write(path: Path, series: list[list[tuple[float, float]]]) -> Path:
    path.write_bytes(loglog(series))
    return path
