"""``kube32-sim fleet``: many simulated boards in one process, each a real kubelet.

A ``kube32-sim worker`` is a whole Python process (~75 MB), so a fleet of them does
not fit one machine.  A fleet runs N nodes ``PREFIX-1`` ... ``PREFIX-N`` on one event
loop, each a :class:`~kube32.kubelet.Kubelet` started and stopped by the path every
simulated node takes (:func:`~.worker.start_node`, :func:`~.worker.stop_node`): it
joins with the bootstrap token, gets its own token and serving certificate, renews
its Lease, reports its status, heap and MemoryPressure, serves its kubelet endpoint on
its own address, runs its pods on a real engine, and takes and serves checkpoints
and moves, as a worker does.

Design and invariants:

* Shared, because nothing of a node is in it: the event loop, the engine and its
  compiled modules (one :class:`~kube32.wasm.Runtime`: a module compiled once serves
  every node's pods; its speed is measured once), the client-side TLS context
  (the cluster CA only), the process's threads, and the watch of the Nodes
  (:class:`~kube32.kubelet.nodewatch.NodeWatch` of every Node: what each kubelet compares
  its status with, one watch for the fleet instead of one a node; a node may read every
  Node, as in Kubernetes).  It watches with the credentials of a node of the fleet (a
  client of its own beside that node's), and moves to another running node when that one
  stops; each node still writes its own Node with its own credentials.
* Owned by each node, because a board owns it: its client (its credentials after the
  join, its source address, its connections: the API server hands a node its
  credentials for the address its join came from, so the connection pool is the
  node's), its endpoint and certificate, its pods and their threads, its heap
  accounting, its image cache.
* Names and addresses never collide with ``up``'s: workers are ``sim-<i>`` on
  127.0.0.<i+1>, the control plane's node ``devkit``; fleet nodes are ``PREFIX-<i>``
  (``fleet`` by default) from ``--first-address`` (127.32.0.1 by default) on, one
  address each, skipping every x.y.z.0 and x.y.z.255.
* Nodes join :data:`JOINS_AT_ONCE` at a time (``--joins-at-once``): a thousand CSRs at
  once would only queue in the API server.  A node that cannot join is reported and
  the others go on; ``fleet`` fails only when none joined.
* Control: lines on stdin (a pipe or a terminal) act on one node:
  ``kill NAME`` (as SIGKILL does to a worker: nothing more is written, its Lease just
  stops, its endpoint closes), ``drain NAME`` (as SIGTERM does to a worker: it drains
  itself, then stops), ``start NAME`` (starts it again, under the same name and
  address), ``list``, ``watching`` (the node whose credentials watch the Nodes).  Each
  answer is one line starting with ``fleet:``.
* SIGINT/SIGTERM stop every node without a drain (a fleet-wide drain would only move
  every pod onto nodes that are stopping too): pods stop, each Node is marked NotReady.
* ``--pods-per-node K`` creates K pods of ``--image`` on each node once it is Ready
  (``PREFIX-<i>-<j>``, bound by ``spec.nodeName``), with the credentials of
  ``--pods-kubeconfig`` (a node may not create pods): the kubeconfig's directory's
  ``admin.kubeconfig`` by default.
"""
from __future__ import annotations

import argparse
import asyncio
import dataclasses
import ipaddress
import logging
import os
import stat
import sys
import time
from pathlib import Path
from typing import IO
from ..collector import SurvivorFreezer
from ..client import PODS, ApiError, Client
from ..kubelet import Kubelet, KubeletOptions
from ..kubelet.join import node_name_problem
from ..kubelet.nodewatch import NodeWatch
from ..terms import Label
from ..wasm import Runtime
from .worker import address_problem, kubelet_options, node_client, start_node, stop_node, stop_on_signals

log = logging.getLogger("kube32.sim.fleet")

JOINS_AT_ONCE = 8
FIRST_ADDRESS = "127.32.0.1"
DEFAULT_PREFIX = "fleet"
MAX_NODES = 10_000


def fleet_addresses(first: str, n: int) -> list[str]:
    """``n`` IPv4 addresses from ``first`` on, none ending in .0 or .255, all in
    ``first``'s /8 (ValueError naming the cause otherwise)."""
    try:
        ip = ipaddress.IPv4Address(first)
    except ValueError:
        raise ValueError(f'--first-address "{first}" is not an IPv4 address') from None
    out: list[str] = []
    value = int(ip)
    top = (value & 0xFF000000) | 0x00FFFFFE
    while len(out) < n:
        if value > top:
            raise ValueError(f"{n} nodes from {first} do not fit in {ip.exploded.split('.')[0]}.0.0.0/8")
        if value & 0xFF not in (0, 255):
            out.append(str(ipaddress.IPv4Address(value)))
        value += 1
    return out


def check_bindable(addresses: list[str]) -> None:
    """ValueError naming the first of the fleet's first and last addresses that this
    machine cannot listen on (each node's kubelet endpoint binds its own)."""
    for address in dict.fromkeys((addresses[0], addresses[-1])):
        if (why := address_problem(address)) is not None:
            raise ValueError(f"--first-address: {why}; it must start a range of this machine's addresses")


def fleet_options(args: argparse.Namespace, names: list[str], addresses: list[str]) -> list[KubeletOptions]:
    """Each node's options: the flags' (as a worker reads them), its name and address."""
    base = kubelet_options(args, names[0] if names else "fleet")
    return [dataclasses.replace(base, node_name=name, host=address, port=0,
                                data_dir=(args.data_dir / "nodes" / name) if args.data_dir else None)
            for name, address in zip(names, addresses, strict=True)]


class Fleet:
    """N kubelets on one loop, one runtime; see the module docstring."""

    def __init__(self, template: Client, options: list[KubeletOptions], runtime: Runtime,
                 joins_at_once: int = JOINS_AT_ONCE) -> None:
        self.template = template
        self.options = {o.node_name: o for o in options}
        self.runtime = runtime
        self.nodes: dict[str, Kubelet] = {}
        self.joined_at: dict[str, float] = {}     # name -> seconds from the fleet's start
        self._gate = asyncio.Semaphore(max(1, joins_at_once))
        self._began = time.monotonic()
        self.node_watch = NodeWatch()         # every Node, for every node (module docstring)
        self.watching_as: str | None = None   # the node whose credentials the watch uses

    def _client(self, name: str) -> Client:
        # The bootstrap token and the CA's TLS context, a session (and pool) of its own.
        return self.template.sibling(user_agent=f"kubelet/{name}")

    async def start(self, name: str) -> Kubelet:
        if name in self.nodes:
            raise ValueError(f"node {name} runs already")
        opts = self.options[name]
        if opts.data_dir is not None:
            opts.data_dir.mkdir(parents=True, exist_ok=True)
        async with self._gate:
            kubelet = await start_node(self._client(name), opts, self.runtime, self.node_watch)
        self.nodes[name] = kubelet
        self.joined_at[name] = time.monotonic() - self._began
        if self.watching_as is None:
            self._watch_as(name)
        return kubelet

    def _watch_as(self, name: str) -> None:
        """The Nodes watched with node ``name``'s credentials (a client and one connection of
        its own), from now on."""
        self.node_watch.start(self.nodes[name].client.sibling(user_agent=f"kubelet/{name} (fleet nodes)", pool=1))
        self.watching_as = name

    async def _watch_elsewhere(self, name: str) -> None:
        """Node ``name`` stops: the watch moves to another running node (or ends with the last)."""
        if self.watching_as != name:
            return
        self.watching_as = None
        if self.nodes:
            self._watch_as(next(iter(self.nodes)))
        else:
            await self.node_watch.stop()

    async def start_all(self) -> list[str]:
        """Start every node; the names of those that could not start (each one logged)."""
        names = list(self.options)
        results = await asyncio.gather(*(self.start(n) for n in names), return_exceptions=True)
        failed = []
        for name, result in zip(names, results, strict=True):
            if isinstance(result, BaseException):
                if isinstance(result, asyncio.CancelledError):
                    raise result
                log.warning("node %s did not join: %s", name, result)
                failed.append(name)
        return failed

    async def kill(self, name: str) -> None:
        """As SIGKILL to a worker: from now on the node writes nothing (every write is
        refused before it leaves: the client's guard), so its Lease just stops; its pods
        and endpoint stop with it."""
        kubelet = self._take(name)
        kubelet.client.guard = lambda: f"node {name} was killed"
        await self._watch_elsewhere(name)
        await stop_node(kubelet, drain=False)

    async def drain(self, name: str) -> list[str]:
        """As SIGTERM to a worker: it drains itself, then stops (pods still there, by name)."""
        kubelet = self._take(name)
        await self._watch_elsewhere(name)
        return await stop_node(kubelet, drain=True)

    async def stop_all(self) -> None:
        nodes, self.nodes = self.nodes, {}
        await asyncio.gather(*(stop_node(k, drain=False) for k in nodes.values()), return_exceptions=True)
        self.watching_as = None
        await self.node_watch.stop()

    def _take(self, name: str) -> Kubelet:
        kubelet = self.nodes.pop(name, None)
        if kubelet is None:
            raise ValueError(f"node {name} does not run" if name in self.options
                             else f"no node {name} in this fleet")
        return kubelet

    async def command(self, line: str) -> str:
        """One control line (see the module docstring) and its answer."""
        words = line.split()
        if not words:
            return ""
        verb, rest = words[0], words[1:]
        try:
            if verb == "list" and not rest:
                return "fleet: running " + (" ".join(sorted(self.nodes)) or "(none)")
            if verb == "watching" and not rest:
                return f"fleet: Nodes watched as {self.watching_as or '(none)'}"
            if verb in ("kill", "drain", "start") and len(rest) == 1:
                name = rest[0]
                if name not in self.options:
                    return f"fleet: error: no node {name} in this fleet"
                if verb == "kill":
                    await self.kill(name)
                    return f"fleet: {name} killed"
                if verb == "drain":
                    left = await self.drain(name)
                    return f"fleet: {name} drained" + (f" (still there after 20 s: {', '.join(left)})" if left else "")
                await self.start(name)
                return f"fleet: {name} started"
        except (ValueError, ApiError, OSError) as e:
            return f"fleet: error: {verb} {' '.join(rest)}: {e}"
        return (f"fleet: error: unknown command {line.strip()[:80]!r} "
                "(kill NAME, drain NAME, start NAME, list, watching)")


async def create_pods(client: Client, nodes: list[str], per_node: int, image: str) -> int:
    """``per_node`` pods of ``image`` bound to each node; how many were created (one that
    exists already is left as it is)."""
    made = 0
    gate = asyncio.Semaphore(JOINS_AT_ONCE)

    async def one(node: str, j: int) -> None:
        nonlocal made
        pod = {"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": f"{node}-{j}", "namespace": "default", "labels": {Label.FLEET_NODE: node}},
               "spec": {"nodeName": node, "terminationGracePeriodSeconds": 1,
                        "containers": [{"name": "main", "image": image}]}}
        async with gate:
            try:
                await client.create(PODS, pod, "default")
                made += 1
            except ApiError as e:
                if e.code != 409:
                    log.warning("cannot create pod %s-%d: %s", node, j, e)
    await asyncio.gather(*(one(n, j) for n in nodes for j in range(1, per_node + 1)))
    return made


def _is_control_stream(stream: IO[str] | None) -> bool:
    """Whether ``stream`` is a pipe, a socket or a terminal: what the event loop can wait
    on.  A file or /dev/null (stdin under ``up --fleet`` or a service manager) is not, and
    asyncio would only report that from inside its loop, as a traceback."""
    if stream is None:
        return False
    try:
        fd = stream.fileno()
        mode = os.fstat(fd).st_mode
    except (AttributeError, OSError, ValueError):
        return False
    return stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode) or os.isatty(fd)


async def _control(fleet: Fleet) -> None:
    """Control lines from stdin until it ends (no stdin, or a file: no control)."""
    if not _is_control_stream(sys.stdin):
        return
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=4096)
    try:
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    except (ValueError, OSError):
        return
    while (line := await read_command(reader)) is not None:
        if line is TOO_LONG:
            answer = "fleet: error: line too long"
        else:
            answer = await fleet.command(line.decode(errors="replace"))
        if answer:
            print(answer, flush=True)


TOO_LONG = b"\0"   # read_command's answer for a line over the reader's limit (compared by identity)


async def read_command(reader: asyncio.StreamReader) -> bytes | None:
    """The next line of ``reader``; :data:`TOO_LONG` for a line over its limit, read to its
    end and dropped (one answer a line: a script reads one per command); None at the end."""
    too_long = False
    while True:
        try:
            line = await reader.readuntil(b"\n")
        except asyncio.IncompleteReadError as e:   # the end: a last line without its newline
            if too_long:
                return TOO_LONG
            return e.partial or None
        except asyncio.LimitOverrunError as e:
            # What is over the limit stays in the buffer: drop it and read on to the line's end.
            await reader.readexactly(e.consumed)
            too_long = True
            continue
        return TOO_LONG if too_long else line


@dataclasses.dataclass(frozen=True)
class FleetArgs:
    kubeconfig: Path
    server: str | None
    options: list[KubeletOptions]
    joins_at_once: int
    pods_per_node: int = 0
    image: str | None = None
    pods_kubeconfig: Path | None = None


def shared_runtime(options: list[KubeletOptions], data_dir: Path | None) -> Runtime:
    engine = options[0].engine if options else "pwasm"
    return Runtime(data_dir / "compiled" if data_dir else None, engine=engine)


async def run_fleet(fa: FleetArgs, data_dir: Path | None = None) -> int:
    template = node_client(fa.kubeconfig, fa.server, "fleet")
    runtime = shared_runtime(fa.options, data_dir)
    if fa.options and fa.options[0].interp_mops is None:
        await asyncio.to_thread(runtime.speed)   # once, before a thousand nodes ask for it
    fleet = Fleet(template, fa.options, runtime, fa.joins_at_once)
    stop = stop_on_signals()
    control: asyncio.Task[None] | None = None
    freezer = SurvivorFreezer()
    try:
        starting = asyncio.create_task(fleet.start_all())
        await asyncio.wait({starting, asyncio.create_task(stop.wait())}, return_when=asyncio.FIRST_COMPLETED)
        if not starting.done():
            starting.cancel()
            await asyncio.gather(starting, return_exceptions=True)
            return 130
        failed = starting.result()
        if len(failed) == len(fa.options):
            print(f"kube32 fleet: no node joined {template.server}", file=sys.stderr, flush=True)
            return 1
        joined = sorted(fleet.joined_at.values())
        first = fa.options[0]
        print(f"kube32 fleet of {len(fleet.nodes)} node{'s' if len(fleet.nodes) != 1 else ''} ({first.profile}, engine "
              f"{runtime.engine.runtime_version}) joined {template.server} in {joined[-1]:.1f} s; "
              f"nodes {fa.options[0].node_name} ({fa.options[0].host}) ... {fa.options[-1].node_name} "
              f"({fa.options[-1].host})" + (f"; not joined: {', '.join(failed)}" if failed else ""), flush=True)
        if fa.pods_per_node and fa.image:
            await _populate(fa, sorted(fleet.nodes))
        # A thousand kubelets' state is long-lived: full collections scan only what is
        # new since the last one (kube32.collector).
        freezer.start()
        control = asyncio.create_task(_control(fleet))
        print("fleet ready (commands on stdin: kill NAME, drain NAME, start NAME, list)", flush=True)
        await stop.wait()
        print(f"kube32 fleet stopping {len(fleet.nodes)} nodes", flush=True)
        return 0
    finally:
        freezer.stop()
        if control is not None:
            control.cancel()
            await asyncio.gather(control, return_exceptions=True)
        await fleet.stop_all()
        await template.close()
        runtime.close()


async def _populate(fa: FleetArgs, nodes: list[str]) -> None:
    path = fa.pods_kubeconfig or fa.kubeconfig.parent / "admin.kubeconfig"
    try:
        client = Client.from_kubeconfig(path, user_agent="kube32-fleet")
    except (OSError, ValueError, KeyError) as e:
        print(f"kube32 fleet: cannot create pods: {path}: {e}", file=sys.stderr, flush=True)
        return
    async with client:
        made = await create_pods(client, nodes, fa.pods_per_node, fa.image or "")
    print(f"kube32 fleet: created {made} pods ({fa.pods_per_node} a node)", flush=True)


def add_fleet_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--nodes", type=int, required=True, help=f"how many nodes (1 to {MAX_NODES})")
    p.add_argument("--prefix", default=DEFAULT_PREFIX,
                   help=f"node names PREFIX-1 ... PREFIX-N (default {DEFAULT_PREFIX})")
    p.add_argument("--first-address", default=FIRST_ADDRESS,
                   help=f"the first node's address; the next ones follow, skipping .0 and .255 "
                        f"(default {FIRST_ADDRESS}: never an address of `up`'s workers)")
    p.add_argument("--joins-at-once", type=int, default=JOINS_AT_ONCE,
                   help=f"nodes joining at the same time (default {JOINS_AT_ONCE})")
    p.add_argument("--pods-per-node", type=int, default=0, metavar="K",
                   help="create K pods of --image on each node once it joined (default 0)")
    p.add_argument("--image", help="the image of the pods --pods-per-node creates (e.g. what "
                                   "`kube32-cli image push` printed)")
    p.add_argument("--pods-kubeconfig", type=Path,
                   help="credentials that may create pods (default: admin.kubeconfig beside --kubeconfig)")


def fleet_args(args: argparse.Namespace) -> FleetArgs:
    """The fleet's settings from its flags (SystemExit naming a bad one)."""
    if not 1 <= args.nodes <= MAX_NODES:
        raise SystemExit(f"kube32-sim fleet: --nodes must be 1 to {MAX_NODES}, not {args.nodes}")
    if args.pods_per_node < 0 or (args.pods_per_node and not args.image):
        raise SystemExit("kube32-sim fleet: --pods-per-node K needs K >= 0, and --image when K > 0")
    if args.kubelet_port or args.address != "127.0.0.1":
        raise SystemExit("kube32-sim fleet: --port and --address are a worker's: each fleet node takes "
                         "a free port on its own address (--first-address)")
    if args.joins_at_once < 1:
        raise SystemExit("kube32-sim fleet: --joins-at-once must be 1 or more")
    if args.prefix in ("sim", "devkit") or not args.prefix or "/" in args.prefix:
        raise SystemExit(f'kube32-sim fleet: --prefix "{args.prefix}" names ordinary nodes; choose another')
    try:
        addresses = fleet_addresses(args.first_address, args.nodes)
        check_bindable(addresses)
    except ValueError as e:
        raise SystemExit(f"kube32-sim fleet: {e}") from None
    names = [f"{args.prefix}-{i}" for i in range(1, args.nodes + 1)]
    if (why := node_name_problem(names[-1], serving_cert=not args.kubelet_insecure_http)) is not None:
        raise SystemExit(f"kube32-sim fleet: --prefix \"{args.prefix}\": {why}")
    return FleetArgs(args.kubeconfig, args.server, fleet_options(args, names, addresses), args.joins_at_once,
                     args.pods_per_node, args.image, args.pods_kubeconfig)


def main_fleet(args: argparse.Namespace) -> int:
    fa = fleet_args(args)
    return asyncio.run(run_fleet(fa, args.data_dir))


