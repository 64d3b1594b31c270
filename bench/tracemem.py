"""Where a process's memory goes: ``python -m bench.tracemem OUT ARGS...`` runs
``kube32-sim ARGS...`` under tracemalloc; each SIGUSR1 writes OUT (the heap traced
now, grouped by file and line, and by the module a traced block's oldest kube32 frame
is in), so a bench can ask a fleet or a control plane at size where its memory went.

For the bench only (issue 25): tracemalloc slows the process (it traces every block), so
its figures of time are not the bench's; RSS is larger than what is traced (the
interpreter's arenas, C libraries such as OpenSSL and SQLite are not traced)."""
from __future__ import annotations

import linecache
import signal
import sys
import tracemalloc
from pathlib import Path
from types import FrameType

FRAMES = 12
TOP = 40


def _kube32_frame(tb: tracemalloc.Traceback) -> str:
    """The innermost frame inside kube32/ (where the product asked for the block)."""
    for frame in reversed(tb):   # innermost first
        if "/kube32/" in frame.filename:
            return f"{frame.filename.split('/kube32/', 1)[1]}:{frame.lineno}"
    return f"(outside kube32) {tb[-1].filename.rsplit('/', 2)[-1]}:{tb[-1].lineno}" if len(tb) else "?"


def report(snapshot: tracemalloc.Snapshot, top: int = TOP) -> str:
    snapshot = snapshot.filter_traces((tracemalloc.Filter(False, tracemalloc.__file__),
                                       tracemalloc.Filter(False, linecache.__file__)))
    total = sum(s.size for s in snapshot.statistics("filename"))
    lines = [f"traced {total / 2**20:.1f} MiB in {len(snapshot.traces)} blocks", "-- by line (innermost frame)"]
    for s in snapshot.statistics("lineno")[:top]:
        f = s.traceback[0]
        lines.append(f"{s.size / 2**20:8.2f} MiB {s.count:8d}  {f.filename.rsplit('/', 3)[-1]}:{f.lineno}  "
                     f"{linecache.getline(f.filename, f.lineno).strip()[:90]}")
    lines.append("-- by the innermost kube32 frame that asked for it")
    by: dict[str, list[int]] = {}
    for t in snapshot.traces:
        k = _kube32_frame(t.traceback)
        acc = by.setdefault(k, [0, 0])
        acc[0] += t.size
        acc[1] += 1
    for k, (size, count) in sorted(by.items(), key=lambda kv: -kv[1][0])[:top]:
        lines.append(f"{size / 2**20:8.2f} MiB {count:8d}  {k}")
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    out = Path(argv[0])
    tracemalloc.start(FRAMES)

    def dump(_sig: int, _frame: FrameType | None) -> None:
        out.write_text(report(tracemalloc.take_snapshot()))
    signal.signal(signal.SIGUSR1, dump)
    from kube32.sim.main import main as sim_main
    return sim_main(argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
