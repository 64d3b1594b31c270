"""A local etcd cluster of child processes: the real etcd (Debian's ``etcd-server``).

`kube32-sim up --store etcd`, the tests and the benchmarks start etcd with it: N members
on loopback, each with a client and a peer port of its own, data in ``<dir>/<member>/``,
logs in ``<dir>/<member>.log``, process ids in ``<dir>/<member>.pid``.  Ports are picked
free (bind port 0, read it, close) and written to ``<dir>/cluster.json``, so a cluster started again on
the same directory finds its members where its data says they are (etcd keeps its peer
URLs in its log); a port someone took in between is a clear error, and a fresh cluster
whose port was taken by someone else between the pick and etcd's bind starts again on
new ports.

Every member runs with ``--max-request-bytes`` = kube32.store.config.MAX_REQUEST_BYTES,
so etcd takes every object the API takes (3 MiB bodies); etcd's own default is 1.5 MiB.
Nothing here imports grpc: health is etcd's HTTP ``/health`` on the client port.
"""
from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from ..store.config import ETCD_SCHEME, MAX_REQUEST_BYTES, format_endpoint

START_TIMEOUT = 30.0
STOP_TIMEOUT = 10.0
START_ATTEMPTS = 3  # a fresh cluster whose picked port was taken meanwhile tries new ones


class EtcdError(Exception):
    """etcd could not be started or is not installed; str() says why."""


def etcd_binary() -> str:
    path = shutil.which("etcd") or ("/usr/bin/etcd" if os.path.exists("/usr/bin/etcd") else None)
    if path is None:
        raise EtcdError("etcd is not installed (Debian: apt-get install etcd-server)")
    return path


def free_port(host: str) -> int:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


@dataclass
class Member:
    name: str
    client_port: int
    peer_port: int
    process: subprocess.Popen[bytes] | None = None


class EtcdCluster:
    """`members` etcd members on `host`, data under `directory`."""

    def __init__(self, directory: Path, members: int = 1, host: str = "127.0.0.1") -> None:
        if members < 1:
            raise EtcdError("an etcd cluster needs at least one member")
        self.directory = Path(directory).resolve()
        self.host = host
        self.size = members
        self.members: list[Member] = []
        self._token = ""

    # --- addresses ---------------------------------------------------------

    def client_url(self, member: Member) -> str:
        return f"http://{format_endpoint(self.host, member.client_port)}"

    def peer_url(self, member: Member) -> str:
        return f"http://{format_endpoint(self.host, member.peer_port)}"

    @property
    def endpoints(self) -> list[str]:
        return [format_endpoint(self.host, m.client_port) for m in self.members]

    @property
    def store_url(self) -> str:
        """The control plane's --store value for this cluster."""
        return ETCD_SCHEME + ",".join(self.endpoints)

    # --- starting and stopping -------------------------------------------

    def start(self, timeout: float = START_TIMEOUT) -> None:
        """Start every member (again, on a directory that has a cluster) and wait until
        each is healthy."""
        self.directory.mkdir(parents=True, exist_ok=True)
        known = self._load()
        for attempt in range(1 if known else START_ATTEMPTS):
            if not known:
                self._plan()
            try:
                for member in self.members:
                    self.start_member(member)
                self.wait_healthy(timeout)
                self._save()
                return
            except EtcdError as err:
                self.stop()
                if known or attempt == START_ATTEMPTS - 1 or "address already in use" not in str(err):
                    raise
        raise AssertionError("unreachable")

    def _plan(self) -> None:
        self._token = f"kube32-{secrets.token_hex(4)}"
        taken: set[int] = set()
        self.members = []
        for i in range(self.size):
            ports: list[int] = []
            while len(ports) < 2:
                port = free_port(self.host)
                if port not in taken:
                    taken.add(port)
                    ports.append(port)
            self.members.append(Member(f"etcd-{i}", ports[0], ports[1]))
            shutil.rmtree(self.directory / f"etcd-{i}", ignore_errors=True)

    def _config_file(self) -> Path:
        return self.directory / "cluster.json"

    def _load(self) -> bool:
        try:
            config = json.loads(self._config_file().read_text())
        except FileNotFoundError:
            return False
        except (OSError, ValueError) as err:
            raise EtcdError(f"cannot read {self._config_file()}: {err}") from None
        if config.get("host") != self.host or len(config.get("members") or []) != self.size:
            raise EtcdError(f"{self.directory} holds an etcd cluster of another shape "
                            f"({len(config.get('members') or [])} members on {config.get('host')})")
        self._token = config["token"]
        self.members = [Member(m["name"], m["client_port"], m["peer_port"]) for m in config["members"]]
        return True

    def _save(self) -> None:
        config = {"host": self.host, "token": self._token,
                  "members": [{"name": m.name, "client_port": m.client_port, "peer_port": m.peer_port}
                              for m in self.members]}
        self._config_file().write_text(json.dumps(config, indent=2) + "\n")

    def _args(self, member: Member) -> list[str]:
        initial = ",".join(f"{m.name}={self.peer_url(m)}" for m in self.members)
        return [
            etcd_binary(), "--name", member.name, "--data-dir", str(self.directory / member.name),
            "--listen-client-urls", self.client_url(member),
            "--advertise-client-urls", self.client_url(member),
            "--listen-peer-urls", self.peer_url(member),
            "--initial-advertise-peer-urls", self.peer_url(member),
            "--initial-cluster", initial, "--initial-cluster-state", "new",
            "--initial-cluster-token", self._token,
            "--max-request-bytes", str(MAX_REQUEST_BYTES),
            "--logger", "zap", "--log-outputs", "stderr", "--log-level", "warn",
        ]

    def pid_file(self, member: Member) -> Path:
        """The member's process id while it runs (for drills that kill one)."""
        return self.directory / f"{member.name}.pid"

    def log_file(self, member: Member) -> Path:
        return self.directory / f"{member.name}.log"

    def start_member(self, member: Member) -> None:
        """Start one member (again); it rejoins from its data directory."""
        if member.process is not None and member.process.poll() is None:
            return
        with open(self.log_file(member), "ab") as log:
            member.process = subprocess.Popen(self._args(member), stdin=subprocess.DEVNULL,
                                              stdout=log, stderr=subprocess.STDOUT,
                                              start_new_session=True)
        self.pid_file(member).write_text(f"{member.process.pid}\n")

    def wait_healthy(self, timeout: float = START_TIMEOUT, members: list[Member] | None = None) -> None:
        deadline = time.monotonic() + timeout
        for member in members or self.members:
            while not self.healthy(member):
                if member.process is not None and member.process.poll() is not None:
                    raise EtcdError(f"etcd member {member.name} exited with code "
                                    f"{member.process.returncode}: {self._tail(member)}")
                if time.monotonic() > deadline:
                    raise EtcdError(f"etcd member {member.name} not healthy after {timeout:g}s: "
                                    f"{self._tail(member)}")
                time.sleep(0.05)

    def healthy(self, member: Member) -> bool:
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        try:
            with opener.open(f"{self.client_url(member)}/health", timeout=2) as resp:
                return json.loads(resp.read()).get("health") == "true"
        except (OSError, ValueError):
            return False

    def _tail(self, member: Member, lines: int = 5) -> str:
        try:
            text = self.log_file(member).read_text(errors="replace").strip().splitlines()
        except OSError:
            return "(no log)"
        return " | ".join(text[-lines:]) or "(empty log)"

    def kill(self, member: Member) -> None:
        """SIGKILL one member, as a machine that dies."""
        if member.process is not None and member.process.poll() is None:
            member.process.send_signal(signal.SIGKILL)
            member.process.wait()

    def stop(self) -> None:
        for member in self.members:
            if member.process is not None and member.process.poll() is None:
                member.process.send_signal(signal.SIGTERM)
        for member in self.members:
            if member.process is None:
                continue
            try:
                member.process.wait(STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                member.process.kill()
                member.process.wait()

    def __enter__(self) -> EtcdCluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
