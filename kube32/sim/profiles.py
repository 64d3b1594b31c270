"""Node profiles for the sim: what a board offers its pods.

A profile supplies the default heap, the drivers' share of it, the devices, the
pod capacity and the Wasm engine (``--engine`` overrides it): the boards run pods in
the pure-Python interpreter (pwasm), as slow as a board's interpreter is and on any
CPU, a laptop in wasmtime.  The interpreter speed is measured at boot on the node's
own engine (``--interp-mops`` overrides it), so ``reference_mops`` here is only the
board's reference figure for documentation and ``kubectl describe`` readers.
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
    reference_mops: float | None
    engine: str = "wasmtime"


PROFILES: dict[str, Profile] = {p.name: p for p in (
    Profile("devkit", "ESP32-S3 dev kit with 8 MiB PSRAM", 8 << 20, 0, (), 16, 8.2, "pwasm"),
    Profile("cardputer", "M5Stack Cardputer (ESP32-S3, no PSRAM)", 320 << 10, 96 << 10,
            ("display", "keyboard", "speaker", "sd"), 8, 7.0, "pwasm"),
    Profile("laptop", "a laptop or PC", 512 << 20, 0, (), 110, None, "wasmtime"),
)}


def profile(name: str) -> Profile:
    try:
        return PROFILES[name]
    except KeyError:
        raise ValueError(f'unknown profile "{name}" (choose one of: {", ".join(PROFILES)})') from None
