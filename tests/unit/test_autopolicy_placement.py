"""The placement policy's decision (spec: "Policies"): an Auto pod with
``kube32.io/placement: fastest`` moves only to a node at least twice as fast, and never
because of noise between figures measured on one machine."""
from __future__ import annotations

import asyncio
from typing import Any

from kube32.client import CHECKPOINTS
from kube32.controllers.autopolicy import AutoPolicy, faster
from kube32.controllers.base import ControllerContext, ControllerOptions, SharedInformers

HOST = "0123456789abcdef"  # the kube32.io/interp-mops-measured-on of this machine


def node(name: str, mops: float | None, measured_on: str | None = None) -> dict:
    ann = {} if mops is None else {"kube32.io/interp-mops": f"{mops:.2f}"}
    if measured_on:
        ann["kube32.io/interp-mops-measured-on"] = measured_on
    return {"metadata": {"name": name, "annotations": ann, "labels": {"kubernetes.io/hostname": name}},
            "spec": {},
            "status": {"conditions": [{"type": "Ready", "status": "True"}],
                       "allocatable": {"memory": str(512 << 20), "pods": "110", "cpu": "1"}}}


def racer(on: str) -> dict:
    return {"metadata": {"name": "racer", "namespace": "default", "uid": "u1",
                         "annotations": {"kube32.io/migration": "Auto", "kube32.io/placement": "fastest"}},
            "spec": {"nodeName": on, "containers": [{"name": "main", "image": "wasm://x/y.wasm"}]},
            "status": {"phase": "Running"}}


def test_identical_nodes_of_one_machine_are_never_faster_than_each_other() -> None:
    # The figures of the issue: two identical workers measured 2398 and 5271 by wall time.
    assert not faster(node("sim-2", 5271, HOST), node("sim-1", 2398, HOST))
    assert not faster(node("sim-1", 2398, HOST), node("sim-2", 5271, HOST))


def test_twice_as_fast_is_needed_between_machines_and_given_figures() -> None:
    assert faster(node("remote", 5000, "fedcba9876543210"), node("sim-1", 2400, HOST))
    assert not faster(node("remote", 4700, "fedcba9876543210"), node("sim-1", 2400, HOST))
    # Figures given with --interp-mops carry no machine.
    assert faster(node("turbo", 1000), node("sim-1", 100))
    assert not faster(node("devkit", 8.2), node("cardputer", 7.0))
    assert faster(node("sim-1", 7000, HOST), node("devkit", 8.2))
    assert not faster(node("devkit", 8.2), node("devkit-2", 8.2))


def test_a_node_without_a_figure_is_never_faster() -> None:
    assert not faster(node("blank", None), node("sim-1", 0))
    assert not faster(node("blank", 0), node("sim-1", 100))


class Api:
    def __init__(self) -> None:
        self.created: list[dict] = []

    async def create(self, kind: Any, obj: dict, ns: Any = None) -> dict:
        assert kind is CHECKPOINTS
        self.created.append(obj)
        return obj


class Recorder:
    async def record(self, *args: Any) -> None:
        pass


def placement(nodes: list[dict], pod: dict) -> list[dict]:
    """The Checkpoints one placement pass creates."""
    api = Api()
    ctl = AutoPolicy(ControllerContext(api, SharedInformers(api), ControllerOptions(),  # type: ignore[arg-type]
                                       Recorder()))  # type: ignore[arg-type]
    ctl.recorder = Recorder()  # type: ignore[assignment]
    ctl.nodes.cache = {n["metadata"]["name"]: n for n in nodes}
    ctl.pods.cache = {"default/racer": pod}
    asyncio.run(ctl._placement())
    return api.created


def test_no_placement_move_between_identical_workers_whatever_their_figures() -> None:
    nodes = [node("sim-1", 2398, HOST), node("sim-2", 5271, HOST), node("devkit", 8.2)]
    assert placement(nodes, racer("sim-1")) == []


def test_the_pod_moves_to_the_fastest_node_that_is_twice_as_fast() -> None:
    # sim-2 has the highest figure, but it is sim-1's machine: the remote node is the
    # one really twice as fast.
    nodes = [node("sim-1", 2400, HOST), node("sim-2", 9000, HOST), node("remote", 6000, "fedcba9876543210")]
    created = placement(nodes, racer("sim-1"))
    assert [c["spec"]["target"]["nodeName"] for c in created] == ["remote"]
    assert created[0]["metadata"]["labels"] == {"kube32.io/trigger": "placement"}
    assert placement([node("devkit", 8.2), node("sim-1", 7000, HOST)], racer("devkit"))[0]["spec"]["target"] \
        == {"nodeName": "sim-1"}
