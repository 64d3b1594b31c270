"""``kube32-cli image push FILE``: upload a Wasm module to the control plane's module store.

Prints the reference to use as a container image (``kube32.io/wasm-sha256:<hex>``);
``-o json`` prints the store's whole answer (digest, size, exports).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path

from ..client import ApiError, Client
from ..urlpath import group_path


async def _push(kubeconfig: str | None, data: bytes) -> dict:
    async with Client.from_kubeconfig(kubeconfig, user_agent="kube32-cli") as client:
        return await client.post_bytes(group_path("images"), data, "application/wasm")


def push_main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="kube32-cli image push", description=__doc__)
    p.add_argument("file", type=Path, help="the .wasm module")
    p.add_argument("--kubeconfig", help="kubeconfig (default: $KUBECONFIG, then ~/.kube/config)")
    p.add_argument("-o", "--output", choices=("name", "json"), default="name")
    args = p.parse_args(argv)
    try:
        data = args.file.read_bytes()
    except OSError as e:
        print(f"kube32-cli image push: cannot read {args.file}: {e.strerror}", file=sys.stderr)
        return 1
    try:
        out = asyncio.run(_push(args.kubeconfig, data))
    except ApiError as e:
        print(f"kube32-cli image push: {e.message}", file=sys.stderr)
        return 1
    except (OSError, KeyError, ValueError) as e:
        print(f"kube32-cli image push: cannot use the kubeconfig: {e}", file=sys.stderr)
        return 1
    print(json.dumps(out, indent=2) if args.output == "json" else out["reference"])
    return 0
