"""``make demo``: the pod migration story in one command, on a local cluster.

The demo starts ``kube32-sim up --workers 2`` (nodes ``devkit``, ``sim-1``,
``sim-2``) in a temporary data directory, with short node-loss timings, and then
does what a user would do in a terminal: pushes the example counter pod, asks it
for its counters, moves it with ``kube32-cli move``, drains its node with
``kubectl drain``, SIGKILLs the worker it runs on and watches it come back from
its periodic checkpoint, then lists the Checkpoints and the events.

Invariants:

- every command is printed (``$ ...``) before it runs, in a form a reader can
  type again (``kube32-cli``, ``kubectl``, with ``KUBECONFIG`` exported once);
- every step checks what it shows, and the counters must continue across each
  move and restore (``init_calls`` stays 1, ``restored_calls`` grows by one,
  ``requests`` goes on from where it was); a step that does not show what it
  should ends the demo with exit code 1 and the tail of the logs;
- every process the demo starts is stopped on success, failure and Ctrl-C
  (``--keep`` leaves the cluster running on success and says how to stop it).
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, TypeVar

import yaml
from rich.console import Console
from rich.panel import Panel

from .. import objects
from ..terms import IMAGE_REFERENCE_PREFIX, Annotation, CheckpointPhase, Label, Trigger

ROOT = Path(__file__).resolve().parents[2]
COUNTER_WASM = ROOT / "examples" / "pods" / "counter.wasm"
POD = "counter"
COUNTER_PATH = f"/api/v1/namespaces/default/pods/{POD}/proxy/"
# Node loss in seconds instead of minutes: Leases every second, Unknown after 4 s
# without one, pods evicted 1 s later.
UP_FLAGS = ["--lease-interval", "1", "--node-monitor-grace-period", "4s", "--pod-eviction-timeout", "1s",
            "--backoff", "1"]

console = Console(highlight=False, soft_wrap=True)
T = TypeVar("T")


class DemoFailed(Exception):
    """A step did not show what it should; the message says what was expected."""


@dataclass
class Cluster:
    data_dir: Path
    up: subprocess.Popen
    env: dict[str, str] = field(default_factory=dict)

    @property
    def kubeconfig(self) -> Path:
        return self.data_dir / "admin.kubeconfig"


# ---------------------------------------------------------------- running commands

def _argv(cmd: list[str]) -> list[str]:
    """The real argv of a command printed as the user types it: our own entry
    points run from this interpreter, so the demo works before ``pip install``."""
    tools = {"kube32-cli": "kube32.cli.main", "kube32-sim": "kube32.sim.main"}
    if cmd[0] in tools:
        return [sys.executable, "-m", tools[cmd[0]], *cmd[1:]]
    return cmd


def say(text: str) -> None:
    console.print(f"[italic]{text}[/]")


def prompt(cmd: list[str], note: str = "") -> None:
    console.print(f"[bold cyan]$ {shlex.join(cmd)}[/]" + (f"   [dim]# {note}[/]" if note else ""))


def sh(c: Cluster, cmd: list[str], *, note: str = "", quiet: bool = False, ok: bool = True,
       timeout: float = 90) -> str:
    """Run ``cmd`` as printed, echo its output, fail the demo on a non-zero exit."""
    if not quiet:
        prompt(cmd, note)
    # stderr interleaved with stdout, as a terminal shows it (kubectl drain's warnings)
    cp = subprocess.run(_argv(cmd), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=c.env,
                        cwd=ROOT, timeout=timeout)
    out = cp.stdout.rstrip()
    if not quiet and out:
        console.print(out, markup=False)
    if ok and cp.returncode != 0:
        raise DemoFailed(f"`{shlex.join(cmd)}` exited with code {cp.returncode}:\n{out}")
    return cp.stdout


def sh_live(c: Cluster, cmd: list[str], timeout: float = 120) -> str:
    """Run ``cmd`` streaming its lines as they come (live phases of a move)."""
    prompt(cmd)
    proc = subprocess.Popen(_argv(cmd), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=c.env, cwd=ROOT)
    lines = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            console.print(line.rstrip(), markup=False)
        code = proc.wait(timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    out = "".join(lines)
    if code != 0:
        raise DemoFailed(f"`{shlex.join(cmd)}` exited with code {code}")
    return out


def get_json(c: Cluster, *args: str) -> Any:
    cp = subprocess.run(["kubectl", "get", *args, "-o", "json"], capture_output=True, text=True, env=c.env,
                        timeout=30)
    if cp.returncode != 0:
        raise DemoFailed(f"kubectl get {' '.join(args)}: {cp.stderr.strip()}")
    return json.loads(cp.stdout)


def wait_for(what: str, check: Callable[[], T | None], timeout: float, interval: float = 0.25) -> T:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            result = check()
        except (DemoFailed, subprocess.TimeoutExpired, json.JSONDecodeError) as e:
            result, last = None, e
        if result:
            return result
        time.sleep(interval)
    raise DemoFailed(f"timed out after {timeout:g} s waiting for {what}" + (f" (last: {last})" if last else ""))


def passed(text: str) -> None:
    console.print(f"[bold green]✓[/] {text}")


def expect(condition: bool, text: str) -> None:
    if not condition:
        raise DemoFailed(text)
    passed(text)


# ---------------------------------------------------------------- the cluster

def start_cluster(data_dir: Path) -> Cluster:
    cmd = ["kube32-sim", "up", "--workers", "2", "--data-dir", str(data_dir), "--port", "0", *UP_FLAGS]
    console.print(f"[bold cyan]$ {shlex.join(cmd)} &[/]   [dim]# short node-loss timings for the demo[/]")
    log = open(data_dir / "up.log", "wb")
    up = subprocess.Popen(_argv(cmd), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=ROOT,
                          env={**os.environ, "PYTHONUNBUFFERED": "1"}, start_new_session=True)
    c = Cluster(data_dir, up, {**os.environ, "KUBECONFIG": str(data_dir / "admin.kubeconfig")})
    with console.status("waiting for every node to be Ready"):
        wait_for("kube32-sim up to report `cluster ready`",
                 lambda: up.poll() is not None or "cluster ready" in read(data_dir / "up.log"), 120)
    if up.poll() is not None:
        raise DemoFailed(f"kube32-sim up exited with code {up.returncode}")
    console.print(read(data_dir / "up.log").rstrip(), markup=False)
    console.print(f"[bold cyan]$ export KUBECONFIG={c.kubeconfig}[/]")
    return c


def stop_cluster(c: Cluster) -> None:
    """SIGTERM ``up`` (it stops its workers, then the control plane); SIGKILL the
    whole process group if that takes too long."""
    if c.up.poll() is None:
        c.up.send_signal(signal.SIGTERM)
        try:
            c.up.wait(45)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(c.up.pid, signal.SIGKILL)  # anything left in the session the demo started
    except (ProcessLookupError, PermissionError):
        pass
    if c.up.poll() is None:
        c.up.wait(5)


def read(path: Path) -> str:
    return path.read_text(errors="replace") if path.exists() else ""


def worker_pid(c: Cluster, node: str) -> int:
    """The pid of ``node``'s worker process: a child of ``up`` started with ``--name node``."""
    out = subprocess.run(["ps", "-A", "-o", "pid=,ppid=,args="], capture_output=True, text=True).stdout
    for line in out.splitlines():
        pid, ppid, args = line.split(None, 2)
        argv = args.split()
        if int(ppid) == c.up.pid and "worker" in argv and "--name" in argv \
                and argv[argv.index("--name") + 1] == node:
            return int(pid)
    raise DemoFailed(f"no worker process for node {node} under kube32-sim up (pid {c.up.pid})")


# ---------------------------------------------------------------- the pod

def pod_manifest(image: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": POD, "labels": {"app": POD},
                         "annotations": {Annotation.CHECKPOINT_INTERVAL: "10s",
                                         Annotation.TOPICS: "greet",
                                         Annotation.TICK_INTERVAL: "500ms"}},
            "spec": {"nodeName": "sim-1", "containers": [{"name": "main", "image": image}]}}


def ask(c: Cluster) -> dict[str, Any]:
    """One request to the pod through the API server's pod proxy, shown."""
    out = sh(c, ["kubectl", "get", "--raw", COUNTER_PATH])
    return json.loads(out)


def pod(c: Cluster) -> dict[str, Any]:
    return get_json(c, "pod", POD)


def ready_pod(c: Cluster, what: str, timeout: float = 40,
              accept: Callable[[dict[str, Any]], bool] = lambda p: True) -> dict[str, Any]:
    def check() -> dict[str, Any] | None:
        p = pod(c)
        statuses = objects.status(p).get("containerStatuses") or [{}]
        return p if statuses[0].get("ready") and accept(p) else None
    with console.status(f"waiting for {what}"):
        return wait_for(what, check, timeout)


def continued(before: dict[str, Any], after: dict[str, Any], restores: int) -> None:
    expect(after["requests"] == before["requests"] + 1,
           f"requests went on: {before['requests']} -> {after['requests']}")
    expect(after["init_calls"] == 1, "init_calls is still 1: k32_init did not run again")
    expect(after["restored_calls"] == restores, f"restored_calls is {restores}: k32_restored ran instead")
    expect(after["time_ms"] >= before["time_ms"], "the pod's clock did not go backward")


def periodic_checkpoints(c: Cluster) -> list[dict[str, Any]]:
    return [ck for ck in get_json(c, "checkpoints")["items"]
            if ck["spec"]["podName"] == POD
            and objects.labels(ck).get(Label.TRIGGER) == Trigger.PERIODIC]


# ---------------------------------------------------------------- the story

def chapter(title: str) -> None:
    console.print()
    console.rule(f"[bold]{title}")


def story(c: Cluster, pod_file: Path) -> None:
    chapter("1. A local cluster: a control plane (node devkit) and two workers")
    sh(c, ["kubectl", "get", "nodes"])
    sh(c, ["kubectl", "cordon", "devkit"], note="keep pods on the workers: the demo kills one later")

    chapter("2. A request pod: the counter, built from examples/pods/counter.c")
    image = sh(c, ["kube32-cli", "image", "push", str(COUNTER_WASM.relative_to(ROOT))]).strip()
    expect(image.startswith(IMAGE_REFERENCE_PREFIX), "the module is in the control plane's image store")
    pod_file.write_text(yaml.safe_dump(pod_manifest(image), sort_keys=False))
    prompt(["cat", str(pod_file)])
    console.print(pod_file.read_text().rstrip(), markup=False)
    sh(c, ["kubectl", "apply", "-f", str(pod_file)])
    first = ready_pod(c, "the counter to run on sim-1")
    sh(c, ["kubectl", "get", "pod", POD, "-o", "wide"])
    say("The pod answers through the API server's pod proxy; each request counts:")
    ask(c)
    ask(c)
    sh(c, ["kube32-cli", "publish", "greet", "hello"], note="an event for the pods subscribed to 'greet'")
    before = wait_for("the event to reach the pod", lambda: (s := ask(c))["events"] >= 1 and s, 10, 0.5)
    expect(before["init_calls"] == 1 and before["restored_calls"] == 0, "k32_init ran once, nothing restored yet")

    chapter("3. kube32-cli move: freeze, snapshot, restore on sim-2")
    out = sh_live(c, ["kube32-cli", "move", POD, "--to", "sim-2"])
    expect("Completed" in out and "after the freeze" in out, "the move completed; its freeze-to-running time is above")
    moved = ready_pod(c, "the counter on sim-2", accept=lambda p: p["spec"]["nodeName"] == "sim-2")
    sh(c, ["kubectl", "get", "pod", POD, "-o", "wide"], note="same name, new uid, new node")
    expect(moved["metadata"]["uid"] != first["metadata"]["uid"], "the replacement has a new uid")
    say("The same pod answers on its new node, its counters continued:")
    after = ask(c)
    continued(before, after, 1)
    expect(after["last_event"] == "greet:hello", "it still remembers the last event: greet:hello")

    chapter("4. kubectl drain moves it again")
    out = sh(c, ["kubectl", "drain", "sim-2", "--ignore-daemonsets", "--force", "--timeout=60s"], timeout=90)
    expect("drained" in out, "sim-2 drained")
    drained = ready_pod(c, "the counter to run on sim-1", accept=lambda p: p["spec"]["nodeName"] == "sim-1")
    sh(c, ["kubectl", "uncordon", "sim-2"])
    sh(c, ["kubectl", "get", "pod", POD, "-o", "wide"])
    expect(drained["spec"]["nodeName"] == "sim-1", "the drain moved the pod to sim-1")
    before_loss = ask(c)
    continued(after, before_loss, 2)

    chapter("5. Node loss: sim-1 dies, the pod comes back from its periodic checkpoint")
    say("The pod's annotation kube32.io/checkpoint-interval: \"10s\" saves its state every 10 s.")
    seen = {ck["metadata"]["name"] for ck in periodic_checkpoints(c)}
    with console.status("waiting for a periodic checkpoint taken after the last request"):
        saved = wait_for("a periodic checkpoint of the counter on sim-1", lambda: next(
            (ck for ck in periodic_checkpoints(c) if ck["metadata"]["name"] not in seen
             and objects.phase(ck) == CheckpointPhase.SAVED and ck["status"].get("nodeName") == "sim-1"),
            None), 30, 0.5)
    sh(c, ["kubectl", "get", "checkpoints", "-l", f"{Label.TRIGGER}={Trigger.PERIODIC}"])
    pid = worker_pid(c, "sim-1")
    prompt(["kill", "-9", str(pid)], "the worker process of sim-1 (its parent is kube32-sim up)")
    os.kill(pid, signal.SIGKILL)
    say("No Lease from sim-1 for 4 s: the node turns NotReady, its pods are evicted, and the counter is "
        "restored on another node from its latest periodic checkpoint.")
    restored = ready_pod(c, "the counter to come back on another node", 60,
                         accept=lambda p: p["metadata"]["uid"] != drained["metadata"]["uid"]
                         and p["spec"].get("nodeName") not in (None, "sim-1"))
    sh(c, ["kubectl", "get", "nodes"])
    sh(c, ["kubectl", "get", "pod", POD, "-o", "wide"])
    expect(restored["spec"]["nodeName"] == "sim-2", "the counter runs on sim-2 again")
    after_loss = ask(c)
    continued(before_loss, after_loss, 3)
    def restored_event() -> str | None:
        out = sh(c, ["kubectl", "get", "events", "--field-selector", f"involvedObject.name={POD},reason=Restored"],
                 quiet=True)
        return out if out and saved["metadata"]["name"] in out else None
    events = wait_for("the Restored event", restored_event, 15)
    sh(c, ["kubectl", "get", "events", "--field-selector", f"involvedObject.name={POD},reason=Restored"])
    expect(saved["metadata"]["name"] in events, f"Restored names {saved['metadata']['name']} and its age")

    chapter("6. What the cluster recorded")
    wide = sh(c, ["kubectl", "get", "ckpt", "-o", "wide"])
    expect("Completed" in wide and "Saved" in wide, "a Completed move, the eviction's move and a Saved periodic one")
    events = sh(c, ["kubectl", "get", "events", "--field-selector", f"involvedObject.name={POD}",
                    "--sort-by=.lastTimestamp"])
    for reason in ("Moving", "Moved", "Checkpointed", "Restored"):
        expect(reason in events, f"event {reason}")


def run(keep: bool) -> int:
    data_dir = Path(tempfile.mkdtemp(prefix="kube32-demo-"))
    console.print(Panel.fit("[bold]Kube32[/]: Kubernetes for microcontroller-class nodes.\n"
                            "A running WebAssembly pod moves between nodes and goes on where it left off.",
                            border_style="cyan"))
    c: Cluster | None = None
    started = time.monotonic()
    ok = failed = False
    try:
        chapter("0. Start the cluster")
        c = start_cluster(data_dir)
        story(c, data_dir / "counter.yaml")
        ok = True
        console.print()
        console.rule("[bold green]demo complete")
        console.print(f"Every step showed what it should, in {time.monotonic() - started:.0f} s.")
        if keep:
            sh(c, ["kubectl", "uncordon", "devkit"])
            console.print(f"\nThe cluster keeps running (kube32-sim up, pid {c.up.pid}). Try:\n"
                          f"  export KUBECONFIG={c.kubeconfig}\n"
                          f"  kubectl get nodes,pods,ckpt -o wide\n"
                          f"  kube32-cli move {POD} --to devkit\n"
                          f"  kubectl get --raw {COUNTER_PATH}\n"
                          f"sim-1 was killed; bring it back with:\n"
                          f"  kube32-sim worker --kubeconfig {data_dir / 'node.kubeconfig'} --name sim-1 &\n"
                          f"Stop the cluster with: kill {c.up.pid}   (logs: {data_dir / 'logs'})")
        else:
            console.print("Run [bold]make demo ARGS=--keep[/] to keep the cluster up and try kubectl against it.")
        return 0
    except DemoFailed as e:
        failed = True
        console.print(f"\n[bold red]demo failed:[/] {e}")
        show_logs(data_dir)
        return 1
    except KeyboardInterrupt:
        console.print("\n[bold yellow]interrupted[/]; stopping the cluster")
        return 130
    finally:
        if c is not None and not (keep and ok):
            with console.status("stopping the cluster"):
                # A stopped worker drains itself first; with the pod gone it stops at once.
                if c.up.poll() is None:
                    subprocess.run(_argv(["kubectl", "delete", "pod", POD, "--wait=false",
                                          "--ignore-not-found"]), env=c.env, capture_output=True, timeout=30)
                stop_cluster(c)
        if failed:
            console.print(f"logs kept in {data_dir}")
        elif not (keep and ok):
            shutil.rmtree(data_dir, ignore_errors=True)


def show_logs(data_dir: Path) -> None:
    for log in [data_dir / "up.log", *sorted((data_dir / "logs").glob("*.log"))]:
        text = read(log)
        if text:
            console.rule(str(log.name), style="red")
            console.print(text[-2500:].rstrip(), markup=False)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="kube32-demo", description="Show a pod moving between Kube32 nodes.")
    p.add_argument("--keep", action="store_true", help="leave the cluster running afterwards")
    args = p.parse_args(argv)
    # Ctrl-C and SIGTERM (a CI runner's timeout) clean up, also when started in the
    # background, where the shell leaves SIGINT ignored.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    return run(args.keep)


if __name__ == "__main__":
    sys.exit(main())
