"""A move's target has the pod's module before the pod is replaced (spec: "Moves").

A move hands a snapshot to the image of the replacement's spec.  Two things would
make that fail after the replacement, where the state is at risk: a target that
cannot pull the image (the replacement waits in ImagePullBackOff until the rollback,
and a source that must pull again fails the same way), and an image that is no longer
the module the snapshot was taken from (the pod's image was changed and its container
has not restarted with it yet, or a ``wasm://`` URL serves another module now).  So
while the source takes the snapshot, the Checkpoint controller has the target's kubelet
pull and load the image (``POST /api/v1/nodes/<target>/proxy/images/pull``, the caches
then hold it for the replacement), and it needs that answer before the pod freezes:
a target that cannot pull, or does not answer within the move's rollback timeout (a
node that hangs), fails the move with the pod never frozen.  Once the snapshot is taken,
the module's digest must be the snapshot's ``imageSha256``, else the move fails before
the replacement: the pod thaws where it runs, with its state.  The pull is never
awaited while the pod is frozen: a hung target's answer could take the pull's whole
timeout (a fresh connection to a stopped node fails in seconds, but one kept alive
from earlier requests waits for an answer), and the pod would stay frozen that long.
"""
from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp

from .. import objects
from ..client import Client
from ..terms import Annotation
from ..urlpath import api_path

PULL_TIMEOUT_SECONDS = 60.0  # the target's own pull gives up after 60 s (kubelet.images)


class TargetImageError(Exception):
    """The target cannot run the image: the message says why."""


def image_of(pod: dict[str, Any], container: str) -> str:
    return next((c.get("image", "") for c in objects.spec(pod).get("containers") or []
                 if c.get("name") == container), "")


async def pull_on(client: Client, node: str, image: str, annotations: dict[str, str],
                  timeout: float = PULL_TIMEOUT_SECONDS) -> str:
    """Have ``node`` pull and load ``image``; the module's digest (TargetImageError when
    it cannot, or gives no answer within ``timeout`` s)."""
    params = {"image": image}
    if annotations.get(Annotation.WASM_PIN):
        params["sha256"] = annotations[Annotation.WASM_PIN]
    try:
        async with client.request("POST", api_path("api", "v1", "nodes", node, "proxy", "images", "pull"),
                                  params=params, timeout=aiohttp.ClientTimeout(total=timeout)) as r:
            text = await r.text()
    except (aiohttp.ClientError, asyncio.TimeoutError, ConnectionError) as e:
        why = f"no answer within {timeout:g} s" if isinstance(e, asyncio.TimeoutError) else str(e) or type(e).__name__
        raise TargetImageError(f"node {node} did not answer whether it can pull image {image}: {why}") from None
    try:
        body = json.loads(text)
    except json.JSONDecodeError:
        body = {"message": text.strip()}
    if r.status == 200 and isinstance(body, dict) and body.get("sha256"):
        return str(body["sha256"])
    message = body.get("message") if isinstance(body, dict) else None
    raise TargetImageError(f"node {node} cannot pull image {image}: {message or f'it answered {r.status}'}")


def drop(pull: "asyncio.Future[str] | None") -> None:
    """A pull whose answer nobody will wait for (the move failed before)."""
    if pull is None:
        return
    if pull.done():
        if not pull.cancelled():
            pull.exception()  # seen: the move failed for another reason first
    else:
        pull.cancel()


def snapshot_mismatch(node: str, image: str, digest: str, snapshot_digest: str | None) -> str | None:
    """Why the snapshot cannot go to ``image`` (``digest`` on ``node``), or None."""
    if not snapshot_digest or digest.lower() == snapshot_digest.lower():
        return None
    return (f"image {image} is module sha256:{digest} on {node}, not the module the snapshot was taken "
            f"from (sha256:{snapshot_digest}): the image changed since the container started")
