"""Runs every bench/bench_*.py module in turn, then writes docs/benchmarks.md
(bench/report.py): `python -m bench [NAME...]`."""

from __future__ import annotations

import importlib
import pkgutil
import sys
import time

import bench
from bench import report


def _busy_jiffies() -> tuple[int, int]:
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    idle = fields[3] + fields[4]
    return sum(fields) - idle, sum(fields)


def settle(quiet: float = 0.15, longest: float = 15.0) -> None:
    """Wait until the machine is quiet (under ``quiet`` of its CPU busy over half a second),
    at most ``longest`` seconds: the previous suite's processes may still be exiting, and a
    ratio measured beside them measures them."""
    deadline = time.monotonic() + longest
    while time.monotonic() < deadline:
        b0, t0 = _busy_jiffies()
        time.sleep(0.5)
        b1, t1 = _busy_jiffies()
        if t1 > t0 and (b1 - b0) / (t1 - t0) < quiet:
            return


def main(argv: list[str]) -> int:
    names = sorted(m.name for m in pkgutil.iter_modules(bench.__path__) if m.name.startswith("bench_"))
    if argv:
        names = [n for n in names if n in argv or n.removeprefix("bench_") in argv]
    status = 0
    started = time.monotonic()
    for name in names:
        settle()
        print(f"== {name}", flush=True)
        module = importlib.import_module(f"bench.{name}")
        status |= module.main([]) or 0
    path = report.write(names, time.monotonic() - started)
    print(f"wrote {path}", flush=True)
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
