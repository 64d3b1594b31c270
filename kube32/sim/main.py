"""``kube32-sim``: run a Kube32 cluster on this machine (control plane, workers, all at once)."""
from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from pathlib import Path

from .controlplane import ControlPlaneOptions, run_control_plane


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kube32-sim", description=__doc__)
    p.add_argument("-v", "--verbose", action="store_true", help="log debug messages")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    cp = sub.add_parser("control-plane", help="run the API server, controllers and the control plane's node")
    cp.add_argument("--data-dir", type=Path, required=True, help="where objects and credentials live")
    cp.add_argument("--port", type=int, default=6443, help="API server port (0 = any free port)")
    cp.add_argument("--host", default="127.0.0.1", help="address to listen on")
    cp.add_argument("--insecure-http", action="store_true",
                    help="serve plain HTTP instead of TLS (kubectl then sends no token: debugging only)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    if args.command == "control-plane":
        opts = ControlPlaneOptions(data_dir=args.data_dir, host=args.host, port=args.port,
                                   insecure_http=args.insecure_http)
        try:
            return asyncio.run(run_control_plane(opts))
        except OSError as e:
            print(f"kube32-sim: cannot start the control plane: {e}", file=sys.stderr)
            return 1
    return 2


if __name__ == "__main__":
    sys.exit(main())
