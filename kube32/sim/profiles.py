"""Node profiles for the sim: what a board offers its pods.

A profile supplies the default heap, the drivers' share of it, the devices, the
pod capacity and the interpreter speed the node reports (``kube32.io/interp-mops``).
A board profile reports the board's modelled speed (``modelled_mops``): the sim runs
on this machine's CPU, not the board's, and two nodes of one board profile must never
look apart.  ``laptop`` has none: its kubelet measures this machine at boot.
``--interp-mops`` overrides either.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Profile:
    name: str
    description: str
    heap_bytes: int
    driver_bytes: int
    devices: tuple[str, ...]
    max_pods: int
    modelled_mops: float | None  # None: measured at boot


PROFILES: dict[str, Profile] = {p.name: p for p in (
    Profile("devkit", "ESP32-S3 dev kit with 8 MiB PSRAM", 8 << 20, 0, (), 16, 8.2),
    Profile("cardputer", "M5Stack Cardputer (ESP32-S3, no PSRAM)", 320 << 10, 96 << 10,
            ("display", "keyboard", "speaker", "sd"), 8, 7.0),
    Profile("laptop", "a laptop or PC", 512 << 20, 0, (), 110, None),
)}


def profile(name: str) -> Profile:
    try:
        return PROFILES[name]
    except KeyError:
        raise ValueError(f'unknown profile "{name}" (choose one of: {", ".join(PROFILES)})') from None
