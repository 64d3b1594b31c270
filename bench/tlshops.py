"""Floors: the least a snapshot's bytes cost over loopback once they are sent the way the
spec and the security model ask (TLS on every hop, SHA-256 on each side), with nothing
else - no HTTP, no JSON, no K32S framing, no Wasm, no event loop.

Each figure is measured in the run that uses it, beside the raw baselines of
bench/rawhops.py, so a report can tell the part of a move that is the product's from
the part that is the machine's:

- ``move_floor_seconds(size)``: source -> relay -> sink, each hop TLS with the contexts
  the product uses (kube32.apiserver.pki, the same CA and defaults), forwarded as it
  arrives (cut-through, as the control plane forwards a move's data), with the three
  SHA-256 passes of a move (the source's trailer, the control plane's check, the
  restore's check) each on a thread of its own beside the copy, into fresh buffers at
  the relay and the sink.  Timed from the source's first byte to the sink's hash.
- ``stream_floor_seconds(size)``: one TLS hop whose sender first hashes all the bytes
  (the spec's answer carries the digest in a header, before the body), then sends them;
  the receiver reads into one reused buffer, as the snapshot-stream bench reads.

Threads in place of an event loop, blocking sockets in place of memory BIOs: the
cheapest way Python moves TLS bytes (tried against asyncio's buffered and copying
protocols; all within 10%).  The processes are spawned, one per role, as in rawhops.
"""
from __future__ import annotations

import hashlib
import mmap
import multiprocessing as mp
import socket
import ssl
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from kube32.apiserver import pki

from .rawhops import CHUNK, Progress, hash_behind, receive_following, timed_run

def _fresh(size: int) -> memoryview:
    return memoryview(mmap.mmap(-1, size))


def _contexts(d: Path) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    return (pki.server_context(d / "floor.crt", d / "floor.key"), pki.client_context(d / "ca.crt"))


def _connect(port: int, client: ssl.SSLContext) -> ssl.SSLSocket:
    return client.wrap_socket(socket.create_connection(("127.0.0.1", port)), server_hostname="127.0.0.1")


def _source(d: Path, port: int, size: int, digest_first: bool, out: Any) -> None:
    data = bytearray(size)
    for offset in range(0, size, 4096):
        data[offset] = offset >> 12 & 0xFF
    view = memoryview(data)
    with _connect(port, _contexts(d)[1]) as sock:
        sock.recv(1)  # everyone is listening
        out.put(("start", time.monotonic()))
        if digest_first:
            hashlib.sha256(view).digest()
        else:
            whole = Progress()
            whole.advance(size)
            digests: list[bytes] = []
            hasher = threading.Thread(target=hash_behind, args=(view, whole, digests))
            hasher.start()
        for offset in range(0, size, CHUNK):
            sock.sendall(view[offset: offset + CHUNK])
        if not digest_first:
            hasher.join()
        sock.recv(1)


def _relay(d: Path, listener: socket.socket, next_port: int, size: int, out: Any) -> None:
    server, client = _contexts(d)
    nxt = _connect(next_port, client)
    nxt.recv(1)
    conn, _ = listener.accept()
    with server.wrap_socket(conn, server_side=True) as tls:
        tls.sendall(b"g")
        view, progress, digests = _fresh(size), Progress(), []
        threads = [threading.Thread(target=receive_following, args=(tls, view, progress)),
                   threading.Thread(target=hash_behind, args=(view, progress, digests))]
        for t in threads:
            t.start()
        sent = 0
        while sent < size:
            end = progress.beyond(sent)
            nxt.sendall(view[sent:end])
            sent = end
        for t in threads:
            t.join()
        nxt.recv(1)
        nxt.close()
        tls.sendall(b"d")


def _sink(d: Path, listener: socket.socket, size: int, reuse: bool, out: Any) -> None:
    conn, _ = listener.accept()
    with _contexts(d)[0].wrap_socket(conn, server_side=True) as tls:
        tls.sendall(b"g")
        if reuse:  # the stream bench's reader: one reused buffer, no hash
            view, got = memoryview(bytearray(CHUNK)), 0
            while got < size:
                got += tls.recv_into(view)
        else:
            view, progress, digests = _fresh(size), Progress(), []
            hasher = threading.Thread(target=hash_behind, args=(view, progress, digests))
            hasher.start()
            receive_following(tls, view, progress)
            hasher.join()
        out.put(("end", time.monotonic()))
        tls.sendall(b"d")


def _certificates(d: Path) -> None:
    pki.ensure_pki(d)
    pki.issue_serving_cert(d, "floor", ["127.0.0.1"])


def _run(size: int, hops: int) -> float:
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    with tempfile.TemporaryDirectory(prefix="kube32-floor-") as tmp:
        d = Path(tmp)
        _certificates(d)
        first = socket.create_server(("127.0.0.1", 0))
        procs = []
        last = None
        if hops == 2:
            last = socket.create_server(("127.0.0.1", 0))
            procs.append(ctx.Process(target=_sink, args=(d, last, size, False, out)))
            procs.append(ctx.Process(target=_relay, args=(d, first, last.getsockname()[1], size, out)))
        else:
            procs.append(ctx.Process(target=_sink, args=(d, first, size, True, out)))
        procs.append(ctx.Process(target=_source, args=(d, first.getsockname()[1], size, hops == 1, out)))
        return timed_run(procs, out, [first, last])


def move_floor_seconds(size: int) -> float:
    """One cut-through TLS transfer over two hops with a move's three SHA-256 passes."""
    return _run(size, 2)


def stream_floor_seconds(size: int) -> float:
    """One TLS hop whose sender hashes all the bytes before it sends them."""
    return _run(size, 1)
