"""Helpers for round 25c's outside tests: a cluster of `kube32-sim up`, extra workers and
fleets as processes of their own, kubectl against it.  Only the documented commands."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
import uuid
from pathlib import Path
from typing import IO, Any

ROOT = Path(__file__).resolve().parents[2]
BIN = ROOT / ".venv" / "bin"
SIM = str(BIN / "kube32-sim")
CLI = str(BIN / "kube32-cli")
COUNTER = ROOT / "examples" / "pods" / "counter.wasm"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def data_dir(tag: str) -> Path:
    d = Path(f"/tmp/attack25c-{tag}-{uuid.uuid4().hex[:6]}")
    d.mkdir(parents=True)
    return d


def descendants(pid: int) -> list[int]:
    """Every process below pid (from /proc), so a test can check nothing is left."""
    children: dict[int, list[int]] = {}
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            stat = (p / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(p.name))
    out: list[int] = []
    todo = [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def procs_with(text: str) -> list[int]:
    """Pids whose command line contains text (used to find leftovers of one data dir)."""
    out = []
    for p in Path("/proc").iterdir():
        if not p.name.isdigit() or int(p.name) == os.getpid():
            continue
        try:
            cmd = (p / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in cmd:
            out.append(int(p.name))
    return out


class Proc:
    """A child process whose output is collected by a thread."""

    def __init__(self, args: list[str], stdin: Any = subprocess.DEVNULL,
                 env: dict[str, str] | None = None) -> None:
        self.args = args
        self.lines: list[str] = []
        self.p = subprocess.Popen(
            args, stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True, bufsize=1, cwd=ROOT, env=env, start_new_session=True)
        self._t = threading.Thread(target=self._read, daemon=True)
        self._t.start()

    def _read(self) -> None:
        assert self.p.stdout is not None
        for line in self.p.stdout:
            self.lines.append(line.rstrip("\n"))

    @property
    def text(self) -> str:
        return "\n".join(self.lines)

    def wait_for(self, needle: str, timeout: float) -> bool:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if any(needle in ln for ln in self.lines):
                return True
            if self.p.poll() is not None:
                time.sleep(0.3)
                return any(needle in ln for ln in self.lines)
            time.sleep(0.2)
        return False

    def wait(self, timeout: float) -> int | None:
        try:
            rc = self.p.wait(timeout)
        except subprocess.TimeoutExpired:
            return None
        self._t.join(5)
        return rc

    def signal(self, sig: int) -> None:
        if self.p.poll() is None:
            os.kill(self.p.pid, sig)

    def stop(self, timeout: float = 40) -> int | None:
        """SIGTERM, then SIGKILL of the whole session if it does not end."""
        if self.p.poll() is None:
            self.signal(signal.SIGCONT)
            self.signal(signal.SIGTERM)
        rc = self.wait(timeout)
        if rc is None:
            try:
                os.killpg(self.p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            rc = self.wait(10)
        return rc


class Cluster:
    def __init__(self, tag: str, workers: int = 1, fleet: int = 0, extra: list[str] | None = None,
                 stdin: Any = subprocess.DEVNULL) -> None:
        self.dir = data_dir(tag)
        self.port = free_port()
        args = [SIM, "up", "--workers", str(workers), "--data-dir", str(self.dir),
                "--port", str(self.port), "--lease-interval", "2",
                "--node-monitor-grace-period", "8s", "--interp-mops", "50"]
        if fleet:
            args += ["--fleet", str(fleet)]
        args += extra or []
        self.up = Proc(args, stdin=stdin)
        self.kubeconfig = str(self.dir / "admin.kubeconfig")
        self.node_kubeconfig = str(self.dir / "node.kubeconfig")
        self.others: list[Proc] = []

    def ready(self, timeout: float = 150) -> None:
        if not self.up.wait_for("cluster ready", timeout):
            out = self.up.text
            self.stop()
            raise AssertionError(f"cluster did not get ready:\n{out[-3000:]}")

    def env(self) -> dict[str, str]:
        e = dict(os.environ)
        e["KUBECONFIG"] = self.kubeconfig
        e["PATH"] = f"{BIN}:{e['PATH']}"
        return e

    def kubectl(self, *args: str, check: bool = True, input: str | None = None,
                timeout: float = 60) -> subprocess.CompletedProcess[str]:
        r = subprocess.run(["kubectl", "--kubeconfig", self.kubeconfig, *args], input=input,
                           capture_output=True, text=True, timeout=timeout)
        if check and r.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)}: {r.stderr}{r.stdout}")
        return r

    def get(self, *args: str) -> Any:
        return json.loads(self.kubectl("get", *args, "-o", "json").stdout)

    def cli(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run([CLI, *args, "--kubeconfig", self.kubeconfig], capture_output=True,
                              text=True, timeout=timeout, cwd=ROOT)

    def worker(self, name: str, address: str, *extra: str, stdin: Any = subprocess.DEVNULL) -> Proc:
        d = self.dir / f"w-{name}-{uuid.uuid4().hex[:4]}"
        p = Proc([SIM, "worker", "--kubeconfig", self.node_kubeconfig, "--name", name,
                  "--address", address, "--data-dir", str(d), "--lease-interval", "2",
                  "--interp-mops", "50", *extra], stdin=stdin)
        self.others.append(p)
        return p

    def fleet(self, *extra: str, stdin: Any = subprocess.DEVNULL) -> Proc:
        d = self.dir / f"fleet-{uuid.uuid4().hex[:4]}"
        p = Proc([SIM, "fleet", "--kubeconfig", self.node_kubeconfig, "--data-dir", str(d),
                  "--lease-interval", "2", "--interp-mops", "50", *extra], stdin=stdin)
        self.others.append(p)
        return p

    def node_ready(self, name: str) -> str | None:
        r = self.kubectl("get", "node", name, "-o",
                         "jsonpath={.status.conditions[?(@.type=='Ready')].status}", check=False)
        return r.stdout.strip() if r.returncode == 0 else None

    def wait_node(self, name: str, status: str, timeout: float = 60) -> bool:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.node_ready(name) == status:
                return True
            time.sleep(0.5)
        return False

    def conditions(self, name: str) -> dict[str, dict[str, Any]]:
        node = self.get("node", name)
        return {c["type"]: c for c in node["status"].get("conditions", [])}

    def apply(self, manifest: dict[str, Any] | str) -> None:
        text = manifest if isinstance(manifest, str) else json.dumps(manifest)
        self.kubectl("apply", "-f", "-", input=text)

    def push_counter(self) -> str:
        r = self.cli("image", "push", str(COUNTER))
        assert r.returncode == 0, r.stderr
        return r.stdout.strip().splitlines()[-1]

    def stop(self) -> None:
        for p in self.others:
            p.stop(30)
        rc = self.up.stop(60)
        assert rc is not None
        left = procs_with(str(self.dir))
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        shutil.rmtree(self.dir, ignore_errors=True)
        assert not left, f"processes left after the cluster stopped: {left}"


def lease(name: str, endpoint: str | None, renew: str, duration: int = 40) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": "kube-node-lease"}
    if endpoint is not None:
        meta["annotations"] = {"kube32.io/kubelet-endpoint": endpoint}
    return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": meta,
            "spec": {"holderIdentity": name, "leaseDurationSeconds": duration, "renewTime": renew}}


def now_micro(offset: float = 0.0) -> str:
    t = time.time() + offset
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int(t % 1 * 1e6):06d}Z"


def run_sim(*args: str, timeout: float = 60, stdin: IO[str] | int | None = subprocess.DEVNULL
            ) -> tuple[int | None, str, float]:
    """A kube32-sim command expected to end on its own: rc (None if it had to be killed), output,
    seconds."""
    t0 = time.monotonic()
    p = Proc([SIM, *args], stdin=stdin)
    rc = p.wait(timeout)
    if rc is None:
        p.stop(30)
    return rc, p.text, time.monotonic() - t0


class HangingEndpoint:
    """A TCP listener whose accept queue is full: a connect to it hangs (no SYN-ACK)."""

    def __init__(self, host: str = "127.0.0.77") -> None:
        self.s = socket.socket()
        self.s.bind((host, 0))
        self.s.listen(0)
        self.host = host
        self.port = int(self.s.getsockname()[1])
        self.fillers = []
        for _ in range(4):
            c = socket.socket()
            c.setblocking(False)
            try:
                c.connect((host, self.port))
            except BlockingIOError:
                pass
            self.fillers.append(c)

    def close(self) -> None:
        for c in self.fillers:
            c.close()
        self.s.close()
