"""``kube32-cli``: the verbs kubectl lacks (move, checkpoint, image push, publish, snapshot inspect).

It reads the kubeconfig as kubectl does (``--kubeconfig``, then ``KUBECONFIG``,
then ``~/.kube/config``).  Each verb lives in its own module; this file only
dispatches.
"""
from __future__ import annotations

import sys
from typing import Callable

from .image import push_main
from .move import checkpoint_main, move_main
from .publish import publish_main
from .snapshot_inspect import inspect_main

USAGE = """usage: kube32-cli COMMAND [ARGS]

commands:
  snapshot inspect FILE [-o json]   print a K32S snapshot's header and sections, check its trailer
  move POD [--to NODE] [-n NS]      move a running pod to another node, keeping its state
  checkpoint POD [-n NS]            save a running pod's state (a Save Checkpoint); it keeps running
  image push FILE [-o json]         upload a Wasm module; prints its kube32.io/wasm-sha256:<hex> image
  publish TOPIC PAYLOAD [-n NS]     publish an event to the pods subscribed to TOPIC
"""

# (verb, sub-verb or "") -> handler(argv) -> exit code; later verbs register here.
COMMANDS: dict[tuple[str, str], Callable[[list[str]], int]] = {
    ("snapshot", "inspect"): inspect_main,
    ("image", "push"): push_main,
    ("move", ""): move_main,
    ("checkpoint", ""): checkpoint_main,
    ("publish", ""): publish_main,
}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(USAGE)
        return 0 if argv else 2
    if len(argv) >= 2 and (argv[0], argv[1]) in COMMANDS:
        return COMMANDS[(argv[0], argv[1])](argv[2:])
    if (argv[0], "") in COMMANDS:
        return COMMANDS[(argv[0], "")](argv[1:])
    print(f"kube32-cli: unknown command {' '.join(argv[:2])!r}\n\n{USAGE}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
