"""`make demo` runs non-interactively, shows what it should, and cleans up after itself."""
from __future__ import annotations

import subprocess
import sys

from tests.conftest import ROOT


def test_demo_runs_and_cleans_up() -> None:
    cp = subprocess.run([sys.executable, "-m", "kube32.sim.demo"], cwd=ROOT, capture_output=True,
                        text=True, timeout=300)
    assert cp.returncode == 0, cp.stdout + cp.stderr
    assert "$ kubectl get nodes,pods -A" in cp.stdout and "demo complete" in cp.stdout
    left = subprocess.run(["pgrep", "-f", "kube32-demo-"], capture_output=True, text=True)
    assert left.stdout.strip() == "", "the demo left processes behind"
