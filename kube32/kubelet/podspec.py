"""From a Pod object to the runtime's PodConfig: environment, topics, ticks, assets, memory.

* ``env``: plain values, ``valueFrom`` configMapKeyRef / secretKeyRef (``optional``
  honoured) and fieldRef (metadata.name, metadata.namespace, metadata.uid,
  spec.nodeName, status.podIP, status.hostIP); ``$(VAR)`` references to earlier
  variables are expanded as Kubernetes does.  ``HOSTNAME`` is the pod's name.
* topics: annotation ``kube32.io/events: "a,b"``; tick interval:
  ``kube32.io/tick-interval: "500ms"``.
* assets: ConfigMap (and Secret) volumes mounted by the container; each key is a file
  at ``<mountPath>/<key>`` (or the ``items`` paths).
* memory limit: ``resources.limits.memory``.
* asset paths cannot leave their volume: a ``mountPath`` must be absolute and an
  ``items[].path`` relative, and neither may hold a ``..`` element (Kubernetes
  refuses the same), so no file of one volume lands in another.

Anything missing or malformed raises :class:`ConfigError`, whose message goes to
the container's waiting state (reason ``CreateContainerConfigError``).
"""
from __future__ import annotations

import base64
import re
from typing import Any

from .. import movability, objects
from ..client import CONFIGMAPS, SECRETS, ApiError, Client
from ..wasm import PodConfig
from ..quantity import parse_bytes, parse_duration_ms
from ..terms import Annotation

TICK_ANNOTATION = Annotation.TICK_INTERVAL
_VAR_REF = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)|\$\$")


class ConfigError(Exception):
    pass


class _Sources:
    """ConfigMaps and Secrets read once per pod start."""

    def __init__(self, client: Client, namespace: str) -> None:
        self.client, self.namespace = client, namespace
        self._cache: dict[tuple[str, str], dict | None] = {}

    async def data(self, kind: str, name: str, optional: bool) -> dict[str, bytes] | None:
        key = (kind, name)
        if key not in self._cache:
            try:
                self._cache[key] = await self.client.try_get(CONFIGMAPS if kind == "configmap" else SECRETS,
                                                             name, self.namespace)
            except ApiError as e:
                raise ConfigError(f"cannot read {kind} {self.namespace}/{name}: {e.message}") from None
        obj = self._cache[key]
        if obj is None:
            if optional:
                return None
            raise ConfigError(f'{kind} "{name}" not found')
        out: dict[str, bytes] = {}
        if kind == "configmap":
            out.update({k: str(v).encode() for k, v in (obj.get("data") or {}).items()})
            out.update({k: base64.b64decode(v) for k, v in (obj.get("binaryData") or {}).items()})
        else:
            out.update({k: base64.b64decode(v) for k, v in (obj.get("data") or {}).items()})
            out.update({k: str(v).encode() for k, v in (obj.get("stringData") or {}).items()})
        return out


def _field_ref(pod: dict[str, Any], path: str, pod_ip: str) -> str:
    md, spec = objects.meta(pod), objects.spec(pod)
    values = {"metadata.name": md.get("name", ""), "metadata.namespace": md.get("namespace", ""),
              "metadata.uid": md.get("uid", ""), "spec.nodeName": spec.get("nodeName", ""),
              "spec.serviceAccountName": spec.get("serviceAccountName", ""),
              "status.podIP": pod_ip, "status.hostIP": pod_ip}
    m = re.match(r"^metadata\.(labels|annotations)\['(.+)'\]$", path)
    if m:
        return str((md.get(m.group(1)) or {}).get(m.group(2), ""))
    if path not in values:
        raise ConfigError(f'unsupported fieldRef "{path}"')
    return values[path]


def _expand(value: str, env: dict[str, str]) -> str:
    return _VAR_REF.sub(lambda m: "$" if m.group(0) == "$$" else env.get(m.group(1), m.group(0)), value)


async def _env(pod: dict, container: dict, sources: _Sources, pod_ip: str) -> dict[str, str]:
    env: dict[str, str] = {"HOSTNAME": pod["metadata"]["name"]}
    for src in container.get("envFrom") or []:
        prefix = src.get("prefix", "")
        for kind, ref in (("configmap", src.get("configMapRef")), ("secret", src.get("secretRef"))):
            if ref:
                data = await sources.data(kind, ref.get("name", ""), bool(ref.get("optional")))
                env.update({prefix + k: v.decode(errors="replace") for k, v in (data or {}).items()})
    for item in container.get("env") or []:
        name = item.get("name", "")
        if "value" in item or not item.get("valueFrom"):
            env[name] = _expand(str(item.get("value", "")), env)
            continue
        vf = item["valueFrom"]
        if vf.get("fieldRef"):
            env[name] = _field_ref(pod, vf["fieldRef"].get("fieldPath", ""), pod_ip)
            continue
        for kind, key in (("configmap", "configMapKeyRef"), ("secret", "secretKeyRef")):
            ref = vf.get(key)
            if not ref:
                continue
            optional = bool(ref.get("optional"))
            data = await sources.data(kind, ref.get("name", ""), optional)
            if data is None:
                break
            if ref.get("key") not in data:
                if optional:
                    break
                raise ConfigError(f'couldn\'t find key {ref.get("key")} in {kind} '
                                  f'{pod["metadata"]["namespace"]}/{ref.get("name")}')
            env[name] = data[ref["key"]].decode(errors="replace")
            break
        else:
            raise ConfigError(f'env {name}: unsupported valueFrom (use configMapKeyRef, secretKeyRef or fieldRef)')
    return env


async def _assets(pod: dict, container: dict, sources: _Sources) -> dict[str, bytes]:
    volumes = {v.get("name"): v for v in objects.spec(pod).get("volumes") or []}
    assets: dict[str, bytes] = {}
    for mount in container.get("volumeMounts") or []:
        vol = volumes.get(mount.get("name"))
        if vol is None:
            raise ConfigError(f'volumeMount "{mount.get("name")}" names no volume of the pod')
        if vol.get("configMap") is not None:
            kind, ref = "configmap", vol["configMap"]
            name = ref.get("name", "")
        elif vol.get("secret") is not None:
            kind, ref = "secret", vol["secret"]
            name = ref.get("secretName", "")
        else:
            raise ConfigError(f'volume "{vol.get("name")}": only configMap and secret volumes exist on a Kube32 node')
        data = await sources.data(kind, name, bool(ref.get("optional")))
        mount_path = str(mount.get("mountPath", ""))
        if not mount_path.startswith("/") or ".." in mount_path.split("/"):
            raise ConfigError(f'volumeMount "{mount.get("name")}": mountPath "{mount_path}" must be an '
                              "absolute path without '..'")
        base = mount_path.rstrip("/")
        items = ref.get("items")
        pairs = ([(i.get("key"), i.get("path") or i.get("key")) for i in items] if items
                 else [(k, k) for k in (data or {})])
        for key, path in pairs:
            if data is None:
                break
            if key not in data:
                raise ConfigError(f'configmap "{name}" has no key "{key}"')
            _check_item_path(str(vol.get("name")), str(path))
            assets[f"{base}/{path}"] = data[key]
    return assets


def _check_item_path(volume: str, path: str) -> None:
    if not path or path.startswith("/") or ".." in path.split("/"):
        raise ConfigError(f'volume "{volume}": item path "{path}" must be a relative path without \'..\'')


async def pod_config(client: Client, pod: dict[str, Any], pod_ip: str,
                     call_timeout_ms: int = 10000, start_timeout_ms: int | None = None) -> PodConfig:
    md, spec = pod["metadata"], objects.spec(pod)
    container = (spec.get("containers") or [{}])[0]
    ann = md.get("annotations") or {}
    sources = _Sources(client, md["namespace"])
    topics = movability.topics(pod)
    tick = None
    if ann.get(TICK_ANNOTATION):
        try:
            tick = parse_duration_ms(ann[TICK_ANNOTATION])
        except ValueError as e:
            raise ConfigError(f"annotation {TICK_ANNOTATION}: {e}") from None
        if tick <= 0:
            raise ConfigError(f"annotation {TICK_ANNOTATION}: the interval must be positive")
    memory = ((container.get("resources") or {}).get("limits") or {}).get("memory")
    limit = None
    if memory is not None:
        try:
            limit = parse_bytes(memory)
        except ValueError as e:
            raise ConfigError(f"resources.limits.memory: {e}") from None
    return PodConfig(namespace=md["namespace"], name=md["name"], container=container.get("name", "main"),
                     env=await _env(pod, container, sources, pod_ip), topics=topics,
                     tick_interval_ms=tick, assets=await _assets(pod, container, sources),
                     memory_limit_bytes=limit, call_timeout_ms=call_timeout_ms,
                     start_timeout_ms=start_timeout_ms)
