"""``kube32-sim up``: a whole cluster on this machine in one command.

The control plane (with its own node ``devkit``) and ``--workers N`` workers
(``sim-1`` ... ``sim-N``) run as child processes of this one (``python -m
kube32.sim.main ...``, each kubelet on a free port), logging to
``<data-dir>/logs/<name>.log``.  ``up`` waits until every node is Ready, prints the
kubeconfig and how to use it, then the line ``cluster ready``.  Ctrl-C / SIGTERM
stops the workers first, then the control plane; a child that does not stop in
time is killed.  If the only control plane dies, ``up`` stops everything and fails.

``--fleet N`` also starts a fleet of N boards in one process (``kube32-sim fleet``:
nodes ``fleet-1`` ... ``fleet-N`` on 127.32.0.1 on, logging to ``logs/fleet.log``),
and waits for those to be Ready too.  Stopping ``up`` stops the fleet's nodes without
a drain (each marked NotReady).

``--store etcd`` starts an etcd cluster of its own first (``<data-dir>/etcd``, one
member per control plane; kube32.sim.etcd) and runs the control planes on it;
``--store etcd://...`` uses an etcd that runs already.  ``--control-planes N`` (N > 1,
etcd only) runs N control planes ``cp-1`` ... ``cp-N`` in ``<data-dir>/cp-<i>``: cp-1
starts first and makes the cluster's credentials (tokens, the key that signs
ServiceAccount and node tokens, the two CAs), which the others get a copy of before
they start; they share one image directory.  The controllers run on one of them at a
time (leader election), the control planes run no node of their own (the workers
carry the pods), and ``<data-dir>/admin.kubeconfig`` and ``node.kubeconfig`` name
every API server: a context per control plane (``admin@cp-<i>``) and, for kube32's
clients, the extension ``kube32.io/servers`` to fail over by; the workers' own first
is cp-2 (cp-1 usually leads).  A control plane that exits is reported and not started
again; ``up`` goes on even when none of those it started is left, as nodes run their
pods on without a control plane (and take up with one started again on its port).
"""
from __future__ import annotations

import asyncio
import os
import shutil
import signal
import sys
import time
from pathlib import Path

import yaml

from .. import objects
from ..aio import wait_set
from ..client import NODES, ApiError, Client
from ..client.rest import SERVERS_EXTENSION
from ..terms import Condition
from ..timing import NODE_STOP_SECONDS
from .etcd import EtcdCluster
from .fleet import DEFAULT_PREFIX as FLEET_PREFIX

READY_TIMEOUT = 120.0
FLEET_JOIN_SECONDS = 0.5  # more time to be Ready, per fleet node (a 2-core machine joins ~10 a second)
SHARED_CREDENTIALS = ("tokens.json", "sa.key", "pki/ca.crt", "pki/ca.key", "pki/kubelet-ca.crt",
                      "pki/kubelet-ca.key")
STOP_TIMEOUT = NODE_STOP_SECONDS  # a worker drains itself first


def _sim(*args: str) -> list[str]:
    return [sys.executable, "-m", "kube32.sim.main", *args]


async def _spawn(args: list[str], log: Path) -> asyncio.subprocess.Process:
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as f:
        return await asyncio.create_subprocess_exec(*args, stdout=f, stderr=asyncio.subprocess.STDOUT,
                                                    stdin=asyncio.subprocess.DEVNULL,
                                                    env={**os.environ, "PYTHONUNBUFFERED": "1"})


async def _stop(procs: dict[str, asyncio.subprocess.Process]) -> None:
    for proc in procs.values():
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
    for name, proc in procs.items():
        try:
            await asyncio.wait_for(proc.wait(), STOP_TIMEOUT)
        except TimeoutError:
            print(f"kube32-sim up: {name} did not stop in {STOP_TIMEOUT:g}s; killing it", flush=True)
            proc.kill()
            await proc.wait()


async def _nodes_ready(client: Client, names: list[str]) -> list[str]:
    """The nodes of ``names`` that are not Ready yet."""
    items, _ = await client.list(NODES)
    ready = {n["metadata"]["name"] for n in items
             if any(c.get("type") == Condition.READY and c.get("status") == "True"
                    for c in objects.status(n).get("conditions") or [])}
    return [n for n in names if n not in ready]


def share_credentials(first: Path, other: Path) -> None:
    """Give control plane `other` the cluster credentials `first` made."""
    for name in SHARED_CREDENTIALS:
        (other / name).parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        shutil.copy2(first / name, other / name)


def share_images(plane: Path, images: Path) -> None:
    """Point the control plane's image directory at the one every control plane shares."""
    plane.mkdir(parents=True, exist_ok=True)
    link = plane / "images"
    if not link.is_symlink():
        if link.exists():
            shutil.rmtree(link)
        link.symlink_to(images, target_is_directory=True)


def write_cluster_kubeconfigs(data_dir: Path, planes: list[Path]) -> None:
    """admin.kubeconfig and node.kubeconfig in `data_dir` naming every control plane."""
    for name in ("admin.kubeconfig", "node.kubeconfig"):
        docs = [yaml.safe_load((plane / name).read_text()) for plane in planes]
        servers = [d["clusters"][0]["cluster"]["server"] for d in docs]
        user = docs[0]["users"][0]
        clusters, contexts = [], []
        for plane, doc in zip(planes, docs, strict=True):
            cluster = dict(doc["clusters"][0]["cluster"])
            cluster["extensions"] = [{"name": SERVERS_EXTENSION, "extension": {"servers": servers}}]
            clusters.append({"name": f"kube32-{plane.name}", "cluster": cluster})
            contexts.append({"name": f"{user['name']}@{plane.name}",
                             "context": {"cluster": f"kube32-{plane.name}", "user": user["name"],
                                         "namespace": "default"}})
        # The nodes go to cp-2 first: cp-1 starts first and so usually leads, and a node's
        # checkpoint data lives in its API server, so losing the leader then costs a
        # failover of the controllers and not the nodes' data.
        first = 1 if name == "node.kubeconfig" else 0
        doc = {**docs[0], "clusters": clusters, "contexts": contexts, "users": [user],
               "current-context": contexts[first]["name"]}
        path = data_dir / name
        tmp = path.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(yaml.safe_dump(doc, sort_keys=False))
        os.replace(tmp, path)


async def _wait_for_file(path: Path, proc: asyncio.subprocess.Process, stop: asyncio.Event,
                         deadline: float) -> bool:
    while not path.exists():
        if proc.returncode is not None or stop.is_set() or time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.1)
    return True


async def _start_control_planes(data_dir: Path, planes: list[Path], port: int, args: list[str],
                                controls: dict[str, asyncio.subprocess.Process], stop: asyncio.Event,
                                deadline: float) -> bool:
    """Start each control plane in turn (the next once the last wrote its kubeconfig)."""
    ha = len(planes) > 1
    for i, plane in enumerate(planes):
        if ha:
            (data_dir / "images").mkdir(exist_ok=True)
            share_images(plane, data_dir / "images")
        if i:
            share_credentials(planes[0], plane)
        (plane / "admin.kubeconfig").unlink(missing_ok=True)  # a previous run's names old ports
        name = f"control plane {plane.name}" if ha else "control plane"
        plane_port = port + i if port else 0
        controls[name] = await _spawn(
            _sim("control-plane", "--data-dir", str(plane), "--port", str(plane_port), *args,
                 *(["--no-kubelet"] if ha else [])),
            data_dir / "logs" / (f"{plane.name}.log" if ha else "control-plane.log"))
        if not await _wait_for_file(plane / "admin.kubeconfig", controls[name], stop, deadline):
            print(f"kube32-sim up: the {name} did not start; see {data_dir / 'logs'}", file=sys.stderr, flush=True)
            return False
    if ha:
        write_cluster_kubeconfigs(data_dir, planes)
    return True


async def _start_workers(data_dir: Path, names: list[str], node_args: list[str],
                         children: dict[str, asyncio.subprocess.Process]) -> None:
    for i, name in enumerate(names, start=2):
        # Each node has an address of its own on loopback (127.0.0.2, ...), as boards
        # on a network do: its NodePort Services listen there.
        children[name] = await _spawn(
            _sim("worker", "--kubeconfig", str(data_dir / "node.kubeconfig"), "--name", name,
                 "--address", f"127.0.0.{i}", "--port", "0", "--data-dir", str(data_dir / "nodes" / name),
                 *node_args),
            data_dir / "logs" / f"{name}.log")


async def _start_fleet(data_dir: Path, nodes: int, node_args: list[str],
                       children: dict[str, asyncio.subprocess.Process]) -> list[str]:
    """The fleet's process (see kube32.sim.fleet); its node names."""
    children["fleet"] = await _spawn(
        _sim("fleet", "--kubeconfig", str(data_dir / "node.kubeconfig"), "--nodes", str(nodes),
             "--data-dir", str(data_dir / "fleet"), *node_args),
        data_dir / "logs" / "fleet.log")
    return [f"{FLEET_PREFIX}-{i}" for i in range(1, nodes + 1)]


async def _wait_ready(admin: Path, want: list[str], procs: dict[str, asyncio.subprocess.Process],
                      stop: asyncio.Event, deadline: float) -> str | None:
    """None once every node in `want` is Ready; else why not (a process exited, Ctrl-C, time)."""
    async with Client.from_kubeconfig(admin, user_agent="kube32-sim-up") as client:
        missing = want
        while missing:
            dead = [n for n, p in procs.items() if p.returncode is not None]
            if dead or stop.is_set() or time.monotonic() > deadline:
                more = f" and {len(missing) - 10} more" if len(missing) > 10 else ""
                return f"{', '.join(dead)} exited" if dead else "interrupted" if stop.is_set() else \
                    f"nodes not Ready in time: {', '.join(missing[:10])}{more}"
            try:
                missing = await _nodes_ready(client, want)
            except ApiError:
                pass
            if missing:
                # A fleet's thousand Nodes are a big list: asked for less often.
                await asyncio.sleep(max(0.2, len(want) / 500))
    return None


async def _supervise(controls: dict[str, asyncio.subprocess.Process],
                     children: dict[str, asyncio.subprocess.Process], stop: asyncio.Event) -> int:
    """Until Ctrl-C: report children that exit; stop when the only control plane does.

    With several control planes, none exiting stops the cluster, not even the last of
    those this process started: the workers run their pods on, as Kubernetes' nodes do
    without a control plane, and take up with any API server started again on its port
    (an operator's, from the command line in the log; attack round 26's tests do that)."""
    several = len(controls) > 1
    while not stop.is_set():
        for name, proc in list(controls.items()):
            if proc.returncode is not None:
                if not several:
                    print(f"kube32-sim up: the {name} exited; stopping", file=sys.stderr, flush=True)
                    return 1
                print(f"kube32-sim up: the {name} exited with code {proc.returncode}", flush=True)
                controls.pop(name)
                if not controls:
                    print("kube32-sim up: no control plane it started runs; the workers and etcd go on",
                          flush=True)
        for name, proc in list(children.items()):
            if proc.returncode is not None:
                print(f"kube32-sim up: worker {name} exited with code {proc.returncode}", flush=True)
                children.pop(name)
        await wait_set(stop, 0.5)
    print("kube32 cluster stopping", flush=True)
    return 0


async def run_up(data_dir: Path, workers: int, port: int, node_args: list[str],
                 cp_args: list[str] | tuple[str, ...] = (), control_planes: int = 1,
                 store: str = "sqlite", fleet: int = 0) -> int:
    data_dir = data_dir.resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    admin = data_dir / "admin.kubeconfig"
    admin.unlink(missing_ok=True)
    logs = data_dir / "logs"
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    etcd: EtcdCluster | None = None
    if store == "etcd":
        etcd = EtcdCluster(data_dir / "etcd", members=control_planes)
        await asyncio.to_thread(etcd.start)
        store = etcd.store_url
        print(f"kube32 etcd up: {store}", flush=True)
    ha = control_planes > 1
    planes = [data_dir / f"cp-{i}" for i in range(1, control_planes + 1)] if ha else [data_dir]
    store_args = [] if store == "sqlite" else ["--store", store]
    controls: dict[str, asyncio.subprocess.Process] = {}
    children: dict[str, asyncio.subprocess.Process] = {}
    try:
        deadline = time.monotonic() + READY_TIMEOUT
        if not await _start_control_planes(data_dir, planes, port, [*store_args, *node_args, *cp_args],
                                           controls, stop, deadline):
            return 1
        names = [f"sim-{i}" for i in range(1, workers + 1)]
        await _start_workers(data_dir, names, node_args, children)
        fleet_names = await _start_fleet(data_dir, fleet, node_args, children) if fleet else []
        if fleet:
            deadline += fleet * FLEET_JOIN_SECONDS
        why = await _wait_ready(admin, [*(names if ha else ["devkit", *names]), *fleet_names],
                                {**controls, **children}, stop, deadline)
        if why is not None:
            print(f"kube32-sim up: {why}; logs in {logs}", file=sys.stderr, flush=True)
            return 1
        what = (f"{control_planes} control planes on {store}" if ha
                else "control plane + node devkit")
        print(f"kube32 cluster up: {what}, workers {', '.join(names) or '(none)'}"
              + (f", a fleet of {fleet} nodes ({fleet_names[0]} ... {fleet_names[-1]})" if fleet else ""),
              flush=True)
        print(f"kubeconfig: {admin}", flush=True)
        print(f"  export KUBECONFIG={admin}", flush=True)
        print("  kubectl get nodes", flush=True)
        print(f"logs: {logs}", flush=True)
        print("cluster ready (Ctrl-C stops it)", flush=True)
        return await _supervise(controls, children, stop)
    finally:
        await _stop(children)
        await _stop(controls)
        if etcd is not None:
            await asyncio.to_thread(etcd.stop)
