"""Fault injection for the reliability tests: every fault Kube32 can be made to show, and
the one function through which each is injected.

The product modules hold no fault of their own: where one is injected they call the
injection point below (one line), which does nothing unless the fault was named.  Two
ways to name one, both test-only:

* a worker's ``kube32-sim worker --fault NAME`` (repeatable; the kubelet's
  ``KubeletOptions.faults``), one of :data:`WORKER_FAULTS`:

  - ``corrupt-restores`` flips one byte of every snapshot the node restores, as damage in
    transfer would; the real checks must then refuse it;
  - ``truncate-restores`` ends the download of every restore after 4 KiB;
  - ``hang-restores`` never finishes a restore (a target that never starts the replacement);
  - ``crash-restores`` fails every pod that would restore on the node before its restore
    begins, as a node whose runtime cannot load the module would: the container ends
    terminated with reason Error (not RestoreError) and is restarted with back-off;
  - ``slow-snapshots`` sends half of every snapshot taken for a move (``leave=frozen``) and
    then waits :data:`SLOW_SNAPSHOT_PAUSE` before the rest: a window to kill the node or the
    control plane mid-transfer, or to publish events, and shorter than the 10 s without a
    byte after which the API server gives up on a snapshot
    (``kube32.timing.SNAPSHOT_STALL_SECONDS``), so the move then completes;

* the control plane's environment ``KUBE32_TEST_FAULTS=a,b``, for a Checkpoint labelled
  ``kube32.io/test-fault: <name>`` (both are needed), one of :data:`CONTROL_PLANE_FAULTS`:

  - ``corrupt-stored-data`` flips one byte of the Checkpoint's data once it is stored and
    checked, as damage in storage would (tests/e2e/test_faults.py);
  - ``hold-moving-status`` writes a move's Moving status :data:`HOLD_MOVING_SECONDS` after
    the replacement instead of ``kube32.timing.MOVING_WRITE_DELAY`` (a window to restart
    the control plane between the two: tests/e2e/test_rollbacks.py);
  - ``fast-cron``, for a *CronJob* so labelled: the CronJob controller keeps its schedule
    on a clock that runs :data:`FAST_CRON_SPEED` times as fast as the wall clock from the
    controller's start (kube32.timing.ScaledClock), so a minute of schedule passes in a
    second and an e2e test never waits a real minute (tests/e2e/test_batch.py).  Its
    ``lastScheduleTime`` and Jobs' names are on that clock.

docs/reliability.md lists them for users.  Imports only kube32.terms, kube32.objects and
kube32.timing.
"""
from __future__ import annotations

import asyncio
import mmap
import os
from typing import Any, Awaitable, Callable, Iterable, Protocol

from . import objects, timing
from .terms import Label

# --- worker faults (kube32-sim worker --fault) -------------------------------------
CORRUPT_RESTORES = "corrupt-restores"
TRUNCATE_RESTORES = "truncate-restores"
HANG_RESTORES = "hang-restores"
CRASH_RESTORES = "crash-restores"
SLOW_SNAPSHOTS = "slow-snapshots"
WORKER_FAULTS = (CORRUPT_RESTORES, TRUNCATE_RESTORES, HANG_RESTORES, CRASH_RESTORES, SLOW_SNAPSHOTS)
CRASH_RESTORES_MESSAGE = "injected fault crash-restores: this node cannot load the module of a pod to restore"
SLOW_SNAPSHOT_PAUSE = 8.0   # s; under timing.SNAPSHOT_STALL_SECONDS, so the snapshot still arrives
CORRUPT_AT = 200            # the byte corrupt-restores flips: past the header
TRUNCATE_AFTER = 4096       # the bytes truncate-restores lets through

# --- control plane faults (KUBE32_TEST_FAULTS and the label kube32.io/test-fault) ----
ENV = "KUBE32_TEST_FAULTS"
CORRUPT_STORED_DATA = "corrupt-stored-data"
HOLD_MOVING_STATUS = "hold-moving-status"
FAST_CRON = "fast-cron"
CONTROL_PLANE_FAULTS = (CORRUPT_STORED_DATA, HOLD_MOVING_STATUS, FAST_CRON)
HOLD_MOVING_SECONDS = 30.0
FAST_CRON_SPEED = 60.0


class Readable(Protocol):
    async def read(self, n: int) -> bytes: ...


Write = Callable[[Any], Awaitable[None]]


class _Corrupting:
    """A stream that flips one byte past the header."""

    def __init__(self, inner: Readable, at: int = CORRUPT_AT) -> None:
        self.inner, self.at, self.pos = inner, at, 0

    async def read(self, n: int) -> bytes:
        data = await self.inner.read(n)
        if self.pos <= self.at < self.pos + len(data):
            i = self.at - self.pos
            data = data[:i] + bytes([data[i] ^ 0xFF]) + data[i + 1:]
        self.pos += len(data)
        return data


class _Truncating:
    """A stream that ends after ``limit`` bytes."""

    def __init__(self, inner: Readable, limit: int = TRUNCATE_AFTER) -> None:
        self.inner, self.left = inner, limit

    async def read(self, n: int) -> bytes:
        if self.left <= 0:
            return b""
        data = await self.inner.read(min(n, self.left))
        self.left -= len(data)
        return data


def _slow_writer(write: Write, total: int) -> Write:
    """``write`` that pauses SLOW_SNAPSHOT_PAUSE once half of ``total`` bytes went out."""
    sent = 0

    async def slow(data: Any) -> None:
        nonlocal sent
        view = memoryview(data)
        half = total // 2
        if sent < half <= sent + len(view):
            cut = half - sent
            await write(view[:cut])
            sent += cut
            await asyncio.sleep(SLOW_SNAPSHOT_PAUSE)
            view = view[cut:]
        await write(view)
        sent += len(view)
    return slow


# --- injection points: worker -------------------------------------------------------
async def restore_stream(faults: Iterable[str], stream: Any) -> Any:
    """The stream a restore reads its snapshot from: hangs for ever (hang-restores), or
    damaged (corrupt-restores) or cut short (truncate-restores)."""
    faults = tuple(faults)
    if HANG_RESTORES in faults:
        await asyncio.Event().wait()
    if CORRUPT_RESTORES in faults:
        stream = _Corrupting(stream)
    if TRUNCATE_RESTORES in faults:
        stream = _Truncating(stream)
    return stream


def crashes_restores(faults: Iterable[str]) -> bool:
    """A pod that would restore here fails first (crash-restores; the caller raises the
    runtime's error with CRASH_RESTORES_MESSAGE)."""
    return CRASH_RESTORES in faults


def snapshot_writer(faults: Iterable[str], write: Write, total: int, for_move: bool) -> Write:
    """What a snapshot of ``total`` bytes is written with: paused halfway for a move
    (slow-snapshots), else ``write`` itself."""
    return _slow_writer(write, total) if for_move and SLOW_SNAPSHOTS in faults else write


# --- injection points: control plane ------------------------------------------------
def _checkpoint_fault(ck: dict[str, Any], name: str) -> bool:
    """The fault is named in the environment and on the object (a Checkpoint or CronJob)."""
    return name in os.environ.get(ENV, "").split(",") and objects.labels(ck).get(Label.TEST_FAULT) == name


def cron_speed(cronjob: dict[str, Any]) -> float:
    """How many times as fast as the wall clock the CronJob's schedule runs (fast-cron)."""
    return FAST_CRON_SPEED if _checkpoint_fault(cronjob, FAST_CRON) else 1.0


def corrupts_stored_data(ck: dict[str, Any]) -> bool:
    """The Checkpoint's data is damaged once stored (corrupt-stored-data): it is then served
    from storage only, never while it arrives."""
    return _checkpoint_fault(ck, CORRUPT_STORED_DATA)


def stored_data(ck: dict[str, Any], data: bytearray | mmap.mmap) -> None:
    """The Checkpoint's data as it is stored: one byte flipped under corrupt-stored-data."""
    if corrupts_stored_data(ck):
        data[len(data) // 2] ^= 0xFF


def moving_write_delay(ck: dict[str, Any]) -> float:
    """How long after the replacement a move writes its Moving status."""
    return HOLD_MOVING_SECONDS if _checkpoint_fault(ck, HOLD_MOVING_STATUS) else timing.MOVING_WRITE_DELAY
