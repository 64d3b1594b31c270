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

A pod with ``kube32.io/restore-from`` restores instead of step 3 (never restarted when
that fails: ``RestoreError``).  A move's replacement usually finds its restore begun by
the node's prefetch (kube32.kubelet.prefetch): it then takes the prepared module and
instance, and only finishes the restore when the image and the config it builds in
step 2 are the ones prepared.

Status is written as Kubernetes' kubelet writes it, through ``pods/<name>/status``
with a JSON patch whose first operation tests ``metadata.uid``: a status write can
never land on a replacement pod of the same name.  Writes happen on every state
change (and are skipped when nothing changed).
"""
from __future__ import annotations

import asyncio
import datetime as dt
import logging
from typing import TYPE_CHECKING, Any

from ..aio import wait_set
from ..client import PODS, ApiError
from ..movability import RESTORE_FROM
from ..wasm import ImageError, Pod, PodError
from .images import PullError
from .logs import LogBuffer
from .migration import CRASH_RESTORES_MESSAGE, DataRequest, RestoreError, finish, restore
from .podspec import ConfigError

if TYPE_CHECKING:
    from .kubelet import Kubelet
    from .prefetch import Prepared

log = logging.getLogger("kube32.kubelet.pods")

FIRST_REPORT_GRACE = 0.05  # s
STARTED_EVENT_WAIT = 1.0  # s: the Started event waits this long at most for the Running status


def now() -> str:
    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


class PodWorker:
    def __init__(self, kubelet: "Kubelet", pod: dict[str, Any]) -> None:
        self.kl = kubelet
        self.pod = pod
        md = pod["metadata"]
        self.uid: str = md["uid"]
        self.namespace: str = md["namespace"]
        self.name: str = md["name"]
        self.container: str = (pod["spec"].get("containers") or [{}])[0].get("name", "main")
        self.image: str = (pod["spec"].get("containers") or [{}])[0].get("image", "")
        self.logs = LogBuffer(asyncio.get_running_loop(), kubelet.options.log_lines)
        self.instance: Pod | None = None
        self.restart_count = 0
        self.state: dict[str, Any] = {"waiting": {"reason": "ContainerCreating"}}
        self.last_state: dict[str, Any] = {}
        self.image_id = ""
        self.phase = "Pending"
        self.start_time = now()
        self.started = False
        self.terminating = False
        self._transitions: dict[str, tuple[str, str]] = {}
        self._written: Any = None
        self._dirty = asyncio.Event()
        self._reported = asyncio.Event()  # set by each status write
        self._created = asyncio.Event()  # the container left ContainerCreating (started, failed...)
        self._exit: asyncio.Future | None = None
        self._pull_failures = 0
        self._restore_tried = False
        self._data_request: DataRequest | None = None  # a restore's data GET, sent ahead
        self._prepared: Prepared | None = None  # a restore the move's prefetch began, not yet used
        self.frozen_since: float | None = None     # monotonic time a checkpoint froze it
        self.snapshot_digest: tuple[Any, str] | None = None  # (frozen state, trailer hex)
        self._task = asyncio.create_task(self._run(), name=f"pod {self.namespace}/{self.name}")
        self._status_task = asyncio.create_task(self._status_loop(), name=f"status {self.namespace}/{self.name}")
        self.changed()

    # --- lifecycle ---------------------------------------------------------------
    @property
    def policy(self) -> str:
        return (self.pod.get("spec") or {}).get("restartPolicy", "Always")

    @property
    def ready(self) -> bool:
        inst = self.instance
        return ("running" in self.state and inst is not None and not inst.frozen
                and inst.state in ("running", "starting"))

    def update(self, pod: dict[str, Any]) -> None:
        self.pod = pod

    def changed(self) -> None:
        """Something the status shows changed: write it soon (and tell the node)."""
        if (self.state.get("waiting") or {}).get("reason") != "ContainerCreating":
            self._created.set()
        self._dirty.set()
        self.kl.node_changed()

    async def _run(self) -> None:
        backoff = self.kl.options.backoff_base
        try:
            while True:
                outcome = await self._attempt()
                if outcome == "done":
                    return
                delay = backoff
                backoff = min(backoff * 2, self.kl.options.backoff_max)
                if outcome == "crash":
                    self.state = {"waiting": {"reason": "CrashLoopBackOff", "message":
                                  f"back-off {delay:g}s restarting failed container={self.container} "
                                  f"pod={self.name}_{self.namespace}({self.uid})"}}
                    self.changed()
                await asyncio.sleep(delay)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 - a kubelet bug must show on the pod, not kill the node
            log.exception("pod %s/%s", self.namespace, self.name)
            self._terminated(1, "Error", f"kubelet error: {type(e).__name__}: {e}")
            self.phase = "Failed"
            self.changed()

    async def _attempt(self) -> str:
        """One try at running the container: "done", "retry" (pull/config) or "crash"."""
        try:
            return await self._attempt_once()
        finally:
            if self._data_request is not None:
                request, self._data_request = self._data_request, None
                await request.close()
            if self._prepared is not None:
                prepared, self._prepared = self._prepared, None
                self.kl.prefetch.discard(prepared)

    async def _attempt_once(self) -> str:
        ann = self.pod["metadata"].get("annotations") or {}
        wanted = None if self._restore_tried else self._restore_annotation()
        # A move toward this node began its restore before this pod existed (kube32.kubelet.prefetch).
        begun = self.kl.prefetch.take(self.namespace, wanted) if wanted else None
        self._prepared = await begun if begun is not None else None
        try:
            if wanted and "crash-restores" in self.kl.options.faults:
                raise ImageError(CRASH_RESTORES_MESSAGE)
            if self._prepared is not None and self._prepared.image == self.image:
                module = self._prepared.module
            else:
                module = await self.kl.load_module(self.image, ann)
        except (PullError, ImageError) as e:
            if isinstance(e, ImageError) and "digest mismatch" not in str(e):
                return self._crashed(f"image {self.image} is no pod: {e}")
            self._pull_failures += 1
            reason = "ErrImagePull" if self._pull_failures == 1 else "ImagePullBackOff"
            self.state = {"waiting": {"reason": reason, "message": str(e)}}
            self.changed()
            await self.kl.events.record(self.pod, "Warning", "Failed", f"Failed to pull image \"{self.image}\": {e}")
            return "retry"
        self._pull_failures = 0
        self.image_id = f"kube32.io/wasm-sha256:{module.sha256}"
        if wanted and self._prepared is None:
            # A restore's data request goes out now: its round trip overlaps the config and
            # the instantiation (not before the image is loaded: a slow pull would leave
            # the answer waiting in buffers).
            self._data_request = DataRequest(self.kl, self.namespace, wanted)
        try:
            config = await self.kl.config_for(self.pod)
        except ConfigError as e:
            self.state = {"waiting": {"reason": "CreateContainerConfigError", "message": str(e)}}
            self.changed()
            await self.kl.events.record(self.pod, "Warning", "Failed", f"Error: {e}")
            return "retry"
        prepared, self._prepared = self._prepared, None
        if prepared is not None and (prepared.image != self.image or prepared.config != config):
            # Prepared for another image or config than this pod's: restore by ourselves.
            self.kl.prefetch.discard(prepared)
            prepared = None
            self._data_request = DataRequest(self.kl, self.namespace, wanted) if wanted else None
        loop = asyncio.get_running_loop()
        self._exit = loop.create_future()
        exit_future = self._exit

        def on_exit(code: int, reason: str, message: str) -> None:   # on the pod's thread
            loop.call_soon_threadsafe(lambda: exit_future.done() or exit_future.set_result((code, reason, message)))

        try:
            instance = self.kl.prefetch.claim(prepared) if prepared is not None else \
                Pod(self.kl.runtime, module, self.kl.within_heap(config), self.kl)
        except PodError as e:
            return self._crashed(str(e))
        instance.on_exit = on_exit
        self.instance = instance
        self.kl.instances[id(instance)] = self
        started_at = now()
        self.phase = "Running"
        restore_from = self._restore_from()
        try:
            if restore_from and prepared is not None:
                log.info("restoring %s/%s from checkpoint %s: begun before the replacement arrived",
                         self.namespace, self.name, restore_from)
                await finish(instance, prepared.snapshot)
            elif restore_from:
                if self._data_request is None or self._data_request.checkpoint_name != restore_from:
                    if self._data_request is not None:
                        await self._data_request.close()
                    self._data_request = DataRequest(self.kl, self.namespace, restore_from)
                request, self._data_request = self._data_request, None
                try:
                    await restore(self.kl, instance, request)
                finally:
                    await request.close()
            else:
                await asyncio.to_thread(instance.start)
        except RestoreError as e:
            # Not restarted: a second try would start the pod afresh, losing the state.
            self._forget_instance()
            self._terminated(1, "RestoreError", str(e), started_at)
            self.phase = "Failed"
            self.changed()
            await self.kl.events.record(self.pod, "Warning", "RestoreError", str(e))
            return "done"
        except PodError as e:
            self._forget_instance()
            return self._crashed(str(e), started_at)
        self.started = True
        self.state = {"running": {"startedAt": started_at}}
        self._reported.clear()
        self.changed()
        # The Running status first, the Started event after it: the status is what the
        # control plane (a move's completion, a Service's endpoints) waits for.
        await wait_set(self._reported, STARTED_EVENT_WAIT)
        how = f" (restored from checkpoint {restore_from})" if restore_from else ""
        await self.kl.events.record(self.pod, "Normal", "Started", f"Started container {self.container}{how}")
        code, reason, message = await exit_future
        self._forget_instance()
        self.started = False
        self._terminated(code, reason, message, started_at)
        restart = self.policy == "Always" or (self.policy == "OnFailure" and code != 0)
        if not restart:
            self.phase = "Succeeded" if code == 0 else "Failed"
            self.changed()
            return "done"
        self.restart_count += 1
        self.last_state, self.state = self.state, {}
        return "crash"

    def _restore_from(self) -> str | None:
        """The Checkpoint to restore from: only the first start of this pod does; a
        container that restarts later starts afresh with k32_init."""
        if self._restore_tried:
            return None
        self._restore_tried = True
        return self._restore_annotation()

    def _restore_annotation(self) -> str | None:
        return (self.pod["metadata"].get("annotations") or {}).get(RESTORE_FROM) or None

    def _crashed(self, message: str, started_at: str | None = None) -> str:
        self._terminated(1, "Error", message, started_at)
        self.kl._spawn(self.kl.events.record(self.pod, "Warning", "BackOff", message))
        if self.policy == "Never":
            self.phase = "Failed"
            self.changed()
            return "done"
        self.restart_count += 1
        self.last_state, self.state = self.state, {}
        self.phase = "Running"
        return "crash"

    def _terminated(self, code: int, reason: str, message: str, started_at: str | None = None) -> None:
        self.state = {"terminated": {"exitCode": code, "reason": reason, "message": message,
                                     "startedAt": started_at or now(), "finishedAt": now(),
                                     "containerID": self._container_id()}}
        self.changed()

    def _forget_instance(self) -> None:
        inst = self.instance
        if inst is not None:
            self.kl.instances.pop(id(inst), None)
            inst.stop()   # already ended by itself: returns at once
        self.instance = None

    def _container_id(self) -> str:
        return f"wasm://{self.uid}/{self.container}/{self.restart_count}"

    async def stop(self) -> None:
        """Stop the container (and this worker's tasks); the API object is not touched."""
        self._task.cancel()
        try:
            await self._task
        except (asyncio.CancelledError, Exception):
            pass
        inst, self.instance = self.instance, None
        if inst is not None:
            self.kl.instances.pop(id(inst), None)
            await asyncio.to_thread(inst.stop)
        self._status_task.cancel()
        try:
            await self._status_task
        except (asyncio.CancelledError, Exception):
            pass
        self.logs.close()

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
        not_ready = "PodCompleted" if self.phase in ("Succeeded", "Failed") else "ContainersNotReady"
        cs: dict[str, Any] = {"name": self.container, "state": self.state, "lastState": self.last_state,
                              "ready": ready, "restartCount": self.restart_count, "image": self.image,
                              "imageID": self.image_id, "started": "running" in self.state}
        if "waiting" not in self.state:
            cs["containerID"] = self._container_id()
        ip = self.kl.ip
        return {"phase": self.phase,
                "conditions": [self._condition("PodReadyToStartContainers", True),
                               self._condition("Initialized", True),
                               self._condition("Ready", ready, not_ready),
                               self._condition("ContainersReady", ready, not_ready),
                               self._condition("PodScheduled", True)],
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
                await self.kl.client.patch(PODS, self.name, [
                    {"op": "test", "path": "/metadata/uid", "value": self.uid},
                    {"op": "replace", "path": "/status", "value": status}], self.namespace,
                    type="json", subresource="status")
                self._written = status
                self._reported.set()
            except ApiError as e:
                if e.code in (404, 409, 422):
                    log.debug("pod %s/%s (%s) is gone or replaced: %s", self.namespace, self.name, self.uid, e)
                    self._written = status
                    self._reported.set()
                    continue
                log.warning("cannot write status of pod %s/%s: %s", self.namespace, self.name, e)
                await asyncio.sleep(1)
                self._dirty.set()
