"""A pod's host services for unit tests of kube32.wasm: channels of its own, logs kept,
publishes dropped (the kubelet's PodHost does the real work)."""
from __future__ import annotations

from kube32.wasm import ChannelRegistry


class Host:
    def __init__(self) -> None:
        self.channels = ChannelRegistry()
        self.logs: list[str] = []

    def log(self, pod, line):
        self.logs.append(line)

    def publish(self, pod, topic, payload):
        pass
