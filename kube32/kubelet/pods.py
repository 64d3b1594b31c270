"""One pod on this node, from bound to gone: pull, start, restart with back-off, status.

A :class:`PodWorker` is keyed by the pod's UID (never its name: a pod may be
replaced in one write by one of the same name and a new UID on another node, and
this node must then stop the old UID and never touch the new object).  Its task
runs the container's life:

1. pull the image and load it with the digest the pod names
   (failure: waiting ``ErrImagePull``, then ``ImagePullBackOff``, retried with back-off);
2. build the PodConfig (failure: waiting ``CreateContainerConfigError``, retried);
3. start it (a module that is no pod or whose ``k32_init`` traps: terminated
   ``Error`` with the message, then per ``restartPolicy`` waiting
   ``CrashLoopBackOff`` and a back-off restart, or phase ``Failed``);
4. run until the pod exits by itself (a command pod returned: ``Completed``; a trap:
   ``Error``), then restart per ``restartPolicy`` or end in ``Succeeded``/``Failed``.

A container image is one of the pod spec's mutable fields (``kubectl set image``,
``kubectl patch``).  As Kubernetes' kubelet does, a worker whose pod's image changed
ends the container ("Container main definition changed, will be restarted", event
``Killing``), counts a restart and starts the new image at once, whatever the
``restartPolicy``: a fresh start with ``k32_init`` (the state of another module is
not this one's); a back-off or a failing pull of the old image is cut short.  A
frozen container (a move's snapshot is being taken of it) restarts once it thaws:
the snapshot is of the module that ran, and the move refuses to hand it to the new
image (kube32.controllers.imagecheck).  ``status.containerStatuses[].image`` is the
image of the container that runs.

A pod with ``kube32.io/restore-from`` restores instead of step 3 (never restarted when
that fails: ``RestoreError``).  Its first start takes a :class:`~.restore.RestorePlan` from
the node's :class:`~.restore.RestoreSource` (the move's prefetch, kube32.kubelet.prefetch):
the restore the prefetch began before this pod existed, or a fetch of the data by the
plan itself; the worker runs the plan's steps the same way whichever it is.

A worker owns its container's freeze state (a checkpoint freezes it:
kube32.kubelet.migration): :meth:`PodWorker.freeze` and :meth:`PodWorker.thaw`,
:attr:`PodWorker.frozen_since`, and the snapshot's digest kept for one frozen state
(:meth:`PodWorker.snapshot_digest`).  Ready turns False once a freeze is reported
(:data:`FROZEN_REPORT_DELAY`) and True at once on a thaw.

The worker reaches its node only through :class:`~.nodeapi.NodeServices`; each instance
it runs has a :class:`~.podhost.PodHost` of its own, which the worker owns while it runs
the instance (the pod's log lines go to :attr:`PodWorker.logs`).

Status is written as Kubernetes' kubelet writes it, through ``pods/<name>/status``
with a JSON patch whose first operation tests ``metadata.uid``: a status write can
never land on a replacement pod of the same name.  Writes happen on every state
change (and are skipped when nothing changed).
"""
from __future__ import annotations

import asyncio
import datetime as dt
import logging
import time
from typing import Any

from .. import objects, testing
from ..aio import wait_set
from ..client import PODS, ApiError
from ..snapshot import HeldEvent
from ..terms import IMAGE_REFERENCE_PREFIX, Annotation, Condition, ContainerReason, PodPhase
from ..timing import FROZEN_REPORT_DELAY
from ..wasm import ImageError, Module, Pod, PodConfig, PodError, StartTimeout
from .images import PullError
from .logs import LogBuffer
from .nodeapi import NodeServices
from .podhost import host_of
from .podspec import ConfigError
from .restore import RestoreError, RestorePlan, RestoreSource

log = logging.getLogger("kube32.kubelet.pods")

FIRST_REPORT_GRACE = 0.05  # s
FROZEN_RESTART_POLL = 0.2  # s: how often a frozen container whose image changed looks for its thaw
STARTED_EVENT_WAIT = 1.0  # s: the Started event waits this long at most for the Running status


def now() -> str:
    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


class PodWorker:
    def __init__(self, node: NodeServices, restores: RestoreSource, pod: dict[str, Any]) -> None:
        self.node = node
        self.restores = restores
        self.pod = pod
        md = pod["metadata"]
        self.uid: str = md["uid"]
        self.namespace: str = md["namespace"]
        self.name: str = md["name"]
        self.container: str = (pod["spec"].get("containers") or [{}])[0].get("name", "main")
        self.image: str = self._spec_image()  # the image of the container that runs (or starts)
        self._respec = asyncio.Event()  # the pod's image is no longer self.image
        self.logs = LogBuffer(asyncio.get_running_loop(), node.options.log_lines)
        self.instance: Pod | None = None
        self.restart_count = 0
        self.state: dict[str, Any] = {"waiting": {"reason": ContainerReason.CONTAINER_CREATING}}
        self.last_state: dict[str, Any] = {}
        self.image_id = ""
        self.phase = PodPhase.PENDING
        self.start_time = now()
        self.started = False
        self._terminating = False
        self._transitions: dict[str, tuple[str, str]] = {}
        self._written: Any = None
        self._dirty = asyncio.Event()
        self._reported = asyncio.Event()  # set by each status write
        self._created = asyncio.Event()  # the container left ContainerCreating (started, failed...)
        self._pull_failures = 0
        self._restore_tried = False
        self._frozen_since: float | None = None     # monotonic time a checkpoint froze it
        self._digest: tuple[Any, str] | None = None  # ((frozen_since, held events), trailer hex)
        self._task = asyncio.create_task(self._run(), name=f"pod {self.namespace}/{self.name}")
        self._status_task = asyncio.create_task(self._status_loop(), name=f"status {self.namespace}/{self.name}")
        self.changed()

    # --- lifecycle ---------------------------------------------------------------
    @property
    def policy(self) -> str:
        return objects.spec(self.pod).get("restartPolicy", "Always")

    @property
    def ready(self) -> bool:
        inst = self.instance
        return ("running" in self.state and inst is not None and not inst.frozen
                and inst.state in ("running", "starting"))

    @property
    def terminating(self) -> bool:
        """The worker is stopping (:meth:`stop`): its pod left the node or is being deleted."""
        return self._terminating

    def _spec_image(self) -> str:
        return (self.pod["spec"].get("containers") or [{}])[0].get("image", "")

    def update(self, pod: dict[str, Any]) -> None:
        self.pod = pod
        if self._spec_image() != self.image:
            self._respec.set()

    def changed(self) -> None:
        """Something the status shows changed: write it soon (and tell the node)."""
        if (self.state.get("waiting") or {}).get("reason") != ContainerReason.CONTAINER_CREATING:
            self._created.set()
        self._dirty.set()
        self.node.node_changed()

    async def _run(self) -> None:
        backoff = self.node.options.backoff_base
        try:
            while True:
                outcome = await self._attempt()
                if outcome == "done":
                    return
                if outcome == "respec" or self._respec.is_set():
                    continue  # a new image starts at once, with no back-off of the old one's
                delay = backoff
                backoff = min(backoff * 2, self.node.options.backoff_max)
                if outcome == "crash":
                    self.state = {"waiting": {"reason": "CrashLoopBackOff", "message":
                                  f"back-off {delay:g}s restarting failed container={self.container} "
                                  f"pod={self.name}_{self.namespace}({self.uid})"}}
                    self.changed()
                await wait_set(self._respec, delay)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 - a kubelet bug must show on the pod, not kill the node
            log.exception("pod %s/%s", self.namespace, self.name)
            self._terminated(1, ContainerReason.ERROR, f"kubelet error: {type(e).__name__}: {e}")
            self.phase = PodPhase.FAILED
            self.changed()

    async def _attempt(self) -> str:
        """One try at running the container: "done", "retry" (pull/config), "crash" or
        "respec" (the image changed while it ran)."""
        self._respec.clear()
        self.image = self._spec_image()
        plan = await self._restore_plan()
        try:
            return await self._attempt_with(plan)
        finally:
            if plan is not None:
                await plan.close()

    async def _restore_plan(self) -> RestorePlan | None:
        """How this start restores; None: it starts afresh with k32_init.  Only the first
        start of this pod restores (a start that failed before its restore began tries
        again); a container that restarts later starts afresh."""
        checkpoint = None if self._restore_tried else \
            objects.annotations(self.pod).get(Annotation.RESTORE_FROM)
        return await self.restores.plan(self.namespace, checkpoint) if checkpoint else None

    async def _attempt_with(self, plan: RestorePlan | None) -> str:
        module = await self._module(plan)
        if isinstance(module, str):
            return module
        if plan is not None:
            plan.fetch_early()
        config = await self._config()
        if config is None:
            return "retry"
        try:
            instance = plan.instance(self.image, module, config) if plan is not None else \
                self.node.new_instance(module, config)
        except PodError as e:
            return self._crashed(str(e))
        exit_future = self._take(instance)
        started_at = now()
        self.phase = PodPhase.RUNNING
        try:
            await self._start(instance, plan)
        except RestoreError as e:
            # Not restarted: a second try would start the pod afresh, losing the state.
            self._forget_instance()
            self._terminated(1, ContainerReason.RESTORE_ERROR, str(e), started_at)
            self.phase = PodPhase.FAILED
            self.changed()
            await self.node.events.record(self.pod, "Warning", ContainerReason.RESTORE_ERROR, str(e))
            return "done"
        except StartTimeout as e:
            # The container never started (a start function or k32_init that loops): said
            # as Kubernetes says a container that failed to start.
            self._forget_instance()
            self.node.spawn(self.node.events.record(self.pod, "Warning", ContainerReason.FAILED_EVENT,
                                                    f"Error: {e}"))
            return self._crashed(str(e), started_at, ContainerReason.START_ERROR)
        except PodError as e:
            self._forget_instance()
            return self._crashed(str(e), started_at)
        await self._report_started(f" (restored from checkpoint {plan.checkpoint})" if plan is not None else "",
                                   started_at)
        ended = await self._until_exit(exit_future)
        if ended is None:
            return await self._restart_for_new_image(instance, started_at)
        return self._ended(*ended, started_at)

    async def _start(self, instance: Pod, plan: RestorePlan | None) -> None:
        """k32_init, or the plan's restore (PodError, RestoreError)."""
        if plan is None:
            await asyncio.to_thread(instance.start)
            return
        self._restore_tried = True
        await plan.restore(instance)

    async def _module(self, plan: RestorePlan | None) -> Module | str:
        """The module of the pod's image (the plan's when prepared for it), or the attempt's
        outcome when there is none."""
        try:
            if plan is not None and testing.crashes_restores(self.node.options.faults):
                raise ImageError(testing.CRASH_RESTORES_MESSAGE)
            module = plan.module_for(self.image) if plan is not None else None
            if module is None:
                module = await self.node.load_module(self.image, self.pod["metadata"].get("annotations") or {})
        except (PullError, ImageError) as e:
            if isinstance(e, ImageError) and "digest mismatch" not in str(e):
                return self._crashed(f"image {self.image} is no pod: {e}")
            self._pull_failures += 1
            reason = ContainerReason.ERR_IMAGE_PULL if self._pull_failures == 1 else ContainerReason.IMAGE_PULL_BACK_OFF
            self.state = {"waiting": {"reason": reason, "message": str(e)}}
            self.changed()
            await self.node.events.record(self.pod, "Warning", "Failed", f"Failed to pull image \"{self.image}\": {e}")
            return "retry"
        self._pull_failures = 0
        self.image_id = IMAGE_REFERENCE_PREFIX + module.sha256
        return module

    async def _config(self) -> PodConfig | None:
        """The pod's config on this node; None when it cannot be built (the reason shows)."""
        try:
            return await self.node.config_for(self.pod)
        except ConfigError as e:
            self.state = {"waiting": {"reason": "CreateContainerConfigError", "message": str(e)}}
            self.changed()
            await self.node.events.record(self.pod, "Warning", "Failed", f"Error: {e}")
            return None

    def _take(self, instance: Pod) -> asyncio.Future:
        """``instance`` is now this worker's container: its host's, its exit's."""
        loop = asyncio.get_running_loop()
        exit_future: asyncio.Future = loop.create_future()

        def ended(code: int, reason: str, message: str) -> None:
            if not exit_future.done():
                exit_future.set_result((code, reason, message))

        def on_exit(code: int, reason: str, message: str) -> None:   # on the pod's thread
            loop.call_soon_threadsafe(ended, code, reason, message)

        instance.on_exit = on_exit
        host_of(instance).attach(f"pod/{self.uid}", self._logged)
        self.instance = instance
        return exit_future

    def _logged(self, line: str) -> None:   # on the pod's thread
        self.logs.append(line, self.restart_count)

    async def _report_started(self, how: str, started_at: str) -> None:
        self.started = True
        self.state = {"running": {"startedAt": started_at}}
        self._reported.clear()
        self.changed()
        # The Running status first, the Started event after it: the status is what the
        # control plane (a move's completion, a Service's endpoints) waits for.
        await wait_set(self._reported, STARTED_EVENT_WAIT)
        await self.node.events.record(self.pod, "Normal", "Started", f"Started container {self.container}{how}")

    def _ended(self, code: int, reason: str, message: str, started_at: str) -> str:
        """The container ended by itself: "done", or "crash" to restart it per the policy."""
        self._forget_instance()
        self.started = False
        self._terminated(code, reason, message, started_at)
        restart = self.policy == "Always" or (self.policy == "OnFailure" and code != 0)
        if not restart:
            self.phase = PodPhase.SUCCEEDED if code == 0 else PodPhase.FAILED
            self.changed()
            return "done"
        self.restart_count += 1
        self.last_state, self.state = self.state, {}
        return "crash"

    async def _until_exit(self, exit_future: asyncio.Future) -> tuple[int, str, str] | None:
        """How the container ended by itself, or None when the pod's image changed first
        (the container still runs; a frozen one is waited for until it thaws)."""
        while True:
            respec = asyncio.ensure_future(self._respec.wait())
            try:
                await asyncio.wait({exit_future, respec}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                respec.cancel()
            if exit_future.done():
                return exit_future.result()
            inst = self.instance
            if inst is None or not inst.frozen:
                return None
            await asyncio.sleep(FROZEN_RESTART_POLL)

    async def _restart_for_new_image(self, instance: Pod, started_at: str) -> str:
        """Kubernetes' kubelet on a changed container spec: kill, count a restart, start anew."""
        message = f"Container {self.container} definition changed, will be restarted"
        await self.node.events.record(self.pod, "Normal", "Killing", message)
        await asyncio.to_thread(instance.stop)
        self._forget_instance()
        self.started = False
        self._terminated(0, ContainerReason.COMPLETED, message, started_at)
        self.restart_count += 1
        self.last_state, self.state = self.state, {"waiting": {"reason": ContainerReason.CONTAINER_CREATING}}
        self.changed()
        return "respec"

    def _crashed(self, message: str, started_at: str | None = None,
                 reason: str = ContainerReason.ERROR) -> str:
        self._terminated(1, reason, message, started_at)
        self.node.spawn(self.node.events.record(self.pod, "Warning", "BackOff", message))
        if self.policy == "Never":
            self.phase = PodPhase.FAILED
            self.changed()
            return "done"
        self.restart_count += 1
        self.last_state, self.state = self.state, {}
        self.phase = PodPhase.RUNNING
        return "crash"

    def _terminated(self, code: int, reason: str, message: str, started_at: str | None = None) -> None:
        self.state = {"terminated": {"exitCode": code, "reason": reason, "message": message,
                                     "startedAt": started_at or now(), "finishedAt": now(),
                                     "containerID": self._container_id()}}
        self.logs.end_run(self.restart_count)   # its follows (kubectl logs -f) end
        self.changed()

    def _forget_instance(self) -> None:
        inst, self.instance = self.instance, None
        if inst is not None:
            host_of(inst).detach()
            inst.stop()   # already ended by itself: returns at once

    def _container_id(self) -> str:
        return f"wasm://{self.uid}/{self.container}/{self.restart_count}"

    async def stop(self) -> None:
        """Stop the container (and this worker's tasks); the API object is not touched."""
        self._terminating = True
        self._task.cancel()
        try:
            await self._task
        except (asyncio.CancelledError, Exception):
            pass
        inst, self.instance = self.instance, None
        if inst is not None:
            host_of(inst).detach()
            await asyncio.to_thread(inst.stop)
        self._status_task.cancel()
        try:
            await self._status_task
        except (asyncio.CancelledError, Exception):
            pass
        self.logs.close()

    # --- freeze state (a checkpoint's: kube32.kubelet.migration) -------------------
    @property
    def frozen_since(self) -> float | None:
        """When (monotonic) a checkpoint froze the container; None while it is not frozen."""
        return self._frozen_since

    async def freeze(self, instance: Pod, timeout_ms: int) -> None:
        """Freeze ``instance``, this worker's container as the caller found it, once its
        current call returns (CallTimeout, PodError as :meth:`Pod.freeze`: the pod then
        keeps running).  A container frozen already stays as it is, with its freeze time."""
        was_frozen = instance.frozen
        await asyncio.to_thread(instance.freeze, timeout_ms)
        if not was_frozen:
            self._frozen_since = time.monotonic()
            self.frozen_changed()

    async def thaw(self, instance: Pod) -> None:
        """Thaw ``instance`` (frozen by :meth:`freeze`); nothing when it cannot be (it
        stopped meanwhile)."""
        try:
            await asyncio.to_thread(instance.thaw)
        except PodError:
            return
        self._frozen_since = None
        self.frozen_changed()

    def snapshot_digest(self, events: tuple[HeldEvent, ...]) -> str | None:
        """The trailer (hex) of the snapshot taken of this frozen state with these held
        events, when one was taken: a frozen pod's memory, globals and tables never change."""
        key = (self._frozen_since, events)
        return self._digest[1] if self._digest is not None and self._digest[0] == key else None

    def keep_snapshot_digest(self, events: tuple[HeldEvent, ...], digest: str) -> None:
        self._digest = ((self._frozen_since, events), digest)

    def frozen_changed(self) -> None:
        """A freeze or thaw: a thaw's Ready=True is written at once; a freeze's Ready=False
        after FROZEN_REPORT_DELAY (the spec allows 2 s).  A move's source pod is usually
        replaced by then, so the write is not made at all instead of competing with the
        move's own requests; a request routed to the frozen pod meanwhile gets 503 with
        Retry-After, before the replacement and after it (the node's moved-away record)."""
        if self._status_task.done():
            return  # stopped: nothing of this worker is written any more
        inst = self.instance
        if inst is not None and inst.frozen:
            asyncio.get_running_loop().call_later(FROZEN_REPORT_DELAY, self.changed)
        else:
            self.changed()

    # --- status ------------------------------------------------------------------
    def _condition(self, type_: str, ok: bool, reason: str = "") -> dict[str, Any]:
        status = "True" if ok else "False"
        prev = self._transitions.get(type_)
        if prev is None or prev[0] != status:
            prev = (status, now())
            self._transitions[type_] = prev
        cond = {"type": type_, "status": status, "lastProbeTime": None, "lastTransitionTime": prev[1]}
        if not ok and reason:
            cond["reason"] = reason
        return cond

    def status(self) -> dict[str, Any]:
        ready = self.ready
        not_ready = "PodCompleted" if self.phase in PodPhase.TERMINAL else "ContainersNotReady"
        cs: dict[str, Any] = {"name": self.container, "state": self.state, "lastState": self.last_state,
                              "ready": ready, "restartCount": self.restart_count, "image": self.image,
                              "imageID": self.image_id, "started": "running" in self.state}
        if "waiting" not in self.state:
            cs["containerID"] = self._container_id()
        ip = self.node.ip
        return {"phase": self.phase,
                "conditions": [self._condition(Condition.POD_READY_TO_START_CONTAINERS, True),
                               self._condition(Condition.INITIALIZED, True),
                               self._condition(Condition.READY, ready, not_ready),
                               self._condition(Condition.CONTAINERS_READY, ready, not_ready),
                               self._condition(Condition.POD_SCHEDULED, True)],
                "hostIP": ip, "hostIPs": [{"ip": ip}], "podIP": ip, "podIPs": [{"ip": ip}],
                "startTime": self.start_time, "qosClass": "BestEffort",
                "containerStatuses": [cs]}

    async def _status_loop(self) -> None:
        # A new pod's first report waits a moment for its container: one write then says
        # Running, where two (ContainerCreating, then Running) would compete with the
        # start's own requests - a restore's data above all.
        await wait_set(self._created, FIRST_REPORT_GRACE)
        while True:
            # Also look once a second: a freeze or thaw by code that did not call the
            # hook still shows in Ready within about a second.
            await wait_set(self._dirty, 1.0)
            self._dirty.clear()
            status = self.status()
            if status == self._written:
                self._reported.set()
                continue
            try:
                await self.node.client.patch(PODS, self.name, [
                    {"op": "test", "path": "/metadata/uid", "value": self.uid},
                    {"op": "replace", "path": "/status", "value": status}], self.namespace,
                    type="json", subresource="status")
                self._written = status
                self._reported.set()
            except ApiError as e:
                if e.code in (404, 422):   # gone, or the uid test failed: replaced
                    log.debug("pod %s/%s (%s) is gone or replaced: %s", self.namespace, self.name, self.uid, e)
                    self._written = status
                    self._reported.set()
                    continue
                # 409: other writes of the pod won its turn (this patch names no version, so
                # it is not stale): written again, as any other failure, a moment later.
                log.warning("cannot write status of pod %s/%s: %s", self.namespace, self.name, e)
                await asyncio.sleep(1)
                self._dirty.set()
