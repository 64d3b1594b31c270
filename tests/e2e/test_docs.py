"""Every command the user docs show runs, against one real ``kube32-sim up`` cluster.

How the docs mark their commands (every fenced ``sh`` block in the pages below, the README included,
carries exactly one marker on the line before it):

- ``<!-- test: up -->``: the block that starts the cluster (``kube32-sim up ...``).
  The test runs that very command, with the data dir filled in and the short
  node-loss timings of :data:`FAST` added, and waits for ``cluster ready``;
- ``<!-- test -->``: runs with ``bash -e -o pipefail``; it must exit 0;
- ``<!-- test: fails -->``: runs the same way; it must exit non-zero (a refusal the
  page shows on purpose);
- ``<!-- no test: REASON -->``: not run here, for the reason given (``make demo``
  has its own test, for example).

Placeholders the test fills: the data dir ``/tmp/kube32`` becomes a fresh temporary
directory. Blocks of one page run in order in the repository root, with the venv's
``kube32-cli``/``kube32-sim`` first on ``PATH``; shell variables a block sets (every
assignment is exported with ``set -a``) reach the blocks after it, as in one
terminal. Pages run in :data:`PAGES` order on one shared cluster, so each page
cleans up what it creates. Processes a block leaves in the background are stopped
at the end (each block runs in its own process group).

The reference page is also checked against the commands themselves: every flag of
every ``--help`` appears in it.
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import pytest

from tests.conftest import ROOT, wait_for

DOCS = ROOT / "docs"
PAGES = ["getting-started.md", "writing-pods.md", "moving-pods.md", "reference.md", "architecture.md",
         "../README.md"]
PLACEHOLDER = "/tmp/kube32"
FAST = ["--lease-interval", "1", "--node-monitor-grace-period", "4s", "--pod-eviction-timeout", "1s",
        "--backoff", "1"]
MARKER = re.compile(r"^<!-- (test(?::\s*(up|fails))?|no test:\s*(.+?)) -->\s*$")
FENCE = re.compile(r"^```(\w*)\s*$")
BLOCK_TIMEOUT = 150
# The docs' `kube32-sim up` takes its default port, 6443; here a free one (the kubeconfig
# the blocks use names it), so that two runs of the suite at once do not collide.
FREE_PORT = ["--port", "0"]


@dataclass(frozen=True)
class Block:
    page: str
    line: int
    kind: str  # "run", "up", "fails" or "skip"
    code: str

    def __str__(self) -> str:
        return f"{self.page}:{self.line}"


def blocks(page: str) -> list[Block]:
    """The fenced ``sh`` blocks of ``page`` with their markers; an unmarked one is an error."""
    lines = (DOCS / page).read_text().splitlines()
    found: list[Block] = []
    i = 0
    while i < len(lines):
        fence = FENCE.match(lines[i])
        if not fence:
            i += 1
            continue
        start = i
        i += 1
        while i < len(lines) and not FENCE.match(lines[i]):
            i += 1
        if fence.group(1) == "sh":
            marker = MARKER.match(lines[start - 1]) if start else None
            assert marker, f"{page}:{start + 1}: a sh block without a <!-- test --> or <!-- no test: why --> marker"
            kind = "skip" if marker.group(3) else {None: "run", "up": "up", "fails": "fails"}[marker.group(2)]
            found.append(Block(page, start + 1, kind, "\n".join(lines[start + 1:i])))
        i += 1
    return found


class Terminal:
    """One terminal's worth of state: environment and background process groups."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        bin_dir = str(Path(sys.executable).parent)
        self.env = {**os.environ, "PATH": f"{bin_dir}:{os.environ.get('PATH', '')}", "PYTHONUNBUFFERED": "1",
                    "KUBECACHEDIR": str(data_dir / "kubectl-cache")}
        self.env.pop("KUBECONFIG", None)
        self.groups: list[int] = []
        self.up: subprocess.Popen | None = None

    def fill(self, code: str) -> str:
        return code.replace(PLACEHOLDER, str(self.data_dir))

    def start_up(self, block: Block) -> None:
        line = next(c for c in self.fill(block.code).splitlines() if c.strip().startswith("kube32-sim up"))
        cmd = line.split("#")[0].strip().rstrip("&").strip()
        log = open(self.data_dir / "up.log", "wb")
        self.up = subprocess.Popen(["bash", "-c", f"exec {cmd} {' '.join(FREE_PORT + FAST)}"], env=self.env, cwd=ROOT,
                                   stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self.groups.append(self.up.pid)
        wait_for(lambda: self.up.poll() is not None or "cluster ready" in self.up_log(), 120,
                 what="kube32-sim up to report the cluster ready")
        assert self.up.poll() is None, f"{block}: kube32-sim up exited:\n{self.up_log()}"

    def up_log(self) -> str:
        return (self.data_dir / "up.log").read_text(errors="replace")

    def run(self, block: Block) -> subprocess.CompletedProcess:
        state = self.data_dir / "env.out"
        script = f"set -a\n{self.fill(block.code)}\nenv -0 > {state}\n"
        proc = subprocess.Popen(["bash", "-e", "-o", "pipefail", "-c", script], env=self.env, cwd=ROOT,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                start_new_session=True)
        self.groups.append(proc.pid)
        try:
            out, _ = proc.communicate(timeout=BLOCK_TIMEOUT)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
            raise AssertionError(f"{block}: still running after {BLOCK_TIMEOUT} s:\n{block.code}\n---\n{out}") from None
        if proc.returncode == 0 and state.exists():
            self.env = dict(kv.split("=", 1) for kv in state.read_text().split("\0") if "=" in kv)
            state.unlink()
        return subprocess.CompletedProcess(block.code, proc.returncode, out)

    def close(self) -> None:
        if self.up is not None and self.up.poll() is None:
            subprocess.run(["kubectl", "delete", "pods", "--all", "--wait=false"], env=self.env,
                           capture_output=True, timeout=30)
            self.up.send_signal(signal.SIGTERM)
            try:
                self.up.wait(45)
            except subprocess.TimeoutExpired:
                pass
        for group in self.groups:
            try:
                os.killpg(group, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


@pytest.fixture(scope="module")
def terminal(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Terminal]:
    t = Terminal(tmp_path_factory.mktemp("docs"))
    try:
        yield t
    finally:
        t.close()


def test_every_sh_block_is_marked() -> None:
    kinds = [b.kind for page in PAGES for b in blocks(page)]
    assert kinds.count("up") == 1, "exactly one block starts the cluster"
    assert kinds.count("run") >= 10


@pytest.mark.parametrize("page", PAGES)
def test_page_commands_run(terminal: Terminal, page: str) -> None:
    for block in blocks(page):
        if block.kind == "skip":
            continue
        if block.kind == "up":
            terminal.start_up(block)
            continue
        assert terminal.up is not None and terminal.up.poll() is None, f"{block}: the cluster is not running"
        result = terminal.run(block)
        if block.kind == "fails":
            assert result.returncode != 0, f"{block}: should fail but exited 0:\n{block.code}\n---\n{result.stdout}"
        else:
            assert result.returncode == 0, \
                f"{block}: exited {result.returncode}:\n{block.code}\n---\n{result.stdout}"


HELPS = [["kube32-sim", "up"], ["kube32-sim", "control-plane"], ["kube32-sim", "worker"], ["kube32-sim", "fleet"],
         ["kube32-cli", "move"], ["kube32-cli", "checkpoint"], ["kube32-cli", "image", "push"],
         ["kube32-cli", "publish"], ["kube32-cli", "snapshot", "inspect"]]


@pytest.mark.parametrize("command", HELPS, ids=[" ".join(c) for c in HELPS])
def test_reference_names_every_flag(command: list[str]) -> None:
    module = {"kube32-sim": "kube32.sim.main", "kube32-cli": "kube32.cli.main"}[command[0]]
    out = subprocess.run([sys.executable, "-m", module, *command[1:], "--help"], capture_output=True, text=True,
                         cwd=ROOT, env={**os.environ, "COLUMNS": "200"})
    assert out.returncode == 0, out.stderr
    reference = (DOCS / "reference.md").read_text()
    section = reference.split(f"### {' '.join(command)}\n", 1)
    assert len(section) == 2, f"reference.md has no section ### {' '.join(command)}"
    body = section[1].split("\n### ", 1)[0]
    flags = set(re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", out.stdout)) - {"--help"}
    missing = sorted(f for f in flags if f not in body)
    assert not missing, f"reference.md, {' '.join(command)}: flags not described: {missing}"
