"""``kube32-cli publish TOPIC PAYLOAD [-n NS]``: publish an event to the pods subscribed
to TOPIC in a namespace (annotation ``kube32.io/events``), on every node.

The payload is the argument's UTF-8 bytes, or stdin's with ``-`` .  No history is
kept: pods running (and subscribed) at that moment get it.
"""
from __future__ import annotations

import argparse
import asyncio
import sys

from ..client import ApiError, Client
from ..urlpath import PathRefused, group_path


async def _publish(kubeconfig: str | None, ns: str, topic: str, payload: bytes) -> dict:
    async with Client.from_kubeconfig(kubeconfig, user_agent="kube32-cli") as client:
        path = group_path("namespaces", ns, "topics", *topic.split("/"))
        return await client.post_bytes(path, payload, "application/octet-stream", {"source": "user"})


def publish_main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="kube32-cli publish", description=__doc__)
    p.add_argument("topic")
    p.add_argument("payload", help="the event's payload ('-' reads stdin)")
    p.add_argument("-n", "--namespace", default="default")
    p.add_argument("--kubeconfig", help="kubeconfig (default: $KUBECONFIG, then ~/.kube/config)")
    args = p.parse_args(argv)
    payload = sys.stdin.buffer.read() if args.payload == "-" else args.payload.encode()
    try:
        out = asyncio.run(_publish(args.kubeconfig, args.namespace, args.topic, payload))
    except ApiError as e:
        print(f"kube32-cli publish: {e.message}", file=sys.stderr)
        return 1
    except PathRefused as e:
        print(f"kube32-cli publish: topic {args.topic!r}: {e}", file=sys.stderr)
        return 1
    except (OSError, KeyError, ValueError) as e:
        print(f"kube32-cli publish: cannot use the kubeconfig: {e}", file=sys.stderr)
        return 1
    print(f"published {out.get('size', len(payload))} bytes on {args.namespace}/{args.topic} "
          f"({out.get('subscribers', 0)} node subscriptions)")
    return 0
