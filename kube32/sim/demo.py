"""``make demo``: start a local Kube32 cluster and show it through kubectl.

Each command is printed before it runs, so a reader can repeat it by hand.
The demo checks what each step shows and exits non-zero when a step does not
show what it should; it stops every process it started (``--keep`` leaves the
cluster running and says how to use it and stop it).
"""
from __future__ import annotations

import argparse
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console

console = Console(highlight=False)


class DemoFailed(Exception):
    pass


def show(cmd: list[str], env: dict[str, str], expect: str | None = None) -> str:
    console.print(f"[bold cyan]$ {shlex.join(cmd)}[/]")
    cp = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
    out = cp.stdout + cp.stderr
    console.print(out.rstrip(), markup=False)
    if cp.returncode != 0 or (expect is not None and expect not in out):
        raise DemoFailed(f"`{shlex.join(cmd)}` did not show {expect!r}" if expect else
                         f"`{shlex.join(cmd)}` failed with exit code {cp.returncode}")
    return out


def wait_for_file(path: Path, proc: subprocess.Popen, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise DemoFailed(f"the control plane did not start (no {path})")
        time.sleep(0.1)


def run(keep: bool) -> int:
    data_dir = Path(tempfile.mkdtemp(prefix="kube32-demo-"))
    kubeconfig = data_dir / "admin.kubeconfig"
    start = [sys.executable, "-m", "kube32.sim.main", "control-plane", "--data-dir", str(data_dir), "--port", "0"]
    console.rule("[bold]Kube32: a control plane that speaks the Kubernetes API")
    console.print(f"[bold cyan]$ kube32-sim control-plane --data-dir {data_dir} --port 0 &[/]")
    log = open(data_dir / "control-plane.log", "wb")
    proc = subprocess.Popen(start, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    env = {**os.environ, "KUBECONFIG": str(kubeconfig)}
    try:
        wait_for_file(kubeconfig, proc)
        console.print(f"[bold cyan]$ export KUBECONFIG={kubeconfig}[/]")
        show(["kubectl", "version"], env, "Server Version: v1.32")
        show(["kubectl", "get", "nodes,pods", "-A"], env)
        show(["kubectl", "get", "namespaces"], env, "kube-node-lease")
        if keep:
            console.print(f"\nThe cluster keeps running (pid {proc.pid}).\n"
                          f"  export KUBECONFIG={kubeconfig}\n  kubectl get nodes,pods -A\n"
                          f"Stop it with: kill {proc.pid}")
            return 0
        console.print("\n[bold green]demo complete[/]  (run `make demo ARGS=--keep` to keep the cluster up)")
        return 0
    except DemoFailed as e:
        console.print(f"[bold red]demo failed:[/] {e}")
        console.print((data_dir / "control-plane.log").read_text(errors="replace")[-3000:], markup=False)
        return 1
    finally:
        if not keep and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="kube32-demo", description=__doc__)
    p.add_argument("--keep", action="store_true", help="leave the cluster running afterwards")
    return run(p.parse_args(argv).keep)


if __name__ == "__main__":
    sys.exit(main())
