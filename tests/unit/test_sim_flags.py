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

    async def fake_run_up(data_dir, workers, port, node_args, cp_args=()) -> int:
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

    async def fake_run_up(data_dir, workers, port, node_args, cp_args=()) -> int:
        seen.append(list(node_args))
        return 0
    monkeypatch.setattr(kube32.sim.up, "run_up", fake_run_up)
    assert main(["up", "--data-dir", "x", "--engine", "pwasm"]) == 0
    assert seen == [["--engine", "pwasm"]]
