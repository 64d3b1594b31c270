"""``kube32-sim``: run a Kube32 cluster on this machine (control plane, workers, all at once)."""
from __future__ import annotations

import argparse
import asyncio
import logging
import re
import sys
from pathlib import Path

from .. import timing
from ..apiserver.auth import TokenFileError
from ..controllers.base import ControllerOptions
from ..controllers.leaderelection import LeaderElectionTimings
from ..apiserver.checkpointdata import BOARD_CAPACITY, SIM_CAPACITY
from ..quantity import parse_bytes
from ..store import StoreError
from ..store.config import StoreSpec, parse_store
from ..wasm import ENGINES
from .controlplane import ControlPlaneOptions, run_control_plane
from .etcd import EtcdError
from .fleet import MAX_NODES, add_fleet_flags, main_fleet
from .worker import add_node_flags, kubelet_options, run_worker


def duration(text: str) -> float:
    """A Go-style duration ("40s", "5m0s", "500ms", "1h") or plain seconds, as seconds."""
    units = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|h|m|s)", text)
    try:
        if not parts:
            value = float(text)
        elif "".join(n + u for n, u in parts) != text:
            raise ValueError
        else:
            value = sum(float(n) * units[u] for n, u in parts)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid duration {text!r} (use e.g. 40s, 5m0s, 500ms)") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"invalid duration {text!r}: must not be negative")
    return value


# Control plane timings: (flag, default seconds, help).  `up` forwards the ones given.
TIMINGS = [
    ("--node-monitor-grace-period", 40.0, "a node whose Lease is not renewed this long turns Ready=Unknown"),
    ("--pod-eviction-timeout", 300.0, "how long pods stay on a not-ready/unreachable node without a toleration "
                                      "saying otherwise"),
    ("--node-monitor-period", 1.0, "how often node health is checked"),
    ("--move-rollback-timeout", timing.MOVE_ROLLBACK_SECONDS,
     "a moved pod's replacement not running by then goes back to its source"),
    ("--checkpoint-retention", 3600.0, "finished Checkpoints other than the latest periodic ones go after this"),
    ("--pressure-move-cooldown", 60.0, "memory pressure moves at most one pod per node per this"),
    ("--auto-move-cooldown", 600.0, "a pod with the Auto policy moves on its own at most once per this"),
    ("--job-backoff", timing.JOB_BACKOFF_SECONDS, "a Job makes the next pod this long after a failed one "
                                                 "(doubling per failure)"),
    # Leader election of the controllers among control planes (kube-controller-manager's flags).
    ("--leader-elect-lease-duration", 15.0, "a leader not renewing its Lease this long is replaced"),
    ("--leader-elect-renew-deadline", 10.0, "a leader that could not renew this long stops leading"),
    ("--leader-elect-retry-period", 2.0, "how often candidates try and the leader renews"),
]


def store_flag(text: str) -> StoreSpec:
    try:
        return parse_store(text)
    except StoreError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def add_control_plane_timings(p: argparse.ArgumentParser, forward: bool = False) -> None:
    for flag, default, text in TIMINGS:
        p.add_argument(flag, type=duration, default=None if forward else default, metavar="DURATION",
                       help=f"{text} (default {default:g}s)")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kube32-sim", description=__doc__)
    p.add_argument("-v", "--verbose", action="store_true", help="log debug messages")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    cp = sub.add_parser("control-plane", help="run the API server, controllers and the control plane's node")
    cp.add_argument("--data-dir", type=Path, required=True, help="where objects and credentials live")
    cp.add_argument("--store", type=store_flag, default=StoreSpec(), metavar="STORE",
                    help="where objects live: sqlite (the default: DATA_DIR/state.db) or "
                         "etcd://HOST:PORT[,HOST:PORT...] (an etcd v3 cluster)")
    cp.add_argument("--port", type=int, default=6443, help="API server port (0 = any free port)")
    cp.add_argument("--host", default="127.0.0.1", help="address to listen on")
    cp.add_argument("--insecure-http", action="store_true",
                    help="serve plain HTTP instead of TLS (kubectl then sends no token: debugging only)")
    cp.add_argument("--token-auth-file", type=Path, metavar="FILE",
                    help='static bearer tokens, CSV lines token,user,uid,"group1,group2" '
                         "(as kube-apiserver's --token-auth-file)")
    add_control_plane_timings(cp)
    cp.add_argument("--checkpoint-space", metavar="SIZE",
                    help="memory for all checkpoint data (default 16Mi; 256Ki, the board's PSRAM share, "
                         "when --profile devkit is given)")
    cp.add_argument("--node-name", default="devkit", help="the control plane's own node (default devkit)")
    cp.add_argument("--no-kubelet", action="store_true", help="run no node on the control plane")
    add_node_flags(cp, default_profile="devkit", port_flag="--kubelet-port")

    w = sub.add_parser("worker", help="run one simulated board (a kubelet) that joins a cluster")
    w.add_argument("--kubeconfig", type=Path, required=True,
                   help="the control plane's node.kubeconfig (server address and bootstrap token)")
    w.add_argument("--server", help="API server URL (default: the kubeconfig's)")
    w.add_argument("--name", required=True, help="node name")
    w.add_argument("--data-dir", type=Path, help="where the node caches images and compiled code")
    add_node_flags(w, default_profile="laptop")

    fl = sub.add_parser("fleet", help="run N simulated boards, each a real kubelet, in one process")
    fl.add_argument("--kubeconfig", type=Path, required=True,
                    help="the control plane's node.kubeconfig (server address and bootstrap token)")
    fl.add_argument("--server", help="API server URL (default: the kubeconfig's)")
    fl.add_argument("--data-dir", type=Path, help="where the nodes cache images and compiled code")
    add_fleet_flags(fl)
    add_node_flags(fl, default_profile="devkit")

    up = sub.add_parser("up", help="control plane plus N workers as child processes, in one command")
    up.add_argument("--workers", type=int, default=2, help="number of workers sim-1 ... sim-N (default 2)")
    up.add_argument("--fleet", type=int, default=0, metavar="N",
                    help="also a fleet of N boards in one process (fleet-1 ... fleet-N, devkit profile; "
                         "see `kube32-sim fleet`)")
    up.add_argument("--data-dir", type=Path, required=True, help="the control plane's data directory")
    up.add_argument("--port", type=int, default=6443,
                    help="API server port (0 = any free port; control plane i listens on PORT+i-1)")
    up.add_argument("--control-planes", type=int, default=1, metavar="N",
                    help="run N control planes on one etcd, the controllers on one of them at a time "
                         "(needs --store etcd; default 1)")
    up.add_argument("--store", default="sqlite", metavar="STORE",
                    help="sqlite (the default), etcd (an etcd cluster of its own, one member per control "
                         "plane) or etcd://HOST:PORT[,HOST:PORT...]")
    up.add_argument("--interp-mops", help="interpreter speed every node reports instead of measuring it on its engine")
    up.add_argument("--engine", choices=tuple(ENGINES),
                    help="the Wasm engine of every node (default: each node's profile's)")
    up.add_argument("--lease-interval", help="seconds between Lease renewals on every node")
    up.add_argument("--backoff", help="first restart back-off in seconds on every node")
    add_control_plane_timings(up, forward=True)
    up.add_argument("--checkpoint-space", metavar="SIZE",
                    help="the control plane's memory for all checkpoint data (default 16Mi; e.g. 128Mi "
                         "for 64 MiB pods)")
    return p


def leader_election(args: argparse.Namespace) -> LeaderElectionTimings:
    timings = LeaderElectionTimings(args.leader_elect_lease_duration, args.leader_elect_renew_deadline,
                                    args.leader_elect_retry_period)
    try:
        timings.check()
    except ValueError as e:
        raise SystemExit(f"kube32-sim: {e}") from None
    return timings


def checkpoint_space(args: argparse.Namespace, argv: list[str]) -> int:
    """Bytes for checkpoint data: --checkpoint-space, else the board's 256 KiB when the
    devkit profile is asked for explicitly, else the simulator's 16 MiB."""
    if args.checkpoint_space:
        try:
            return parse_bytes(args.checkpoint_space)
        except ValueError as e:
            raise SystemExit(f"kube32-sim: --checkpoint-space: {e}") from None
    explicit = any(a == "--profile" or a.startswith("--profile=") for a in argv)
    return BOARD_CAPACITY if explicit and args.profile == "devkit" else SIM_CAPACITY


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        if args.command == "control-plane":
            kubelet = None if args.no_kubelet else kubelet_options(
                args, args.node_name, control_plane=True, data_dir=args.data_dir / "nodes" / args.node_name)
            opts = ControlPlaneOptions(data_dir=args.data_dir, host=args.host, port=args.port,
                                       insecure_http=args.insecure_http, kubelet=kubelet,
                                       checkpoint_space=checkpoint_space(args, argv),
                                       token_auth_file=args.token_auth_file, store=args.store,
                                       controllers=ControllerOptions(
                                           node_monitor_grace_seconds=args.node_monitor_grace_period,
                                           pod_eviction_timeout_seconds=args.pod_eviction_timeout,
                                           node_monitor_period_seconds=args.node_monitor_period,
                                           move_rollback_seconds=args.move_rollback_timeout,
                                           checkpoint_retention_seconds=args.checkpoint_retention,
                                           pressure_move_cooldown_seconds=args.pressure_move_cooldown,
                                           auto_move_cooldown_seconds=args.auto_move_cooldown,
                                           job_backoff_seconds=args.job_backoff),
                                       leader_election=leader_election(args))
            return asyncio.run(run_control_plane(opts))
        if args.command == "worker":
            opts_w = kubelet_options(args, args.name, data_dir=args.data_dir)
            return asyncio.run(run_worker(args.kubeconfig, args.server, opts_w))
        if args.command == "fleet":
            return main_fleet(args)
        if args.command == "up":
            from .up import run_up
            if args.workers < 0 or not 0 <= args.fleet <= MAX_NODES:
                print(f"kube32-sim up: --workers must be 0 or more, --fleet 0 to {MAX_NODES}", file=sys.stderr)
                return 2
            node_args: list[str] = []
            for flag in ("interp_mops", "lease_interval", "backoff", "engine"):
                if getattr(args, flag) is not None:
                    node_args += [f"--{flag.replace('_', '-')}", str(getattr(args, flag))]
            cp_args: list[str] = []
            for flag, _, _ in TIMINGS:
                value = getattr(args, flag[2:].replace("-", "_"))
                if value is not None:
                    cp_args += [flag, f"{value:g}s"]
            if args.checkpoint_space:
                cp_args += ["--checkpoint-space", args.checkpoint_space]
            if args.store != "etcd":
                parse_store(args.store)  # a bad URL: StoreError naming its cause
            if args.control_planes < 1 or (args.control_planes > 1 and args.store == "sqlite"):
                print("kube32-sim up: --control-planes N needs N >= 1, and --store etcd when N > 1 "
                      "(one SQLite file has one control plane)", file=sys.stderr)
                return 2
            return asyncio.run(run_up(args.data_dir, args.workers, args.port, node_args, cp_args,
                                      control_planes=args.control_planes, store=args.store,
                                      fleet=args.fleet))
    except (OSError, TokenFileError, StoreError, EtcdError) as e:
        print(f"kube32-sim: cannot start {args.command}: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return 2


if __name__ == "__main__":
    sys.exit(main())
