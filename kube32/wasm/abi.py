"""The pod ABI in one table: what a pod may import from module ``k32``, what it
exports, and the error codes.  docs/pod-abi.md and sdk/c/k32.h describe the same
table for pod authors; keep the three in step.

Conventions (invariants the host keeps):
- Every import returns a value; none ever traps or raises into Wasm.  A negative
  i32 is an error code below; a non-negative one is a length, count or handle.
- Buffers are pull-style: the pod passes (pointer, length); the host copies at
  most ``length`` bytes and returns the full length of the value, so a pod whose
  buffer was too small sees a return value larger than its buffer and can retry.
- A (pointer, length) pair that leaves linear memory gives K32_EINVAL, never a trap.
"""
from __future__ import annotations

from kube32 import snapshot as k32s

I32, I64 = 0x7F, 0x7E

K32_OK = 0
K32_EINVAL = -1      # pointer/length outside linear memory, bad UTF-8, bad argument
K32_ENOENT = -2      # no such header, environment variable, asset or channel
K32_EBADF = -3       # unknown channel handle or file descriptor
K32_EAGAIN = -4      # nothing to receive yet
K32_ENOSPC = -5      # too many open channels/files, or a queue is full
K32_ESTATE = -6      # not available in this call (e.g. request access outside k32_handle)
K32_E2BIG = -7       # a message or value is larger than the host accepts
K32_EINTERNAL = -8   # the host failed; the pod may retry later

ERROR_NAMES = {
    K32_EINVAL: "K32_EINVAL", K32_ENOENT: "K32_ENOENT", K32_EBADF: "K32_EBADF",
    K32_EAGAIN: "K32_EAGAIN", K32_ENOSPC: "K32_ENOSPC", K32_ESTATE: "K32_ESTATE",
    K32_E2BIG: "K32_E2BIG", K32_EINTERNAL: "K32_EINTERNAL",
}

IMPORT_MODULE = "k32"

# name -> (params, results).  Pointers and lengths are i32.
IMPORTS: dict[str, tuple[tuple[int, ...], tuple[int, ...]]] = {
    "k32_time_ms": ((), (I64,)),
    "k32_sleep_ms": ((I32,), (I32,)),
    "k32_log": ((I32, I32), (I32,)),
    "k32_env": ((I32, I32, I32, I32), (I32,)),
    "k32_random": ((I32, I32), (I32,)),
    "k32_req_method": ((I32, I32), (I32,)),
    "k32_req_path": ((I32, I32), (I32,)),
    "k32_req_query": ((I32, I32), (I32,)),
    "k32_req_header": ((I32, I32, I32, I32), (I32,)),
    "k32_req_headers": ((I32, I32), (I32,)),
    "k32_req_body_len": ((), (I32,)),
    "k32_req_body": ((I32, I32, I32), (I32,)),
    "k32_resp_status": ((I32,), (I32,)),
    "k32_resp_header": ((I32, I32, I32, I32), (I32,)),
    "k32_resp_body": ((I32, I32), (I32,)),
    "k32_event_topic": ((I32, I32), (I32,)),
    "k32_event_payload": ((I32, I32, I32), (I32,)),
    "k32_publish": ((I32, I32, I32, I32), (I32,)),
    "kube32_channel_open": ((I32, I32), (I32,)),
    "kube32_channel_send": ((I32, I32, I32), (I32,)),
    "kube32_channel_receive": ((I32, I32, I32), (I32,)),
    "kube32_channel_close": ((I32,), (I32,)),
    "k32_fs_open": ((I32, I32), (I32,)),
    "k32_fs_size": ((I32,), (I32,)),
    "k32_fs_read": ((I32, I32, I32), (I32,)),
    "k32_fs_close": ((I32,), (I32,)),
}

# Exports the host calls, all optional; a request pod has at least one of the first three.
EXPORTS: dict[str, tuple[tuple[int, ...], tuple[int, ...]]] = {
    "k32_handle": ((), ()),
    "k32_tick": ((), ()),
    "k32_event": ((I32, I32), ()),      # (topic length, payload length)
    "k32_init": ((), ()),
    "k32_restored": ((), ()),
}
REQUEST_EXPORTS = ("k32_handle", "k32_tick", "k32_event")
ENTRY_POINTS = ("_start", "app_main", "main")

# Host-side bounds: keep one pod from exhausting the node through the host.
MAX_CHANNELS = k32s.MAX_CHANNELS          # what a snapshot carries at most (K32S v1's bound)
MAX_CHANNEL_NAME = k32s.MAX_CHANNEL_NAME  # bytes of a channel name
MAX_OPEN_FILES = 8
MAX_MESSAGE = 64 * 1024
MAX_INBOX = 64
MAX_RESPONSE_BODY = 16 * 1024 * 1024
MAX_HELD_EVENTS = 8
FIRST_FD = 3
