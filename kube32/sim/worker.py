"""``kube32-sim worker``: one simulated board, a kubelet joining a cluster.

It reads the API server's address and the node bootstrap token from a kubeconfig
(``<data-dir>/node.kubeconfig`` of the control plane; ``--server`` overrides the
address), runs a :class:`~kube32.kubelet.Kubelet` with the options of its profile
and flags, and stops cleanly on SIGINT/SIGTERM: it drains itself
(kube32.kubelet.drain), its pods stop and its Node is marked NotReady.  Started again
under the same name, its kubelet undoes that drain.
"""
from __future__ import annotations

import argparse
import asyncio
import ipaddress
import signal
import socket
import sys
from pathlib import Path

from ..client import ApiError, Client
from ..kubelet import Kubelet, KubeletOptions
from ..kubelet.drain import drain_self
from ..kubelet.join import node_name_problem
from ..kubelet.nodewatch import NodeWatch
from ..testing import WORKER_FAULTS
from ..quantity import parse_bytes
from ..wasm import ENGINES, Runtime, engine_class
from .profiles import profile


def add_node_flags(p: argparse.ArgumentParser, *, default_profile: str, port_flag: str = "--port") -> None:
    """Flags shared by ``worker`` and the control plane's own node."""
    p.add_argument(port_flag, dest="kubelet_port", type=int, default=0,
                   help="kubelet endpoint port (0 = any free port)")
    p.add_argument("--address", default="127.0.0.1",
                   help="the node's IP: its kubelet endpoint and NodePort Services listen there "
                        "(any 127.x.y.z is this machine; default 127.0.0.1)")
    p.add_argument("--profile", default=default_profile, choices=("devkit", "cardputer", "laptop"),
                   help=f"board profile: default heap, devices and pod capacity (default {default_profile})")
    p.add_argument("--heap", help="heap size, e.g. 512Ki, 8Mi (default: the profile's)")
    p.add_argument("--devices", help="comma-separated devices, e.g. display,keyboard (default: the profile's)")
    p.add_argument("--engine", choices=tuple(ENGINES),
                   help="the Wasm engine that runs the node's pods: wasmtime (compiled) or pwasm "
                        "(pure Python, any CPU); default: the profile's (pwasm for devkit and cardputer)")
    p.add_argument("--interp-mops", type=float,
                   help="interpreter speed to report instead of measuring it on the engine")
    p.add_argument("--lease-interval", type=float, default=10.0, help="seconds between Lease renewals")
    p.add_argument("--status-interval", type=float, default=10.0,
                   help="seconds between two comparisons of the node's status with the server's Node "
                        "(written when they differ, else every 5 minutes)")
    p.add_argument("--backoff", type=float, default=10.0, help="first restart back-off in seconds (doubles to 300)")
    p.add_argument("--kubelet-insecure-http", action="store_true",
                   help="serve the kubelet endpoint over plain HTTP instead of TLS (debugging only)")
    p.add_argument("--fault", action="append", default=[], choices=WORKER_FAULTS, metavar="FAULT",
                   help="inject a fault, for reliability tests: " + ", ".join(WORKER_FAULTS))


def address_problem(address: str) -> str | None:
    """Why a node cannot have ``address`` (its kubelet endpoint and NodePorts listen
    there, its certificate names it): not an IPv4 address, or one this machine cannot
    listen on; None when it can.  Said before the join, which would otherwise refuse it
    with a certificate's words or fail to connect without a cause."""
    try:
        ip = ipaddress.IPv4Address(address)
    except ValueError:
        return f'"{address}" is not an IPv4 address (a node\'s address is one, e.g. 127.0.0.2)'
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((str(ip), 0))
        except OSError as e:
            return (f"this machine cannot listen on {ip} ({e.strerror}); a node's address must be one of this "
                    "machine's (127.x.y.z on Linux)")
    return None


def kubelet_options(args: argparse.Namespace, name: str, *, control_plane: bool = False,
                    data_dir: Path | None = None) -> KubeletOptions:
    if (why := node_name_problem(name, serving_cert=not args.kubelet_insecure_http)) is not None:
        raise SystemExit(f"kube32-sim: {why}")
    if (why := address_problem(args.address)) is not None:
        raise SystemExit(f"kube32-sim: --address: {why}")
    prof = profile(args.profile)
    try:
        heap = parse_bytes(args.heap) if args.heap else prof.heap_bytes
    except ValueError as e:
        raise SystemExit(f"kube32-sim: --heap: {e}") from None
    devices = (tuple(d.strip() for d in args.devices.split(",") if d.strip()) if args.devices is not None
               else prof.devices)
    engine = args.engine or prof.engine
    try:
        engine_class(engine)
    except ValueError as e:
        whose = "" if args.engine else f" (the {prof.name} profile's)"
        hint = "; --engine pwasm runs on any CPU" if engine != "pwasm" else ""
        raise SystemExit(f"kube32-sim: --engine{whose}: {e}{hint}") from None
    return KubeletOptions(node_name=name, host=args.address, port=args.kubelet_port, profile=prof.name, heap_bytes=heap,
                          driver_bytes=prof.driver_bytes if not args.heap else min(prof.driver_bytes, heap // 4),
                          devices=devices, max_pods=prof.max_pods, interp_mops=args.interp_mops, engine=engine,
                          control_plane=control_plane, lease_interval=args.lease_interval,
                          status_interval=args.status_interval, backoff_base=args.backoff,
                          data_dir=data_dir, faults=tuple(args.fault), insecure_http=args.kubelet_insecure_http)


def node_client(kubeconfig: Path, server: str | None, name: str) -> Client:
    """A node's client before its join: the kubeconfig's bootstrap token, ``server``
    (when given) instead of the kubeconfig's address."""
    client = Client.from_kubeconfig(kubeconfig, user_agent=f"kubelet/{name}")
    if server:
        client.server = server.rstrip("/")
    return client


async def start_node(client: Client, opts: KubeletOptions, runtime: Runtime | None = None,
                     node_watch: NodeWatch | None = None) -> Kubelet:
    """One kubelet joined and started on ``client`` (which carries the node's own token
    from then on); the one path every simulated node takes: a worker, the control
    plane's node, each node of a fleet (``runtime``, ``node_watch``: the fleet's shared
    ones).  The client is closed when the node cannot start."""
    kubelet = Kubelet(client, opts, runtime, node_watch)
    try:
        await kubelet.start()
    except BaseException:
        await client.close()
        raise
    return kubelet


async def stop_node(kubelet: Kubelet, *, drain: bool) -> list[str]:
    """Stop a node started by :func:`start_node`: drained first (its pods evicted: a
    movable pod moves) when ``drain``, then its pods stop and its Node is marked
    NotReady.  The pods still there after the drain's 20 s, by name."""
    left = await drain_self(kubelet) if drain else []
    await kubelet.stop()
    await kubelet.client.close()
    return left


def stop_on_signals() -> asyncio.Event:
    """An event SIGINT or SIGTERM sets: the process's stop (a worker's, the control
    plane's node's)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    return stop


async def run_worker(kubeconfig: Path, server: str | None, opts: KubeletOptions) -> int:
    try:
        kubelet = await start_node(node_client(kubeconfig, server, opts.node_name), opts)
    except ApiError as e:
        # A refusal names its cause (e.g. the name held by a running kubelet): one line, no traceback.
        print(f"kube32 worker {opts.node_name}: {e.code} {e.reason}: {e.message}", file=sys.stderr, flush=True)
        return 1
    print(f"kube32 worker {opts.node_name} ({opts.profile}) joined {kubelet.client.server}; "
          f"kubelet on {kubelet.ip}:{kubelet.port}, engine {kubelet.runtime.engine.runtime_version}, "
          f"interp-mops {kubelet.interp_mops:.2f}", flush=True)
    await stop_on_signals().wait()
    print(f"kube32 worker {opts.node_name} draining (up to 20 s)", flush=True)
    left = await stop_node(kubelet, drain=True)
    if left:
        print(f"kube32 worker {opts.node_name}: still here after 20 s: {', '.join(left)}", flush=True)
    print(f"kube32 worker {opts.node_name} stopped", flush=True)
    return 0
