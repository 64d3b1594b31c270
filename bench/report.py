"""The benchmark report: each bench module adds a markdown section (its table, with
every figure a median and a ratio against a baseline measured in the same run, and
each target met or missed); ``python -m bench`` writes them, after the machine they
ran on, to docs/benchmarks.md.  The notes (analysis, fixes, before/after) live in
bench/notes.md, written by hand, and are appended as they are."""
from __future__ import annotations

import os
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "docs" / "benchmarks.md"
NOTES = Path(__file__).resolve().parent / "notes.md"

SECTIONS: list[str] = []


def add(section: str) -> None:
    SECTIONS.append(section.rstrip() + "\n")


def verdict(ok: bool) -> str:
    return "met" if ok else "**missed**"


def table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def machine() -> str:
    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = 0
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem = int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        import wasmtime
        wt = getattr(wasmtime, "__version__", None) or _pip_version("wasmtime")
    except ImportError:
        wt = "not installed"
    import aiohttp
    try:
        kubectl = subprocess.run(["kubectl", "version", "--client", "-o", "yaml"], capture_output=True,
                                 text=True, timeout=10).stdout
        kubectl = next((ln.split(":", 1)[1].strip() for ln in kubectl.splitlines()
                        if ln.strip().startswith("gitVersion")), "?")
    except (OSError, subprocess.TimeoutExpired):
        kubectl = "?"
    return table(["", ""], [
        ["CPU", cpu], ["cores", str(os.cpu_count())], ["memory", f"{mem / 2**30:.1f} GiB"],
        ["OS", f"{platform.system()} {platform.release()}"],
        ["Python", sys.version.split()[0]], ["wasmtime (Python)", wt], ["pwasm", _pip_version("pwasm")],
        ["aiohttp", aiohttp.__version__],
        ["kubectl", kubectl],
    ])


def _pip_version(name: str) -> str:
    from importlib.metadata import version
    try:
        return version(name)
    except Exception:  # noqa: BLE001 - a report line, not a failure
        return "?"


def _title(section: str) -> str:
    return section.lstrip().split("\n", 1)[0].strip()


def sections_of(doc: str) -> list[str]:
    """A written report's ``## `` sections, each with its text up to the next one."""
    out: list[str] = []
    for part in ("\n" + doc).split("\n## ")[1:]:
        out.append("## " + part.rstrip() + "\n")
    return out


KEPT = ("## Fleets at scale",)   # sections a `make bench` keeps from the last report (written by their own target)
NOTES_TITLE = "## Notes:"


def _kept(existing: str, fresh: list[str]) -> list[str]:
    titles = {_title(s) for s in fresh}
    return [s for s in sections_of(existing) if _title(s).startswith(KEPT) and _title(s) not in titles]


def replace_section(section: str, drop: tuple[str, ...] = ()) -> Path:
    """Put ``section`` into the written report in place of the one of the same title (or
    before the notes), leaving the rest as it is: a target that runs one bench alone
    (`make bench-fleet`) updates its own figures only."""
    doc = OUT.read_text() if OUT.exists() else "# Benchmarks\n"
    section = section.rstrip() + "\n"
    title = _title(section)
    head, _, _ = ("\n" + doc).partition("\n## ")
    parts = [p for p in sections_of(doc) if _title(p) not in drop]
    if any(_title(p) == title for p in parts):
        parts = [section if _title(p) == title else p for p in parts]
    else:
        at = next((i for i, p in enumerate(parts) if _title(p).startswith(NOTES_TITLE)), len(parts))
        parts.insert(at, section)
    if NOTES.exists():   # the notes as they are now, as write() appends them
        parts = [p for p in parts if not _title(p).startswith(NOTES_TITLE)] + [NOTES.read_text().rstrip() + "\n"]
    OUT.write_text(head.lstrip("\n").rstrip() + "\n\n" + "\n".join(parts))
    return OUT


def write(ran: list[str], seconds: float) -> Path:
    parts = [
        "# Benchmarks\n",
        "Written by `make bench` (`python -m bench`); do not edit by hand: the analysis lives in "
        "`bench/notes.md` and is appended below.  Every figure is the median of several runs; every "
        "target is a ratio against a baseline measured in the same run on the same machine.\n",
        f"Run {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}: {', '.join(ran)} in {seconds:.0f} s.\n",
        "## Machine\n",
        machine(),
        *SECTIONS,
        *_kept(OUT.read_text() if OUT.exists() else "", SECTIONS),
    ]
    if NOTES.exists():
        parts.append(NOTES.read_text())
    OUT.write_text("\n".join(parts))
    return OUT
