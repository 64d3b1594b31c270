"""kube32-sim's flags that pick sizes: the checkpoint data space."""
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
