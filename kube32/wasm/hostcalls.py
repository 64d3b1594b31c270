"""The pod ABI's host functions (module ``k32``), one implementation for every engine.

``HostCalls`` is one pod's side of the ABI: the functions of abi.IMPORTS and the
state they keep between calls - the request of the running ``k32_handle``, the
event of the running ``k32_event``, the pod's channel handles and open files.  The
pod (pod.py) owns the lifecycle and reads this state for blockers and snapshots.

Invariants:
- Every function takes the signed i32 arguments of its signature and returns an
  int; none raises: :meth:`functions` wraps each one so that a Python failure
  becomes K32_EINTERNAL.  An engine only adapts the calling convention.
- Memory goes through the engine instance's bounds-checked ``read``/``write``: a
  (pointer, length) that leaves linear memory is K32_EINVAL, never a trap.
- They run on the pod's call thread, inside a Wasm call; channels and files are
  touched there only, except for :meth:`open_files` (any thread, under the lock)
  and the restore and close the pod does while no call runs.
"""
from __future__ import annotations

import re
import threading
import time
from typing import TYPE_CHECKING, Any, Callable, Iterable

from kube32 import snapshot as k32s

from . import abi
from .host import Endpoint, HostServices, random_bytes
from .types import HttpRequest, HttpResponse, PodConfig

_TOKEN = re.compile(r"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$")   # an HTTP field name (RFC 9110 token)

if TYPE_CHECKING:
    from .engine import HostFunction, Instance


def now_ms() -> int:
    """The monotonic clock every pod clock counts from."""
    return time.monotonic_ns() // 1_000_000


class Exchange:
    """The request of the running k32_handle call and the response it builds."""

    __slots__ = ("request", "status", "headers", "body")

    def __init__(self, request: HttpRequest) -> None:
        self.request = request
        self.status = 200
        self.headers: list[tuple[str, str]] = []
        self.body = bytearray()

    def response(self) -> HttpResponse:
        return HttpResponse(self.status, tuple(self.headers), bytes(self.body))


class _File:
    __slots__ = ("path", "data", "pos")

    def __init__(self, path: str, data: bytes) -> None:
        self.path, self.data, self.pos = path, data, 0


class HostCalls:
    """One pod's ABI host functions and the state they keep (see the module docstring)."""

    def __init__(self, pod: Any, config: PodConfig, host: HostServices, clock: Callable[[], int],
                 stop: threading.Event) -> None:
        self.pod = pod                  # what HostServices.log/publish are told about
        self.config = config
        self.host = host
        self.clock = clock              # the pod clock: what k32_time_ms returns
        self.stop = stop                # set when the pod stops: ends a k32_sleep_ms
        self.instance: "Instance | None" = None
        self.exchange: Exchange | None = None
        self.event: tuple[bytes, bytes] | None = None
        self.channels: dict[int, Endpoint] = {}
        self._next_channel = 1
        self._files: dict[int, _File] = {}
        self._next_fd = abi.FIRST_FD
        self._lock = threading.Lock()

    # -- what the pod uses ---------------------------------------------------------------
    def functions(self, names: Iterable[str]) -> dict[str, "HostFunction"]:
        """The host functions for these import names (all in abi.IMPORTS: the runtime
        refused any other), each wrapped so it never raises."""
        return {name: self._safe(getattr(self, name)) for name in names if name in abi.IMPORTS}

    @staticmethod
    def _safe(impl: Callable[..., int]) -> "HostFunction":
        def call(*args: int) -> int:
            try:
                return impl(*args)
            except BaseException:  # noqa: BLE001 - nothing may escape into Wasm
                return abi.K32_EINTERNAL
        call.__name__ = impl.__name__
        return call

    def open_files(self) -> list[str]:
        with self._lock:
            return [f"open file {f.path} (descriptor {fd})" for fd, f in sorted(self._files.items())]

    def channel_states(self) -> tuple["k32s.ChannelState", ...]:
        return tuple(k32s.ChannelState(h, e.name) for h, e in sorted(self.channels.items()))

    def reopen_channels(self, states: Iterable["k32s.ChannelState"]) -> None:
        """A restore: each channel open again by name under the handle it had.

        Only channels a pod could have opened (the snapshot reader refuses others; this
        holds for any caller): at most MAX_CHANNELS in all, distinct handles, valid names
        - else ValueError and nothing opened.  Every endpoint registered is one the pod
        keeps (so :meth:`close` gives back all of them)."""
        wanted = list(states)
        handles = {ch.handle for ch in wanted}
        if len(self.channels) + len(wanted) > abi.MAX_CHANNELS or len(handles) != len(wanted) \
                or handles & self.channels.keys():
            raise ValueError(f"a pod has at most {abi.MAX_CHANNELS} channels open, each under its own handle")
        for ch in wanted:
            if not 1 <= ch.handle <= k32s.MAX_CHANNEL_HANDLE or not 1 <= len(ch.name.encode()) <= abi.MAX_CHANNEL_NAME:
                raise ValueError(f"channel {ch.handle} ({ch.name[:40]!r}) is not one a pod can open")
        for ch in wanted:
            self.channels[ch.handle] = self.host.channels.open(self.config.namespace, ch.name)
        self._next_channel = max([self._next_channel] + [h + 1 for h in self.channels])

    def close(self) -> None:
        """Close the pod's channels and files (it stopped, failed or exited)."""
        for endpoint in list(self.channels.values()):
            endpoint.close()
        self.channels.clear()
        with self._lock:
            self._files.clear()

    # -- memory helpers ----------------------------------------------------------------
    def _size(self) -> int:
        assert self.instance is not None
        return self.instance.memory_size()

    def _read(self, ptr: int, length: int) -> bytes | None:
        if ptr < 0 or length < 0 or self.instance is None:
            return None
        return self.instance.read(ptr, length)

    def _text(self, ptr: int, length: int) -> str | None:
        raw = self._read(ptr, length)
        if raw is None:
            return None
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            return None

    def _put(self, ptr: int, length: int, value: bytes) -> int:
        """Copy up to *length* bytes of *value* to *ptr*; the full length of value."""
        if ptr < 0 or length < 0:
            return abi.K32_EINVAL
        n = min(length, len(value))
        if ptr + n > self._size():
            return abi.K32_EINVAL
        if n and not self.instance.write(ptr, value[:n]):  # type: ignore[union-attr]
            return abi.K32_EINVAL
        return len(value)

    def _request(self) -> HttpRequest | None:
        return self.exchange.request if self.exchange is not None else None

    # -- the host functions (module "k32"); each returns an int -----------------------------
    def k32_time_ms(self) -> int:
        return self.clock()

    def k32_sleep_ms(self, ms: int) -> int:
        if ms > 0 and self.stop.wait(ms / 1000):
            return abi.K32_ESTATE
        return abi.K32_OK

    def k32_log(self, ptr: int, length: int) -> int:
        raw = self._read(ptr, length)
        if raw is None:
            return abi.K32_EINVAL
        self.host.log(self.pod, raw.decode("utf-8", "replace").rstrip("\n"))
        return abi.K32_OK

    def k32_env(self, nptr: int, nlen: int, buf: int, length: int) -> int:
        name = self._text(nptr, nlen)
        if name is None:
            return abi.K32_EINVAL
        value = self.config.env.get(name)
        if value is None:
            return abi.K32_ENOENT
        return self._put(buf, length, value.encode())

    def k32_random(self, buf: int, length: int) -> int:
        if length < 0 or length > abi.MAX_MESSAGE:
            return abi.K32_E2BIG if length > 0 else abi.K32_EINVAL
        return self._put(buf, length, random_bytes(self.host, length))

    def k32_req_method(self, buf: int, length: int) -> int:
        req = self._request()
        return abi.K32_ESTATE if req is None else self._put(buf, length, req.method.encode())

    def k32_req_path(self, buf: int, length: int) -> int:
        req = self._request()
        return abi.K32_ESTATE if req is None else self._put(buf, length, req.path.encode())

    def k32_req_query(self, buf: int, length: int) -> int:
        req = self._request()
        return abi.K32_ESTATE if req is None else self._put(buf, length, req.query.encode())

    def k32_req_header(self, nptr: int, nlen: int, buf: int, length: int) -> int:
        req = self._request()
        if req is None:
            return abi.K32_ESTATE
        name = self._text(nptr, nlen)
        if name is None:
            return abi.K32_EINVAL
        wanted = name.lower()
        for key, value in req.headers:
            if key.lower() == wanted:
                return self._put(buf, length, value.encode())
        return abi.K32_ENOENT

    def k32_req_headers(self, buf: int, length: int) -> int:
        req = self._request()
        if req is None:
            return abi.K32_ESTATE
        return self._put(buf, length, "".join(f"{k}: {v}\n" for k, v in req.headers).encode())

    def k32_req_body_len(self) -> int:
        req = self._request()
        return abi.K32_ESTATE if req is None else len(req.body)

    def k32_req_body(self, buf: int, length: int, offset: int) -> int:
        req = self._request()
        if req is None:
            return abi.K32_ESTATE
        if offset < 0 or length < 0:
            return abi.K32_EINVAL
        return self._put(buf, length, req.body[offset:offset + length])

    def k32_resp_status(self, code: int) -> int:
        if self.exchange is None:
            return abi.K32_ESTATE
        if not 100 <= code <= 599:
            return abi.K32_EINVAL
        self.exchange.status = code
        return abi.K32_OK

    def k32_resp_header(self, nptr: int, nlen: int, vptr: int, vlen: int) -> int:
        if self.exchange is None:
            return abi.K32_ESTATE
        name, value = self._text(nptr, nlen), self._text(vptr, vlen)
        if not name or value is None or not _TOKEN.match(name) or any(c in value for c in "\r\n\0"):
            return abi.K32_EINVAL   # a name is an HTTP token (RFC 9110): no space, no separator
        self.exchange.headers.append((name, value))
        return abi.K32_OK

    def k32_resp_body(self, ptr: int, length: int) -> int:
        if self.exchange is None:
            return abi.K32_ESTATE
        raw = self._read(ptr, length)
        if raw is None:
            return abi.K32_EINVAL
        if len(self.exchange.body) + len(raw) > abi.MAX_RESPONSE_BODY:
            return abi.K32_E2BIG
        self.exchange.body += raw
        return len(raw)

    def k32_event_topic(self, buf: int, length: int) -> int:
        if self.event is None:
            return abi.K32_ESTATE
        return self._put(buf, length, self.event[0])

    def k32_event_payload(self, buf: int, length: int, offset: int) -> int:
        if self.event is None:
            return abi.K32_ESTATE
        if offset < 0 or length < 0:
            return abi.K32_EINVAL
        return self._put(buf, length, self.event[1][offset:offset + length])

    def k32_publish(self, tptr: int, tlen: int, pptr: int, plen: int) -> int:
        topic = self._text(tptr, tlen)
        payload = self._read(pptr, plen)
        if not topic or payload is None:
            return abi.K32_EINVAL
        if plen > abi.MAX_MESSAGE:
            return abi.K32_E2BIG
        self.host.publish(self.pod, topic, payload)
        return abi.K32_OK

    def kube32_channel_open(self, nptr: int, nlen: int) -> int:
        name = self._text(nptr, nlen)
        if not name or len(name.encode()) > abi.MAX_CHANNEL_NAME:
            return abi.K32_EINVAL
        if len(self.channels) >= abi.MAX_CHANNELS:
            return abi.K32_ENOSPC
        handle = self._next_channel
        self._next_channel += 1
        self.channels[handle] = self.host.channels.open(self.config.namespace, name)
        return handle

    def kube32_channel_send(self, handle: int, ptr: int, length: int) -> int:
        endpoint = self.channels.get(handle)
        if endpoint is None:
            return abi.K32_EBADF
        if length > abi.MAX_MESSAGE:
            return abi.K32_E2BIG
        message = self._read(ptr, length)
        if message is None:
            return abi.K32_EINVAL
        return endpoint.send(message)

    def kube32_channel_receive(self, handle: int, buf: int, length: int) -> int:
        endpoint = self.channels.get(handle)
        if endpoint is None:
            return abi.K32_EBADF
        size = endpoint.next_length()
        if size is None:
            return abi.K32_EAGAIN
        if size > length:
            return size            # too small: the message stays queued
        if buf < 0 or buf + size > self._size():
            return abi.K32_EINVAL
        message = endpoint.receive()
        return self._put(buf, length, message or b"")

    def kube32_channel_close(self, handle: int) -> int:
        endpoint = self.channels.pop(handle, None)
        if endpoint is None:
            return abi.K32_EBADF
        endpoint.close()
        return abi.K32_OK

    def k32_fs_open(self, ptr: int, length: int) -> int:
        path = self._text(ptr, length)
        if path is None or ".." in path.split("/"):   # never climb out of a volume
            return abi.K32_EINVAL
        assets = self.config.assets
        data = assets.get(path)
        if data is None:
            data = assets.get(path.lstrip("/"))
        if data is None:
            return abi.K32_ENOENT
        with self._lock:
            if len(self._files) >= abi.MAX_OPEN_FILES:
                return abi.K32_ENOSPC
            fd = self._next_fd
            self._next_fd += 1
            self._files[fd] = _File(path, bytes(data))
        return fd

    def k32_fs_size(self, fd: int) -> int:
        f = self._files.get(fd)
        return abi.K32_EBADF if f is None else len(f.data)

    def k32_fs_read(self, fd: int, buf: int, length: int) -> int:
        f = self._files.get(fd)
        if f is None:
            return abi.K32_EBADF
        if length < 0:
            return abi.K32_EINVAL
        n = self._put(buf, length, f.data[f.pos:f.pos + length])
        if n >= 0:
            f.pos += n
        return n

    def k32_fs_close(self, fd: int) -> int:
        with self._lock:
            f = self._files.pop(fd, None)
        return abi.K32_EBADF if f is None else abi.K32_OK
