"""Runs every bench/bench_*.py module in turn, then writes docs/benchmarks.md
(bench/report.py): `python -m bench [NAME...]`."""

from __future__ import annotations

import importlib
import pkgutil
import sys
import time

import bench
from bench import report


def main(argv: list[str]) -> int:
    names = sorted(m.name for m in pkgutil.iter_modules(bench.__path__) if m.name.startswith("bench_"))
    if argv:
        names = [n for n in names if n in argv or n.removeprefix("bench_") in argv]
    status = 0
    started = time.monotonic()
    for name in names:
        print(f"== {name}", flush=True)
        module = importlib.import_module(f"bench.{name}")
        status |= module.main([]) or 0
    path = report.write(names, time.monotonic() - started)
    print(f"wrote {path}", flush=True)
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
