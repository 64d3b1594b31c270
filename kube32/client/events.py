"""Kubernetes Events, as client-go's recorder writes them.

An event with the same object, reason and message as a recent one bumps that
event's ``count`` and ``lastTimestamp`` instead of adding a new object, so
``kubectl describe`` shows ``(x3 over 2m)``.  Recording never raises: an event
that cannot be written is logged and dropped (events are best effort).
"""
from __future__ import annotations

import datetime as dt
import logging
import secrets
from typing import Any

from .. import objects
from .kinds import EVENTS
from .rest import ApiError, Client

log = logging.getLogger("kube32.events")


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


class EventRecorder:
    def __init__(self, client: Client, component: str, host: str | None = None) -> None:
        self.client = client
        self.component = component
        self.host = host
        self._recent: dict[tuple, tuple[str, str, int]] = {}  # key -> (ns, name, count)

    async def record(self, obj: dict[str, Any], type_: str, reason: str, message: str,
                     times: int = 1) -> None:
        """Record that it happened ``times`` times (the event's ``count`` grows by that)."""
        md = objects.meta(obj)
        ns = md.get("namespace") or "default"
        involved = {"kind": obj.get("kind", ""), "apiVersion": obj.get("apiVersion", ""),
                    "name": md.get("name", ""), "namespace": md.get("namespace", ""),
                    "uid": md.get("uid", ""), "resourceVersion": md.get("resourceVersion", "")}
        key = (involved["kind"], ns, involved["name"], involved["uid"], type_, reason, message)
        now = _now()
        try:
            if key in self._recent:
                ens, ename, count = self._recent[key]
                try:
                    await self.client.patch(EVENTS, ename, {"count": count + times, "lastTimestamp": now}, ens)
                    self._recent[key] = (ens, ename, count + times)
                    return
                except ApiError:
                    self._recent.pop(key, None)
            name = f"{involved['name']}.{secrets.token_hex(8)}"
            ev = {"apiVersion": "v1", "kind": "Event",
                  "metadata": {"name": name, "namespace": ns},
                  "involvedObject": involved, "reason": reason, "message": message, "type": type_,
                  "source": {"component": self.component, **({"host": self.host} if self.host else {})},
                  "firstTimestamp": now, "lastTimestamp": now, "count": times,
                  "reportingComponent": self.component, "reportingInstance": self.host or ""}
            await self.client.create(EVENTS, ev, ns)
            if len(self._recent) > 4096:
                self._recent.clear()
            self._recent[key] = (ns, name, times)
        except Exception as e:  # noqa: BLE001 - events are best effort
            log.warning("cannot record event %s for %s/%s: %s", reason, ns, involved["name"], e)
