"""Leader election on a coordination.k8s.io Lease, as client-go's leaderelection package.

Several control planes share one etcd; their controllers and scheduler must run on one
of them at a time, as kube-controller-manager's do.  Each candidate, every
`retry_period`, reads the Lease ``kube-system/kube32-controller-manager``:

* free (no holder, or its record has not changed for `lease_duration` as *this*
  candidate observed it: the local clock of the observer, never the holder's
  renewTime, so clocks need not agree), or its own: it writes itself as the holder with
  a compare-and-swap on the Lease's resourceVersion; two candidates never both win.
* held by another, renewed within `lease_duration`: it waits.

The leader renews every `retry_period`; when a look finds another holder (the Lease
was taken from it) it stops leading at once, and when it could not renew for
`renew_deadline` it stops leading at once (its controllers are cancelled) and becomes a candidate
again, before `lease_duration` has passed for the others (renew_deadline <
lease_duration), so two leaders never run together for longer than the clock rates of
two machines differ.  On a clean stop the leader releases the Lease (holder cleared,
duration 1 s) so another takes over at its next try instead of after
`lease_duration`.  client-go's defaults: 15 s, 10 s, 2 s; a crashed leader is replaced
after at most lease_duration + retry_period.

Fencing: a leader that hung (a stopped process, a machine that paused) wakes with its
controllers' tasks as ready to run as the renewal, and may well run them first.  So the
controllers' writes are checked (:meth:`LeaderElector.fence`, the controllers' client's
guard): once `renew_deadline` has passed since the start of the last renewal that
succeeded, no controller write is sent, whatever ran first after the wake, until a
renewal succeeds again; by then the elector has stopped the controllers if the Lease
was lost.

The identity names the control plane; a control plane restarted with the same
identity (its data directory keeps it) takes its own Lease back at once.
"""
from __future__ import annotations

import asyncio
import datetime as dt
import logging
import time
from dataclasses import dataclass
from typing import Any, Callable, Coroutine

from ..client import LEASES, ApiError, Client
from ..terms import CONTROLLER_MANAGER_LEASE

log = logging.getLogger("kube32.leaderelection")

LEASE_NAME = CONTROLLER_MANAGER_LEASE
LEASE_NAMESPACE = "kube-system"


@dataclass(frozen=True)
class LeaderElectionTimings:
    """kube-controller-manager's --leader-elect-lease-duration, -renew-deadline, -retry-period."""

    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0

    def check(self) -> None:
        if not 0 < self.retry_period < self.renew_deadline < self.lease_duration:
            raise ValueError("leader election needs 0 < retry period < renew deadline < lease duration "
                             f"(got {self.retry_period:g}s, {self.renew_deadline:g}s, {self.lease_duration:g}s)")


def _micro_now() -> str:
    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaderElector:
    """Runs `lead()` while this candidate holds the Lease; cancels it when it stops holding it."""

    def __init__(self, client: Client, identity: str, timings: LeaderElectionTimings = LeaderElectionTimings(),
                 *, name: str = LEASE_NAME, namespace: str = LEASE_NAMESPACE) -> None:
        timings.check()
        self.client = client
        self.identity = identity
        self.timings = timings
        self.name = name
        self.namespace = namespace
        self.leading = asyncio.Event()
        self._observed: tuple[Any, ...] | None = None  # (holder, renewTime, duration) last seen
        self._observed_at = 0.0  # monotonic time it was first seen
        self._renewed_at: float | None = None  # monotonic start of the last successful acquire/renew
        self._held_by: str = ""  # another holder the last look found, within its term

    async def run(self, lead: Callable[[], Coroutine[Any, Any, None]]) -> None:
        """Campaign, lead, and campaign again after a loss, until cancelled (then release)."""
        try:
            while True:
                await self._acquire()
                log.info("%s became the leader (Lease %s/%s)", self.identity, self.namespace, self.name)
                task = asyncio.create_task(lead(), name="leader")
                self.leading.set()
                try:
                    await self._renew_until_lost(task)
                finally:
                    self.leading.clear()
                    task.cancel()
                    await asyncio.gather(task, return_exceptions=True)
                log.warning("%s stopped leading: the Lease was not renewed within %gs",
                            self.identity, self.timings.renew_deadline)
        finally:
            await self._release()

    def fence(self) -> str | None:
        """None while this candidate leads within its renew deadline; otherwise why its
        controllers may not write (see the module docstring)."""
        if not self.leading.is_set() or self._renewed_at is None:
            return f"{self.identity} does not lead (Lease {self.namespace}/{self.name})"
        age = time.monotonic() - self._renewed_at
        if age >= self.timings.renew_deadline:
            return (f"{self.identity} has not renewed the Lease {self.namespace}/{self.name} for {age:.1f}s "
                    f"(renew deadline {self.timings.renew_deadline:g}s): it may no longer lead")
        return None

    async def _acquire(self) -> None:
        while not await self._try_acquire_or_renew():
            await asyncio.sleep(self.timings.retry_period)

    async def _renew_until_lost(self, task: asyncio.Task[None]) -> None:
        renewed = time.monotonic()
        while not task.done():
            await asyncio.wait({task}, timeout=self.timings.retry_period)
            if task.done():
                break
            try:
                ok = await asyncio.wait_for(self._try_acquire_or_renew(),
                                            max(renewed + self.timings.renew_deadline - time.monotonic(), 0.01))
            except TimeoutError:
                ok = False
            if ok:
                renewed = time.monotonic()
            elif self._held_by:
                # Another holds the Lease now: stop at once, not at the renew deadline, so
                # two controller managers never act side by side meanwhile.
                log.warning("%s stopped leading: the Lease names %s", self.identity, self._held_by)
                self._renewed_at = None   # the fence shuts now
                return
            elif time.monotonic() - renewed >= self.timings.renew_deadline:
                return
        if task.done() and not task.cancelled() and task.exception() is not None:
            raise task.exception()  # type: ignore[misc]

    async def _try_acquire_or_renew(self) -> bool:
        started = time.monotonic()
        if await self._try_once():
            self._renewed_at = started
            return True
        return False

    async def _try_once(self) -> bool:
        now = _micro_now()
        try:
            lease = await self.client.get(LEASES, self.name, self.namespace)
        except ApiError as e:
            if e.code != 404:
                log.info("leader election: cannot read the Lease: %s", e)
                return False
            return await self._write(None, now)
        spec = lease.get("spec") or {}
        record = (spec.get("holderIdentity"), spec.get("renewTime"), spec.get("leaseDurationSeconds"))
        if record != self._observed:
            self._observed, self._observed_at = record, time.monotonic()
        holder = spec.get("holderIdentity") or ""
        duration = float(spec.get("leaseDurationSeconds") or self.timings.lease_duration)
        self._held_by = ""
        if holder and holder != self.identity and time.monotonic() - self._observed_at < duration:
            self._held_by = holder
            return False
        return await self._write(lease, now)

    async def _write(self, lease: dict[str, Any] | None, now: str) -> bool:
        spec = dict((lease or {}).get("spec") or {})
        if spec.get("holderIdentity") != self.identity:
            spec["acquireTime"] = now
            spec["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + (1 if lease else 0)
        spec.update(holderIdentity=self.identity, renewTime=now,
                    leaseDurationSeconds=int(round(self.timings.lease_duration)))
        try:
            if lease is None:
                body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                        "metadata": {"name": self.name, "namespace": self.namespace}, "spec": spec}
                await self.client.create(LEASES, body, self.namespace)
            else:
                # The resourceVersion read makes this a compare-and-swap: of two
                # candidates writing the same free Lease, one gets 409.
                await self.client.update(LEASES, {**lease, "spec": spec})
        except ApiError as e:
            if e.code not in (409, 0, 500, 503, 504):
                log.warning("leader election: cannot write the Lease: %s", e)
            return False
        self._observed, self._observed_at = None, time.monotonic()
        return True

    async def _release(self) -> None:
        """Give the Lease up on a clean stop, so another takes over at its next try."""
        try:
            lease = await asyncio.wait_for(self.client.get(LEASES, self.name, self.namespace), 2)
            spec = lease.get("spec") or {}
            if spec.get("holderIdentity") != self.identity:
                return
            spec = {**spec, "holderIdentity": "", "leaseDurationSeconds": 1, "renewTime": _micro_now()}
            await asyncio.wait_for(self.client.update(LEASES, {**lease, "spec": spec}), 2)
        except (ApiError, TimeoutError, asyncio.CancelledError):
            pass
