"""Baselines: the raw transfer of N bytes over loopback TCP between processes, no
processing (no hashing, no HTTP, no JSON).

- ``hops=1``: A sendall -> B recv_into (the snapshot stream's baseline).
- ``hops=2``: A -> B, store and forward (B receives all N bytes into a fresh buffer,
  then sends them on) -> C, the route of a move's bytes: source kubelet -> control
  plane (which holds the Checkpoint's data) -> target kubelet.

``Progress``, ``hash_behind`` and ``receive_following`` let a thread hash (or forward)
bytes while another receives them; the floors (bench/tlshops.py, bench_snapshot's
``hashed`` mode) use them.

The sender's buffer exists and is touched beforehand (a pod's memory exists before
its move); every receiver's buffer is fresh, so its page faults count, as in a real
restore.  The time runs from A's first send to the last byte in the last receiver,
on CLOCK_MONOTONIC (one clock across processes).
"""
from __future__ import annotations

import hashlib
import multiprocessing as mp
import socket
import threading
import time
from typing import Any

CHUNK = 1 << 20
STEP = 256 << 10  # bytes received between wake-ups of the threads that follow the receiver


def _recv_all(conn: socket.socket, size: int) -> bytearray:
    buf = bytearray(size)
    view = memoryview(buf)
    got = 0
    while got < size:
        n = conn.recv_into(view[got: got + CHUNK])
        if not n:
            raise RuntimeError("the sender stopped early")
        got += n
    return buf


def _send_all(sock: socket.socket, data: bytes | bytearray) -> None:
    view = memoryview(data)
    for offset in range(0, len(view), CHUNK):
        sock.sendall(view[offset: offset + CHUNK])


class Progress:
    """How many bytes of a buffer are in; the hash and the forwarder wait on it."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._done = 0

    def advance(self, done: int) -> None:
        with self._cond:
            self._done = done
            self._cond.notify_all()

    def beyond(self, pos: int) -> int:
        with self._cond:
            while self._done <= pos:
                self._cond.wait()
            return self._done


def hash_behind(view: memoryview, progress: Progress, out: list[bytes]) -> None:
    """SHA-256 of ``view``, following ``progress``; the digest goes into ``out``."""
    h, pos = hashlib.sha256(), 0
    while pos < len(view):
        end = progress.beyond(pos)
        h.update(view[pos:end])
        pos = end
    out.append(h.digest())


def receive_following(conn: socket.socket, view: memoryview, progress: Progress) -> None:
    """Fill ``view`` from ``conn``, telling ``progress`` every STEP bytes."""
    got = told = 0
    while got < len(view):
        n = conn.recv_into(view[got: got + CHUNK])
        if not n:
            raise RuntimeError("the sender stopped early")
        got += n
        if got - told >= STEP or got == len(view):
            progress.advance(got)
            told = got


def _source(port: int, size: int, out: Any) -> None:
    data = bytearray(size)
    for offset in range(0, size, 4096):
        data[offset] = offset >> 12 & 0xFF
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.recv(1)  # everyone is listening
        out.put(("start", time.monotonic()))
        _send_all(sock, data)
        sock.recv(1)


def _relay(listener: socket.socket, next_port: int | None, size: int, out: Any) -> None:
    nxt = socket.create_connection(("127.0.0.1", next_port)) if next_port else None
    if nxt is not None:
        nxt.recv(1)
    conn, _ = listener.accept()
    with conn:
        conn.sendall(b"g")
        buf = _recv_all(conn, size)
        if nxt is None:
            out.put(("end", time.monotonic()))
        else:
            _send_all(nxt, buf)
            nxt.recv(1)
            nxt.close()
        conn.sendall(b"d")


def _sink(listener: socket.socket, size: int, out: Any) -> None:
    conn, _ = listener.accept()
    with conn:
        conn.sendall(b"g")
        _recv_all(conn, size)
        out.put(("end", time.monotonic()))
        conn.sendall(b"d")


def transfer_seconds(size: int, hops: int) -> float:
    """One raw transfer of ``size`` bytes over ``hops`` (1 or 2) loopback hops."""
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    first = socket.create_server(("127.0.0.1", 0))
    procs = []
    last = None
    if hops == 2:
        last = socket.create_server(("127.0.0.1", 0))
        procs.append(ctx.Process(target=_sink, args=(last, size, out)))
        procs.append(ctx.Process(target=_relay, args=(first, last.getsockname()[1], size, out)))
    else:
        procs.append(ctx.Process(target=_relay, args=(first, None, size, out)))
    procs.append(ctx.Process(target=_source, args=(first.getsockname()[1], size, out)))
    return timed_run(procs, out, [first, last])


def timed_run(procs: list[Any], out: Any, listeners: list[socket.socket | None]) -> float:
    """Start the role processes, and give the seconds from the "start" one reports to the
    "end" another does; then every process is joined (killed if it hangs) and every
    listener closed."""
    for p in procs:
        p.start()
    try:
        got = dict(out.get(timeout=120) for _ in range(2))
    finally:
        for p in procs:
            p.join(30)
            if p.is_alive():
                p.kill()
        for listener in listeners:
            if listener is not None:
                listener.close()
    return got["end"] - got["start"]
