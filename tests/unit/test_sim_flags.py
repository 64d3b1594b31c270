"""kube32-sim's flags that pick sizes and engines: the checkpoint data space, each node's Wasm engine."""
from kube32.sim.main import _parser, checkpoint_space


def space(*extra: str) -> int:
    argv = ["control-plane", "--data-dir", "x", *extra]
    return checkpoint_space(_parser().parse_args(argv), argv)


def test_the_simulator_has_16_mib_and_the_devkit_board_256_kib() -> None:
    assert space() == 16 << 20
    assert space("--profile", "devkit") == 256 << 10
    assert space("--profile", "laptop") == 16 << 20
    assert space("--checkpoint-space", "1Mi") == 1 << 20


def test_up_forwards_the_checkpoint_space_to_the_control_plane(monkeypatch) -> None:
    import kube32.sim.up
    from kube32.sim.main import main
    seen: list[list[str]] = []

    async def fake_run_up(data_dir, workers, port, node_args, cp_args=(), **ha) -> int:
        seen.append(list(cp_args))
        return 0
    monkeypatch.setattr(kube32.sim.up, "run_up", fake_run_up)
    assert main(["up", "--data-dir", "x", "--checkpoint-space", "128Mi"]) == 0
    assert main(["up", "--data-dir", "x"]) == 0
    assert seen == [["--checkpoint-space", "128Mi"], []]


def engine_of(command: str, *extra: str) -> str:
    from kube32.sim.worker import kubelet_options
    base = {"worker": ["worker", "--kubeconfig", "k", "--name", "n"],
            "control-plane": ["control-plane", "--data-dir", "x"]}[command]
    return kubelet_options(_parser().parse_args([*base, *extra]), "n").engine


def test_the_boards_run_pods_in_the_interpreter_and_a_laptop_in_wasmtime() -> None:
    assert engine_of("worker") == "wasmtime"                       # profile laptop
    assert engine_of("worker", "--profile", "cardputer") == "pwasm"
    assert engine_of("control-plane") == "pwasm"                   # its node is a devkit
    assert engine_of("worker", "--profile", "devkit", "--engine", "wasmtime") == "wasmtime"
    assert engine_of("worker", "--engine", "pwasm") == "pwasm"


def test_up_forwards_the_engine_to_every_node(monkeypatch) -> None:
    import kube32.sim.up
    from kube32.sim.main import main
    seen: list[list[str]] = []

    async def fake_run_up(data_dir, workers, port, node_args, cp_args=(), **ha) -> int:
        seen.append(list(node_args))
        return 0
    monkeypatch.setattr(kube32.sim.up, "run_up", fake_run_up)
    assert main(["up", "--data-dir", "x", "--engine", "pwasm"]) == 0
    assert seen == [["--engine", "pwasm"]]


def test_up_takes_several_control_planes_on_etcd_only(monkeypatch, capsys) -> None:
    import kube32.sim.up
    from kube32.sim.main import main
    seen: list[dict] = []

    async def fake_run_up(data_dir, workers, port, node_args, cp_args=(), **ha) -> int:
        seen.append(ha)
        return 0
    monkeypatch.setattr(kube32.sim.up, "run_up", fake_run_up)
    assert main(["up", "--data-dir", "x", "--control-planes", "3", "--store", "etcd"]) == 0
    assert main(["up", "--data-dir", "x", "--store", "etcd://127.0.0.1:2379"]) == 0
    assert seen == [{"control_planes": 3, "store": "etcd", "fleet": 0},
                    {"control_planes": 1, "store": "etcd://127.0.0.1:2379", "fleet": 0}]
    assert main(["up", "--data-dir", "x", "--control-planes", "3"]) == 2
    assert "one SQLite file has one control plane" in capsys.readouterr().err
    assert main(["up", "--data-dir", "x", "--store", "etcd://nowhere"]) == 1
    assert "HOST:PORT" in capsys.readouterr().err


def test_the_control_planes_node_gets_every_kubelet_option_in_its_process():
    """kube32/sim/node.py: the options cross to the child process whole, and nothing else."""
    from pathlib import Path

    import pytest

    from kube32.kubelet import KubeletOptions
    from kube32.sim.node import options_from_json, options_to_json
    opts = KubeletOptions(node_name="devkit", profile="devkit", devices=("display", "keyboard"), engine="pwasm",
                          control_plane=True, faults=("corrupt-restores",), data_dir=Path("/tmp/x/nodes/devkit"),
                          extra_labels={"a": "b"}, interp_mops=8.2)
    assert options_from_json(options_to_json(opts)) == opts
    with pytest.raises(ValueError, match="unknown kubelet options: bogus"):
        options_from_json('{"node_name": "devkit", "bogus": 1}')


def test_up_with_several_control_planes_runs_on_when_they_all_exit(capsys) -> None:
    """`up --control-planes 3`: no control plane exiting stops the cluster, the last of
    its own neither (the workers run on); with one control plane, its exit stops `up`."""
    import asyncio
    from types import SimpleNamespace

    from kube32.sim.up import _supervise

    async def go(count: int) -> tuple[int | None, int]:
        controls = {f"control plane cp-{i}": SimpleNamespace(returncode=-9) for i in range(1, count + 1)}
        stop = asyncio.Event()
        task = asyncio.ensure_future(_supervise(controls, {}, stop))  # type: ignore[arg-type]
        await asyncio.sleep(0.2)
        if task.done():
            return task.result(), len(controls)
        stop.set()
        await task
        return None, len(controls)

    assert asyncio.run(go(1)) == (1, 1)
    assert asyncio.run(go(3)) == (None, 0)
    assert "no control plane it started runs; the workers and etcd go on" in capsys.readouterr().out
