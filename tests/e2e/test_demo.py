"""`make demo` runs non-interactively, shows every step of the migration story, fails
loudly when a step does not show what it should, and leaves no process behind, also
when it is interrupted."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

from tests.conftest import ROOT


def demo_command() -> list[str]:
    return [sys.executable, "-m", "kube32.sim.demo"]


def leftovers(output: str) -> str:
    """Processes still running with the demo's data dir on their command line."""
    m = re.search(r"--data-dir (/\S*kube32-demo-\S+)", output)
    assert m, output
    return subprocess.run(["pgrep", "-a", "-f", m.group(1)], capture_output=True, text=True).stdout.strip()


def test_demo_tells_the_story_and_cleans_up() -> None:
    cp = subprocess.run(demo_command(), cwd=ROOT, capture_output=True, text=True, timeout=240,
                        env={**os.environ, "COLUMNS": "200"})
    out = cp.stdout
    assert cp.returncode == 0, out + cp.stderr
    for shown in ("$ kube32-sim up --workers 2", "$ kube32-cli image push examples/pods/counter.wasm",
                  "$ kubectl get --raw /api/v1/namespaces/default/pods/counter/proxy/",
                  "$ kube32-cli move counter --to sim-2", "Saving", "Completed", "after the freeze",
                  "$ kubectl drain sim-2 --ignore-daemonsets --force", "$ kill -9 ",
                  "$ kubectl get ckpt -o wide", "$ kubectl get events", "Restored on sim-2 from checkpoint",
                  "restored_calls is 3", "demo complete", "make demo ARGS=--keep"):
        assert shown in out, f"{shown!r} not shown:\n{out}"
    # the counters continued: the pod's own JSON, in order, across two moves and a restore
    restored = [int(n) for n in re.findall(r'"restored_calls":(\d+)', out)]
    assert restored[0] == 0 and restored[-1] == 3 and restored == sorted(restored)
    assert set(re.findall(r'"init_calls":(\d+)', out)) == {"1"}
    assert leftovers(out) == "", "the demo left processes behind"


def test_interrupted_demo_stops_its_cluster() -> None:
    proc = subprocess.Popen(demo_command(), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    out = ""
    assert proc.stdout is not None
    deadline = time.monotonic() + 120
    for line in proc.stdout:  # up to the first command against the running cluster
        out += line
        if "$ kubectl get nodes" in line or time.monotonic() > deadline:
            break
    proc.send_signal(signal.SIGINT)
    rest, _ = proc.communicate(timeout=90)
    out += rest
    assert proc.returncode == 130, out
    assert "interrupted" in out and "demo complete" not in out
    assert leftovers(out) == "", "the interrupted demo left processes behind"
