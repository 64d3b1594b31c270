"""``kube32-cli move POD [--to NODE]`` and ``kube32-cli checkpoint POD``.

Both create a Checkpoint (action Move or Save) and follow it live: each phase is
printed as the controller reaches it, then the outcome in plain words: the
freeze-to-running time of a move, the size of a saved snapshot, or the blockers
and the reason of a failure (exit code 1).  After a failed move that replaced the pod
(a rollback), ``move`` also waits, a minute at most, to say whether the pod runs again
with its state or started afresh.
"""
from __future__ import annotations

import argparse
import asyncio
import secrets
import time
from typing import Any

from rich.console import Console

from .. import movability, objects
from . import output
from ..client import CHECKPOINTS, PODS, ApiError, Client
from ..terms import API_VERSION, Annotation, CheckpointAction, CheckpointPhase

TERMINAL = set(CheckpointPhase.FINISHED)
PHASE_WORDS = {
    CheckpointPhase.PENDING: "created, waiting for the controller",
    CheckpointPhase.SAVING: "the node freezes the pod and sends its state",
    CheckpointPhase.SAVED: "the snapshot is stored",
    CheckpointPhase.MOVING: "the replacement is restoring on the target",
    CheckpointPhase.COMPLETED: "the replacement runs on the target",
    CheckpointPhase.FAILED: "refused or rolled back",
}


def _parser(prog: str, move: bool) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog)
    p.add_argument("pod", help="the pod to " + ("move" if move else "checkpoint"))
    if move:
        p.add_argument("--to", dest="node", help="the target node (default: the scheduler picks)")
        p.add_argument("--selector", action="append", default=[], metavar="KEY=VALUE",
                       help="a node label the target must have (repeatable)")
    p.add_argument("-n", "--namespace", default=None, help="the pod's namespace (default: the kubeconfig's)")
    p.add_argument("-c", "--container", help="the container (default: the only one)")
    p.add_argument("--kubeconfig", help="path to the kubeconfig (default: $KUBECONFIG, ~/.kube/config)")
    p.add_argument("--timeout", type=float, default=180, help="seconds to wait for the outcome")
    return p


def _namespace(args: argparse.Namespace) -> str:
    if args.namespace:
        return args.namespace
    import os
    from pathlib import Path

    import yaml
    path = args.kubeconfig or os.environ.get("KUBECONFIG") or str(Path.home() / ".kube" / "config")
    try:
        doc = yaml.safe_load(Path(path).read_text())
        ctx = next(c["context"] for c in doc.get("contexts", []) if c["name"] == doc.get("current-context"))
        return ctx.get("namespace") or "default"
    except (OSError, StopIteration, KeyError, TypeError):
        return "default"


def checkpoint_object(args: argparse.Namespace, action: str) -> dict[str, Any]:
    spec: dict[str, Any] = {"podName": args.pod, "action": action}
    if args.container:
        spec["containerName"] = args.container
    if action == CheckpointAction.MOVE:
        target: dict[str, Any] = {}
        if args.node:
            target["nodeName"] = args.node
        if args.selector:
            target["nodeSelector"] = dict(s.split("=", 1) for s in args.selector)
        if target:
            spec["target"] = target
    suffix = "move" if action == CheckpointAction.MOVE else "save"
    return {"apiVersion": API_VERSION, "kind": "Checkpoint",
            "metadata": {"name": f"{args.pod[:40]}-{suffix}-{secrets.token_hex(3)}"}, "spec": spec}


async def follow(client: Client, ns: str, name: str, console: Console, timeout: float,
                 since: str | None = None) -> dict[str, Any]:
    """Print each phase as it is reached; return the final Checkpoint.

    The watch starts at ``since`` (the resourceVersion of the create), so every phase
    the controller wrote is seen, however fast the move was."""
    last = CheckpointPhase.PENDING if since else None
    waited = ""
    if since:
        console.print(f"  [dim]{0:6.2f}s[/]  [bold]{'Pending':<9}[/] {PHASE_WORDS['Pending']}")
    start = time.monotonic()
    deadline = start + timeout
    while time.monotonic() < deadline:
        try:
            async for etype, ck in client.watch(CHECKPOINTS, ns, field_selector=f"metadata.name={name}",
                                                resource_version=since,
                                                timeout_seconds=max(1, int(deadline - time.monotonic()))):
                since = ck["metadata"].get("resourceVersion", since)
                phase = objects.status(ck).get("phase", CheckpointPhase.PENDING)
                said = objects.status(ck).get("message") or ""
                if phase != last or (phase == CheckpointPhase.PENDING and said and said != waited):
                    # A Pending move says why it waits (its turn, room in the data space).
                    last, waited = phase, said
                    words = said if phase == CheckpointPhase.PENDING and said else PHASE_WORDS.get(phase, "")
                    console.print(f"  [dim]{time.monotonic() - start:6.2f}s[/]  [bold]{phase:<9}[/] {words}")
                if phase in TERMINAL or etype == "DELETED":
                    return ck
        except ApiError as e:
            if e.code not in (0, 410):
                raise
            if e.code == 410:
                since = None  # history compacted: go on from the current state
            await asyncio.sleep(0.2)
    raise TimeoutError(f"no outcome after {timeout:.0f} s (last phase: {last})")


def report(ck: dict[str, Any], console: Console) -> int:
    st = objects.status(ck)
    phase = st.get("phase")
    if phase == CheckpointPhase.COMPLETED:
        took = f"running {st['moveMillis']} ms after the freeze" if "moveMillis" in st else st.get("message", "")
        console.print(f"[bold green]moved[/] {ck['spec']['podName']} from {st.get('nodeName')} to "
                      f"{st.get('targetNode')}: {took}")
        return 0
    if phase == CheckpointPhase.SAVED:
        console.print(f"[bold green]saved[/] {ck['spec']['podName']} on {st.get('nodeName')}: "
                      f"{st.get('sizeBytes', 0)} bytes, pod time {st.get('podTimeMs')} ms, checkpoint "
                      f"{ck['metadata']['name']}")
        return 0
    console.print(f"[bold red]failed:[/] {st.get('message') or 'the checkpoint failed'}")
    for b in st.get("blockers") or []:
        console.print(f"  - {b}")
    return 1


async def _run(args: argparse.Namespace, action: str) -> int:
    console = output.console(highlight=False, soft_wrap=True)
    ns = _namespace(args)
    async with Client.from_kubeconfig(args.kubeconfig, user_agent="kube32-cli") as client:
        try:
            await client.get(PODS, args.pod, ns)
            ck = await client.create(CHECKPOINTS, checkpoint_object(args, action), ns)
        except ApiError as e:
            console.print(f"[bold red]error:[/] {e.message or e}")
            return 1
        name = ck["metadata"]["name"]
        what = f"moving {ns}/{args.pod}" + (f" to {args.node}" if action == CheckpointAction.MOVE and args.node else "")
        console.print(f"{what if action == 'Move' else f'checkpointing {ns}/{args.pod}'} (checkpoint {name})")
        started = time.monotonic()
        try:
            final = await follow(client, ns, name, console, args.timeout, ck["metadata"]["resourceVersion"])
        except (TimeoutError, ApiError) as e:
            console.print(f"[bold red]error:[/] {e}")
            return 1
        code = report(final, console)
        if objects.status(final).get("rollbackPodUID"):
            left = args.timeout - (time.monotonic() - started)
            await rolled_back(client, ns, final, console, max(1.0, min(ROLLBACK_FOLLOW_SECONDS, left)))
        return code


ROLLBACK_FOLLOW_SECONDS = 60.0


async def rolled_back(client: Client, ns: str, ck: dict[str, Any], console: Console, timeout: float) -> None:
    """After a failed move, what became of the pod: it runs on its source with its state (its
    kube32.io/restore-from is removed once it runs), or it was replaced again and started
    afresh (the Checkpoint's message then says why), or, when the Checkpoint's data was
    gone, it was not rolled back and runs afresh.  A pod its source refused for room is
    replaced to restore where the scheduler binds it: the Checkpoint's ``rollbackPodUID``
    then names that one, which is followed.  Bounded by ``timeout``."""
    st = objects.status(ck)
    uid, pod_name = st["rollbackPodUID"], st.get("newPodName") or ck["spec"]["podName"]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            pod = await client.get(PODS, pod_name, ns)
        except ApiError as e:
            if e.code != 404:
                raise
            pod = None
        if pod is None or pod["metadata"]["uid"] != uid:
            again = objects.status(await client.get(CHECKPOINTS, ck["metadata"]["name"], ns))
            if pod is not None and (again.get("rollbackPodUID") == pod["metadata"]["uid"]
                                    or movability.restore_from(pod) == ck["metadata"]["name"]):
                uid, st = pod["metadata"]["uid"], again  # the rollback goes on in this pod
                continue
            console.print(f"[bold red]state lost:[/] {again.get('message', '')}"
                          if pod is not None else "the pod is gone")
            return
        statuses = objects.status(pod).get("containerStatuses") or []
        restoring = Annotation.RESTORE_FROM in objects.annotations(pod)
        if statuses and all("running" in (c.get("state") or {}) for c in statuses) and not restoring:
            node = pod["spec"].get("nodeName")
            console.print(f"the pod runs on {node}, started afresh: its state is lost"
                          if "not rolled back" in st.get("message", "") else
                          f"the pod runs on {node} again, with its state")
            return
        await asyncio.sleep(0.2)
    console.print("the rolled-back pod was not seen running yet")


def move_main(argv: list[str]) -> int:
    return asyncio.run(_run(_parser("kube32-cli move", True).parse_args(argv), CheckpointAction.MOVE))


def checkpoint_main(argv: list[str]) -> int:
    return asyncio.run(_run(_parser("kube32-cli checkpoint", False).parse_args(argv), CheckpointAction.SAVE))
